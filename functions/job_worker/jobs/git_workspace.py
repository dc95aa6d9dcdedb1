"""Workspaces that are branches of git remotes, in pure Python (dulwich): the worker needs no git binary.

A `GitWorkspace` is one branch of one remote (a local path, a `file://` URL or an `https://` URL). It keeps the
`Workspace` promises the job handlers rely on:

- every commit it makes carries the `Agent-Job-Id: <jobId>` trailer, and `find_commit` looks for that trailer on the
  branch, back to where the branch left its base branch;
- the remote branch moves only by compare-and-swap (`jobs.git.transport`). A stale worker gets `HeadMovedError` and
  the branch stays where it is.

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
from pathlib import Path
from typing import Any

from dulwich.objects import ZERO_SHA, Blob, ObjectID, Tree
from dulwich.refs import Ref
from dulwich.repo import Repo

from agent_jobs.models import ID_PATTERN
from agent_jobs.patch_limits import PatchLimits, patch_bytes_error, patch_hunks_error
from jobs.errors import PermanentJobError
from jobs.git.cache import evict_caches, open_cache
from jobs.git.commits import (
    DEFAULT_IDENTITY,
    IDENTITY,
    SHA,
    TEST_RESULT_FILE,
    commit_of,
    job_commits,
    job_id_of,
    new_commit,
    result_ref,
)
from jobs.git.remote import GitCredentials, GitRemote
from jobs.git.transport import LOCAL_PUSH_TURN, RemoteTransport
from jobs.git.trees import CHECKOUT_ENTRY_BYTES, CheckoutBudget, patched_tree, write_tree_to_folder
from jobs.limits import GitLimits
from jobs.patching import PATCH_AS_A_WHOLE, REGULAR_FILE_MODE, PatchDoesNotApplyError
from jobs.workspace import JOB_TRAILER, ROOT_HEAD, Commit, HeadMovedError

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


class JobAlreadyOnBranchError(HeadMovedError):
    """The branch at the expected head already has a commit of this job: it moved past the job after the caller
    looked for it. A HeadMovedError, so a caller that retries on a moved head looks again and finds `commit`."""

    def __init__(self, commit: Commit, branch: str) -> None:
        self.commit = commit
        super().__init__(f"job {commit.job_id} is already on {branch} as {commit.sha[:12]}")


class GitWorkspaceStore:
    """Opens the git workspace of a workspace id; `resolve` says which remote and branch that is. Patches are applied
    within `patch_limits` (PATCH_MAX_BYTES, PATCH_MAX_HUNKS, PATCH_SEARCH_WINDOW_LINES)."""

    def __init__(
        self,
        cache_root: Path,
        resolve: Callable[[str], GitRemote],
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
        if not re.match(ID_PATTERN, workspace_id):
            raise ValueError(f"not a workspace id: {workspace_id!r}")
        remote = self._resolve(workspace_id)
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
        self._transport = RemoteTransport(remote, self.limits)

    # -- the Workspace protocol -------------------------------------------------------------------------------

    def head(self) -> str:
        """The remote branch's commit; before the branch exists, its base's commit (ROOT_HEAD for an empty remote)."""
        with self._cache() as repo:
            return self._head_of(self._fetch(repo, [self._branch, self._base]))

    def history(self) -> list[Commit]:
        """The job commits of the branch since it left its base, oldest first (commits without a trailer skipped)."""
        with self._cache() as repo:
            heads = self._fetch(repo, [self._branch, self._base])
            return list(reversed(list(self._job_commits(repo, heads))))

    def find_commit(self, job_id: str) -> Commit | None:
        """The branch's commit whose trailer names `job_id`, walking back from the remote head to the base."""
        with self._cache() as repo:
            heads = self._fetch(repo, [self._branch, self._base])
            return next((commit for commit in self._job_commits(repo, heads) if commit.job_id == job_id), None)

    def commit(self, *, job_id: str, message: str, patch: str, expected_head: str, author: str | None = None) -> Commit:
        """Apply `patch` on `expected_head` and move the remote branch there, iff it is still at `expected_head`.

        Raises HeadMovedError when the branch is elsewhere (before or during the push), JobAlreadyOnBranchError (a
        HeadMovedError) when the branch already has a commit of `job_id`, PatchDoesNotApplyError when the patch does
        not apply to `expected_head`'s tree. `author` is "Name <email>"; the committer is always Agent Jobs.
        """
        if not re.match(ID_PATTERN, job_id):
            raise ValueError(f"not a job id: {job_id!r}")  # it goes into the trailer, which must stay one line
        if author is not None and not IDENTITY.match(author):
            raise PermanentJobError(f"author must look like 'Name <email>', got {author!r}")
        too_large = patch_bytes_error(patch, self.patch_limits) or patch_hunks_error(patch, self.patch_limits)
        if too_large:  # refused before the remote is touched
            raise PatchDoesNotApplyError(PATCH_AS_A_WHOLE, None, too_large)
        full_message = f"{message.rstrip()}\n\n{JOB_TRAILER}: {job_id}\n"
        with self._cache() as repo:
            heads = self._fetch(repo, [self._branch, self._base])
            head = self._head_of(heads)
            if head != expected_head:
                raise HeadMovedError(self._moved(head, expected_head))
            # The caller looked for this job's commit before it read the head: a worker that committed the same job
            # in between is on the head it passes here. One commit per job is the workspace's promise, so check.
            existing = next((c for c in self._job_commits(repo, heads) if c.job_id == job_id), None)
            if existing is not None:
                raise JobAlreadyOnBranchError(existing, self.remote.branch)
            parent_tree = None if expected_head == ROOT_HEAD else commit_of(repo.object_store, expected_head).tree
            tree = patched_tree(repo.object_store, parent_tree, patch, self.patch_limits)
            git_commit = new_commit(
                tree,
                parents=[] if expected_head == ROOT_HEAD else [ObjectID(expected_head.encode())],
                message=full_message,
                author=author or DEFAULT_IDENTITY,
            )
            repo.object_store.add_object(git_commit)
            expected = ObjectID(expected_head.encode())

            def still_expected(refs: Mapping[Ref, ObjectID]) -> bool:
                if self._branch in refs:
                    return refs[self._branch] == expected
                # First commit: the branch must not exist, and is created on the base's current commit.
                return refs.get(self._base, ZERO_SHA) == expected

            if not self._push(repo, self._branch, git_commit.id, still_expected):
                raise HeadMovedError(self._moved(None, expected_head))
            repo.refs[self._branch] = git_commit.id
        return Commit(
            sha=git_commit.id.decode(), parent=expected_head, job_id=job_id, message=full_message, patch=patch
        )

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
        if not SHA.match(sha):
            raise ValueError(f"not a commit sha: {sha!r}")
        with self._cache() as repo:
            if ObjectID(sha.encode()) not in repo.object_store:
                self._fetch(repo, [self._branch, self._base])
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
        with open_cache(self.cache_path, self._after_use) as repo:
            yield repo

    def _fetch(self, repo: Repo, wanted: Sequence[Ref]) -> dict[Ref, ObjectID]:
        """Fetch what the cache lacks of `wanted` and return their values on the remote (absent: not there)."""
        return self._transport.fetch(repo, wanted)

    def _push(
        self, repo: Repo, ref: Ref, new: ObjectID, still_expected: Callable[[Mapping[Ref, ObjectID]], bool]
    ) -> bool:
        """Set the remote `ref` to `new` iff `still_expected(remote refs)`, by compare-and-swap; False when refused."""
        return self._transport.push(repo, ref, new, still_expected)

    def _head_of(self, heads: Mapping[Ref, ObjectID]) -> str:
        sha = heads.get(self._branch) or heads.get(self._base)
        return sha.decode() if sha else ROOT_HEAD

    def _moved(self, head: str | None, expected_head: str) -> str:
        where = f"is at {head[:12]}" if head else "moved"
        return f"branch {self.remote.branch} of {self.workspace_id} {where}, expected {expected_head[:12]}"

    def _job_commits(self, repo: Repo, heads: Mapping[Ref, ObjectID]) -> Iterator[Commit]:
        """The branch's commits with a job trailer, newest first, down to (not into) the base branch."""
        return job_commits(repo.object_store, heads.get(self._branch), heads.get(self._base))
