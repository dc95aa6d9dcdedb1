"""Workspaces that are branches of git remotes, in pure Python (dulwich): the worker needs no git binary.

A `GitWorkspace` is one branch of one remote (a local path, a `file://` URL or an `https://` URL). It keeps the
`Workspace` promises the job handlers rely on:

- every commit it makes carries the `Agent-Job-Id: <jobId>` trailer, and `find_commit` looks for that trailer on the
  branch, back to where the branch left its base branch;
- the remote branch moves only by compare-and-swap (`jobs.git.transport`). A stale worker gets `HeadMovedError` and
  the branch stays where it is.

An apply_patch job is one call, `apply_once`. On a warm cache it is one push: the job's trailer is looked for on the
branch as the cache last saw it (exactly-once), the patch applied to that head's tree and pushed by compare-and-swap,
so the remote itself decides whether the cache was current. Only a refused push (or a cold cache) fetches: the trailer
is looked for again on what the fetch found, and the patch applied and pushed on that head.

Heads, and the branch that does not exist yet. `head()` is the remote branch's commit. Before the first commit the
branch does not exist: `head()` is then the base branch's commit, or `ROOT_HEAD` when the remote is empty, and a
`commit` with that `expected_head` creates the branch on top of it, on condition that the branch still does not exist
(and the base has not moved).

Each workspace works in a bare cache repository of its own (`jobs.git.cache`), kept apart per owner and url: a
workspace id registered again, by another tenant or for another remote, never reads what the first remote left.
What one job may bring is bounded (`GitLimits`, the worker's MAX_BLOB_BYTES, MAX_FETCH_BYTES and MAX_CHECKOUT_BYTES;
`jobs.git.bounded_fetch`), and the jobs a worker runs at once take turns with objects above LARGE_OBJECT_BYTES
(`jobs.git.object_sizes`). Test results are stored in the remote too (`jobs.git.commits`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dulwich.objects import Blob, ObjectID, Tree
from dulwich.refs import Ref
from dulwich.repo import Repo

from agent_jobs.models import ID_PATTERN
from agent_jobs.patch_limits import PatchLimits
from job_worker.jobs.errors import PermanentJobError, RetryableJobError
from job_worker.jobs.git.branch import FetchedBranch
from job_worker.jobs.git.cache import evict_caches, open_cache
from job_worker.jobs.git.commits import (
    DEFAULT_IDENTITY,
    IDENTITY,
    SHA,
    TEST_RESULT_FILE,
    commit_of,
    job_id_of,
    new_commit,
    result_ref,
)
from job_worker.jobs.git.remote import GitCredentials, GitRemote
from job_worker.jobs.git.transport import DEEPEN_DEPTHS, LOCAL_PUSH_TURN, RemoteTransport
from job_worker.jobs.git.trees import CHECKOUT_ENTRY_BYTES, CheckoutBudget, write_tree_to_folder
from job_worker.jobs.limits import GitLimits
from job_worker.jobs.patching import REGULAR_FILE_MODE, ParsedPatch, parse_patch, patch_text
from job_worker.jobs.workspace import JOB_TRAILER, Commit, HeadMovedError

__all__ = [
    "CHECKOUT_ENTRY_BYTES",
    "DEFAULT_IDENTITY",
    "LOCAL_PUSH_TURN",
    "GitCredentials",
    "GitRemote",
    "GitWorkspace",
    "GitWorkspaceStore",
    "JobAlreadyOnBranchError",
    "evict_caches",
    "job_id_of",
]


@dataclass(frozen=True)
class AppliedPatch:
    """What `GitWorkspace.apply_once` did: `commit` is the job's commit, made now or found on the branch already."""

    commit: Commit
    already_applied: bool


class JobAlreadyOnBranchError(HeadMovedError):
    """The branch at the expected head already has a commit of this job: it moved past the job after the caller
    looked for it. A HeadMovedError, so a caller that retries on a moved head looks again and finds `commit`."""

    def __init__(self, commit: Commit, branch: str) -> None:
        self.commit = commit
        super().__init__(f"job {commit.job_id} is already on {branch} as {commit.sha[:12]}")


class GitWorkspaceStore:
    """Opens the git workspace of a workspace id on its remote (`open_remote`), or on the remote `resolve` names for
    it (`open`). Patches are applied within `patch_limits` (PATCH_MAX_BYTES, PATCH_MAX_HUNKS,
    PATCH_SEARCH_WINDOW_LINES)."""

    def __init__(
        self,
        cache_root: Path,
        resolve: Callable[[str], GitRemote] | None = None,
        *,
        limits: GitLimits | None = None,
        cache_budget_bytes: int | None = None,
        patch_limits: PatchLimits | None = None,
    ) -> None:
        self.cache_root = Path(cache_root)
        self._resolve = resolve
        self.limits = limits or GitLimits()
        # The caches under cache_root in all (None: unbounded); see `evict_caches`.
        self.cache_budget_bytes = cache_budget_bytes
        self.patch_limits = patch_limits or PatchLimits()

    def open(self, workspace_id: str) -> GitWorkspace:
        if not re.fullmatch(ID_PATTERN, workspace_id):
            raise ValueError(f"not a workspace id: {workspace_id!r}")
        if self._resolve is None:
            raise TypeError("this store resolves no remotes: open_remote(workspace_id, remote)")
        return self.open_remote(workspace_id, self._resolve(workspace_id))

    def open_remote(self, workspace_id: str, remote: GitRemote) -> GitWorkspace:
        """The git workspace of `workspace_id` on `remote`, with its warm cache under cache_root."""
        if not re.fullmatch(ID_PATTERN, workspace_id):
            raise ValueError(f"not a workspace id: {workspace_id!r}")
        cache_path = self.cache_root / f"{workspace_id}-{remote.cache_key}.git"
        return GitWorkspace(
            workspace_id,
            remote,
            cache_path,
            limits=self.limits,
            after_use=self._after_use,
            patch_limits=self.patch_limits,
        )

    def _after_use(self) -> None:
        if self.cache_budget_bytes is not None:
            evict_caches(self.cache_root, self.cache_budget_bytes)


class GitWorkspace:
    """One workspace: a branch of a git remote, with a warm bare cache of its objects (see the module docstring)."""

    def __init__(
        self,
        workspace_id: str,
        remote: GitRemote,
        cache_path: Path,
        *,
        limits: GitLimits | None = None,
        after_use: Callable[[], None] | None = None,
        patch_limits: PatchLimits | None = None,
    ) -> None:
        self.workspace_id = workspace_id
        self.remote = remote
        self.cache_path = cache_path
        self.limits = limits or GitLimits()
        self._after_use = after_use
        self.patch_limits = patch_limits or PatchLimits()
        self._branch = Ref(b"refs/heads/" + remote.branch.encode())
        self._base = Ref(b"refs/heads/" + remote.base_branch.encode())
        self._transport = RemoteTransport(remote, self.limits, workspace_id=workspace_id)

    # -- the Workspace protocol -------------------------------------------------------------------------------

    def head(self) -> str:
        """The remote branch's commit; before the branch exists, its base's commit (ROOT_HEAD for an empty remote)."""
        with self._fetched_branch() as branch:
            return branch.head

    def history(self) -> list[Commit]:
        """The job commits of the branch since it left its base, oldest first (commits without a trailer skipped)."""
        with self._fetched_branch() as branch:
            return list(reversed(list(branch.job_commits())))

    def find_commit(self, job_id: str) -> Commit | None:
        """The branch's commit whose trailer names `job_id`, walking back from the remote head to the base."""
        with self._fetched_branch() as branch:
            return branch.job_commit(job_id)

    def commit(
        self,
        *,
        job_id: str,
        message: str,
        patch: str | bytes,
        expected_head: str,
        author: str | None = None,
        fetched: FetchedBranch | None = None,
    ) -> Commit:
        """Apply `patch` on `expected_head` and move the remote branch there, iff it is still at `expected_head`.

        Raises HeadMovedError when the branch is elsewhere (before or during the push), JobAlreadyOnBranchError (a
        HeadMovedError) when the branch already has a commit of `job_id`, PatchDoesNotApplyError when the patch does
        not apply to `expected_head`'s tree. `author` is "Name <email>"; the committer is always Agent Jobs.
        `fetched` is the branch as the caller fetched it in its own use of the cache (`apply_once`), to commit on
        instead of fetching again.
        """
        if not re.fullmatch(ID_PATTERN, job_id):
            raise ValueError(f"not a job id: {job_id!r}")  # it goes into the trailer, which must stay one line
        if author is not None and not IDENTITY.fullmatch(author):
            raise PermanentJobError(f"author must look like 'Name <email>', got {author!r}")
        # Refused before this commit touches the remote.
        parsed = parse_patch(patch, self.patch_limits, max_file_bytes=self.limits.max_blob_bytes)
        full_message = f"{message.rstrip()}\n\n{JOB_TRAILER}: {job_id}\n"
        with self._fetched_branch(fetched) as branch:
            sha = self._commit_on(
                branch, job_id=job_id, patch=parsed, message=full_message, expected_head=expected_head, author=author
            )
        return Commit(
            sha=sha.decode(), parent=expected_head, job_id=job_id, message=full_message, patch=patch_text(patch)
        )

    def apply_once(
        self, *, job_id: str, message: str, patch: str | bytes, author: str | None = None, races: int
    ) -> AppliedPatch:
        """Commit `patch` on the branch's head unless the branch has a commit of `job_id` already: an apply_patch job.

        A warm cache first tries the branch as the cache last saw it (`_cached_branch`), without fetching: the job's
        trailer looked for there, the patch committed on its head and pushed by compare-and-swap. The remote refuses
        that push if the branch moved since, and only then is it fetched. Each later round fetches the branch once,
        looks for the job's trailer on it (a worker that crashed after pushing, or a stale worker whose lease was
        taken over, finds its own commit and commits nothing), then commits on the head it fetched (`commit`, by
        compare-and-swap). A push refused because the branch moved starts the next round, which fetches again; after
        `races` fetching rounds the branch kept moving, a RetryableJobError.
        """
        with self._cached_branch() as cached:
            if cached is not None:
                try:
                    applied = self._apply_on(cached, job_id=job_id, message=message, patch=patch, author=author)
                except PermanentJobError:
                    # Refused on a head the cache may have missed the news of (a patch that needs the jobs another
                    # worker applied since): decided on the head a fetch finds, below.
                    applied = None
                if applied is not None:
                    return applied
        for _ in range(races):
            with self._fetched_branch() as branch:
                applied = self._apply_on(branch, job_id=job_id, message=message, patch=patch, author=author)
                if applied is not None:
                    return applied
            # someone moved the branch: look for the trailer again on the new head
        raise RetryableJobError(f"branch of {self.workspace_id} kept moving; will retry")

    def stored_test_result(self, job_id: str, head: str) -> dict[str, Any] | None:
        ref = result_ref(job_id, head)
        with self._cache() as repo:
            # A result ref never moves once created, so a copy already in the cache is as good as the remote's.
            sha = repo.refs.as_dict().get(ref) or self._fetch(repo, [ref]).get(ref)
            if sha is None:
                return None
            tree = repo.object_store[commit_of(repo.object_store, sha.decode()).tree]
            assert isinstance(tree, Tree)
            blob = repo.object_store[tree[TEST_RESULT_FILE][1]]
            assert isinstance(blob, Blob)
            return dict(json.loads(blob.data))

    def store_test_result(self, job_id: str, head: str, result: dict[str, Any]) -> None:
        ref = result_ref(job_id, head)
        with self._cache() as repo:
            blob = Blob.from_string(json.dumps(result, sort_keys=True).encode())
            tree = Tree()
            tree.add(TEST_RESULT_FILE, REGULAR_FILE_MODE, blob.id)
            git_commit = new_commit(
                tree.id, parents=[], message=f"Test result of job {job_id} at {head}\n", author=DEFAULT_IDENTITY
            )
            for obj in (blob, tree, git_commit):
                repo.object_store.add_object(obj)
            # Created once: when another worker stored a result for this job and commit first, theirs stands.
            if self._push(repo, ref, git_commit.id, lambda refs: ref not in refs):
                repo.refs[ref] = git_commit.id

    def find_open_pull_request(self, head_branch: str) -> dict[str, Any] | None:
        raise NotImplementedError(self._pull_requests_elsewhere())

    def open_pull_request(self, head_branch: str, title: str, body: str) -> dict[str, Any]:
        raise NotImplementedError(self._pull_requests_elsewhere())

    def _pull_requests_elsewhere(self) -> str:
        return f"pull requests of {self.remote.display_url} live on its forge: use jobs.github, not the git workspace"

    # -- beyond the protocol ------------------------------------------------------------------------------------

    def checkout(self, sha: str, path: Path) -> None:
        """Write the tree of commit `sha` (of the branch or its base) into the empty or missing folder `path`."""
        if not SHA.fullmatch(sha):
            raise ValueError(f"not a commit sha: {sha!r}")
        with self._cache() as repo:
            self._bring_commit(repo, ObjectID(sha.encode()))
            tree = commit_of(repo.object_store, sha).tree
            path.mkdir(parents=True, exist_ok=True)
            if any(path.iterdir()):
                raise ValueError(f"checkout needs an empty folder; {path} is not empty")
            budget = CheckoutBudget(self.limits.max_checkout_bytes, sha)
            write_tree_to_folder(repo.object_store, tree, path, budget)

    # -- remote and cache -------------------------------------------------------------------------------------

    @contextmanager
    def _cache(self) -> Iterator[Repo]:
        """The workspace's bare cache repository (`jobs.git.cache.open_cache`): one user at a time per machine."""
        with open_cache(self.cache_path, self._after_use, max_object_bytes=self.limits.max_blob_bytes) as repo:
            yield repo

    def _fetch(self, repo: Repo, wanted: Sequence[Ref]) -> dict[Ref, ObjectID]:
        """Fetch what the cache lacks of `wanted` and return their values on the remote (absent: not there)."""
        return self._transport.fetch(repo, wanted)

    def _push(
        self, repo: Repo, ref: Ref, new: ObjectID, still_expected: Callable[[Mapping[Ref, ObjectID]], bool]
    ) -> bool:
        """Set the remote `ref` to `new` iff `still_expected(remote refs)`, by compare-and-swap; False when refused."""
        return self._transport.push(repo, ref, new, still_expected)

    def _apply_on(
        self, branch: FetchedBranch, *, job_id: str, message: str, patch: str | bytes, author: str | None
    ) -> AppliedPatch | None:
        """The job's commit found on `branch`, or made on its head and pushed; None when the push was refused (the
        branch moved)."""
        existing = branch.job_commit(job_id)
        if existing is not None:
            return AppliedPatch(existing, already_applied=True)
        try:
            made = self.commit(
                job_id=job_id, message=message, patch=patch, expected_head=branch.head, author=author, fetched=branch
            )
        except HeadMovedError:
            return None
        return AppliedPatch(made, already_applied=False)

    @contextmanager
    def _cached_branch(self) -> Iterator[FetchedBranch | None]:
        """A use of the cache and the branch and its base as the cache last saw them on the remote (its copies of the
        refs, which a fetch or this cache's own accepted push set, so every object they name is in the cache), without
        fetching; None for a cache that has never fetched the base.

        A commit of a job found there was on the remote branch; a head that moved since makes the remote refuse the
        compare-and-swap push on it. A base that moved since only makes the trailer walk longer."""
        with self._cache() as repo:
            refs = repo.refs.as_dict()
            if self._base not in refs:
                yield None
                return
            yield FetchedBranch(
                repo,
                self._branch,
                self._base,
                {ref: refs[ref] for ref in (self._branch, self._base) if ref in refs},
                self._deepener(repo),
            )

    @contextmanager
    def _fetched_branch(self, fetched: FetchedBranch | None = None) -> Iterator[FetchedBranch]:
        """A use of the cache and the branch and its base as one fetch into it finds them on the remote; or `fetched`,
        the branch a caller fetched in a use of the cache it is within."""
        if fetched is not None:
            yield fetched
            return
        with self._cache() as repo:
            heads = self._fetch(repo, [self._branch, self._base])
            yield FetchedBranch(repo, self._branch, self._base, heads, self._deepener(repo))

    def _bring_commit(self, repo: Repo, sha: ObjectID) -> None:
        """Bring commit `sha` of the branch or its base into the cache `repo`: fetch the tips, then, for a commit
        below a shallow cache's tips (a test run of an older head, a patch's older base), deepen them step by step
        (DEEPEN_DEPTHS) until it is there. A commit in neither history is still missing after the last step."""
        if sha not in repo.object_store:
            self._fetch(repo, [self._branch, self._base])
        deepen = self._deepener(repo)
        for depth in DEEPEN_DEPTHS:
            if sha in repo.object_store:
                return
            deepen(depth)

    def _deepener(self, repo: Repo) -> Callable[[int], object]:
        """How a walk on the cache `repo` deepens the history of the branch and its base."""
        return lambda depth: self._transport.fetch(repo, [self._branch, self._base], depth=depth)

    def _commit_on(
        self,
        branch: FetchedBranch,
        *,
        job_id: str,
        patch: ParsedPatch,
        message: str,
        expected_head: str,
        author: str | None,
    ) -> ObjectID:
        if branch.head != expected_head:
            raise HeadMovedError(self._moved(branch.head, expected_head))
        # The caller looked for this job's commit before it read the head: a worker that committed the same job
        # in between is on the head it passes here. One commit per job is the workspace's promise, so check.
        existing = branch.job_commit(job_id)
        if existing is not None:
            raise JobAlreadyOnBranchError(existing, self.remote.branch)
        sha = branch.new_commit(patch, message=message, author=author)
        if not self._push(branch.repo, self._branch, sha, branch.still_at_head()):
            raise HeadMovedError(self._moved(None, expected_head))
        branch.repo.refs[self._branch] = sha
        return sha

    def _moved(self, head: str | None, expected_head: str) -> str:
        where = f"is at {head[:12]}" if head else "moved"
        return f"branch {self.remote.branch} of {self.workspace_id} {where}, expected {expected_head[:12]}"
