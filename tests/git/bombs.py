"""Hostile remotes built cheaply: a pack of one huge zero-filled file is written by streaming zlib, so a 200 MiB file
costs a fraction of a MiB on disk and never sits in memory, here or in the code under test unless it inflates it."""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dulwich.client import FetchPackResult
from dulwich.object_format import DEFAULT_OBJECT_FORMAT
from dulwich.objects import Commit, ObjectID, ShaFile, Tree
from dulwich.pack import pack_object_header, write_pack_index
from dulwich.refs import Ref
from dulwich.repo import Repo

BLOB_TYPE = 3
MIB = 1024 * 1024
NEW_FILE = "--- /dev/null\n+++ b/hello.txt\n@@ -0,0 +1 @@\n+hello\n"


def write_zero_blob_pack(
    objects_dir: Path, size: int, *, header_size: int | None = None, after: Sequence[ShaFile] = ()
) -> tuple[ObjectID, Path]:
    """Store a blob of `size` zero bytes, then the objects `after`, as a pack in `objects_dir/pack`; returns the blob's
    id and the pack file. `header_size` writes another size into the blob's pack header (a pack that lies)."""
    zeros = bytes(MIB)
    sha = hashlib.sha1(f"blob {size}\0".encode())
    compressor = zlib.compressobj(1)
    body = bytearray()
    left = size
    while left:
        chunk = zeros[: min(left, MIB)]
        sha.update(chunk)
        body += compressor.compress(chunk)
        left -= len(chunk)
    body += compressor.flush()
    header = bytes(pack_object_header(BLOB_TYPE, None, header_size or size, DEFAULT_OBJECT_FORMAT))
    entries = [(sha.digest(), header + bytes(body))]
    for obj in after:
        raw = obj.as_raw_string()
        small = bytes(pack_object_header(obj.type_num, None, len(raw), DEFAULT_OBJECT_FORMAT)) + zlib.compress(raw)
        entries.append((obj.sha().digest(), small))
    pack = bytearray(b"PACK" + (2).to_bytes(4, "big") + len(entries).to_bytes(4, "big"))
    index_entries = []
    for digest, entry in entries:
        index_entries.append((digest, len(pack), zlib.crc32(entry)))
        pack += entry
    checksum = hashlib.sha1(pack).digest()
    pack_dir = objects_dir / "pack"
    pack_dir.mkdir(parents=True, exist_ok=True)
    name = f"pack-{checksum.hex()}"
    (pack_dir / f"{name}.pack").write_bytes(bytes(pack) + checksum)
    with (pack_dir / f"{name}.idx").open("wb") as index:
        write_pack_index(index, sorted(index_entries), checksum)
    return ObjectID(sha.hexdigest().encode()), pack_dir / f"{name}.pack"


def zero_bomb_remote(path: Path, size: int, branch: str = "main", *, header_size: int | None = None) -> Path:
    """A bare remote whose `branch` has one commit of one file, `zeros.bin`: `size` zero bytes, all in one pack (the
    blob first), which `bomb_pack` finds."""
    Repo.init_bare(str(path), mkdir=True, default_branch=branch.encode()).close()
    blob = _zero_blob_id(size)
    tree = Tree()
    tree.add(b"zeros.bin", 0o100644, blob)
    commit = Commit()
    commit.tree = tree.id
    commit.author = commit.committer = b"Mallory <mallory@example.com>"
    commit.author_time = commit.commit_time = 1_700_000_000
    commit.author_timezone = commit.commit_timezone = 0
    commit.message = b"a small pack\n"
    write_zero_blob_pack(path / "objects", size, header_size=header_size, after=[tree, commit])
    with Repo(str(path)) as repo:
        repo.refs[Ref(f"refs/heads/{branch}".encode())] = commit.id
    return path


def bomb_pack(remote: Path) -> Path:
    """The one pack of a `zero_bomb_remote`."""
    (pack,) = (remote / "objects" / "pack").glob("*.pack")
    return pack


def _zero_blob_id(size: int) -> ObjectID:
    sha = hashlib.sha1(f"blob {size}\0".encode())
    zeros = bytes(MIB)
    left = size
    while left:
        sha.update(zeros[: min(left, MIB)])
        left -= min(left, MIB)
    return ObjectID(sha.hexdigest().encode())


class StreamedRemote:
    """A network remote as GitWorkspace's fetch sees one: the refs of a bare repository, then its one pack streamed to
    the `pack_data` callback 64 KiB at a time. `sent` counts the bytes it handed over until the receiver stopped it."""

    def __init__(self, remote: Path, pack: Path | None = None) -> None:
        self._remote = remote
        self._pack = pack or bomb_pack(remote)
        self.sent = 0

    def fetch_pack(
        self,
        path: bytes,
        determine_wants: Callable[[Mapping[Ref, ObjectID], int | None], list[ObjectID]],
        graph_walker: Any,
        pack_data: Callable[[bytes], int],
        **kwargs: Any,
    ) -> FetchPackResult:
        with Repo(str(self._remote)) as repo:
            refs = repo.refs.as_dict()
        if determine_wants(refs, None):
            with self._pack.open("rb") as pack:
                while chunk := pack.read(64 * 1024):
                    self.sent += len(chunk)
                    pack_data(chunk)
        return FetchPackResult(dict(refs), {}, b"test")
