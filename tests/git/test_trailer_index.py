"""The index of a branch's job commits in a workspace's cache (`jobs.git.trailer_index`): a job walks only the commits
above the indexed head, and the answer is always the one a walk of the whole branch gives: after a force push, after
the base moved, with an index cut short or edited, and for a job whose commit is far below the head.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from dulwich.objects import ObjectID
from dulwich.refs import Ref
from dulwich.repo import Repo

from job_worker.jobs import apply_patch
from job_worker.jobs.git.commits import new_commit
from job_worker.jobs.git.trailer_index import INDEX_FILE
from job_worker.jobs.git_workspace import GitWorkspace, GitWorkspaceStore
from tests.git.conftest import BASE_BRANCH, SEED_FILES, apply_patch_job, commit_files, remote_ref
from tests.git.test_git_workspace import BRANCH, append_line, branch_job_ids, context

StoreFactory = Callable[..., GitWorkspaceStore]


def _apply(workspace: GitWorkspace, n: int) -> dict[str, Any]:
    return apply_patch.run(apply_patch_job(f"job-{n}", append_line(n)), context(workspace))


def _warm(make_store: StoreFactory, jobs: int) -> GitWorkspace:
    """A workspace that applied jobs 1..`jobs` in order: its cache's index holds them all."""
    workspace = make_store().open("ws-1")
    for n in range(1, jobs + 1):
        _apply(workspace, n)
    assert (workspace.cache_path / INDEX_FILE).is_file()
    return workspace


def _job_commit(remote: Path, job_id: str, parent: str) -> ObjectID:
    """A commit with `job_id`'s trailer pushed onto the branch by hand, on `parent`."""
    message = f"by hand\n\nAgent-Job-Id: {job_id}\n"
    files = {**SEED_FILES, f"{job_id}.txt": b"x\n"}
    return commit_files(remote, BRANCH, files, message, [ObjectID(parent.encode())])


def test_a_job_far_below_the_indexed_head_is_found(remote: Path, make_store: StoreFactory) -> None:
    workspace = _warm(make_store, 6)
    first = workspace.history()[0]

    again = _apply(workspace, 1)

    assert again["alreadyApplied"] is True
    assert again["commit"] == first.sha
    assert workspace.find_commit("job-1") == first
    assert branch_job_ids(remote) == [f"job-{n}" for n in range(1, 7)]


def test_a_job_reads_only_the_commits_above_the_indexed_head(remote: Path, make_store: StoreFactory) -> None:
    # Given a warm cache that has lost the commit of its first job (a walk of the whole branch could not read it)
    workspace = _warm(make_store, 4)
    sha = workspace.history()[0].sha
    (workspace.cache_path / "objects" / sha[:2] / sha[2:]).unlink()

    # When the next jobs run, they look for their trailers above the indexed head only, and commit
    assert _apply(workspace, 5)["alreadyApplied"] is False
    assert _apply(workspace, 6)["alreadyApplied"] is False
    assert branch_job_ids(remote) == [f"job-{n}" for n in range(1, 7)]


def test_a_force_pushed_branch_is_walked_again(remote: Path, make_store: StoreFactory) -> None:
    # Given an index of jobs 1-3, then the branch rewritten by hand: one job-9 commit on the base, jobs 1-3 gone
    workspace = _warm(make_store, 3)
    base = remote_ref(remote, BASE_BRANCH)
    assert base is not None
    rewritten = _job_commit(remote, "job-9", base)

    # Then what the branch holds now is found, and what it no longer holds is not
    assert workspace.find_commit("job-1") is None
    found = workspace.find_commit("job-9")
    assert found is not None
    assert found.sha == rewritten.decode()
    assert [c.job_id for c in workspace.history()] == ["job-9"]
    # and a job that is no longer on the branch is applied again
    assert _apply(workspace, 1)["alreadyApplied"] is False


def test_a_branch_rewritten_above_a_kept_commit_is_walked_again(remote: Path, make_store: StoreFactory) -> None:
    # Given an index of jobs 1-3, then the branch reset to job 1's commit and a hand-made job-8 commit put on it
    workspace = _warm(make_store, 3)
    first = workspace.history()[0]
    _job_commit(remote, "job-8", first.sha)

    # Then jobs 2 and 3 are gone from the branch, jobs 1 and 8 are on it
    assert workspace.find_commit("job-2") is None
    assert workspace.find_commit("job-3") is None
    assert workspace.find_commit("job-1") == first
    assert [c.job_id for c in workspace.history()] == ["job-1", "job-8"]


def test_jobs_below_a_base_that_moved_past_them_are_no_longer_looked_at(remote: Path, make_store: StoreFactory) -> None:
    # Given an index of jobs 1-3, then the base fast-forwarded to job 2's commit (part of the branch merged)
    workspace = _warm(make_store, 3)
    second = workspace.history()[1]
    with Repo(str(remote)) as repo:
        repo.refs[Ref(f"refs/heads/{BASE_BRANCH}".encode())] = ObjectID(second.sha.encode())

    # Then the jobs since the base are the ones above it, as a walk of the whole branch finds them
    assert workspace.find_commit("job-1") is None
    assert workspace.find_commit("job-2") is None
    assert [c.job_id for c in workspace.history()] == ["job-3"]

    # and after the base moved past the whole branch, on top of a merge of it, only the new job is since the base
    head = remote_ref(remote, BRANCH) or ""
    with_jobs = {**SEED_FILES, "journal.txt": b"job 1\njob 2\njob 3\n"}
    commit_files(remote, BASE_BRANCH, with_jobs, "merged\n", [ObjectID(head.encode())])
    _job_commit(remote, "job-4", remote_ref(remote, BASE_BRANCH) or "")
    assert workspace.find_commit("job-3") is None
    assert [c.job_id for c in workspace.history()] == ["job-4"]


def test_a_base_that_moved_elsewhere_keeps_the_branch_jobs(remote: Path, make_store: StoreFactory) -> None:
    workspace = _warm(make_store, 3)
    base = remote_ref(remote, BASE_BRANCH)
    commit_files(remote, BASE_BRANCH, {**SEED_FILES, "other.txt": b"x\n"}, "other\n", [ObjectID((base or "").encode())])

    assert [c.job_id for c in workspace.history()] == ["job-1", "job-2", "job-3"]
    assert _apply(workspace, 2)["alreadyApplied"] is True


def test_an_index_cut_short_at_a_line_end_is_not_read_as_a_shorter_one(remote: Path, make_store: StoreFactory) -> None:
    workspace = _warm(make_store, 4)
    index = workspace.cache_path / INDEX_FILE
    lines = index.read_text().splitlines(keepends=True)
    index.write_text("".join(lines[:-2]))  # job 1's line (the oldest, last) and the end line gone

    assert _apply(workspace, 1)["alreadyApplied"] is True
    assert branch_job_ids(remote) == ["job-1", "job-2", "job-3", "job-4"]


def test_an_index_that_is_not_one_is_ignored(remote: Path, make_store: StoreFactory) -> None:
    workspace = _warm(make_store, 3)
    index = workspace.cache_path / INDEX_FILE
    for garbage in (b"", b"\xff\xfe not ascii", index.read_bytes().replace(b"job-1", b"job 1"), b"agent-jobs"):
        index.write_bytes(garbage)
        assert _apply(workspace, 1)["alreadyApplied"] is True
        assert workspace.find_commit("job-2") is not None
    assert branch_job_ids(remote) == ["job-1", "job-2", "job-3"]


def test_an_index_that_names_the_wrong_commit_for_a_job_is_walked_again(remote: Path, make_store: StoreFactory) -> None:
    # Given an index edited so that job-1 names job-2's commit
    workspace = _warm(make_store, 3)
    history = workspace.history()
    index = workspace.cache_path / INDEX_FILE
    index.write_text(index.read_text().replace(f"{history[0].sha} job-1", f"{history[1].sha} job-1"))

    # Then job-1 is found as its own commit
    assert workspace.find_commit("job-1") == history[0]
    assert _apply(workspace, 1)["commit"] == history[0].sha


def test_a_commit_whose_trailer_names_no_job_breaks_neither_the_lookup_nor_the_index(
    remote: Path, make_store: StoreFactory
) -> None:
    # Given commits pushed onto the branch by hand whose trailer is not a jobId (not ASCII; a slash)
    workspace = _warm(make_store, 2)
    with Repo(str(remote)) as repo:
        ref = Ref(f"refs/heads/{BRANCH}".encode())
        for value in ("café", "a/b"):
            head = repo[repo.refs[ref]]
            commit = new_commit(
                head.tree,  # type: ignore[attr-defined]
                parents=[head.id],
                message=f"by hand\n\nAgent-Job-Id: {value}\n",
                author="Someone <someone@example.com>",
            )
            repo.object_store.add_object(commit)
            repo.refs[ref] = commit.id

    # When the next jobs run (and one is delivered again)
    assert _apply(workspace, 3)["alreadyApplied"] is False
    assert _apply(workspace, 1)["alreadyApplied"] is True

    # Then the index is written and read again: the next lookup walks only what is new
    from job_worker.jobs.git import trailer_index

    with Repo(str(workspace.cache_path)) as cache:
        base = cache.refs[Ref(f"refs/heads/{BASE_BRANCH}".encode())]
    assert trailer_index._read(workspace.cache_path / INDEX_FILE, Ref(f"refs/heads/{BRANCH}".encode()), base)
    assert branch_job_ids(remote) == ["job-1", "job-2", "<no trailer>", "<no trailer>", "job-3"]
