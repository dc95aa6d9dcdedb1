"""The bare cache repository of each workspace, and the budget all caches of a worker stay within.

Each workspace keeps a bare repository at `<cache_root>/<workspaceId>-<key>.git` holding the objects of its branch and
base (cloned on first use, then fetched incrementally: a warm execution environment downloads only new commits).
`<key>` is a digest of the remote's owner and url (`GitRemote.cache_key`): a workspace id registered again, by
another tenant or for another remote, gets a cache of its own and never reads what the first remote left. One user at
a time per machine holds a cache (an flock on `<cache>.lock`, whose modification time is its last use). The caches of
one worker stay within a budget (the worker's WORKSPACE_CACHE_BYTES): after each use, the least recently used caches
are removed until the rest fit, except those in use, whose flock a removal must take first. A removed cache is cloned
again by its next job.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path

from dulwich.object_store import DiskObjectStore
from dulwich.repo import Repo

from agent_jobs.settings import DEFAULT_MAX_BLOB_BYTES
from job_worker.jobs.git.consolidation import consolidate
from job_worker.jobs.git.object_sizes import large_object_scope

# The standard library's logger: Powertools' Logger of the function handles its records in Lambda.
logger = logging.getLogger(__name__)


@contextmanager
def open_cache(
    cache_path: Path, after_use: Callable[[], None] | None = None, *, max_object_bytes: int = DEFAULT_MAX_BLOB_BYTES
) -> Iterator[Repo]:
    """The bare cache repository at `cache_path`, created on first use; one user at a time per machine. `after_use`
    runs when the use ends, also after one that failed. A use that ends well leaves the cache's packs and loose
    objects few (`jobs.git.consolidation`, never inflating an object above `max_object_bytes`)."""
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = Path(f"{cache_path}.lock")
    try:
        with lock_path.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                os.utime(lock_path)  # its last use, which orders the caches for eviction
                if not (cache_path / "HEAD").exists():
                    # Created aside and renamed, so a crash never leaves half a repository where the cache
                    # belongs; what such a crash left aside is removed here, under the lock its creator held.
                    for stale in cache_path.parent.glob(f".{cache_path.name}-*"):
                        shutil.rmtree(stale, ignore_errors=True)
                    staging = Path(tempfile.mkdtemp(prefix=f".{cache_path.name}-", dir=cache_path.parent))
                    Repo.init_bare(staging).close()
                    shutil.rmtree(cache_path, ignore_errors=True)
                    staging.rename(cache_path)
                _clear_stale_locks(cache_path)
                with closing(Repo(str(cache_path))) as repo, large_object_scope():
                    yield repo
                    _consolidate(repo, max_object_bytes)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    finally:
        # Also after a use that failed (a patch that does not apply, a limit, a full disk): a tenant's failing
        # jobs must not leave /tmp over its budget, or every later job of any tenant would fail to fetch.
        if after_use is not None:
            after_use()


def _consolidate(repo: Repo, max_object_bytes: int) -> None:
    """Keep the cache to few packs (`jobs.git.consolidation`), after a use that succeeded. Best effort: the job's work
    is done, and a merge that fails (a full disk) leaves every object where it was."""
    assert isinstance(repo.object_store, DiskObjectStore)
    try:
        consolidate(repo.object_store, max_object_bytes, pack_loose=True)
    except Exception:
        logger.warning("could not merge the packs of the cache %s; it is merged after a later use", repo.path)


def _clear_stale_locks(cache_path: Path) -> None:
    """Remove the `.lock` files inside the cache. git and dulwich write a ref, `packed-refs`, a loose object or a pack's
    index to `<name>.lock` and rename it into place; a process killed in between (an invocation that crashed or timed
    out, taking every job it held with it; /tmp outlives the process in Lambda) leaves the lock file behind, and every
    later write of that name would fail: a ref's next update, or the same object written again by the job's retry.
    Every writer of the cache holds the lock `open_cache` holds now, so a lock file found here has no live writer. (No
    ref or object is itself named `*.lock`: git forbids it.)"""
    for path in cache_path.rglob("*.lock"):
        path.unlink(missing_ok=True)


def evict_caches(cache_root: Path, budget_bytes: int) -> list[Path]:
    """Remove the least recently used caches under `cache_root` until the rest take at most `budget_bytes`; returns
    the removed ones. A cache in use (its flock held) is never removed: it is skipped, and counts against the budget.

    A cache's last use is its lock file's modification time (`open_cache` touches it). The lock files stay:
    removing one would let two users lock two different files of the same name."""
    caches: list[tuple[float, Path, int]] = []
    for path in cache_root.glob("*.git"):
        lock_path = Path(f"{path}.lock")
        try:
            last_use = lock_path.stat().st_mtime if lock_path.exists() else 0.0
        except OSError:
            continue
        caches.append((last_use, path, _folder_bytes(path)))
    total = sum(size for _, _, size in caches)
    removed: list[Path] = []
    for _, path, size in sorted(caches):
        if total <= budget_bytes:
            break
        with Path(f"{path}.lock").open("a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a job is using it this very moment
            try:
                shutil.rmtree(path, ignore_errors=True)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        total -= size
        removed.append(path)
    return removed


def _folder_bytes(folder: Path) -> int:
    total = 0
    for parent, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(parent, name)).st_size
            except OSError:
                continue  # removed meanwhile
    return total
