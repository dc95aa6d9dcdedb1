"""Benchmarks: their counts and the report they write (quick mode; counts and structure, never times)."""
