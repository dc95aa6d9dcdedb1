"""Plain `diff -ruN` patches (no git headers) that delete and create files: `diff -N` writes a file missing on one
side as empty, dated at the Unix epoch, and git apply and GNU patch delete (or create) it. apply_patch does the same:
the branch it pushes holds exactly the files of the directory the patch was made towards."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
from dulwich.refs import Ref
from dulwich.repo import Repo

from job_worker.jobs import apply_patch
from job_worker.jobs.context import JobContext
from job_worker.jobs.git_workspace import GitWorkspaceStore
from tests.git.conftest import SEED_FILES, apply_patch_job

pytestmark = pytest.mark.skipif(shutil.which("diff") is None, reason="GNU diff makes the patches")

# What the agent's directory looks like after its change: SEED_FILES with files removed (None), added or changed.
CHANGES: dict[str, Mapping[str, bytes | None]] = {
    "a file deleted": {"old/name.txt": None},
    "a file added": {"new/file.txt": b"one\ntwo\n"},
    "deleted, added and changed at once": {
        "docs/notes.txt": None,
        "src/extra.py": b"x = 1\n",
        "README.md": b"# demo\n\nmore\n",
    },
    "every line of a file deleted in a folder that goes away": {"old/name.txt": None, "tail.txt": None},
}


def _write(root: Path, files: Mapping[str, bytes]) -> None:
    for path, content in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(content)


def _branch_files(remote: Path, branch: str) -> dict[str, bytes]:
    with Repo(str(remote)) as repo:
        commit = repo[repo.refs[Ref(f"refs/heads/{branch}".encode())]]
        tree = repo[commit.tree]  # type: ignore[attr-defined]
        return {
            entry.path.decode(): repo[entry.sha].as_raw_string()
            for entry in repo.object_store.iter_tree_contents(tree.id)
        }


@pytest.mark.parametrize("case", sorted(CHANGES))
def test_a_plain_diff_deletes_and_creates_files_as_gnu_patch_does(
    case: str, remote: Path, make_store: Callable[..., GitWorkspaceStore], tmp_path: Path
) -> None:
    # Given the workspace's files in a/ and the agent's change of them in b/, exported by `diff -ruN a b`
    before, after = tmp_path / "a", tmp_path / "b"
    _write(before, SEED_FILES)
    expected = {path: content for path, content in {**SEED_FILES, **CHANGES[case]}.items() if content is not None}
    _write(after, expected)
    made = subprocess.run(["diff", "-ruN", "a", "b"], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert made.returncode == 1, made.stderr  # 1: the directories differ
    assert "diff --git" not in made.stdout

    # When the worker runs it as an apply_patch job
    job = apply_patch_job("job-1", made.stdout, message=case)
    result = apply_patch.run(job, JobContext(workspace=make_store().open("ws-1"), remaining_ms=lambda: 60_000))

    # Then the branch holds b/'s files exactly: the deleted ones are gone, not left empty
    assert result["alreadyApplied"] is False
    assert _branch_files(remote, "agent/ws-1") == expected


def test_a_plain_diff_that_empties_a_file_without_the_epoch_keeps_it_empty(
    remote: Path, make_store: Callable[..., GitWorkspaceStore]
) -> None:
    # Given a plain diff that removes every line of tail.txt, its new side dated now (the file still exists, empty)
    patch = (
        "--- a/tail.txt\t2026-12-04 10:00:00.000000000 +0000\n"
        "+++ b/tail.txt\t2026-12-04 10:05:00.000000000 +0000\n"
        "@@ -1,2 +0,0 @@\n"
        "-first\n"
        "-last\n"
        "\\ No newline at end of file\n"
    )

    # When it is applied, Then the file stays, empty, as GNU patch leaves it without -E
    apply_patch.run(apply_patch_job("job-1", patch), JobContext(make_store().open("ws-1"), lambda: 60_000))
    assert _branch_files(remote, "agent/ws-1")["tail.txt"] == b""
