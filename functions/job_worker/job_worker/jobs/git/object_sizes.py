"""The size of a git object, read from its headers without inflating it, and the process's turn for large objects.

The worker runs jobs of several workspaces at once (GROUP_CONCURRENCY threads). Objects above LARGE_OBJECT_BYTES are
handled by one of them at a time: whoever meets one waits for the process's turn (`inflating`), and holds it until
its use of the cache ends (`large_object_scope`). So the worker's memory holds one large object's few copies, not one
per thread.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from dulwich.object_store import BaseObjectStore, DiskObjectStore
from dulwich.objects import ObjectID
from dulwich.pack import DELTA_TYPES, OFS_DELTA, take_msb_bytes

from job_worker.jobs.git.confinement import MAX_ALTERNATES_DEPTH

LARGE_OBJECT_BYTES = 1024 * 1024
_LARGE_OBJECT_TURN = threading.RLock()
_large_object_turn = threading.local()


@contextmanager
def large_object_scope() -> Iterator[None]:
    """One use of a cache: the process's turn for large objects, if `inflating` took it, is released at its end."""
    outer = getattr(_large_object_turn, "held", None)
    _large_object_turn.held = False
    try:
        yield
    finally:
        if _large_object_turn.held:
            _LARGE_OBJECT_TURN.release()
        _large_object_turn.held = outer


def inflating(size: int) -> None:
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


def delta_result_size(head: bytes | bytearray) -> int | None:
    """The size of the object a delta makes, from the delta's first inflated bytes (its base's size, then its own)."""
    base = _varint(head, 0)
    result = _varint(head, base[1]) if base else None
    return result[0] if result else None


def stored_size(store: DiskObjectStore, sha: ObjectID, *, depth: int = 0) -> int | None:
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
            return max(size, _inflated_head_size(file, delta_result_size))
    hexsha = sha.decode("ascii")
    loose = Path(store.path) / hexsha[:2] / hexsha[2:]
    if loose.is_file():
        with loose.open("rb") as file:
            return _inflated_head_size(file, _loose_object_size)
    if depth < MAX_ALTERNATES_DEPTH:
        for alternate in store.alternates:
            if isinstance(alternate, DiskObjectStore):
                borrowed = stored_size(alternate, sha, depth=depth + 1)
                if borrowed is not None:
                    return borrowed
    return None


def cached_size(store: BaseObjectStore, sha: ObjectID) -> int:
    """The size of object `sha` of a cache, without inflating it (0 when unknown: not a disk store, or missing)."""
    return (stored_size(store, sha) or 0) if isinstance(store, DiskObjectStore) else 0


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
