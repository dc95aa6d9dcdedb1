"""Scratch folders for one job's files (run_tests' checkout of the head), in the worker's ephemeral storage (/tmp).

A scratch folder is removed when its job ends, whether the job succeeded or failed. A process killed mid-job (an
invocation that timed out or crashed) cannot remove its own, and /tmp outlives the process in Lambda: every new
scratch folder first removes those left behind. A live job holds an flock on its folder's IN_USE file (released by
the system when its holder dies), so only folders no live job holds are removed.

A folder exists for a moment before its lock does (made, then its IN_USE file opened, then locked), and in that
moment it looks exactly like one whose job died. So creating a folder and removing abandoned ones exclude each other
through an flock on the parent folder itself: creators hold it shared from before the folder is made until its lock
is taken, the removal holds it exclusive while it decides what is abandoned. A removal that finds a folder being
created leaves the cleanup to the next job instead of waiting: nothing is lost by a later cleanup.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO, Final

SCRATCH_PREFIX: Final = "agent-jobs-tests-"
IN_USE: Final = ".in-use.flock"


@contextmanager
def scratch_folder(root: Path | None = None) -> Iterator[Path]:
    """An empty folder for one job's files, removed with everything in it when the block ends."""
    parent = Path(root or tempfile.gettempdir())
    remove_abandoned(parent)
    with ExitStack() as held:
        with _parent_locked(parent, fcntl.LOCK_SH):  # no removal decides until this job holds its folder
            folder = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=parent))
            held.callback(shutil.rmtree, folder, ignore_errors=True)
            in_use = held.enter_context((folder / IN_USE).open("a"))
            fcntl.flock(in_use, fcntl.LOCK_EX)  # this job's until the block ends, or the system's until it dies
        work = folder / "work"
        work.mkdir()
        yield work


def remove_abandoned(parent: Path) -> list[Path]:
    """Remove the scratch folders under `parent` that no live job holds; returns them. Removes nothing while a
    scratch folder is being created there (the next job's cleanup takes what this one leaves)."""
    abandoned: list[Path] = []
    held: list[IO[str]] = []  # the abandoned folders' locks, taken by this removal
    try:
        with _parent_locked(parent, fcntl.LOCK_EX | fcntl.LOCK_NB):
            for folder in parent.glob(f"{SCRATCH_PREFIX}*"):
                try:
                    lock = (folder / IN_USE).open("r")
                except FileNotFoundError:
                    if folder.is_dir():
                        abandoned.append(folder)  # its creator died before it made its lock
                    continue
                except OSError:
                    continue
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    lock.close()
                    continue  # a live job's
                held.append(lock)
                abandoned.append(folder)
    except BlockingIOError:
        return []  # a folder is being created: it would look abandoned
    # Removed outside the parent's lock, so creators never wait on a large checkout's removal; the abandoned folders'
    # locks are held meanwhile, so no other removal counts them as abandoned too.
    for folder in abandoned:
        shutil.rmtree(folder, ignore_errors=True)
    for opened in held:
        opened.close()
    return abandoned


@contextmanager
def _parent_locked(parent: Path, operation: int) -> Iterator[None]:
    """`parent` (the folder the scratch folders are made in) flocked with `operation` while the block runs."""
    descriptor = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(descriptor, operation)
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(descriptor, fcntl.LOCK_UN)
        os.close(descriptor)
