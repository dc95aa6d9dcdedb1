"""Patches with no '---' or '@@' line at all (a pure rename, a mode change, an empty file added or deleted), as real
`git format-patch` and `git diff` write them: apply_patch applies them as git does. The branch it pushes holds git's
very tree (the same tree id), so every path, mode and content matches."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from job_worker.jobs import apply_patch
from job_worker.jobs.context import JobContext
from job_worker.jobs.git_workspace import GitWorkspaceStore
from tests.git.conftest import apply_patch_job, branch_tree_id, committed_change, real_git

pytestmark = pytest.mark.skipif(
    subprocess.run(["git", "--version"], capture_output=True, check=False).returncode != 0,
    reason="git is not installed: the patches are made by real git",
)


def _git(clone: Path, *args: str) -> str:
    return real_git(clone, *args).decode()


def _touch(clone: Path, path: str) -> None:
    (clone / path).parent.mkdir(parents=True, exist_ok=True)
    (clone / path).write_bytes(b"")
    _git(clone, "add", path)


def _move(clone: Path, old: str, new: str, *, mode: int | None = None) -> None:
    (clone / new).parent.mkdir(parents=True, exist_ok=True)
    _git(clone, "mv", old, new)
    if mode is not None:
        _chmod(clone, new, mode)


def _chmod(clone: Path, path: str, mode: int) -> None:
    (clone / path).chmod(mode)
    _git(clone, "add", path)


# Each case: what the base commit adds first (pushed to the remote's main), then the agent's change.
Step = Callable[[Path], object]
CASES: dict[str, tuple[Step | None, Step]] = {
    "pure rename": (None, lambda clone: _move(clone, "old/name.txt", "new/name.txt")),
    "mode change only": (None, lambda clone: _chmod(clone, "README.md", 0o755)),
    "executable bit dropped": (None, lambda clone: _chmod(clone, "scripts/check.sh", 0o644)),
    "empty file added": (None, lambda clone: _touch(clone, "empty/added.txt")),
    "empty file deleted": (lambda clone: _touch(clone, "gone.txt"), lambda clone: _git(clone, "rm", "-q", "gone.txt")),
    "rename and mode change": (None, lambda clone: _move(clone, "tail.txt", "bin/tail", mode=0o755)),
}
FORMATS = {
    "format-patch": lambda clone: _git(clone, "format-patch", "-1", "--stdout"),
    "git diff": lambda clone: _git(clone, "diff", "HEAD~1", "HEAD"),
}


@pytest.mark.parametrize("exported", sorted(FORMATS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_patch_without_a_hunk_is_applied_as_git_applies_it(
    case: str, exported: str, remote: Path, make_store: Callable[..., GitWorkspaceStore], tmp_path: Path
) -> None:
    # Given a clone of the workspace's remote, the case's base on main, and the agent's change committed by git
    clone = committed_change(remote, tmp_path, *CASES[case], message=case)
    patch = FORMATS[exported](clone)
    body = patch[patch.index("diff --git ") :]
    assert "\n@@ " not in body
    assert "\n--- " not in body  # no file header: git's extended header lines alone say it all

    # When the worker runs it as an apply_patch job
    job = apply_patch_job("job-1", patch, message=case)
    result = apply_patch.run(job, JobContext(workspace=make_store().open("ws-1"), remaining_ms=lambda: 60_000))

    # Then the branch's tree is git's, to the tree id
    assert result["alreadyApplied"] is False
    assert branch_tree_id(remote) == _git(clone, "rev-parse", "HEAD^{tree}").strip()
