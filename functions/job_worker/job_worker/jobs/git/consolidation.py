"""Few packs in a workspace's cache.

Every fetch into a cache adds a pack, and every object read looks through each pack's index: after a few hundred jobs a
job spent most of its time opening the indexes of hundreds of packs. git keeps this in check with `gc.autoPackLimit`
(`git gc --auto`); dulwich does not. So at the end of each use of a cache (`jobs.git.cache`), a cache holding more
than PACK_LIMIT packs has its smaller packs merged into one, and one holding more than a few dozen loose objects (each
job's own commit is written loose) has them packed. A remote's packs are never merged here: a push to a local remote
writes its few objects loose, as git's receive-pack does (`jobs.git.transport`), and what its owner keeps there is
never read or rewritten by a push.

Which packs are merged follows git's geometric repacking: packs ordered by their number of objects, the smallest are
merged until the next one holds at least twice what the merged ones do. A large pack (the first fetch of a big
repository) is left alone while the small ones are merged, and each object is rewritten a logarithmic number of times
over the repository's life, so the cost per job stays flat. Packs with a `.keep` file and packs above
MERGE_MAX_PACK_BYTES are never merged, and one merge rewrites at most MERGE_MAX_BYTES of packs.

Nothing is ever lost to a crash: the merged pack is written whole (its data, then its index) and renamed into place
before the packs it replaces are removed, and an object is never deleted before the pack holding it is in place. What
a crash leaves is at worst the same objects in two packs, merged away the next time. Objects above MAX_BLOB_BYTES are
never inflated: a cache holding one is left as it is.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from dulwich.object_store import DiskObjectStore
from dulwich.objects import ObjectID
from dulwich.pack import generate_unpacked_objects, load_pack_index

from job_worker.jobs.git.object_sizes import inflating, stored_size

# More packs than this and the smaller ones are merged (git's gc.autoPackLimit is 50; a dulwich read costs more).
PACK_LIMIT = 10
# More folders of loose objects than this in a cache (of 256 possible) and its loose objects are packed.
LOOSE_FOLDER_LIMIT = 64
# A pack file above this is never merged: it is large enough (a first fetch, a repository's own history), and merged
# packs are written without deltas, so rewriting it would cost a job far more than its reads save, and grow the
# repository.
MERGE_MAX_PACK_BYTES = 16 * 1024 * 1024
# One merge rewrites at most this many bytes of pack files (the smallest first): a merge runs in a job's time.
MERGE_MAX_BYTES = 64 * 1024 * 1024
_HEX = frozenset("0123456789abcdef")
_PACK_SIDE_FILES = (".rev", ".bitmap", ".mtimes")


@dataclass(frozen=True)
class _PackFile:
    basename: str  # the path without ".pack"
    count: int  # of objects, from its index's header
    size: int  # of the pack file, in bytes

    def objects(self, store: DiskObjectStore) -> list[ObjectID]:
        index = load_pack_index(f"{self.basename}.idx", store.object_format)
        try:
            return list(index)
        finally:
            index.close()


def consolidate(store: DiskObjectStore, max_object_bytes: int, *, pack_loose: bool) -> bool:
    """Pack the loose objects (when `pack_loose` and they fill more than LOOSE_FOLDER_LIMIT folders), then merge the
    smaller packs (when there are more than PACK_LIMIT); True if anything was rewritten. The caller holds the
    repository alone. Below both limits this lists two folders and reads nothing else."""
    rewritten = False
    # Counted as git's `gc --auto` estimates them, without listing them: here by the folders they fill (about
    # LOOSE_FOLDER_LIMIT * 1.2 objects when it is reached, as each object's folder is the first byte of its sha).
    if pack_loose and len(_loose_folders(store)) > LOOSE_FOLDER_LIMIT:
        rewritten = _pack_loose(store, max_object_bytes)
    if pack_files_over(Path(store.pack_dir), PACK_LIMIT):
        packs = _pack_files(store)
        if len(packs) > PACK_LIMIT:
            merged = _within_merge_bytes(_geometric_rollup(packs))
            rewritten = (len(merged) >= 2 and _merge(store, merged, max_object_bytes)) or rewritten
    return rewritten


def pack_files_over(pack_folder: Path, limit: int) -> bool:
    """Whether `pack_folder` holds more than `limit` pack files (counted from one listing, without opening any)."""
    try:
        names = os.listdir(pack_folder)
    except OSError:
        return False
    return sum(name.endswith(".pack") for name in names) > limit


def _loose_folders(store: DiskObjectStore) -> list[Path]:
    """The folders of loose objects (`objects/<2 hex digits>/`), listed with one read of the objects folder."""
    try:
        names = os.listdir(store.path)
    except OSError:
        return []
    return [Path(store.path) / name for name in names if len(name) == 2 and all(c in _HEX for c in name)]


def _loose_objects(folders: list[Path]) -> list[ObjectID]:
    found: list[ObjectID] = []
    for folder in folders:
        try:
            names = os.listdir(folder)
        except OSError:
            continue  # not a folder
        found += [ObjectID((folder.name + name).encode()) for name in names if len(name) == 38]
    return found


def _pack_loose(store: DiskObjectStore, max_object_bytes: int) -> bool:
    """Write all loose objects into one pack, then remove them and their emptied folders."""
    folders = _loose_folders(store)
    loose = _loose_objects(folders)
    if not loose or not _fit(store, loose, max_object_bytes):
        return False
    _write_pack(store, loose)
    for sha in loose:
        store.delete_loose_object(sha)
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when empty; another object's folder stays
    return True


def _pack_files(store: DiskObjectStore) -> list[_PackFile]:
    """The store's complete packs (a `.pack` with its `.idx`) without a `.keep` file and at most MERGE_MAX_PACK_BYTES,
    with their number of objects."""
    packs = []
    folder = Path(store.pack_dir)
    for data in sorted(folder.glob("*.pack")) if folder.is_dir() else []:
        basename = str(data)[: -len(".pack")]
        if not Path(f"{basename}.idx").exists() or Path(f"{basename}.keep").exists():
            continue
        try:
            size = data.stat().st_size
        except OSError:
            continue  # removed meanwhile
        if size > MERGE_MAX_PACK_BYTES:
            continue
        index = load_pack_index(f"{basename}.idx", store.object_format)
        try:
            packs.append(_PackFile(basename, len(index), size))
        finally:
            index.close()
    return packs


def _geometric_rollup(packs: list[_PackFile]) -> list[_PackFile]:
    """The smallest packs, up to the first one that holds at least twice their objects (always two at least)."""
    ordered = sorted(packs, key=lambda pack: pack.count)
    total = 0
    for taken, pack in enumerate(ordered):
        if taken >= 2 and pack.count >= 2 * total:
            return ordered[:taken]
        total += pack.count
    return ordered


def _within_merge_bytes(packs: list[_PackFile]) -> list[_PackFile]:
    """The smallest of `packs` that take at most MERGE_MAX_BYTES together."""
    taken: list[_PackFile] = []
    total = 0
    for pack in sorted(packs, key=lambda pack: pack.size):
        if total + pack.size > MERGE_MAX_BYTES:
            break
        taken.append(pack)
        total += pack.size
    return taken


def _merge(store: DiskObjectStore, packs: list[_PackFile], max_object_bytes: int) -> bool:
    objects = list(dict.fromkeys(sha for pack in packs for sha in pack.objects(store)))
    if not _fit(store, objects, max_object_bytes):
        return False
    written = _write_pack(store, objects)
    for pack in packs:
        if pack.basename != written:
            _remove_pack_files(pack.basename)
    store.close()  # forget the removed packs; the store reads the pack folder again on its next use
    return True


def _fit(store: DiskObjectStore, objects: list[ObjectID], max_object_bytes: int) -> bool:
    """Whether every object is at most `max_object_bytes` inflated, read from its headers (and the process's turn for
    large objects taken, when one is above LARGE_OBJECT_BYTES)."""
    largest = max((stored_size(store, sha) or 0 for sha in objects), default=0)
    if largest > max_object_bytes:
        return False
    inflating(largest)
    return True


def _write_pack(store: DiskObjectStore, objects: list[ObjectID]) -> str | None:
    """Write `objects` into one new pack (complete, with its index, before this returns); its basename."""
    # Whole objects: dulwich's search for deltas to reuse reads every object of every pack.
    unpacked = generate_unpacked_objects(store, [(sha, None) for sha in objects], reuse_deltas=False)
    pack = store.add_pack_data(len(objects), unpacked)
    if pack is None:
        return None
    return str(pack.data.path)[: -len(".pack")]


def _remove_pack_files(basename: str) -> None:
    """Remove a pack that another pack now holds all of: its data first, so a crash leaves no pack without index."""
    for suffix in (".pack", ".idx", *_PACK_SIDE_FILES):
        Path(f"{basename}{suffix}").unlink(missing_ok=True)
