"""What one fetch may bring into the worker (`GitLimits`: MAX_BLOB_BYTES, MAX_FETCH_BYTES), checked before inflating.

A fetch counts the pack bytes as they arrive and reads every object's size from its pack header (a delta's from the
delta's own header) before the object is inflated (`PackGuard`), so a small pack of a huge zero-filled file is refused
after a few bytes of it, in bounded memory. A remote on this machine's file system is read through a store that checks
each object's stored size the same way before the sending side inflates it (`SizeCheckingLocalClient`). Going over a
limit is a PermanentJobError naming the setting to raise: the remote is the same on every retry.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Iterator, Sequence, Set
from contextlib import closing
from typing import IO, Any

from dulwich.client import LocalGitClient
from dulwich.object_store import DiskObjectStore, MissingObjectFinder
from dulwich.objects import ObjectID, RawObjectID, ShaFile, hex_to_sha, sha_to_hex
from dulwich.pack import DELTA_TYPES, OFS_DELTA, REF_DELTA, UnpackedObject, read_pack_header_at
from dulwich.repo import Repo

from job_worker.jobs.errors import PermanentJobError, RetryableJobError
from job_worker.jobs.git.confinement import MAX_ALTERNATES_DEPTH
from job_worker.jobs.git.object_sizes import delta_result_size, inflating, stored_size
from job_worker.jobs.limits import GitLimits

# A fetch inflates an object this many bytes at a time while it looks for the object's end in the pack.
_INFLATE_STEP = 64 * 1024


class PackGuard:
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
            raise self._limits.fetch_too_large(self._source)
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
        inflating(size)
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
                result = delta_result_size(self._delta_head)
                if result is not None:
                    if result > self._limits.max_blob_bytes:
                        raise self._limits.object_too_large(self._source, result)
                    inflating(result)
                    self._delta_head = None
                elif len(self._delta_head) >= 20:
                    raise self._invalid("a delta header too long")
            if inflater.eof:
                self._inflater = None
                return bytes(inflater.unused_data)
            if not data and len(out) < _INFLATE_STEP:
                return b""


class _SizeCheckedObjects:
    """A local remote's object store as the sending side of a fetch reads it: every object the fetch reads (commits
    and trees while it walks, then each object it packs) has its stored size checked before it is inflated."""

    def __init__(self, store: DiskObjectStore, limits: GitLimits, source: str) -> None:
        self._store = store
        self._limits = limits
        self._source = source

    def _check(self, sha: ObjectID) -> None:
        try:
            size = stored_size(self._store, sha)
        except (ValueError, IndexError, OSError) as error:
            raise PermanentJobError(
                f"{self._source} holds an object {sha.decode()} that cannot be read: {error}"
            ) from error
        if size is None and sha in self._store:
            raise PermanentJobError(
                f"{self._source} holds an object {sha.decode()} whose size cannot be read without inflating it"
                f" (more than {MAX_ALTERNATES_DEPTH} alternates deep?); repack the remote"
            )
        if size is not None and size > self._limits.max_blob_bytes:
            raise self._limits.object_too_large(self._source, size)
        inflating(size or 0)

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

    def iter_unpacked_subset(self, shas: Set[ObjectID], **_: Any) -> Iterator[UnpackedObject]:
        """The deltas a fetch of `shas` can send as they are stored (dulwich's `find_reusable_deltas` asks for them):
        each object of `shas` stored in a pack as a delta whose base is in `shas` too, as a REF_DELTA. The other
        objects are sent whole. Each is looked up in the packs' indexes and read alone: dulwich's own reads every
        object of every pack to find them, which costs what the remote's whole history costs (time and memory),
        however few objects the fetch sends."""
        for sha in shas:
            self._check(sha)
        return self._stored_deltas(frozenset(shas))

    def _stored_deltas(self, shas: Set[ObjectID]) -> Iterator[UnpackedObject]:
        left = set(shas)
        for pack in self._store.packs:
            here: dict[int, ObjectID] = {}  # offset in this pack -> object
            for sha in left:
                try:
                    here[pack.index.object_offset(sha)] = sha
                except KeyError:
                    continue
            left.difference_update(here.values())
            for offset in sorted(here):
                stored = pack.data.get_unpacked_object_at(offset)
                if stored.pack_type_num == OFS_DELTA:
                    assert isinstance(stored.delta_base, int)
                    base = here.get(offset - stored.delta_base)
                elif stored.pack_type_num == REF_DELTA:
                    assert isinstance(stored.delta_base, bytes)
                    base = sha_to_hex(RawObjectID(stored.delta_base))
                    base = base if base in shas else None
                else:
                    continue
                if base is not None:
                    yield UnpackedObject(
                        REF_DELTA,
                        delta_base=hex_to_sha(base),
                        decomp_len=stored.decomp_len,
                        sha=hex_to_sha(here[offset]),
                        decomp_chunks=stored.decomp_chunks,
                    )

    def iterobjects_subset(self, shas: Sequence[ObjectID] | Set[ObjectID], *args: Any, **kwargs: Any) -> Any:
        for sha in shas:
            self._check(sha)
        return self._store.iterobjects_subset(shas, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


class SizeCheckingLocalClient(LocalGitClient):
    """LocalGitClient whose fetches read the remote's objects through `_SizeCheckedObjects`: the sending side of a
    local fetch runs in this process, and would otherwise inflate a huge object before the pack reaches PackGuard."""

    def __init__(self, limits: GitLimits, source: str) -> None:
        super().__init__()
        self._limits = limits
        self._source = source

    def _open_repo(self, path: str | bytes) -> closing[Repo]:  # type: ignore[override]
        repo = Repo(os.fsdecode(path))
        assert isinstance(repo.object_store, DiskObjectStore)
        repo.object_store = _SizeCheckedObjects(repo.object_store, self._limits, self._source)  # type: ignore[assignment]
        repo.find_missing_objects = _ShallowCacheFinder(repo)  # type: ignore[method-assign]
        return closing(repo)


class _ShallowCacheFinder:
    """The local remote `repo`'s `find_missing_objects`, except for an incremental fetch into a shallow cache:
    dulwich's sends such a cache everything from the wanted tips down to its shallow commits again (it sets the
    cache's haves aside); this one sends what the cache's tips do not hold, as git's upload-pack does for a shallow
    client, walking the remote's history no deeper than the cache's shallow commits. Only the trees of the cache's
    tips count as held: an object the new commits share with an older commit is sent again, never taken as held."""

    def __init__(self, repo: Repo) -> None:
        self._repo = repo
        self._dulwich = repo.find_missing_objects

    def __call__(
        self,
        determine_wants: Callable[..., list[ObjectID]],
        graph_walker: Any,
        progress: Callable[[bytes], None] | None,
        *,
        get_tagged: Callable[[], dict[ObjectID, ObjectID]] | None = None,
        depth: int | None = None,
    ) -> MissingObjectFinder | None:
        shallow = set(getattr(graph_walker, "shallow", ()))
        if depth is not None or not shallow:
            return self._dulwich(determine_wants, graph_walker, progress, get_tagged=get_tagged, depth=depth)
        store = self._repo.object_store
        refs = {ref: sha for ref, sha in self._repo.get_refs().items() if sha in store}
        wants = determine_wants(refs, None)
        if not wants:
            return None  # nothing new: an empty pack
        haves = [sha for sha in getattr(graph_walker, "heads", ()) if sha in store]
        return MissingObjectFinder(
            store, haves=haves, wants=wants, shallow=shallow, progress=progress, get_tagged=get_tagged
        )
