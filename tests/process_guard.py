"""A guard for tests that start fork bombs: this test process, and everything it starts from then on, in a pids cgroup
of its own with a cap well above what the sandbox under test should allow, so a bomb the sandbox failed to bound
still cannot take this machine's processes. The sandboxes' own cgroups are created under it (the runtime makes them
below its own cgroup), so the cap holds whatever they do."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_jobs_local.sandbox_cgroups import parse_mountinfo, parse_proc_cgroup

GUARD_MAX_TASKS = 4096


def _pids_cgroup() -> Path | None:
    own = parse_proc_cgroup(Path("/proc/self/cgroup").read_text()).get("pids")
    for mount in parse_mountinfo(Path("/proc/self/mountinfo").read_text()):
        if mount.version == 1 and "pids" in mount.controllers and own is not None:
            return mount.mount_point / os.path.relpath(own, mount.root)
    return None


@contextlib.contextmanager
def guarded_process_tree(max_tasks: int = GUARD_MAX_TASKS) -> Iterator[Path]:
    """Run the body with this process in a new pids cgroup capped at `max_tasks`; skips the test where none can be
    made (a fork bomb is never started unguarded)."""
    own = _pids_cgroup()
    if own is None:
        pytest.skip("no cgroup v1 pids hierarchy to guard a fork bomb with here")
    guard = own / f"test-guard-{os.getpid()}"
    try:
        guard.mkdir()
        (guard / "pids.max").write_text(str(max_tasks))
        (guard / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as error:
        with contextlib.suppress(OSError):
            guard.rmdir()
        pytest.skip(f"no pids cgroup to guard a fork bomb with here ({error})")
    try:
        yield guard
    finally:
        (own / "cgroup.procs").write_text(str(os.getpid()))
        deadline = time.monotonic() + 10
        while True:
            try:
                guard.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
