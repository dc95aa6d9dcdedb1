"""`python -m agent_jobs_local demo|local|token|container-host`: `agent-jobs demo` and `agent-jobs local`, bearer tokens
for the local API, and the address `sam local`'s containers reach this machine at."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from agent_jobs_cli.commands.local import local_runtime_app
from agent_jobs_cli.context import run_alias


def main(argv: Sequence[str] | None = None) -> int:
    return run_alias(local_runtime_app, argv, prog_name="python -m agent_jobs_local")


if __name__ == "__main__":
    sys.exit(main())
