"""`python -m agent_jobs_cli ...` runs the `agent-jobs` command line."""

from agent_jobs_cli.main import main

main()
