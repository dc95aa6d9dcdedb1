"""A cold cache fetches the tips, not the history: what a worker's first job on a workspace costs does not grow with the
repository's history, and exactly-once (the trailer lookup) deepens the cache only as far as the branch goes."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dulwich.objects import Blob, ObjectID, RawObjectID, sha_to_hex
from dulwich.objects import Commit as GitCommit
from dulwich.pack import DELTA_TYPES, PackData
from dulwich.refs import Ref
from dulwich.repo import Repo

from agent_jobs_bench.git_http_backend import git_http_backend
from job_worker.jobs import apply_patch
from job_worker.jobs.context import JobContext
from job_worker.jobs.errors import PermanentJobError
from job_worker.jobs.git_workspace import GitRemote, GitWorkspaceStore
from job_worker.jobs.limits import GitLimits
from tests.git.conftest import BASE_BRANCH, SEED_FILES, apply_patch_job, commit_files, real_git, remote_ref
from tests.git.test_git_workspace import BRANCH, append_line, branch_job_ids, object_count

StoreFactory = Callable[..., GitWorkspaceStore]


def grow_base(remote: Path, commits: int) -> ObjectID:
    """`commits` more commits on main, each changing history.txt: a history of 3 objects per commit."""
    with Repo(str(remote)) as repo:
        parent = repo.refs[Ref(f"refs/heads/{BASE_BRANCH}".encode())]
        start = sum(1 for _ in repo.get_walker(include=[parent]))
    for n in range(start, start + commits):
        files = {**SEED_FILES, "history.txt": f"revision {n}\n".encode()}
        parent = commit_files(remote, BASE_BRANCH, files, f"Revision {n}\n", parents=[parent])
    return parent


def run(store: GitWorkspaceStore, job_id: str, patch: str) -> dict[str, object]:
    job = apply_patch_job(job_id, patch)
    return apply_patch.run(job, JobContext(workspace=store.open("ws-1"), remaining_ms=lambda: 60_000))


def cache_of(store: GitWorkspaceStore) -> Path:
    (cache,) = store.cache_root.glob("ws-1-*.git")
    return cache


def shallow_commits(cache: Path) -> set[ObjectID]:
    with Repo(str(cache)) as repo:
        return repo.get_shallow()


def test_a_cold_cache_fetches_the_tips_not_the_history(remote: Path, make_store: StoreFactory) -> None:
    # Given a base branch with a long history
    base_tip = grow_base(remote, 300)
    remote_objects = object_count(remote)

    # When a worker with a cold cache applies the first job of a workspace
    worker = make_store("cold")
    result = run(worker, "job-1", append_line(1))

    # Then it fetched the base's tip (its tree), not its history, and the job took effect on the tip
    cache = cache_of(worker)
    assert shallow_commits(cache) == {base_tip}
    assert object_count(cache) <= 20 < remote_objects // 40
    assert branch_job_ids(remote) == ["job-1"]
    with Repo(str(remote)) as repo:
        commit = repo[ObjectID(str(result["commit"]).encode())]
        assert isinstance(commit, GitCommit)
        assert commit.parents == [base_tip]


def test_a_cold_fetch_reads_what_it_sends_from_a_local_remotes_packs_and_keeps_their_deltas(
    remote: Path, make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a remote packed by git (as `git gc` leaves it) with a long history, whose tip has two files alike, one
    # stored as a delta of the other
    grow_base(remote, 200)
    text = "".join(f"line {n} of a long file\n" for n in range(400)).encode()
    alike = {"a.txt": text, "b.txt": text + b"one more line\n"}
    tip = commit_files(remote, BASE_BRANCH, {**SEED_FILES, **alike}, "Alike\n", parents=[remote_sha(remote)])
    real_git(remote, "repack", "-a", "-d", "-q")
    alike_blobs = {Blob.from_string(content).id for content in alike.values()}
    assert alike_blobs & stored_deltas(remote)

    # When a cold cache fetches the tip, every pack read whole recorded
    read_whole: list[Path] = []
    iter_unpacked = PackData.iter_unpacked

    def recording(self: PackData, *args: Any, **kwargs: Any) -> Any:
        read_whole.append(Path(self.path))
        return iter_unpacked(self, *args, **kwargs)

    monkeypatch.setattr(PackData, "iter_unpacked", recording)
    worker = make_store("cold")
    run(worker, "job-1", append_line(1))
    monkeypatch.undo()

    # Then none of the remote's packs was read whole (only the objects sent were read: the history costs nothing),
    # and the delta came as it is stored, not inflated and sent whole
    assert not [path for path in read_whole if path.is_relative_to(remote)]
    assert shallow_commits(cache_of(worker)) == {tip}
    assert alike_blobs & stored_deltas(cache_of(worker))
    assert branch_job_ids(remote) == ["job-1"]


def remote_sha(remote: Path) -> ObjectID:
    with Repo(str(remote)) as repo:
        return repo.refs[Ref(f"refs/heads/{BASE_BRANCH}".encode())]


def stored_deltas(path: Path) -> set[ObjectID]:
    """The objects the packs of the repository at `path` store as deltas."""
    with Repo(str(path)) as repo:
        return {
            sha_to_hex(RawObjectID(unpacked.sha()))
            for pack in repo.object_store.packs
            for unpacked in pack.iter_unpacked()
            if unpacked.pack_type_num in DELTA_TYPES
        }


def test_a_redelivery_on_a_cold_cache_finds_its_commit_below_the_tips(remote: Path, make_store: StoreFactory) -> None:
    # Given a workspace branch of twelve jobs on a long base history, written by one worker
    grow_base(remote, 300)
    writer = make_store("writer")
    for n in range(1, 13):
        run(writer, f"job-{n}", append_line(n))
    head = remote_ref(remote, BRANCH)

    # When a new worker (a cold cache) runs job 3 again (a redelivery after a crash that followed its push)
    redelivered = make_store("cold")
    result = run(redelivered, "job-3", append_line(3))

    # Then it finds job 3's commit (it deepened the cache down the branch) and commits nothing, and its cache is still
    # shallow: it holds the branch, not the base's history
    assert result["alreadyApplied"] is True
    assert remote_ref(remote, BRANCH) == head
    assert branch_job_ids(remote) == [f"job-{n}" for n in range(1, 13)]
    assert shallow_commits(cache_of(redelivered))
    assert object_count(cache_of(redelivered)) < object_count(remote) // 2

    # and the next job applies once, on the head
    assert run(redelivered, "job-13", append_line(13))["alreadyApplied"] is False
    assert branch_job_ids(remote) == [f"job-{n}" for n in range(1, 14)]


def test_a_cold_cache_finds_a_job_after_the_base_moved_far_beyond_the_fork(
    remote: Path, make_store: StoreFactory
) -> None:
    # Given a branch of three jobs, whose base then gained a hundred commits (humans merging elsewhere), and a commit
    # of someone else's on the branch (no trailer)
    writer = make_store("writer")
    for n in (1, 2):
        run(writer, f"job-{n}", append_line(n))
    with Repo(str(remote)) as repo:
        branch_head = repo.refs[Ref(f"refs/heads/{BRANCH}".encode())]
        tree = {path.decode(): repo[sha].as_raw_string() for path, _, sha in _files(repo, branch_head)}
    commit_files(remote, BRANCH, {**tree, "notes.md": b"by hand\n"}, "A note\n", parents=[branch_head])
    run(writer, "job-3", append_line(3))
    grow_base(remote, 100)

    # When a cold worker runs job 2 again, then a new job
    cold = make_store("cold")
    again = run(cold, "job-2", append_line(2))
    new = run(cold, "job-4", append_line(4))

    # Then job 2 is found (the walk went down past the fork, where the base's history excludes the rest), and job 4
    # applies once on the branch's head
    assert again["alreadyApplied"] is True
    assert new["alreadyApplied"] is False
    assert branch_job_ids(remote) == ["job-1", "job-2", "<no trailer>", "job-3", "job-4"]
    assert [commit.job_id for commit in cold.open("ws-1").history()] == ["job-1", "job-2", "job-3", "job-4"]


def test_a_test_run_checks_out_an_older_commit_a_shallow_cache_lacks(
    tmp_path: Path, remote: Path, make_store: StoreFactory
) -> None:
    # Given a branch of ten jobs
    writer = make_store("writer")
    commits = [str(run(writer, f"job-{n}", append_line(n))["commit"]) for n in range(1, 11)]

    # When a cold worker checks out the second job's commit (a test run of an older head)
    cold = make_store("cold").open("ws-1")
    cold.checkout(commits[1], tmp_path / "checkout")

    # Then it has that commit's files, fetched by deepening its shallow cache
    assert (tmp_path / "checkout" / "journal.txt").read_text() == "job 1\njob 2\n"
    assert (tmp_path / "checkout" / "README.md").read_bytes() == SEED_FILES["README.md"]


def _files(repo: Repo, commit: ObjectID) -> list[tuple[bytes, int, ObjectID]]:
    from dulwich.object_store import iter_tree_contents

    tree = repo[commit].tree  # type: ignore[attr-defined]
    return [(entry.path, entry.mode, entry.sha) for entry in iter_tree_contents(repo.object_store, tree)]


# -- over smart HTTP: git's own server, as GitHub's ----------------------------------------------------------------


def http_store(tmp_path: Path, url: str, worker: str) -> GitWorkspaceStore:
    def resolve(workspace_id: str) -> GitRemote:
        return GitRemote(url=url, branch=f"agent/{workspace_id}", base_branch=BASE_BRANCH)

    return GitWorkspaceStore(tmp_path / "caches" / worker, resolve)


def test_over_http_a_cold_cache_fetches_the_tips_and_a_redelivery_deepens(tmp_path: Path, remote: Path) -> None:
    grow_base(remote, 300)
    with git_http_backend(remote.parent) as base_url:
        url = f"{base_url}/{remote.name}"
        # A cold cache over HTTP fetches the base's tip only
        first = http_store(tmp_path, url, "first")
        run(first, "job-1", append_line(1))
        assert shallow_commits(cache_of(first))
        assert object_count(cache_of(first)) <= 20
        # its warm cache fetches only what is new after another worker's jobs
        writer = http_store(tmp_path, url, "writer")
        for n in range(2, 13):
            run(writer, f"job-{n}", append_line(n))
        before = object_count(cache_of(first))
        assert first.open("ws-1").head() == remote_ref(remote, BRANCH)
        # git's server may send a few objects again; never again all that the cache held (a shallow client's haves
        # ignored, as dulwich's own local fetch does)
        assert 11 * 3 <= object_count(cache_of(first)) - before < 11 * 3 + before
        # and a cold cache's redelivery of job 3 finds its commit below the tips
        head = remote_ref(remote, BRANCH)
        assert run(http_store(tmp_path, url, "cold"), "job-3", append_line(3))["alreadyApplied"] is True
        assert remote_ref(remote, BRANCH) == head
    assert branch_job_ids(remote) == [f"job-{n}" for n in range(1, 13)]


# -- the fetch limit bounds what a job brings in: a tip, not a history ------------------------------------------


def grow_base_with_noise(remote: Path, commits: int, noise_bytes: int) -> None:
    """`commits` more commits on main, each replacing noise.bin with `noise_bytes` of incompressible bytes."""
    with Repo(str(remote)) as repo:
        parent = repo.refs[Ref(f"refs/heads/{BASE_BRANCH}".encode())]
    for n in range(commits):
        files = {**SEED_FILES, "noise.bin": os.urandom(noise_bytes)}
        parent = commit_files(remote, BASE_BRANCH, files, f"Noise {n}\n", parents=[parent])


def limited_store(tmp_path: Path, remote: Path, worker: str, limits: GitLimits) -> GitWorkspaceStore:
    def resolve(workspace_id: str) -> GitRemote:
        return GitRemote(url=str(remote), branch=f"agent/{workspace_id}", base_branch=BASE_BRANCH)

    return GitWorkspaceStore(tmp_path / "caches" / worker, resolve, limits=limits)


def test_a_history_over_the_fetch_limit_is_served_when_its_tip_fits(tmp_path: Path, remote: Path) -> None:
    # Given a base whose history (40 x 64 KiB of noise) is five times the fetch limit, and whose tip is far below it
    grow_base_with_noise(remote, 40, 64 * 1024)
    limits = GitLimits(max_fetch_bytes=512 * 1024)

    # When a cold worker applies a job, and another cold worker runs it again
    first = run(limited_store(tmp_path, remote, "first", limits), "job-1", append_line(1))
    again = run(limited_store(tmp_path, remote, "again", limits), "job-1", append_line(1))

    # Then both are within the limit: the job took effect once
    assert (first["alreadyApplied"], again["alreadyApplied"]) == (False, True)
    assert branch_job_ids(remote) == ["job-1"]


def test_a_tip_over_the_fetch_limit_fails_the_job_naming_the_parameter(tmp_path: Path, remote: Path) -> None:
    # Given a base whose tip alone holds more than the fetch limit
    grow_base_with_noise(remote, 1, 2 * 1024 * 1024)
    limits = GitLimits(max_fetch_bytes=1024 * 1024)

    # When a cold worker runs a job, then it fails for good, saying which parameter to raise
    with pytest.raises(PermanentJobError, match=r"MAX_FETCH_BYTES \(the template's MaxFetchBytes parameter\)") as error:
        run(limited_store(tmp_path, remote, "cold", limits), "job-1", append_line(1))
    assert "raise MaxFetchBytes" in str(error.value)
    assert remote_ref(remote, BRANCH) is None
