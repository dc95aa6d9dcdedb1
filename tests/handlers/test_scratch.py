"""Scratch folders in the worker's /tmp: a job's folder is its own from the moment it exists, and another job's
cleanup of abandoned folders never takes it, however their steps interleave."""

from __future__ import annotations

import fcntl
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from job_worker.jobs.scratch import IN_USE, SCRATCH_PREFIX, remove_abandoned, scratch_folder


def on_another_thread(cleanup: Callable[[], list[Path]], removed: list[Path]) -> None:
    """Another job's cleanup, run to its end on its own thread (as a group of the batch running at once would)."""
    thread = threading.Thread(target=lambda: removed.extend(cleanup()))
    thread.start()
    thread.join()


def test_scratch_folder_is_never_removed_by_a_cleanup_that_runs_while_it_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given another job's cleanup of abandoned folders that runs, to its end, between every step of this job's making
    # of its folder: after the folder is made, and before the job takes the folder's lock
    removed: list[Path] = []
    real_mkdtemp, real_flock = tempfile.mkdtemp, fcntl.flock

    def mkdtemp(*args: Any, **kwargs: Any) -> str:
        made = str(real_mkdtemp(*args, **kwargs))
        on_another_thread(lambda: remove_abandoned(tmp_path), removed)
        return made

    def flock(file: Any, operation: int) -> None:
        if operation == fcntl.LOCK_EX and Path(str(getattr(file, "name", ""))).name == IN_USE:
            on_another_thread(lambda: remove_abandoned(tmp_path), removed)
        real_flock(file, operation)

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    monkeypatch.setattr(fcntl, "flock", flock)

    # When the job makes its folder and writes into it
    with scratch_folder(tmp_path) as work:
        (work / "checkout.txt").write_text("the head")

        # Then the cleanup took nothing: the folder is the job's, whole
        assert removed == []
        assert (work / "checkout.txt").read_text() == "the head"

    # And the folder is removed when the job ends
    assert list(tmp_path.iterdir()) == []


def test_scratch_cleanup_takes_a_folder_whose_job_died_before_locking_it(tmp_path: Path) -> None:
    # Given folders whose jobs died: one before making its lock file, one after (its lock died with it)
    unlocked = tmp_path / f"{SCRATCH_PREFIX}no-lock"
    unlocked.mkdir()
    killed = tmp_path / f"{SCRATCH_PREFIX}killed"
    (killed / "work").mkdir(parents=True)
    (killed / IN_USE).touch()

    # When another job makes its scratch folder
    with scratch_folder(tmp_path) as work:
        # Then both are gone, and only its own folder is left
        assert [path.name for path in tmp_path.iterdir()] == [work.parent.name]


def test_scratch_cleanup_keeps_a_live_jobs_folder(tmp_path: Path) -> None:
    with scratch_folder(tmp_path) as work:
        (work / "file").write_text("in use")
        assert remove_abandoned(tmp_path) == []
        assert (work / "file").read_text() == "in use"
