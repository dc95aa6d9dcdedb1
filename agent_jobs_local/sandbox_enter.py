"""Put this process in a sandbox's bounds, then become bwrap: `python3 -I -S sandbox_enter.py SPEC bwrap ...`.

SPEC is `{"cgroupProcs": [...], "rlimits": {"RLIMIT_NPROC": n}}`: the cgroup.procs files this process writes its pid
to and the rlimits it sets. Entering before bwrap starts bounds bwrap and everything it starts from their first
instruction; a process moved into a cgroup after it started may have forked first. Anything that fails stops the
sandbox before it starts (it never runs unbounded). Standard library only.
"""

from __future__ import annotations

import json
import os
import resource
import sys


def main(argv: list[str]) -> None:
    spec = json.loads(argv[1])
    pid = str(os.getpid())
    for procs in spec["cgroupProcs"]:
        with open(procs, "w") as cgroup:
            cgroup.write(pid)
    for name, limit in spec["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (limit, limit))
    os.execv(argv[2], argv[2:])


if __name__ == "__main__":
    main(sys.argv)
