"""The `agent-jobs` command line (not deployed): jobs, workspaces, resume and the dead-letter queue."""
