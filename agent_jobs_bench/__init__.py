"""Benchmarks of Agent Jobs against the naive pattern, measured in the same run (`make bench` → BENCHMARKS.md).

Not deployed: like agent_jobs_local, this package runs on a developer's machine against the local runtime.
"""
