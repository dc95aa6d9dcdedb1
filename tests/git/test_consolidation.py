"""Few packs in the repositories the worker writes (`jobs.git.consolidation`): a local remote after its pushes, a cache
after its uses; merged only while no other worker uses the remote, never losing an object, never inflating one above
MAX_BLOB_BYTES.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dulwich.object_store import DiskObjectStore
from dulwich.objects import Blob
from dulwich.pack import load_pack_index
from dulwich.repo import Repo

from job_worker.jobs import apply_patch
from job_worker.jobs.git import consolidation
from job_worker.jobs.git.consolidation import LOOSE_FOLDER_LIMIT, PACK_LIMIT, consolidate
from job_worker.jobs.git_workspace import GitWorkspace, GitWorkspaceStore
from tests.git.conftest import apply_patch_job, diff
from tests.git.test_git_workspace import branch_job_ids, context

StoreFactory = Callable[..., GitWorkspaceStore]


def _own_file(n: int) -> str:
    return diff("--- /dev/null", f"+++ b/jobs/job-{n}.txt", "@@ -0,0 +1 @@", f"+job {n}")


def _apply(workspace: GitWorkspace, numbers: range) -> None:
    for n in numbers:
        apply_patch.run(apply_patch_job(f"job-{n}", _own_file(n)), context(workspace))


def _packs(repository: Path) -> list[str]:
    return sorted(path.name for path in (repository / "objects" / "pack").glob("*.pack"))


def _loose_folders(repository: Path) -> int:
    return sum(1 for path in (repository / "objects").iterdir() if len(path.name) == 2)


def _fsck(repository: Path) -> None:
    checked = subprocess.run(
        ["git", "-C", str(repository), "fsck", "--strict", "--no-dangling"], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_pushes_to_a_local_remote_add_no_pack_and_leave_its_packs_alone(remote: Path, make_store: StoreFactory) -> None:
    # Given a remote whose owner's packs must never be read or rewritten by a push
    packs_before = {name: (remote / "objects" / "pack" / name).stat().st_mtime_ns for name in _packs(remote)}
    workspace = make_store().open("ws-1")

    _apply(workspace, range(1, 3 * PACK_LIMIT + 1))

    # Then each push's few objects are loose (as git's receive.unpackLimit keeps them): no pack was added or touched
    assert {name: (remote / "objects" / "pack" / name).stat().st_mtime_ns for name in _packs(remote)} == packs_before
    assert _loose_folders(remote) > 0
    _fsck(remote)
    assert branch_job_ids(remote) == [f"job-{n}" for n in range(1, 3 * PACK_LIMIT + 1)]
    # and a cold worker still reads all of it
    assert len(make_store("cold").open("ws-1").history()) == 3 * PACK_LIMIT


def test_a_cache_keeps_few_packs_and_few_loose_objects(make_store: StoreFactory) -> None:
    workspace = make_store().open("ws-1")

    _apply(workspace, range(1, 3 * LOOSE_FOLDER_LIMIT // 2))

    assert _loose_folders(workspace.cache_path) <= LOOSE_FOLDER_LIMIT
    assert len(_packs(workspace.cache_path)) <= PACK_LIMIT
    _fsck(workspace.cache_path)
    assert len(workspace.history()) == 3 * LOOSE_FOLDER_LIMIT // 2 - 1


def _small_packs(path: Path, count: int, *, big_blob_bytes: int = 0) -> Repo:
    """A bare repository of `count` packs of one blob each (the first `big_blob_bytes` long, when given)."""
    repo = Repo.init_bare(str(path), mkdir=True)
    for n in range(count):
        data = b"x" * big_blob_bytes if n == 0 and big_blob_bytes else f"blob {n}\n".encode()
        repo.object_store.add_objects([(Blob.from_string(data), None)])
    return repo


def test_the_largest_pack_is_left_alone_while_the_small_ones_are_merged(tmp_path: Path) -> None:
    repo = _small_packs(tmp_path / "repo.git", PACK_LIMIT + 1)
    large = [Blob.from_string(f"large {n}\n".encode()) for n in range(100)]
    repo.object_store.add_objects([(blob, None) for blob in large])
    large_pack = set(_packs(tmp_path / "repo.git")) - set(_packs_of_one_blob(repo))
    store = repo.object_store
    assert isinstance(store, DiskObjectStore)

    assert consolidate(store, 1024, pack_loose=False)

    packs = _packs(tmp_path / "repo.git")
    assert len(packs) == 2
    assert large_pack <= set(packs)
    assert all(blob.id in store for blob in large)
    _fsck(tmp_path / "repo.git")
    repo.close()


def test_a_pack_above_the_merge_limit_is_never_rewritten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a repository's own large pack (its history, packed with deltas by git) beside many small packs
    repo = _small_packs(tmp_path / "repo.git", PACK_LIMIT + 1)
    large = [Blob.from_string(f"large {n}\n".encode() * 50) for n in range(200)]
    repo.object_store.add_objects([(blob, None) for blob in large])
    (large_pack,) = set(_packs(tmp_path / "repo.git")) - set(_packs_of_one_blob(repo))
    large_bytes = (tmp_path / "repo.git" / "objects" / "pack" / large_pack).stat().st_size
    monkeypatch.setattr(consolidation, "MERGE_MAX_PACK_BYTES", large_bytes - 1)
    # (the geometric rule alone would merge it: the small packs hold more objects than half of it)
    monkeypatch.setattr(consolidation, "_geometric_rollup", lambda packs: packs)
    store = repo.object_store
    assert isinstance(store, DiskObjectStore)

    assert consolidate(store, 1 << 20, pack_loose=False)

    packs = _packs(tmp_path / "repo.git")
    assert large_pack in packs  # untouched
    assert len(packs) == 2
    assert all(blob.id in store for blob in large)
    _fsck(tmp_path / "repo.git")
    repo.close()


def test_one_merge_rewrites_at_most_merge_max_bytes_of_packs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = _small_packs(tmp_path / "repo.git", 3 * PACK_LIMIT)
    sizes = sorted(path.stat().st_size for path in (tmp_path / "repo.git" / "objects" / "pack").glob("*.pack"))
    monkeypatch.setattr(consolidation, "MERGE_MAX_BYTES", sum(sizes[:PACK_LIMIT]))
    store = repo.object_store
    assert isinstance(store, DiskObjectStore)

    assert consolidate(store, 1024, pack_loose=False)

    # PACK_LIMIT packs merged into one: the rest wait for later pushes
    assert len(_packs(tmp_path / "repo.git")) == 3 * PACK_LIMIT - PACK_LIMIT + 1
    _fsck(tmp_path / "repo.git")
    repo.close()


def _packs_of_one_blob(repo: Repo) -> list[str]:
    return [Path(pack.data.path).name for pack in repo.object_store.packs if len(pack) == 1]


def test_an_object_above_the_blob_limit_is_never_inflated_to_merge(tmp_path: Path) -> None:
    repo = _small_packs(tmp_path / "repo.git", PACK_LIMIT + 2, big_blob_bytes=64 * 1024)
    before = _packs(tmp_path / "repo.git")
    store = repo.object_store
    assert isinstance(store, DiskObjectStore)

    assert not consolidate(store, 1024, pack_loose=False)

    assert _packs(tmp_path / "repo.git") == before
    repo.close()


def test_a_merge_killed_before_it_removed_the_old_packs_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "repo.git"
    repo = _small_packs(path, PACK_LIMIT + 2)
    shas = set(repo.object_store)
    store = repo.object_store
    assert isinstance(store, DiskObjectStore)
    removed: list[str] = []
    remove = consolidation._remove_pack_files

    def killed_after_one(basename: str) -> None:
        if removed:
            raise KeyboardInterrupt  # as if the process died here
        removed.append(basename)
        remove(basename)

    monkeypatch.setattr(consolidation, "_remove_pack_files", killed_after_one)
    with pytest.raises(KeyboardInterrupt):
        consolidate(store, 1024, pack_loose=False)
    repo.close()

    with Repo(str(path)) as reopened:
        assert set(reopened.object_store) == shas
        assert all(reopened.object_store[sha].id == sha for sha in shas)
    _fsck(path)
    # and the next merge finishes the work
    monkeypatch.setattr(consolidation, "_remove_pack_files", remove)
    with Repo(str(path)) as reopened:
        store = reopened.object_store
        assert isinstance(store, DiskObjectStore)
        consolidate(store, 1024, pack_loose=False)
        assert set(reopened.object_store) == shas
    assert len(_packs(path)) <= PACK_LIMIT


def test_a_repository_below_the_limits_is_only_listed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a repository of PACK_LIMIT packs, one of them large (a first fetch of a big repository)
    repo = _small_packs(tmp_path / "repo.git", PACK_LIMIT - 1)
    repo.object_store.add_objects([(Blob.from_string(f"large {n}\n".encode()), None) for n in range(500)])
    store = repo.object_store
    assert isinstance(store, DiskObjectStore)
    opened: list[str] = []

    def counted(path: str, *args: Any) -> Any:
        opened.append(path)
        return load_pack_index(path, *args)

    monkeypatch.setattr(consolidation, "load_pack_index", counted)

    # When a use of it ends, nothing is merged and no pack index was read (each use of a cache ends so)
    assert not consolidate(store, 1024, pack_loose=True)
    assert opened == []
    repo.close()
