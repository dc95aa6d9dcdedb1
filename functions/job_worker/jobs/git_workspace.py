"""Workspaces that are branches of git remotes, in pure Python (dulwich): the worker needs no git binary.

A `GitWorkspace` is one branch of one remote (a local path, a `file://` URL or an `https://` URL). It keeps the
`Workspace` promises the job handlers rely on:

- every commit it makes carries the `Agent-Job-Id: <jobId>` trailer, and `find_commit` looks for that trailer on the
  branch, back to where the branch left its base branch;
- the remote branch moves only by compare-and-swap: a push states the old value it expects and the remote refuses it
  if the branch has moved since (git's receive-pack, or dulwich's `set_if_equals` for a local remote, re-check the
  old value while holding the ref's lock). A stale worker gets `HeadMovedError` and the branch stays where it is.

Heads, and the branch that does not exist yet. `head()` is the remote branch's commit. Before the first commit the
branch does not exist: `head()` is then the base branch's commit, or `ROOT_HEAD` when the remote is empty, and a
`commit` with that `expected_head` creates the branch on top of it, on condition that the branch still does not exist
(and the base has not moved).

A writer killed mid-update (an invocation that crashed or timed out, taking every job it held with it) leaves a ref's
git lock file behind, and git refuses every later update of that ref. A remote on this machine's file system is
written by the pushing worker itself, so its pushes hold an flock (`LOCAL_PUSH_TURN`, released by the system when its
holder dies) shared, and a push that finds a ref locked takes it exclusively: a lock file still there then has no live
writer and is removed. The workspace's own cache is cleared the same way under its own flock. The branch and the
test-result refs of a local remote are written by Agent Jobs only.

Each workspace keeps a bare repository at `<cache_root>/<workspaceId>-<key>.git` holding the objects of its branch and
base (cloned on first use, then fetched incrementally: a warm execution environment downloads only new commits).
`<key>` is a digest of the remote's owner (the tenant that registered the workspace) and url: a workspace id
registered again, by another tenant or for another remote, gets a cache of its own and never reads what the first
remote left. Patches are applied to trees in that object store; no working tree is ever written, except by
`checkout`. The caches of one worker stay within a budget (`GitWorkspaceStore.cache_budget_bytes`, the worker's
WORKSPACE_CACHE_BYTES): after each use, the least recently used caches are removed until the rest fit, except those
in use, whose flock a removal must take first. A removed cache is cloned again by its next job.

What one job may bring is bounded (`GitLimits`, the worker's MAX_BLOB_BYTES, MAX_FETCH_BYTES and MAX_CHECKOUT_BYTES): a
fetch counts the pack bytes as they arrive and reads every object's size from its pack header (a delta's from the
delta's own header) before the object is inflated, so a small pack of a huge zero-filled file is refused after a few
bytes of it, in bounded memory. A remote on this machine's file system is read through a store that checks each
object's stored size the same way before the sending side inflates it. Going over a limit is a PermanentJobError
naming the setting to raise: the remote is the same on every retry. The jobs a worker runs at once take turns with
objects above LARGE_OBJECT_BYTES, so its memory holds one such object at a time, not one per job.

Test results live in the remote too, so any worker finds them: `refs/agent-jobs/tests/<jobId>/<commit>` points at a
commit whose tree holds `result.json`. A ref is created once and never moved; the first stored result wins.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit, urlunsplit

from dulwich.client import LocalGitClient, get_transport_and_path
from dulwich.errors import NotTreeError
from dulwich.file import FileLocked
from dulwich.object_store import BaseObjectStore, DiskObjectStore
from dulwich.objects import S_ISGITLINK, ZERO_SHA, Blob, ObjectID, ShaFile, SubmoduleEncountered, Tree
from dulwich.objects import Commit as GitCommit
from dulwich.pack import DELTA_TYPES, OFS_DELTA, REF_DELTA, UnpackedObject, read_pack_header_at, take_msb_bytes
from dulwich.refs import Ref, check_ref_format
from dulwich.repo import Repo
from dulwich.walk import ORDER_TOPO, Walker

from agent_jobs.models import ID_PATTERN
from agent_jobs.patch_limits import PatchLimits, patch_bytes_error, patch_hunks_error
from jobs.errors import PermanentJobError, RetryableJobError
from jobs.limits import GitLimits
from jobs.patching import (
    PATCH_AS_A_WHOLE,
    REGULAR_FILE_MODE,
    FileChange,
    PatchDoesNotApplyError,
    apply_patch_to_files,
)
from jobs.workspace import JOB_TRAILER, ROOT_HEAD, Commit, HeadMovedError

DEFAULT_IDENTITY = "Agent Jobs <agent-jobs@localhost>"
TEST_RESULTS_NAMESPACE = "refs/agent-jobs/tests"
TEST_RESULT_FILE = b"result.json"

# A remote on this machine's file system (a path or file:// URL) is written by the pushing worker itself. Every push
# to it holds this file of the remote shared (an flock, which dies with its process), so that a ref's git lock file
# found while the file is held exclusively was left by a writer killed mid-update, never by a live one.
LOCAL_PUSH_TURN = "agent-jobs-push.flock"
# How long a push waits for the live pushes of a local remote to end before it takes a ref's lock file for a live one.
STALE_REF_LOCK_WAIT_SECONDS = 5.0

# What each file, folder or link of a checkout counts against MAX_CHECKOUT_BYTES beside its content.
CHECKOUT_ENTRY_BYTES = 512
# How deep a local remote's alternates (objects/info/alternates) are followed to read an object's size.
_MAX_ALTERNATES_DEPTH = 5
# A fetch inflates an object this many bytes at a time while it looks for the object's end in the pack.
_INFLATE_STEP = 64 * 1024
# The worker runs jobs of several workspaces at once (GROUP_CONCURRENCY threads). Objects above this size are handled
# by one of them at a time: whoever meets one waits for the process's turn (`_inflating`), and holds it until its use
# of the cache ends. So the worker's memory holds one large object's few copies, not one per thread.
LARGE_OBJECT_BYTES = 1024 * 1024
_LARGE_OBJECT_TURN = threading.RLock()
_large_object_turn = threading.local()
_IDENTITY = re.compile(r"^[^<>\n]+ <[^<>\n]+>$")
_SHA = re.compile(r"^[0-9a-f]{40}$")
_TRAILER = re.compile(rb"^" + re.escape(JOB_TRAILER.encode()) + rb":[ \t]*(\S+)[ \t]*$", re.MULTILINE)


@dataclass(frozen=True)
class GitCredentials:
    """HTTPS basic credentials: a user name and a password or access token (never shown in reprs or logs)."""

    username: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class GitRemote:
    """Where a workspace lives: `branch` of the repository at `url`, branched from `base_branch`."""

    url: str
    branch: str
    base_branch: str = "main"
    credentials: GitCredentials | None = None
    # The tenant that registered the workspace: caches are kept apart per owner and url.
    owner: str = ""
    # For a file-system remote: the folder it must not reach outside of through git's own pointers (the tenant's
    # folder of the remotes root; see `_local_remote_escape`). Empty: the remote is read as git reads it.
    confined_to: str = ""

    @property
    def cache_key(self) -> str:
        """What a cache of this remote is named by, beside the workspace id: its owner and url (never the token)."""
        return hashlib.sha256(f"{self.owner}\0{self.display_url}".encode()).hexdigest()[:16]

    @property
    def display_url(self) -> str:
        """The url without any user or token in it, for messages and logs."""
        parts = urlsplit(self.url)
        if not parts.netloc or "@" not in parts.netloc:
            return self.url
        return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))

    def __post_init__(self) -> None:
        for name in (self.branch, self.base_branch):
            if not check_ref_format(Ref(b"heads/" + name.encode())):
                raise ValueError(f"not a valid git branch name: {name!r}")
        if self.branch == self.base_branch:
            raise ValueError(f"a workspace branch must differ from its base branch ({self.branch!r})")


class JobAlreadyOnBranchError(HeadMovedError):
    """The branch at the expected head already has a commit of this job: it moved past the job after the caller
    looked for it. A HeadMovedError, so a caller that retries on a moved head looks again and finds `commit`."""

    def __init__(self, commit: Commit, branch: str) -> None:
        self.commit = commit
        super().__init__(f"job {commit.job_id} is already on {branch} as {commit.sha[:12]}")


class _RemoteRefusedError(Exception):
    """update_refs found the remote ref other than the push requires: nothing is sent."""


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
        credentials = remote.credentials
        self._client, remote_path = get_transport_and_path(
            remote.url,
            username=credentials.username if credentials else None,
            password=credentials.password if credentials else None,
        )
        self._remote_path = os.fsencode(remote_path)

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
        if author is not None and not _IDENTITY.match(author):
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
            parent_tree = None if expected_head == ROOT_HEAD else _commit(repo.object_store, expected_head).tree
            tree = _patched_tree(repo.object_store, parent_tree, patch, self.patch_limits)
            git_commit = _new_commit(
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
        ref = _test_result_ref(job_id, head)
        with self._cache() as repo:
            # A result ref never moves once created, so a copy already in the cache is as good as the remote's.
            sha = repo.refs.as_dict().get(ref) or self._fetch(repo, [ref]).get(ref)
            if sha is None:
                return None
            tree = repo.object_store[_commit(repo.object_store, sha.decode()).tree]
            assert isinstance(tree, Tree)
            blob = repo.object_store[tree[TEST_RESULT_FILE][1]]
            assert isinstance(blob, Blob)
            return dict(json.loads(blob.data))

    def store_test_result(self, job_id: str, head: str, result: dict[str, Any]) -> None:
        ref = _test_result_ref(job_id, head)
        with self._cache() as repo:
            blob = Blob.from_string(json.dumps(result, sort_keys=True).encode())
            tree = Tree()
            tree.add(TEST_RESULT_FILE, REGULAR_FILE_MODE, blob.id)
            git_commit = _new_commit(
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
        if not _SHA.match(sha):
            raise ValueError(f"not a commit sha: {sha!r}")
        with self._cache() as repo:
            if ObjectID(sha.encode()) not in repo.object_store:
                self._fetch(repo, [self._branch, self._base])
            tree = _commit(repo.object_store, sha).tree
            path.mkdir(parents=True, exist_ok=True)
            if any(path.iterdir()):
                raise ValueError(f"checkout needs an empty folder; {path} is not empty")
            budget = _CheckoutBudget(self.limits.max_checkout_bytes, sha)
            _write_tree_to_folder(repo.object_store, tree, path, budget)

    # -- remote and cache -------------------------------------------------------------------------------------

    @contextmanager
    def _cache(self) -> Iterator[Repo]:
        """The workspace's bare cache repository, created on first use; one user at a time per machine."""
        self.cache_path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = Path(f"{self.cache_path}.lock")
        try:
            with lock_path.open("a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    os.utime(lock_path)  # its last use, which orders the caches for eviction
                    if not (self.cache_path / "HEAD").exists():
                        # Created aside and renamed, so a crash never leaves half a repository where the cache
                        # belongs; what such a crash left aside is removed here, under the lock its creator held.
                        for stale in self.cache_path.parent.glob(f".{self.cache_path.name}-*"):
                            shutil.rmtree(stale, ignore_errors=True)
                        staging = Path(tempfile.mkdtemp(prefix=f".{self.cache_path.name}-", dir=self.cache_path.parent))
                        Repo.init_bare(staging).close()
                        shutil.rmtree(self.cache_path, ignore_errors=True)
                        staging.rename(self.cache_path)
                    self._clear_stale_ref_locks()
                    with closing(Repo(str(self.cache_path))) as repo, _large_object_scope():
                        yield repo
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)
        finally:
            # Also after a use that failed (a patch that does not apply, a limit, a full disk): a tenant's failing
            # jobs must not leave /tmp over its budget, or every later job of any tenant would fail to fetch.
            if self._after_use is not None:
                self._after_use()

    def _clear_stale_ref_locks(self) -> None:
        """Remove the `.lock` files of the cache's refs. A process killed while it updated a ref of the cache (an
        invocation that crashed or timed out, taking every job it held with it; /tmp outlives the process in Lambda)
        leaves the ref's lock file behind, and every later update of that ref would fail. Every writer of the cache
        holds the lock `_cache` holds now, so a lock file found here has no live writer."""
        stale = [*(self.cache_path / "refs").rglob("*.lock"), self.cache_path / "packed-refs.lock"]
        for path in stale:
            path.unlink(missing_ok=True)

    def _fetch(self, repo: Repo, wanted: Sequence[Ref]) -> dict[Ref, ObjectID]:
        """Fetch what the cache lacks of `refs` and return their values on the remote (absent: not there).

        The values are the ones the remote advertised for this fetch, so every object they name is in the cache.
        The cache keeps a copy of each ref, which makes the next fetch send only what is new.
        """
        self._check_confined()
        advertised: dict[Ref, ObjectID] = {}

        def wants(refs: Mapping[Ref, ObjectID], depth: int | None = None) -> list[ObjectID]:
            advertised.update({ref: refs[ref] for ref in wanted if ref in refs})
            return sorted({sha for sha in advertised.values() if sha not in repo.object_store})

        # As dulwich's GitClient.fetch does, but the pack goes through _PackGuard on its way to a file that the
        # system removes even if this process dies, and a local remote is read through its size-checking client.
        client = (
            _SizeCheckingLocalClient(self.limits, self.remote.display_url) if self._local_remote() else self._client
        )
        with tempfile.TemporaryFile(dir=repo.object_store.path, prefix="incoming-") as pack:
            guard = _PackGuard(pack, self.limits, self.remote.display_url)
            client.fetch_pack(self._remote_path, wants, repo.get_graph_walker(), guard.receive, ref_prefix=list(wanted))
            guard.finish()
            if pack.tell():
                pack.seek(0)
                repo.object_store.add_thin_pack(pack.read, None)
        local = repo.refs.as_dict()
        for ref in wanted:
            if ref in advertised:
                repo.refs[ref] = advertised[ref]
            elif ref in local:
                del repo.refs[ref]
        return advertised

    def _push(
        self, repo: Repo, ref: Ref, new: ObjectID, still_expected: Callable[[Mapping[Ref, ObjectID]], bool]
    ) -> bool:
        """Send `new` and set the remote `ref` to it iff `still_expected(remote refs)`; False when refused.

        The old value sent with the update is the one `still_expected` approved, and the remote applies the update
        only if the ref still has that value (compare-and-swap), so a concurrent change in between is refused too.
        """
        self._check_confined()
        approved: dict[Ref, ObjectID] = {}

        def update_refs(remote_refs: dict[Ref, ObjectID]) -> dict[Ref, ObjectID]:
            if not still_expected(remote_refs):
                raise _RemoteRefusedError
            approved.update(remote_refs)
            return {ref: new}

        def pack_data(
            have: Set[ObjectID],
            want: Set[ObjectID],
            *,
            ofs_delta: bool = False,
            progress: Callable[[bytes], None] | None = None,
        ) -> tuple[int, Iterator[UnpackedObject]]:
            return repo.object_store.generate_pack_data(have, want, ofs_delta=ofs_delta, progress=progress)

        for first_try in (True, False):
            try:
                with self._pushing():
                    result = self._client.send_pack(self._remote_path, update_refs, generate_pack_data=pack_data)
                break
            except _RemoteRefusedError:
                return False
            except FileLocked:
                # Another worker holds the ref's lock: it is moving this very moment, unless that worker was killed
                # mid-update (a crash or a timeout), whose lock file would refuse every later push of the ref.
                if not (first_try and self._clear_stale_ref_lock(ref)):
                    return False
        status = (result.ref_status or {}).get(ref)
        if status is None:
            return True
        # Refused after the check: a compare-and-swap lost in the remote, or a rule of the remote (protected branch,
        # hook). Only the first is a moved head; the second must not be retried as if it were.
        remote_now = self._client.get_refs(self._remote_path).refs
        current = {name: sha for name, sha in remote_now.items() if sha is not None}
        if not still_expected(current):
            return False
        raise RetryableJobError(f"{self.remote.display_url} refused to update {ref.decode()}: {status}")

    def _local_remote(self) -> Path | None:
        return Path(os.fsdecode(self._remote_path)) if isinstance(self._client, LocalGitClient) else None

    def _check_confined(self) -> None:
        """Before each read or write of a local remote that has a confining folder: refuse it if git's own pointers
        lead outside that folder (checked on every use: the remote's owner may change its files at any time)."""
        root = self._local_remote()
        if root is None or not self.remote.confined_to:
            return
        escape = _local_remote_escape(root, self.remote.confined_to)
        if escape is not None:
            raise PermanentJobError(
                f"{self.remote.display_url} reaches outside {self.remote.confined_to}/ (this tenant's remotes): "
                f"{escape}; remove it from the remote (or register a remote that holds its own objects), then resume "
                "the workspace"
            )

    @contextmanager
    def _pushing(self) -> Iterator[None]:
        """A push to a local remote holds its LOCAL_PUSH_TURN shared (pushes run at once; the remote's own
        compare-and-swap orders them)."""
        root = self._local_remote()
        if root is None:
            yield
            return
        with (root / LOCAL_PUSH_TURN).open("a") as turn:
            fcntl.flock(turn, fcntl.LOCK_SH)
            try:
                yield
            finally:
                fcntl.flock(turn, fcntl.LOCK_UN)

    def _clear_stale_ref_lock(self, ref: Ref) -> bool:
        """After a local remote's `ref` was found locked: once no push holds the remote's LOCAL_PUSH_TURN (waiting at
        most STALE_REF_LOCK_WAIT_SECONDS), a lock file of `ref` still there was left by a killed writer: removed.
        True if one was removed (push again), False otherwise (a live writer moved the ref, or still holds it)."""
        root = self._local_remote()
        if root is None:
            return False
        deadline = time.monotonic() + STALE_REF_LOCK_WAIT_SECONDS
        with (root / LOCAL_PUSH_TURN).open("a") as turn:
            while True:
                try:
                    fcntl.flock(turn, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        return False
                    time.sleep(0.01)
            try:
                lock = root / f"{os.fsdecode(ref)}.lock"
                if not lock.exists():
                    return False
                lock.unlink()
                return True
            finally:
                fcntl.flock(turn, fcntl.LOCK_UN)

    def _head_of(self, heads: Mapping[Ref, ObjectID]) -> str:
        sha = heads.get(self._branch) or heads.get(self._base)
        return sha.decode() if sha else ROOT_HEAD

    def _moved(self, head: str | None, expected_head: str) -> str:
        where = f"is at {head[:12]}" if head else "moved"
        return f"branch {self.remote.branch} of {self.workspace_id} {where}, expected {expected_head[:12]}"

    def _job_commits(self, repo: Repo, heads: Mapping[Ref, ObjectID]) -> Iterator[Commit]:
        """The branch's commits with a job trailer, newest first, down to (not into) the base branch."""
        branch = heads.get(self._branch)
        if branch is None:
            return
        base = heads.get(self._base)
        walker = Walker(repo.object_store, include=[branch], exclude=[base] if base else None, order=ORDER_TOPO)
        for entry in walker:
            job_id = job_id_of(entry.commit.message)
            if job_id is None:
                continue
            parents = entry.commit.parents
            yield Commit(
                sha=entry.commit.id.decode(),
                parent=parents[0].decode() if parents else ROOT_HEAD,
                job_id=job_id,
                message=entry.commit.message.decode("utf-8", errors="replace"),
                patch="",  # git keeps the trees, not the patch text; `git diff <parent> <sha>` shows the change
            )


def evict_caches(cache_root: Path, budget_bytes: int) -> list[Path]:
    """Remove the least recently used caches under `cache_root` until the rest take at most `budget_bytes`; returns
    the removed ones. A cache in use (its flock held) is never removed: it is skipped, and counts against the budget.

    A cache's last use is its lock file's modification time (`GitWorkspace._cache` touches it). The lock files stay:
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


def job_id_of(message: bytes) -> str | None:
    """The jobId of the `Agent-Job-Id` trailer, which must be in the message's last paragraph (its trailer block)."""
    trailer_block = message.rstrip().rsplit(b"\n\n", 1)[-1]
    found = _TRAILER.findall(trailer_block)
    return found[-1].decode() if found else None


def _test_result_ref(job_id: str, head: str) -> Ref:
    if not re.match(ID_PATTERN, job_id) or not _SHA.match(head):
        raise ValueError(f"a test result is stored per job id and commit sha, got {job_id!r} and {head!r}")
    ref = Ref(f"{TEST_RESULTS_NAMESPACE}/{job_id}/{head}".encode())
    if not check_ref_format(Ref(ref[len(b"refs/") :])):
        raise ValueError(f"job id {job_id!r} cannot name a git ref")
    return ref


def _commit(store: BaseObjectStore, sha: str) -> GitCommit:
    obj = store[ObjectID(sha.encode())]
    if not isinstance(obj, GitCommit):
        raise ValueError(f"{sha} is not a commit")
    return obj


def _new_commit(tree: ObjectID, *, parents: list[ObjectID], message: str, author: str) -> GitCommit:
    now = int(time.time())
    commit = GitCommit()
    commit.tree = tree
    commit.parents = parents
    commit.author = author.encode()
    commit.committer = DEFAULT_IDENTITY.encode()
    commit.author_time = commit.commit_time = now
    commit.author_timezone = commit.commit_timezone = 0
    commit.message = message.encode()
    return commit


def _patched_tree(store: BaseObjectStore, tree: ObjectID | None, patch: str, limits: PatchLimits) -> ObjectID:
    """Apply `patch` to `tree` (None: the empty tree) and store the new blobs and trees; returns the new root."""

    def entry(path: str) -> tuple[int, ObjectID] | None:
        if tree is None:
            return None
        try:
            root = store[tree]
            assert isinstance(root, Tree)
            return root.lookup_path(store.__getitem__, path.encode())
        except (KeyError, NotTreeError):
            return None
        except SubmoduleEncountered as error:
            raise PatchDoesNotApplyError(path, None, "is inside a submodule, which cannot be patched") from error

    def read(path: str) -> bytes | None:
        found = entry(path)
        if found is None:
            return None
        mode, sha = found
        if stat.S_ISDIR(mode) or S_ISGITLINK(mode):
            raise PatchDoesNotApplyError(path, None, "is a folder or a submodule in the workspace, not a file")
        _inflating(_cached_size(store, sha))
        blob = store[sha]
        assert isinstance(blob, Blob)
        return blob.data

    changes = apply_patch_to_files(patch, read, limits)
    modes: dict[str, int] = {}  # modes this patch gave, for a later rename of the same file

    def mode_of(change: FileChange) -> int:
        if change.mode is not None:
            return change.mode
        source = change.old_path or change.path
        if source in modes:
            return modes[source]
        found = entry(source)
        return found[0] if found else REGULAR_FILE_MODE

    root = _Folder(store, tree)
    for change in changes:
        mode = mode_of(change)
        if change.old_path is not None:
            root.remove(change.old_path.encode())
            modes.pop(change.old_path, None)
        if change.content is None:
            root.remove(change.path.encode())
            modes.pop(change.path, None)
            continue
        blob = Blob.from_string(change.content)
        store.add_object(blob)
        root.put(change.path, mode, blob.id)
        modes[change.path] = mode
    return root.write() or _empty_tree(store)


def _empty_tree(store: BaseObjectStore) -> ObjectID:
    tree = Tree()
    store.add_object(tree)
    return tree.id


class _Folder:
    """A tree being edited: only the folders on a changed path are loaded and rewritten."""

    def __init__(self, store: BaseObjectStore, tree: ObjectID | None) -> None:
        self._store = store
        self._entries: dict[bytes, tuple[int, ObjectID] | _Folder] = {}
        if tree is not None:
            existing = store[tree]
            assert isinstance(existing, Tree)
            self._entries = {item.path: (item.mode, item.sha) for item in existing.iteritems()}

    def _folder(self, name: bytes, path: str) -> _Folder:
        existing = self._entries.get(name)
        if isinstance(existing, _Folder):
            return existing
        if existing is not None and not stat.S_ISDIR(existing[0]):
            raise PatchDoesNotApplyError(path, None, f"{name.decode(errors='replace')} is a file, not a folder")
        folder = _Folder(self._store, existing[1] if existing else None)
        self._entries[name] = folder
        return folder

    def put(self, path: str, mode: int, sha: ObjectID) -> None:
        *folders, name = path.encode().split(b"/")
        target = self
        for part in folders:
            target = target._folder(part, path)
        existing = target._entries.get(name)
        if (isinstance(existing, _Folder) and not existing.is_empty()) or (
            isinstance(existing, tuple) and (stat.S_ISDIR(existing[0]))
        ):
            raise PatchDoesNotApplyError(path, None, "is a folder in the workspace, not a file")
        target._entries[name] = (mode, sha)

    def is_empty(self) -> bool:
        return all(isinstance(item, _Folder) and item.is_empty() for item in self._entries.values())

    def remove(self, path: bytes) -> None:
        first, _, rest = path.partition(b"/")
        if not rest:
            self._entries.pop(first, None)
            return
        existing = self._entries.get(first)
        if existing is None or (not isinstance(existing, _Folder) and not stat.S_ISDIR(existing[0])):
            return
        self._folder(first, path.decode(errors="replace")).remove(rest)

    def write(self) -> ObjectID | None:
        """Store this folder's tree (and its changed subfolders'); None when it ends up empty (git has no such tree)."""
        tree = Tree()
        for name, item in self._entries.items():
            if isinstance(item, _Folder):
                sub = item.write()
                if sub is not None:
                    tree.add(name, stat.S_IFDIR, sub)
            else:
                tree.add(name, item[0], item[1])
        if not tree.items():
            return None
        self._store.add_object(tree)
        return tree.id


class _CheckoutBudget:
    """The bytes a checkout may still write (MAX_CHECKOUT_BYTES). Every file, folder or link counts CHECKOUT_ENTRY_BYTES
    on top of its content: a tree of countless empty files (or of folders repeating one another, which git stores once)
    takes disk space and time too."""

    def __init__(self, limit: int, sha: str) -> None:
        self.limit = limit
        self.left = limit
        self._sha = sha

    def spend(self, size: int) -> None:
        self.left -= size
        if self.left < 0:
            raise PermanentJobError(
                f"the checkout of {self._sha[:12]} is larger than the {self.limit}-byte limit of MAX_CHECKOUT_BYTES;"
                " shrink the branch's tree or raise MAX_CHECKOUT_BYTES"
            )


def _write_tree_to_folder(store: BaseObjectStore, tree_id: ObjectID, folder: Path, budget: _CheckoutBudget) -> None:
    tree = store[tree_id]
    assert isinstance(tree, Tree)
    for item in tree.iteritems():
        name = os.fsdecode(item.path)
        if name in ("", ".", "..") or name.lower() == ".git" or "/" in name or "\0" in name:
            raise ValueError(f"refusing to write the tree entry {name!r} of {tree_id.decode()}")
        target = folder / name
        budget.spend(CHECKOUT_ENTRY_BYTES)
        if stat.S_ISDIR(item.mode):
            target.mkdir()
            _write_tree_to_folder(store, item.sha, target, budget)
        elif S_ISGITLINK(item.mode):
            target.mkdir()  # a submodule: an empty folder, as a clone without --recurse-submodules leaves it
        else:
            _inflating(_cached_size(store, item.sha))
            blob: ShaFile = store[item.sha]
            assert isinstance(blob, Blob)
            budget.spend(len(blob.data))
            if stat.S_ISLNK(item.mode):
                os.symlink(blob.data, target)
            else:
                target.write_bytes(blob.data)
                if item.mode & 0o111:
                    target.chmod(0o755)


@contextmanager
def _large_object_scope() -> Iterator[None]:
    """One use of a cache: the process's turn for large objects, if `_inflating` took it, is released at its end."""
    outer = getattr(_large_object_turn, "held", None)
    _large_object_turn.held = False
    try:
        yield
    finally:
        if _large_object_turn.held:
            _LARGE_OBJECT_TURN.release()
        _large_object_turn.held = outer


def _inflating(size: int) -> None:
    """Before an object of `size` bytes is inflated: above LARGE_OBJECT_BYTES, wait for the process's turn."""
    if size > LARGE_OBJECT_BYTES and getattr(_large_object_turn, "held", None) is False:
        _LARGE_OBJECT_TURN.acquire()
        _large_object_turn.held = True


def _varint(data: bytes | bytearray, start: int) -> tuple[int, int] | None:
    """A delta header's size (7 bits a byte, least significant first) at `start`, and the offset past it; None when
    `data` ends inside it."""
    size = shift = 0
    for index in range(start, len(data)):
        size |= (data[index] & 0x7F) << shift
        shift += 7
        if not data[index] & 0x80:
            return size, index + 1
    return None


def _delta_result_size(head: bytes | bytearray) -> int | None:
    """The size of the object a delta makes, from the delta's first inflated bytes (its base's size, then its own)."""
    base = _varint(head, 0)
    result = _varint(head, base[1]) if base else None
    return result[0] if result else None


class _PackGuard:
    """Receives a fetch's pack (dulwich's `pack_data` callback), writing it to `sink` while it checks the limits.

    It counts the bytes (MAX_FETCH_BYTES) and follows the pack's objects as they stream by: each object's header
    states its inflated size, and a delta's first inflated bytes state the size of the object it makes, so an object
    above MAX_BLOB_BYTES is refused before it is inflated, and the download stops there. Objects are inflated
    `_INFLATE_STEP` bytes at a time, only to find where each ends (and to check that none inflates beyond its header).
    """

    _HASH_SIZE = 20

    def __init__(self, sink: IO[bytes], limits: GitLimits, source: str) -> None:
        self._sink = sink
        self._limits = limits
        self._source = source
        self._received = 0
        self._pending = bytearray()  # received bytes not yet parsed, while outside an object's zlib stream
        self._objects_left: int | None = None  # None until the pack header is read
        self._inflater: Any = None  # the zlib stream of the current object
        self._declared = 0
        self._inflated = 0
        self._delta_head: bytearray | None = None  # a delta's first inflated bytes, until its sizes are read

    def receive(self, data: bytes) -> int:
        self._received += len(data)
        if self._received > self._limits.max_fetch_bytes:
            raise PermanentJobError(
                f"fetching from {self._source} brought more than the {self._limits.max_fetch_bytes}-byte limit of"
                " MAX_FETCH_BYTES; shrink the branch and its history, or raise MAX_FETCH_BYTES"
            )
        self._sink.write(data)
        self._parse(bytes(data))
        return len(data)

    def finish(self) -> None:
        """The fetch ended: a pack cut short inside an object is refused."""
        if self._inflater is not None or (self._objects_left or 0) > 0:
            raise RetryableJobError(f"the pack from {self._source} ended before its last object")

    def _invalid(self, why: str) -> PermanentJobError:
        return PermanentJobError(f"{self._source} sent a pack that is not valid git data ({why})")

    def _parse(self, data: bytes) -> None:
        while True:
            if self._inflater is not None:
                if not data:
                    return
                data = self._inflate(data)
                continue
            self._pending += data
            data = b""
            if self._objects_left is None:
                if len(self._pending) < 12:
                    return
                try:
                    _version, self._objects_left = read_pack_header_at(bytes(self._pending[:12]))
                except AssertionError as error:
                    raise self._invalid(str(error)) from error
                del self._pending[:12]
            if self._objects_left == 0:
                self._pending.clear()  # the pack's checksum, which dulwich verifies
                return
            if not self._start_object():
                return
            data, self._pending = bytes(self._pending), bytearray()

    def _start_object(self) -> bool:
        """Read the next object's header from the pending bytes; False when they end inside it."""
        pending = self._pending
        end = next((i + 1 for i, byte in enumerate(pending) if not byte & 0x80), None)
        if end is None:
            if len(pending) > 10:
                raise self._invalid("an object header too long")
            return False
        type_num = (pending[0] >> 4) & 0x07
        size = pending[0] & 0x0F
        for i, byte in enumerate(pending[1:end]):
            size |= (byte & 0x7F) << (i * 7 + 4)
        if type_num == OFS_DELTA:
            base_end = next((i + 1 for i in range(end, len(pending)) if not pending[i] & 0x80), None)
            if base_end is None:
                return False
            end = base_end
        elif type_num == REF_DELTA:
            if len(pending) < end + self._HASH_SIZE:
                return False
            end += self._HASH_SIZE
        if size > self._limits.max_blob_bytes:
            raise self._limits.object_too_large(self._source, size)
        _inflating(size)
        del pending[:end]
        self._objects_left = (self._objects_left or 0) - 1
        self._inflater = zlib.decompressobj()
        self._declared, self._inflated = size, 0
        self._delta_head = bytearray() if type_num in DELTA_TYPES else None
        return True

    def _inflate(self, data: bytes) -> bytes:
        """Feed `data` to the current object's zlib stream; returns what follows the stream's end, if it ended."""
        inflater = self._inflater
        while True:
            try:
                out = inflater.decompress(data, _INFLATE_STEP)
            except zlib.error as error:
                raise self._invalid(str(error)) from error
            data = inflater.unconsumed_tail
            self._inflated += len(out)
            if self._inflated > self._declared:
                raise self._invalid("an object larger than its header says")
            if self._delta_head is not None and out:
                self._delta_head += out[:32]
                result = _delta_result_size(self._delta_head)
                if result is not None:
                    if result > self._limits.max_blob_bytes:
                        raise self._limits.object_too_large(self._source, result)
                    _inflating(result)
                    self._delta_head = None
                elif len(self._delta_head) >= 20:
                    raise self._invalid("a delta header too long")
            if inflater.eof:
                self._inflater = None
                return bytes(inflater.unused_data)
            if not data and len(out) < _INFLATE_STEP:
                return b""


def _local_remote_escape(remote: Path, folder: str) -> str | None:
    """What of the local remote at `remote` leads outside `folder`, or None.

    A local remote is read and written in the worker's own process, following git's pointers as git does: a `.git`
    file or `commondir` file naming another repository, `objects/info/alternates` naming another object store, and
    symbolic links anywhere under `objects/` or `refs/` (or `packed-refs`, `HEAD`). Each must stay inside `folder`
    (symbolic links resolved), so that one tenant's remote can never hand another tenant's objects or refs to its
    workspace. Alternates inside `folder` are followed and checked in turn, at most _MAX_ALTERNATES_DEPTH deep.
    """
    zone = os.path.realpath(folder).rstrip("/") + "/"

    def outside(path: Path | str) -> bool:
        return not (os.path.realpath(path) + "/").startswith(zone)

    if outside(remote):
        return f"{remote} is not inside it once its symbolic links are resolved"
    dot_git = remote / ".git"
    if dot_git.is_file():
        return "a .git file (a pointer to another repository)"
    control = dot_git if dot_git.is_dir() else remote
    if (control / "commondir").exists():
        return "a commondir file (a pointer to another repository's objects and refs)"
    for name in ("HEAD", "packed-refs", "refs"):
        if (control / name).is_symlink() and outside(control / name):
            return f"{name} is a symbolic link to {os.path.realpath(control / name)}"
    escaped = _escaping_link(control / "refs", outside)
    if escaped is not None:
        return f"{escaped.relative_to(control)} is a symbolic link outside"
    stores, seen = [(control / "objects", 0)], set[str]()
    while stores:
        objects, depth = stores.pop()
        if outside(objects):
            return f"{objects} (objects, or an alternate object store) is outside"
        if os.path.realpath(objects) in seen:
            continue
        seen.add(os.path.realpath(objects))
        escaped = _escaping_link(objects, outside)
        if escaped is not None:
            return f"{escaped} is a symbolic link outside"
        alternates = objects / "info" / "alternates"
        if not alternates.is_file():
            continue
        for raw in alternates.read_text(errors="replace").splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            alternate = Path(line) if line.startswith("/") else objects / line
            if outside(alternate):
                return f"objects/info/alternates names {line}, outside"
            if depth + 1 > _MAX_ALTERNATES_DEPTH:
                return f"alternates more than {_MAX_ALTERNATES_DEPTH} deep"
            stores.append((alternate, depth + 1))
    return None


def _escaping_link(folder: Path, outside: Callable[[Path | str], bool]) -> Path | None:
    """The first symbolic link under `folder` (itself included) that resolves outside, walking without following
    links; None when there is none (or no folder)."""
    if folder.is_symlink() and outside(folder):
        return folder
    for parent, folders, files in os.walk(folder):
        for name in (*folders, *files):
            path = Path(parent) / name
            if path.is_symlink() and outside(path):
                return path
    return None


def _stored_size(store: DiskObjectStore, sha: ObjectID, *, depth: int = 0) -> int | None:
    """The inflated size of object `sha` in `store` or its alternates (for a delta, the larger of the delta and the
    object it makes), read from headers and a delta's first bytes, never by inflating the object; None when the store
    lacks it."""
    for pack in store.packs:
        try:
            offset = pack.index.object_offset(sha)
        except KeyError:
            continue
        with open(pack.data.path, "rb") as file:
            file.seek(offset)
            header, _ = take_msb_bytes(file.read)
            type_num = (header[0] >> 4) & 0x07
            size = header[0] & 0x0F
            for i, byte in enumerate(header[1:]):
                size |= (byte & 0x7F) << (i * 7 + 4)
            if type_num not in DELTA_TYPES:
                return size
            if type_num == OFS_DELTA:
                take_msb_bytes(file.read)
            else:
                file.read(pack.index.object_format.oid_length)
            return max(size, _inflated_head_size(file, _delta_result_size))
    hexsha = sha.decode("ascii")
    loose = Path(store.path) / hexsha[:2] / hexsha[2:]
    if loose.is_file():
        with loose.open("rb") as file:
            return _inflated_head_size(file, _loose_object_size)
    if depth < _MAX_ALTERNATES_DEPTH:
        for alternate in store.alternates:
            if isinstance(alternate, DiskObjectStore):
                borrowed = _stored_size(alternate, sha, depth=depth + 1)
                if borrowed is not None:
                    return borrowed
    return None


def _cached_size(store: BaseObjectStore, sha: ObjectID) -> int:
    """The size of object `sha` of a cache, without inflating it (0 when unknown: not a disk store, or missing)."""
    return (_stored_size(store, sha) or 0) if isinstance(store, DiskObjectStore) else 0


def _loose_object_size(head: bytes | bytearray) -> int | None:
    """The size a loose object's header ("blob 1234\\0") states, once its first inflated bytes hold it."""
    if b"\0" not in head:
        if len(head) > 64:
            raise ValueError("a loose object header too long")
        return None
    return int(bytes(head).split(b"\0", 1)[0].split(b" ", 1)[1])


def _inflated_head_size(file: IO[bytes], size_of: Callable[[bytes | bytearray], int | None]) -> int:
    """Inflate the zlib stream at `file`'s position only as far as `size_of` needs to read a size from its start."""
    inflater = zlib.decompressobj()
    head = bytearray()
    while True:
        chunk = file.read(256)
        head += inflater.decompress(chunk, 64 - len(head)) if len(head) < 64 else b""
        size = size_of(head)
        if size is not None:
            return size
        if not chunk or len(head) >= 64 or inflater.eof:
            raise ValueError("an object header that ends too soon or runs too long")


class _SizeCheckedObjects:
    """A local remote's object store as the sending side of a fetch reads it: every object the fetch reads (commits
    and trees while it walks, then each object it packs) has its stored size checked before it is inflated."""

    def __init__(self, store: DiskObjectStore, limits: GitLimits, source: str) -> None:
        self._store = store
        self._limits = limits
        self._source = source

    def _check(self, sha: ObjectID) -> None:
        try:
            size = _stored_size(self._store, sha)
        except (ValueError, IndexError, OSError) as error:
            raise PermanentJobError(
                f"{self._source} holds an object {sha.decode()} that cannot be read: {error}"
            ) from error
        if size is None and sha in self._store:
            raise PermanentJobError(
                f"{self._source} holds an object {sha.decode()} whose size cannot be read without inflating it"
                f" (more than {_MAX_ALTERNATES_DEPTH} alternates deep?); repack the remote"
            )
        if size is not None and size > self._limits.max_blob_bytes:
            raise self._limits.object_too_large(self._source, size)
        _inflating(size or 0)

    def __getitem__(self, sha: ObjectID) -> ShaFile:
        self._check(sha)
        return self._store[sha]

    def __contains__(self, sha: ObjectID) -> bool:
        return sha in self._store

    def __iter__(self) -> Iterator[ObjectID]:
        return iter(self._store)

    def get_raw(self, sha: ObjectID) -> tuple[int, bytes]:
        self._check(sha)
        return self._store.get_raw(sha)

    def iter_unpacked_subset(self, shas: Set[ObjectID], *args: Any, **kwargs: Any) -> Iterator[UnpackedObject]:
        for sha in shas:
            self._check(sha)
        return self._store.iter_unpacked_subset(shas, *args, **kwargs)

    def iterobjects_subset(self, shas: Sequence[ObjectID] | Set[ObjectID], *args: Any, **kwargs: Any) -> Any:
        for sha in shas:
            self._check(sha)
        return self._store.iterobjects_subset(shas, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


class _SizeCheckingLocalClient(LocalGitClient):
    """LocalGitClient whose fetches read the remote's objects through `_SizeCheckedObjects`: the sending side of a
    local fetch runs in this process, and would otherwise inflate a huge object before the pack reaches _PackGuard."""

    def __init__(self, limits: GitLimits, source: str) -> None:
        super().__init__()
        self._limits = limits
        self._source = source

    def _open_repo(self, path: str | bytes) -> closing[Repo]:  # type: ignore[override]
        repo = Repo(os.fsdecode(path))
        assert isinstance(repo.object_store, DiskObjectStore)
        repo.object_store = _SizeCheckedObjects(repo.object_store, self._limits, self._source)  # type: ignore[assignment]
        return closing(repo)
