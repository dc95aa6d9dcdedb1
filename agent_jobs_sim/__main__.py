"""`python -m agent_jobs_sim`: run seeds on every core and report, or replay one seed.

python -m agent_jobs_sim --seeds 1000                 # seeds 0..999 on all cores
python -m agent_jobs_sim --replay 4242                # one seed again: its violation and trace digest
python -m agent_jobs_sim --seeds 10000 --plant naive-claim --stop-at-first
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

# Python randomises str hashing per process, and set order follows it: a seed replays exactly only when every run
# hashes alike. Set before anything is imported that could iterate a set of strings.
if os.environ.get("PYTHONHASHSEED") != "0":  # pragma: no cover - re-executed at once
    os.execve(
        sys.executable, [sys.executable, "-m", "agent_jobs_sim", *sys.argv[1:]], {**os.environ, "PYTHONHASHSEED": "0"}
    )

from agent_jobs_sim.runner import main


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m agent_jobs_sim", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds to run (default 100)")
    parser.add_argument("--first", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--replay", type=int, default=None, help="run this one seed and print its trace digest")
    parser.add_argument("--jobs", type=int, default=50, help="jobs per seed (default 50)")
    parser.add_argument("--workspaces", type=int, default=5, help="workspaces per seed (default 5)")
    parser.add_argument(
        "--share", type=int, default=1, help="each tenant's share of the worker's invocations (default 1; 0: none)"
    )
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1, help="worker processes (default: cores)")
    parser.add_argument("--plant", default=None, help="run with one planted bug (see --list-plants)")
    parser.add_argument("--list-plants", action="store_true", help="list the planted bugs and exit")
    parser.add_argument("--stop-at-first", action="store_true", help="stop at the first failing seed")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main(_arguments(None)))
