"""The remote's git history and each worker's cache of it, as real dulwich commits, so that the worker's own trailer
lookup (`job_worker.jobs.git.branch.FetchedBranch` over `jobs.git.trailer_index`) runs on them unchanged, its index
file included.

Only commits are kept (each names the empty tree): the lookup reads commits alone. A fetch is modelled as the worker's
transport (`jobs.git.transport.RemoteTransport.fetch`) and the server's upload-pack do it together:

- a cache that holds no ref yet (cold: a new execution environment, or a cache evicted) fetches the tips at
  SHALLOW_DEPTH and records them shallow, as the transport does for a remote that can deepen;
- a deepening fetch (`depth`) brings the tips' history to that many commits and records the new boundary, dropping
  from the shallow list the commits whose parents it now holds (git's `shallow`/`unshallow` lines);
- a warm cache's fetch brings every commit the tips reach that it lacks, down to the ones it holds (`new_history`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dulwich.object_store import MemoryObjectStore
from dulwich.objects import Commit, ObjectID, ShaFile, Tree
from dulwich.refs import Ref

from job_worker.jobs.git.transport import SHALLOW_DEPTH

EMPTY_TREE = Tree().id


def git_commit(parent: ObjectID | None, message: str, *, author: str, when: float) -> Commit:
    """A commit on `parent` (None: a root commit) made at `when` (virtual seconds), naming the empty tree."""
    commit = Commit()
    commit.tree = EMPTY_TREE
    commit.parents = [parent] if parent is not None else []
    commit.author = author.encode()
    commit.committer = b"Agent Jobs <agent-jobs@localhost>"
    commit.author_time = commit.commit_time = int(when)
    commit.author_timezone = commit.commit_timezone = 0
    commit.message = message.encode()
    return commit


class CacheObjects(MemoryObjectStore):
    """A cache's object store: the remote's commit objects themselves, never copied (commits do not change, and the
    lookup only reads them), so that a fetch costs what the list of commits it brings costs."""

    def add_object(self, obj: ShaFile) -> None:
        self._data[obj.id] = obj

    def __getitem__(self, sha: ObjectID | bytes) -> ShaFile:
        return self._data[ObjectID(sha)]

    def __contains__(self, sha: object) -> bool:
        return sha in self._data


@dataclass
class RemoteHistory:
    """The remote's commits and refs."""

    objects: dict[ObjectID, Commit] = field(default_factory=dict)
    refs: dict[Ref, ObjectID] = field(default_factory=dict)


@dataclass
class GitCache:
    """One worker's cache of one workspace: what the product's `Repo` gives the lookup (`object_store`, `path`, where
    the trailer index lives, and `get_shallow`), and the cache's copies of the refs. Lost, it is empty again, its
    index file gone with it, as a new execution environment's /tmp is."""

    path: str
    object_store: CacheObjects = field(default_factory=CacheObjects)
    refs: dict[Ref, ObjectID] = field(default_factory=dict)
    shallow: set[ObjectID] = field(default_factory=set)

    def __post_init__(self) -> None:
        Path(self.path).mkdir(parents=True, exist_ok=True)

    def get_shallow(self) -> set[ObjectID]:
        return set(self.shallow)

    def holds(self, sha: ObjectID) -> bool:
        return sha in self.object_store

    def lose(self) -> None:
        for entry in os.scandir(self.path):
            os.unlink(entry.path)  # the index, and any file a writer of it left aside
        self.object_store = CacheObjects()
        self.refs.clear()
        self.shallow.clear()


def fetch(
    remote: RemoteHistory, cache: GitCache, wanted: Sequence[Ref], *, depth: int | None = None
) -> dict[Ref, ObjectID]:
    """Fetch `wanted` into `cache` and return their values on the remote (absent: not there), as the transport does."""
    advertised = {ref: remote.refs[ref] for ref in wanted if ref in remote.refs}
    if depth is None and not cache.refs:
        depth = SHALLOW_DEPTH
    tips = sorted(set(advertised.values()))
    if depth is None:
        commits, boundary = new_history(remote, cache, tips), list[ObjectID]()
    else:
        commits, boundary = history_to_depth(remote, tips, depth)
    if commits:
        for commit in commits:
            cache.object_store.add_object(commit)
        cache.shallow = {
            sha for sha in (*cache.shallow, *boundary) if any(not cache.holds(p) for p in remote.objects[sha].parents)
        }
    for ref in wanted:
        if ref in advertised:
            cache.refs[ref] = advertised[ref]
        else:
            cache.refs.pop(ref, None)
    return advertised


def new_history(remote: RemoteHistory, cache: GitCache, tips: Iterable[ObjectID]) -> list[Commit]:
    """What a warm cache's fetch brings: every commit the tips reach that the cache lacks, down to those it holds."""
    brought: dict[ObjectID, Commit] = {}
    todo = [sha for sha in tips if not cache.holds(sha)]
    while todo:
        sha = todo.pop()
        if sha in brought or cache.holds(sha):
            continue
        commit = remote.objects[sha]
        brought[sha] = commit
        todo.extend(commit.parents)
    return list(brought.values())


def history_to_depth(
    remote: RemoteHistory, tips: Iterable[ObjectID], depth: int
) -> tuple[list[Commit], list[ObjectID]]:
    """The commits within `depth` of the tips (depth 1: the tips alone), and the deepest of them that have parents
    (the new shallow boundary, as the server states it)."""
    brought: dict[ObjectID, Commit] = {}
    level = list(tips)
    boundary: list[ObjectID] = []
    for _ in range(depth):
        following: list[ObjectID] = []
        for sha in level:
            if sha in brought:
                continue
            commit = remote.objects[sha]
            brought[sha] = commit
            following.extend(commit.parents)
        boundary = [sha for sha in level if remote.objects[sha].parents]
        level = [sha for sha in following if sha not in brought]
        if not level:
            return list(brought.values()), []
    return list(brought.values()), boundary
