"""The connection to one remote: fetches into a cache within the limits, and compare-and-swap pushes.

The remote branch moves only by compare-and-swap: a push states the old value it expects and the remote refuses it if
the branch has moved since (git's receive-pack, or dulwich's `set_if_equals` for a local remote, re-check the old value
while holding the ref's lock).

A writer killed mid-update (an invocation that crashed or timed out, taking every job it held with it) leaves a ref's
git lock file behind, and git refuses every later update of that ref. A remote on this machine's file system is
written by the pushing worker itself, so its pushes hold an flock (`LOCAL_PUSH_TURN`, released by the system when its
holder dies) shared, and a push that finds a ref locked takes it exclusively: a lock file still there then has no live
writer and is removed. The branch and the test-result refs of a local remote are written by Agent Jobs only. Before
each use, a local remote with a confining folder is checked against it (`jobs.git.confinement`). A push of fewer than
UNPACK_LIMIT objects to a local remote writes them loose, as git's receive-pack does, so the remote does not gain a
pack per push; the remote's own packs are never rewritten. An HTTPS remote is verified against the system's CAs, or
against the one CA its `GitRemote.ca_pem` names (the `sam local` git server's).

A cold cache (one that holds no ref yet: every new execution environment's first job on a workspace) fetches the tips
it wants at depth 1, as `git clone --depth 1` does, so a first job costs what the tip trees cost, whatever the history.
What needs more history asks for it (`deepen`, from the tips, at growing depths): the trailer walk
(`jobs.git.branch`) and a checkout of an older commit. A remote on this machine's file system is always fetched so; an
HTTPS remote only when its server can deepen a shallow cache (it advertises `deepen-not`, as git's upload-pack, and
GitHub's, do), and in full otherwise. The cache records its shallow commits in its `shallow` file, as git does.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from contextlib import closing, contextmanager
from pathlib import Path

from dulwich.client import LocalGitClient, get_transport_and_path
from dulwich.config import ConfigDict
from dulwich.errors import NotGitRepository
from dulwich.file import FileLocked
from dulwich.objects import ObjectID, ShaFile
from dulwich.pack import UnpackedObject, generate_unpacked_objects
from dulwich.refs import Ref
from dulwich.repo import Repo

from job_worker.jobs.errors import PermanentJobError, RetryableJobError
from job_worker.jobs.git.bounded_fetch import PackGuard, SizeCheckingLocalClient
from job_worker.jobs.git.confinement import local_remote_escape
from job_worker.jobs.git.new_objects import objects_to_send
from job_worker.jobs.git.remote import GitRemote
from job_worker.jobs.limits import GitLimits

# A remote on this machine's file system (a path or file:// URL) is written by the pushing worker itself. Every push
# to it holds this file of the remote shared (an flock, which dies with its process), so that
# a ref's git lock file found while the file is held exclusively was left by a writer killed mid-update, never by a
# live one.
LOCAL_PUSH_TURN = "agent-jobs-push.flock"
# CA certificate (PEM) -> the file of this process that holds it (`git_config_trusting`); the groups of a batch run on
# threads of one process.
_CA_FILES: dict[str, str] = {}
_CA_FILES_LOCK = threading.Lock()
# A push to a local remote of fewer objects than this is written loose, as git's receive.unpackLimit (100) does.
UNPACK_LIMIT = 100
# How long a push waits for the live pushes of a local remote to end before it takes a ref's lock file for a live one.
STALE_REF_LOCK_WAIT_SECONDS = 5.0
# How deep a cold cache fetches its tips; then the depths a walk that needs more history deepens them to, in turn, the
# last one the whole history (git's own "deepen 2147483647" for `--unshallow`).
SHALLOW_DEPTH = 1
FULL_DEPTH = 2**31 - 1
DEEPEN_DEPTHS = (8, 64, 512, FULL_DEPTH)


def git_config_trusting(ca_pem: str) -> ConfigDict:
    """A git config whose http.sslCAInfo is a file holding `ca_pem`, which dulwich's HTTPS client then trusts instead of
    the system's CAs. The file is this process's own (mkstemp, mode 0600), written once per CA: nobody else can plant
    one under its name."""
    with _CA_FILES_LOCK:
        path = _CA_FILES.get(ca_pem)
        if path is None:
            descriptor, path = tempfile.mkstemp(prefix="agent-jobs-ca-", suffix=".pem")
            with os.fdopen(descriptor, "w", encoding="utf-8") as file:
                file.write(ca_pem)
            _CA_FILES[ca_pem] = path
    config = ConfigDict()
    config.set((b"http",), b"sslCAInfo", os.fsencode(path))
    return config


class _RemoteRefusedError(Exception):
    """update_refs found the remote ref other than the push requires: nothing is sent."""


class RemoteTransport:
    """How a workspace reads and writes its remote (`client`: dulwich's, for the remote's url and credentials).

    A remote that is not there (a folder that is no git repository, or nothing; an HTTPS server answering 404) fails
    the job at once (`missing_remote`): no retry can find it, only a new registration."""

    def __init__(self, remote: GitRemote, limits: GitLimits, *, workspace_id: str | None = None) -> None:
        self.remote = remote
        self.limits = limits
        self.workspace_id = workspace_id
        credentials = remote.credentials
        self.client, remote_path = get_transport_and_path(
            remote.url,
            config=git_config_trusting(remote.ca_pem) if remote.ca_pem else None,
            username=credentials.username if credentials else None,
            password=credentials.password if credentials else None,
        )
        self._path = os.fsencode(remote_path)
        self._deepens: bool | None = None

    def fetch(self, repo: Repo, wanted: Sequence[Ref], *, depth: int | None = None) -> dict[Ref, ObjectID]:
        """Fetch what the cache lacks of `refs` and return their values on the remote (absent: not there).

        The values are the ones the remote advertised for this fetch, so every object they name is in the cache.
        The cache keeps a copy of each ref, which makes the next fetch send only what is new. A cold cache fetches
        them at SHALLOW_DEPTH where the remote can deepen it later (see the module docstring); `depth` deepens the
        cache's history of the refs' tips to that many commits (a depth the history does not have: all of it).
        """
        self._check_confined()
        if depth is None and not repo.refs.as_dict() and self.deepens():
            depth = SHALLOW_DEPTH
        advertised: dict[Ref, ObjectID] = {}

        def wants(refs: Mapping[Ref, ObjectID], depth: int | None = None) -> list[ObjectID]:
            advertised.update({ref: refs[ref] for ref in wanted if ref in refs})
            if depth is not None:
                return sorted(set(advertised.values()))  # deepening: the tips too, though the cache has them
            return sorted({sha for sha in advertised.values() if sha not in repo.object_store})

        # As dulwich's GitClient.fetch does, but the pack goes through PackGuard on its way to a file that the
        # system removes even if this process dies, and a local remote is read through its size-checking client.
        client = SizeCheckingLocalClient(self.limits, self.remote.display_url) if self.local_root() else self.client
        with tempfile.TemporaryFile(dir=repo.object_store.path, prefix="incoming-") as pack, self._remote_there():
            guard = PackGuard(pack, self.limits, self.remote.display_url)
            result = client.fetch_pack(
                self._path, wants, repo.get_graph_walker(), guard.receive, ref_prefix=list(wanted), depth=depth
            )
            guard.finish()
            if pack.tell():
                pack.seek(0)
                repo.object_store.add_thin_pack(pack.read, None)
        # A remote over the network states the cache's new shallow commits in its answer; a local one's fetch has
        # already recorded them through the cache's graph walker.
        if result.new_shallow or result.new_unshallow:
            repo.update_shallow(result.new_shallow, result.new_unshallow)
        local = repo.refs.as_dict()
        for ref in wanted:
            if ref in advertised:
                repo.refs[ref] = advertised[ref]
            elif ref in local:
                del repo.refs[ref]
        return advertised

    def deepens(self) -> bool:
        """Whether the remote can deepen a shallow cache: a local one always; an HTTPS server when it advertises
        `deepen-not` (git's upload-pack since 2.11, GitHub's) or protocol v2's shallow fetch. A server that cannot
        (dulwich's own, which fails a later fetch of a shallow cache) is fetched in full. Asked once per transport."""
        if self._deepens is None:
            self._deepens = self.local_root() is not None or self._server_deepens()
        return self._deepens

    def _server_deepens(self) -> bool:
        # dulwich's HTTP client reads the server's capabilities only inside a fetch; its reference discovery is the
        # same request a fetch begins with (one more round trip, for a cold cache only).
        discover = getattr(self.client, "_discover_references", None)
        url_of = getattr(self.client, "_get_url", None)
        if discover is None or url_of is None:
            return False
        with self._remote_there():
            _refs, capabilities, *_ = discover(b"git-upload-pack", url_of(self._path))
        return b"deepen-not" in capabilities or any(
            capability.startswith(b"fetch=") and b"shallow" in capability.split(b"=", 1)[1].split()
            for capability in capabilities
        )

    def push(
        self, repo: Repo, ref: Ref, new: ObjectID, still_expected: Callable[[Mapping[Ref, ObjectID]], bool]
    ) -> bool:
        """Send `new` and set the remote `ref` to it iff `still_expected(remote refs)`; False when refused.

        The old value sent with the update is the one `still_expected` approved, and the remote applies the update
        only if the ref still has that value (compare-and-swap), so a concurrent change in between is refused too.
        """
        self._check_confined()

        def update_refs(remote_refs: dict[Ref, ObjectID]) -> dict[Ref, ObjectID]:
            if not still_expected(remote_refs):
                raise _RemoteRefusedError
            return {ref: new}

        pack_data = self._pack_data(repo)

        for first_try in (True, False):
            try:
                with self._pushing(), self._remote_there():
                    result = self.client.send_pack(self._path, update_refs, generate_pack_data=pack_data)
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
        with self._remote_there():
            remote_now = self.client.get_refs(self._path).refs
        current = {name: sha for name, sha in remote_now.items() if sha is not None}
        if not still_expected(current):
            return False
        raise RetryableJobError(f"{self.remote.display_url} refused to update {ref.decode()}: {status}")

    def _pack_data(self, repo: Repo) -> Callable[..., tuple[int, Iterator[UnpackedObject]]]:
        """What a push sends: dulwich's `generate_pack_data` callback, over the cache `repo`."""

        def pack_data(
            have: Set[ObjectID],
            want: Set[ObjectID],
            *,
            ofs_delta: bool = False,
            progress: Callable[[bytes], None] | None = None,
        ) -> tuple[int, Iterator[UnpackedObject]]:
            # Only what the new commits change (`jobs.git.new_objects`), not dulwich's walk of the whole history.
            object_ids = objects_to_send(repo.object_store, have, want)
            root = self.local_root()
            if root is not None and len(object_ids) < UNPACK_LIMIT:
                # As git's receive-pack keeps a push of fewer than receive.unpackLimit objects loose: a pack per
                # push would make every later read of the remote look through one more pack index. Written here,
                # before the ref moves; the remote's own packs are never read or rewritten.
                _write_loose(root, [repo.object_store[sha] for sha in object_ids])
                return 0, iter([])
            # Whole objects: dulwich's search for deltas to reuse reads every object of every pack of the cache.
            return len(object_ids), generate_unpacked_objects(
                repo.object_store,
                [(sha, None) for sha in object_ids],
                reuse_deltas=False,
                ofs_delta=ofs_delta,
                progress=progress,
            )

        return pack_data

    def missing_remote(self) -> PermanentJobError:
        """The error of a job whose remote is not there: what to fix, and where."""
        workspace_id = self.workspace_id or "<workspaceId>"
        return PermanentJobError(
            f"the remote at {self.remote.display_url} does not exist or is not a git repository; fix the registration "
            f"with PUT /workspaces/{workspace_id} and resume the workspace"
        )

    @contextmanager
    def _remote_there(self) -> Iterator[None]:
        """dulwich's NotGitRepository, from a local remote's folder or an HTTPS remote's 404, as `missing_remote`."""
        try:
            yield
        except NotGitRepository as error:
            raise self.missing_remote() from error

    def local_root(self) -> Path | None:
        return Path(os.fsdecode(self._path)) if isinstance(self.client, LocalGitClient) else None

    def _check_confined(self) -> None:
        """Before each read or write of a local remote that has a confining folder: refuse it if git's own pointers
        lead outside that folder (checked on every use: the remote's owner may change its files at any time)."""
        root = self.local_root()
        if root is None or not self.remote.confined_to:
            return
        escape = local_remote_escape(root, self.remote.confined_to)
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
        root = self.local_root()
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
        root = self.local_root()
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


def _write_loose(root: Path, objects: Sequence[ShaFile]) -> None:
    """Write `objects` into the local remote at `root` as loose objects (each written aside and renamed into place)."""
    with closing(Repo(str(root))) as remote:
        for obj in objects:
            remote.object_store.add_object(obj)
