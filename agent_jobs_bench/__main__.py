"""`python -m agent_jobs_bench [--quick] [--only NAME ...] [--output BENCHMARKS.md]`: `agent-jobs bench`."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from agent_jobs_bench.harness import Runner, load
from agent_jobs_cli.commands.bench import BenchRun, bench_app
from agent_jobs_cli.context import run_alias


def main(argv: Sequence[str] | None = None, loader: Callable[[str], Runner] = load) -> int:
    return run_alias(bench_app, argv, prog_name="python -m agent_jobs_bench", obj=BenchRun(loader))


if __name__ == "__main__":
    sys.exit(main())
