"""Local tooling for Agent Jobs (not deployed): template.yaml as data, the local runtime and its helpers."""
