"""The naive patterns Agent Jobs replaces, kept only so tests can show their failure modes
(docs/architecture.md lists them)."""
