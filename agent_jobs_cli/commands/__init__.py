"""The `agent-jobs` commands, one module per command group; `agent_jobs_cli.main` builds the app from them."""
