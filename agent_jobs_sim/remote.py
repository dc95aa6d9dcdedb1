"""The git remote: a compare-and-swap ref store of real git commits (`agent_jobs_sim.git_history`), one branch per
workspace off a shared base branch, each job's commit carrying its `Agent-Job-Id` trailer, the branch moved only from
the head its writer read (as a push with a lease is). Other writers push to it too (a bot answering pushes, people
merging into the base), with commits no job made. Each call is a yield point, may fail, and may take effect and lose
its answer, as a push over the network can.

The workspace speaks the worker's `Workspace` protocol, so the product's own apply_patch and open_pr handlers run on
it unchanged, and each call is one use of its execution environment's cache of the workspace, as in
`job_worker.jobs.git_workspace.GitWorkspace`: a fetch into the cache (the tips alone, shallow, when the cache is cold),
then the product's own lookup of the job's trailer (`FetchedBranch.job_commit`, with the cache's trailer index and
its deepening of a shallow cache), and for a commit the product's own compare-and-swap condition
(`FetchedBranch.still_at_head`). The cache, the fetch and the push are modelled; the lookup is the product's.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from dulwich.objects import Commit as GitCommit
from dulwich.objects import ObjectID
from dulwich.refs import Ref
from dulwich.repo import Repo

from agent_jobs_local.unregistered_workspaces import UnregisteredWorkspaces
from agent_jobs_sim.git_history import GitCache, RemoteHistory, fetch, git_commit
from job_worker.jobs.errors import PermanentJobError, RetryableJobError
from job_worker.jobs.git.branch import FetchedBranch
from job_worker.jobs.git.commits import DEFAULT_IDENTITY
from job_worker.jobs.git_workspace import JobAlreadyOnBranchError
from job_worker.jobs.workspace import JOB_TRAILER, ROOT_HEAD, Commit, HeadMovedError

BASE = Ref(b"refs/heads/main")
# The base branch's history before the first job: a few commits.
BASE_COMMITS = 3
OTHER_WRITER = "Format Bot <format-bot@example.com>"


def branch_ref(workspace_id: str) -> Ref:
    """The workspace's branch, as its registration names it (`agent/<workspaceId>`)."""
    return Ref(f"refs/heads/agent/{workspace_id}".encode())


class RemoteUnavailableError(ConnectionError):
    """The remote failed the call (a 5xx, a reset connection): it may or may not have taken effect."""


class RemoteFaults:
    """How the world perturbs the remote: `before(name)` may raise (nothing happened), `after(name)` may raise (it
    happened, the answer is lost); both may yield to other actors. `deepen()` comes before each fetch that deepens a
    shallow cache within a use, and `cache_lost()` is asked as each job opens its workspace."""

    def before(self, name: str) -> None:  # pragma: no cover - the fault-free default
        return None

    def after(self, name: str) -> None:  # pragma: no cover - the fault-free default
        return None

    def deepen(self) -> None:  # pragma: no cover - the fault-free default
        return None

    def cache_lost(self) -> bool:  # pragma: no cover - the fault-free default
        return False


class RefStore:
    """The remote. `on_commit(workspace_id, job_id)` is told of each job's commit as it lands (the world checks
    ordering there); `refuses(job_id)` names the patches the remote never accepts (a permanent failure);
    `on_broken_lookup(workspace_id, job_id, error)` is told of a lookup that failed with an error of its own (not a
    retry the product asks for); `counts` gathers what the caches did."""

    def __init__(
        self,
        faults: RemoteFaults,
        *,
        on_commit: Callable[[str, str], None],
        refuses: Callable[[str], bool],
        on_broken_lookup: Callable[[str, str, Exception], None],
        counts: collections.Counter[str],
        start: float,
    ) -> None:
        self.history = RemoteHistory()
        self.pulls: dict[str, list[dict[str, Any]]] = {}
        self.faults = faults
        self.on_commit = on_commit
        self.refuses = refuses
        self.on_broken_lookup = on_broken_lookup
        self.counts = counts
        head: ObjectID | None = None
        for index in range(BASE_COMMITS):
            made = git_commit(
                head, f"Base commit {index}\n", author=OTHER_WRITER, when=start - 3600 * (BASE_COMMITS - index)
            )
            self.history.objects[made.id] = made
            head = made.id
        assert head is not None
        self.history.refs[BASE] = head
        self._others = 0

    def push(self, ref: Ref, commit: GitCommit, still_expected: Callable[[dict[Ref, ObjectID]], bool]) -> bool:
        """Set `ref` to `commit` iff `still_expected(the remote's refs)`: a compare-and-swap push."""
        if not still_expected(self.history.refs):
            return False
        self.history.objects[commit.id] = commit
        self.history.refs[ref] = commit.id
        return True

    def push_others(self, ref: Ref, count: int, when: float) -> None:
        """Another writer pushes `count` commits of its own (no job's trailer) on `ref`, if it exists."""
        head = self.history.refs.get(ref)
        if head is None:
            return
        for _ in range(count):
            self._others += 1
            made = git_commit(head, f"Format the code (run {self._others})\n", author=OTHER_WRITER, when=when)
            self.history.objects[made.id] = made
            head = made.id
        self.history.refs[ref] = head


class SimWorkspace:
    def __init__(self, store: RefStore, workspace_id: str, cache: GitCache, clock: Callable[[], float]) -> None:
        self.workspace_id = workspace_id
        self._store = store
        self._cache = cache
        self._clock = clock
        self._branch = branch_ref(workspace_id)

    def head(self) -> str:
        self._store.faults.before("head")
        head = self._fetched(self._cache).head
        self._store.faults.after("head")
        return head

    def history(self) -> list[Commit]:
        self._store.faults.before("history")
        commits = list(reversed(list(self._fetched(self._cache).job_commits())))
        self._store.faults.after("history")
        return commits

    def find_commit(self, job_id: str) -> Commit | None:
        self._store.faults.before("find_commit")
        found = self._lookup(self._fetched(self._cache), job_id)
        self._store.faults.after("find_commit")
        return found

    def commit(self, *, job_id: str, message: str, patch: str, expected_head: str, author: str | None = None) -> Commit:
        """As `GitWorkspace.commit` does: on the head a fetch finds, unless it is not `expected_head` or has a commit
        of the job already; then pushed by compare-and-swap, and the cache's ref set when the push answers."""
        self._store.faults.before("commit")
        if self._store.refuses(job_id):
            raise PermanentJobError(f"patch of job {job_id} does not apply to {self.workspace_id}")
        cache = self._cache
        branch = self._fetched(cache)
        if branch.head != expected_head:
            raise HeadMovedError(f"{self.workspace_id} is at {branch.head}, not {expected_head}")
        existing = self._lookup(branch, job_id)
        if existing is not None:
            raise JobAlreadyOnBranchError(existing, self._branch.decode().removeprefix("refs/heads/"))
        full_message = f"{message.rstrip()}\n\n{JOB_TRAILER}: {job_id}\n"
        parent = None if expected_head == ROOT_HEAD else ObjectID(expected_head.encode())
        made = git_commit(parent, full_message, author=author or DEFAULT_IDENTITY, when=self._clock())
        cache.object_store.add_object(made)
        if not self._store.push(self._branch, made, branch.still_at_head()):
            raise HeadMovedError(f"{self.workspace_id} moved, expected {expected_head}")
        self._store.on_commit(self.workspace_id, job_id)
        self._store.faults.after("commit")
        cache.refs[self._branch] = made.id
        return Commit(sha=made.id.decode(), parent=expected_head, job_id=job_id, message=full_message, patch=patch)

    def stored_test_result(self, job_id: str, head: str) -> dict[str, Any] | None:
        return None

    def store_test_result(self, job_id: str, head: str, result: dict[str, Any]) -> None:
        return None

    def find_open_pull_request(self, head_branch: str) -> dict[str, Any] | None:
        self._store.faults.before("find_open_pull_request")
        pulls = self._store.pulls.setdefault(self.workspace_id, [])
        found = next((dict(p) for p in pulls if p["head"] == head_branch), None)
        self._store.faults.after("find_open_pull_request")
        return found

    def open_pull_request(self, head_branch: str, title: str, body: str) -> dict[str, Any]:
        self._store.faults.before("open_pull_request")
        pulls = self._store.pulls.setdefault(self.workspace_id, [])
        number = len(pulls) + 1
        pull = {"number": number, "url": f"sim://{self.workspace_id}/pull/{number}", "head": head_branch}
        pulls.append(pull)
        self._store.faults.after("open_pull_request")
        return dict(pull)

    # ---- the cache ---------------------------------------------------------------------------------------------------

    def _fetched(self, cache: GitCache) -> FetchedBranch:
        """The branch and its base as one fetch into `cache` finds them, with the product's deepening of the cache."""
        if not cache.refs:
            self._store.counts["cold_fetches"] += 1
        heads = fetch(self._store.history, cache, [self._branch, BASE])
        # The lookup reads of the `Repo` only what a cache gives: its object store, its folder and its shallow list.
        return FetchedBranch(cast(Repo, cache), self._branch, BASE, heads, lambda depth: self._deepen(cache, depth))

    def _deepen(self, cache: GitCache, depth: int) -> None:
        self._store.faults.deepen()
        self._store.counts["deepened"] += 1
        fetch(self._store.history, cache, [self._branch, BASE], depth=depth)

    def _lookup(self, branch: FetchedBranch, job_id: str) -> Commit | None:
        """The product's lookup of the job's commit; an error of the lookup's own (not a retry it asks for, nor the
        remote failing a deepening fetch) is reported before it goes on to the handler."""
        deepened = self._store.counts["deepened"]
        try:
            found = branch.job_commit(job_id)
        except (RetryableJobError, RemoteUnavailableError):
            raise
        except Exception as error:
            self._store.on_broken_lookup(self.workspace_id, job_id, error)
            raise
        if found is not None and found.sha != branch.head and self._store.counts["deepened"] > deepened:
            self._store.counts["found_after_deepening"] += 1
        return found


class SimWorkspaceStore(UnregisteredWorkspaces):
    """The worker's workspace store over the ref store, for one execution environment: it keeps the environment's
    cache of each workspace (under `cache_root`). Every workspace is registered (the producer accepts jobs only for
    registered ones), so a workspace and its records belong to its registered owner, as in the deployed worker; a job
    gets no token (the remote asks for none)."""

    binds_tenants = True

    def __init__(
        self, store: RefStore, owners: dict[str, str], *, cache_root: Path, clock: Callable[[], float]
    ) -> None:
        self._store = store
        self._owners = owners
        self._cache_root = cache_root
        self._clock = clock
        self._caches: dict[str, GitCache] = {}

    def owner(self, workspace_id: str) -> str | None:
        return self._owners.get(workspace_id)

    def open(self, workspace_id: str) -> SimWorkspace:
        """The workspace a job runs on, with the environment's cache of it, which the world may have lost since the
        last job (evicted over the worker's cache budget, least recently used first; or a new environment's)."""
        cache = self._caches.get(workspace_id)
        if cache is None:
            cache = self._caches[workspace_id] = GitCache(str(self._cache_root / workspace_id))
        elif self._store.faults.cache_lost():
            cache.lose()
        return SimWorkspace(self._store, workspace_id, cache, self._clock)
