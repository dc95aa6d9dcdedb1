"""Scratch folders for one job's files (run_tests' checkout of the head), in the worker's ephemeral storage (/tmp).

A scratch folder is removed when its job ends, whether the job succeeded or failed. A process killed mid-job (an
invocation that timed out or crashed) cannot remove its own, and /tmp outlives the process in Lambda: every new
scratch folder first removes those left behind. A live job holds an flock on its folder's IN_USE file (released by
the system when its holder dies), so only folders no live job holds are removed.
"""

from __future__ import annotations

import fcntl
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

SCRATCH_PREFIX: Final = "agent-jobs-tests-"
IN_USE: Final = ".in-use.flock"
# A folder without its IN_USE file yet is being created, unless it is older than this.
CREATION_GRACE_SECONDS: Final = 60.0


@contextmanager
def scratch_folder(root: Path | None = None) -> Iterator[Path]:
    """An empty folder for one job's files, removed with everything in it when the block ends."""
    parent = Path(root or tempfile.gettempdir())
    remove_abandoned(parent)
    folder = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=parent))
    try:
        with (folder / IN_USE).open("a") as in_use:
            fcntl.flock(in_use, fcntl.LOCK_EX)
            work = folder / "work"
            work.mkdir()
            yield work
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def remove_abandoned(parent: Path) -> list[Path]:
    """Remove the scratch folders under `parent` that no live job holds; returns them."""
    removed = []
    for folder in parent.glob(f"{SCRATCH_PREFIX}*"):
        in_use = folder / IN_USE
        try:
            if not in_use.exists():
                if time.time() - folder.stat().st_mtime > CREATION_GRACE_SECONDS:
                    shutil.rmtree(folder, ignore_errors=True)
                    removed.append(folder)
                continue
            with in_use.open("a") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a live job's
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
        except OSError:
            continue  # removed meanwhile by its own job
    return removed
