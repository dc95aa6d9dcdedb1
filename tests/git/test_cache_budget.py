"""The warm caches of a worker: kept within a budget (least recently used removed first, never one in use), and kept
apart per tenant and remote, so a workspace id registered again never reads what another remote left."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from dulwich.refs import Ref

from job_worker.jobs import apply_patch
from job_worker.jobs.context import JobContext
from job_worker.jobs.git_workspace import GitRemote, GitWorkspace, GitWorkspaceStore, evict_caches
from tests.git.conftest import BASE_BRANCH, apply_patch_job, commit_files, diff, remote_ref

FILE_BYTES = 96 * 1024
NEW_FILE = diff("--- /dev/null", "+++ b/hello.txt", "@@ -0,0 +1 @@", "+hello")


def caches_bytes(root: Path) -> int:
    return sum(f.stat().st_size for cache in root.glob("*.git") for f in cache.rglob("*") if f.is_file())


def cached_workspaces(root: Path) -> set[str]:
    return {path.name.rsplit("-", 1)[0] for path in root.glob("*.git")}


def test_caches_stay_within_the_budget_and_the_least_recently_used_go_first(
    tmp_path: Path, make_remote: Callable[..., Path]
) -> None:
    # Given 6 workspaces, each on a remote of ~96 KiB of incompressible data, and a budget of about 3 caches
    remotes = {}
    for n in range(6):
        remotes[f"ws-{n}"] = make_remote(f"r{n}", empty=True)
        commit_files(remotes[f"ws-{n}"], BASE_BRANCH, {"data.bin": os.urandom(FILE_BYTES)}, "data\n")
    root = tmp_path / "caches"
    probe = GitWorkspaceStore(tmp_path / "probe", lambda ws: GitRemote(str(remotes[ws]), f"agent/{ws}", BASE_BRANCH))
    probe.open("ws-0").head()
    one_cache = caches_bytes(tmp_path / "probe")
    budget = int(3.5 * one_cache)
    store = GitWorkspaceStore(
        root, lambda ws: GitRemote(str(remotes[ws]), f"agent/{ws}", BASE_BRANCH), cache_budget_bytes=budget
    )

    # When a worker runs a job of each, one after another (ws-1 used again after ws-3)
    for workspace_id in ["ws-0", "ws-1", "ws-2", "ws-3", "ws-1", "ws-4", "ws-5"]:
        store.open(workspace_id).head()
        # Then its caches never take more than the budget
        assert caches_bytes(root) <= budget
    print(f"\n6 caches of {one_cache} bytes each under a {budget}-byte budget: {caches_bytes(root)} bytes kept")

    # and the most recently used stay, the least recently used went
    assert cached_workspaces(root) == {"ws-1", "ws-4", "ws-5"}

    # and an evicted workspace still works: its next job clones it again
    result = apply_patch.run(apply_patch_job("job-1", NEW_FILE, workspace_id="ws-0"), context(store, "ws-0"))
    assert remote_ref(remotes["ws-0"], "agent/ws-0") == result["commit"]
    assert "ws-0" in cached_workspaces(root)
    assert caches_bytes(root) <= budget


def context(store: GitWorkspaceStore, workspace_id: str) -> JobContext:
    return JobContext(workspace=store.open(workspace_id), remaining_ms=lambda: 60_000)


def test_a_cache_in_use_is_never_evicted(tmp_path: Path, remote: Path) -> None:
    root = tmp_path / "caches"
    store = GitWorkspaceStore(root, lambda ws: GitRemote(str(remote), f"agent/{ws}", BASE_BRANCH))
    busy, idle = store.open("ws-busy"), store.open("ws-idle")
    idle.head()
    busy.head()

    # While a job holds the busy cache, an eviction to nothing removes only the idle one
    with busy._cache() as repo:
        assert evict_caches(root, 0) == [idle.cache_path]
        assert (busy.cache_path / "HEAD").exists()
        assert len(repo.refs.as_dict()) > 0

    # and both still work afterwards
    assert idle.head() == busy.head()


def test_a_workspace_registered_again_elsewhere_never_reads_the_old_remotes_cache(
    tmp_path: Path, make_remote: Callable[..., Path]
) -> None:
    # Given a copy of a remote made by another party, and ws-1 registered on the original, with a test result stored
    original = make_remote("original")
    copy = tmp_path / "remotes" / "copy.git"
    shutil.copytree(original, copy)
    registered = {"ws-1": str(original)}
    store = GitWorkspaceStore(tmp_path / "caches", lambda ws: GitRemote(registered[ws], f"agent/{ws}", BASE_BRANCH))
    first = store.open("ws-1")
    head = first.head()
    first.store_test_result("job-1", head, {"outcome": "passed"})

    # When ws-1 is registered again on the copy (same commits, no test result), by the same worker
    registered["ws-1"] = str(copy)
    again = store.open("ws-1")

    # Then it has a cache of its own, and finds no result that only the original remote holds
    assert again.head() == head
    assert again.stored_test_result("job-1", head) is None
    assert again.cache_path != first.cache_path


def test_caches_are_kept_apart_per_owner() -> None:
    remote_a = GitRemote("https://git.example.com/r.git", "agent/ws-1", owner="tenant-a")
    remote_b = GitRemote("https://git.example.com/r.git", "agent/ws-1", owner="tenant-b")
    with_token = GitRemote("https://x:secret@git.example.com/r.git", "agent/ws-1", owner="tenant-a")
    assert remote_a.cache_key != remote_b.cache_key
    assert remote_a.cache_key == with_token.cache_key  # a new token keeps the cache


def test_a_use_that_fails_still_keeps_the_caches_within_the_budget(
    tmp_path: Path, make_remote: Callable[..., Path]
) -> None:
    # Given 3 workspaces on remotes of ~96 KiB each, and a budget of about one cache
    remotes = {}
    for n in range(3):
        remotes[f"ws-{n}"] = make_remote(f"r{n}", empty=True)
        commit_files(remotes[f"ws-{n}"], BASE_BRANCH, {"data.bin": os.urandom(FILE_BYTES)}, "data\n")
    root = tmp_path / "caches"
    store = GitWorkspaceStore(
        root, lambda ws: GitRemote(str(remotes[ws]), f"agent/{ws}", BASE_BRANCH), cache_budget_bytes=150 * 1024
    )

    # When each workspace's job fails inside its cache (as a patch that does not apply does)
    for workspace_id in remotes:
        with pytest.raises(RuntimeError, match="job failed"):
            fetch_then_fail(store.open(workspace_id))

    # Then the failed uses were evicted from too: only the last workspace's cache is left
    assert cached_workspaces(root) == {"ws-2"}
    assert caches_bytes(root) <= 150 * 1024


def fetch_then_fail(workspace: GitWorkspace) -> None:
    with workspace._cache() as repo:
        workspace._fetch(repo, [Ref(f"refs/heads/{BASE_BRANCH}".encode())])
        raise RuntimeError("job failed")
