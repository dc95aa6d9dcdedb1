"""The simulated remote's fetches into a worker's cache, read by the product's own trailer lookup (`FetchedBranch`): a
cold cache holds the tips alone, a lookup deepens it to find a job's commit below them, a warm cache's fetch brings
every new commit, and a fetch that brings only the tips leaves a gap the lookup refuses to read past."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
from dulwich.errors import MissingCommitError
from dulwich.objects import ObjectID
from dulwich.refs import Ref
from dulwich.repo import Repo

from agent_jobs_sim import git_history
from agent_jobs_sim.git_history import GitCache, RemoteHistory, fetch, git_commit
from agent_jobs_sim.planted import PLANTS
from job_worker.jobs.git.branch import FetchedBranch
from job_worker.jobs.git.trailer_index import INDEX_FILE

BRANCH = Ref(b"refs/heads/agent/ws-0")
BASE = Ref(b"refs/heads/main")
AUTHOR = "Someone <someone@example.com>"


def push(remote: RemoteHistory, ref: Ref, message: str, *, onto: Ref | None = None) -> ObjectID:
    parent = remote.refs.get(ref) or (remote.refs.get(onto) if onto else None)
    made = git_commit(parent, message, author=AUTHOR, when=1_800_000_000 + len(remote.objects))
    remote.objects[made.id] = made
    remote.refs[ref] = made.id
    return made.id


def job(remote: RemoteHistory, job_id: str) -> ObjectID:
    return push(remote, BRANCH, f"step\n\nAgent-Job-Id: {job_id}\n", onto=BASE)


@pytest.fixture
def remote() -> RemoteHistory:
    history = RemoteHistory()
    for index in range(3):
        push(history, BASE, f"base {index}\n")
    return history


def lookup(remote: RemoteHistory, cache: GitCache, depths: list[int]) -> FetchedBranch:
    """The branch as one fetch into `cache` finds it, deepened by the product's lookup as it needs (depths noted)."""

    def deepen(depth: int) -> None:
        depths.append(depth)
        fetch(remote, cache, [BRANCH, BASE], depth=depth)

    heads = fetch(remote, cache, [BRANCH, BASE])
    return FetchedBranch(cast(Repo, cache), BRANCH, BASE, heads, deepen)


def test_a_cold_cache_holds_the_tips_and_the_lookup_deepens_to_a_commit_below_them(remote, tmp_path: Path):
    mine = job(remote, "job-1")
    for index in range(10):  # another writer's commits above it, more than the first deepening reaches
        push(remote, BRANCH, f"format {index}\n")
    cache = GitCache(str(tmp_path / "cache"))
    depths: list[int] = []
    branch = lookup(remote, cache, depths)
    assert set(cache.object_store._data) == {remote.refs[BRANCH], remote.refs[BASE]} == cache.shallow
    found = branch.job_commit("job-1")
    assert found is not None
    assert found.sha == mine.decode()
    assert depths == [8, 64]
    assert cache.shallow == set()  # the whole branch, down to the base's root, is held now
    assert (tmp_path / "cache" / INDEX_FILE).exists()


def test_a_warm_cache_fetches_every_new_commit_and_its_index_finds_them(remote, tmp_path: Path):
    job(remote, "job-1")
    cache = GitCache(str(tmp_path / "cache"))
    depths: list[int] = []
    assert lookup(remote, cache, depths).job_commit("job-1") is not None
    second = job(remote, "job-2")
    push(remote, BRANCH, "format\n")
    push(remote, BRANCH, "format again\n")
    branch = lookup(remote, cache, depths)
    found = branch.job_commit("job-2")
    assert found is not None
    assert found.sha == second.decode()
    assert branch.job_commit("job-1") is not None
    # The cold fetch's tips held the branch since its base (one commit on the base's tip); the warm one brought the
    # rest, and the base's tip is the only shallow commit still.
    assert depths == []
    assert cache.shallow == {remote.refs[BASE]}


def test_a_fetch_of_the_tips_alone_leaves_a_gap_the_lookup_refuses_to_read_past(remote, tmp_path: Path):
    job(remote, "job-1")
    cache = GitCache(str(tmp_path / "cache"))
    depths: list[int] = []
    lookup(remote, cache, depths).job_commit("job-1")
    job(remote, "job-2")
    push(remote, BRANCH, "format\n")
    with PLANTS["tips-only-fetch"].patch():
        branch = lookup(remote, cache, depths)
    assert git_history.new_history.__name__ == "new_history"  # put back after the run
    with pytest.raises(MissingCommitError):
        branch.job_commit("job-2")


def test_a_lost_cache_is_cold_again_without_its_index(remote, tmp_path: Path):
    job(remote, "job-1")
    push(remote, BRANCH, "format\n")
    cache = GitCache(str(tmp_path / "cache"))
    depths: list[int] = []
    assert lookup(remote, cache, depths).job_commit("job-1") is not None
    assert (tmp_path / "cache" / INDEX_FILE).exists()
    cache.lose()
    assert not cache.refs
    assert not (tmp_path / "cache" / INDEX_FILE).exists()
    assert lookup(remote, cache, depths).job_commit("job-1") is not None
    assert depths == [8, 8]  # each time cold: the tips alone, then deepened
