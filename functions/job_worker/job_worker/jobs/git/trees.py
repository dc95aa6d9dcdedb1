"""Trees in a cache's object store: a patch applied to a commit's tree, and a tree written out as a checkout.

Patches are applied to trees in the object store; no working tree is ever written, except by a checkout, which stays
within MAX_CHECKOUT_BYTES.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from dulwich.errors import NotTreeError
from dulwich.object_store import BaseObjectStore, tree_lookup_path
from dulwich.objects import S_ISGITLINK, Blob, ObjectID, ShaFile, SubmoduleEncountered, Tree

from job_worker.jobs.errors import PermanentJobError
from job_worker.jobs.git.object_sizes import cached_size, inflating
from job_worker.jobs.patching import (
    REGULAR_FILE_MODE,
    FileChange,
    ParsedPatch,
    PatchDoesNotApplyError,
    apply_parsed_patch,
)

# What each file, folder or link of a checkout counts against MAX_CHECKOUT_BYTES beside its content.
CHECKOUT_ENTRY_BYTES = 512


def patched_tree(store: BaseObjectStore, tree: ObjectID | None, patch: ParsedPatch) -> ObjectID:
    """Apply `patch` to `tree` (None: the empty tree) and store the new blobs and trees; returns the new root."""

    def entry(path: str) -> tuple[int, ObjectID] | None:
        if tree is None:
            return None
        try:
            return tree_lookup_path(store.__getitem__, tree, _path_bytes(path))
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
        inflating(cached_size(store, sha))
        blob = store[sha]
        assert isinstance(blob, Blob)
        return blob.data

    # Binary hunks inflate what they make: above LARGE_OBJECT_BYTES, in the process's turn for large objects.
    inflating(min(patch.binary_bytes(), patch.max_file_bytes))
    changes = apply_parsed_patch(patch, read)
    modes: dict[str, int] = {}  # modes this patch gave, for a later rename of the same file

    def mode_of(change: FileChange) -> int:
        if change.mode is not None:
            return change.mode
        if change.copied_from is not None:  # a copy is of its source before the patch: its mode then too
            found = entry(change.copied_from)
            return found[0] if found else REGULAR_FILE_MODE
        source = change.old_path or change.path
        if source in modes:
            return modes[source]
        found = entry(source)
        return found[0] if found else REGULAR_FILE_MODE

    root = _Folder(store, tree)
    for change in changes:
        mode = mode_of(change)
        if change.old_path is not None:
            root.remove(_path_bytes(change.old_path))
            modes.pop(change.old_path, None)
        if change.content is None:
            root.remove(_path_bytes(change.path))
            modes.pop(change.path, None)
            continue
        blob = Blob.from_string(change.content)
        store.add_object(blob)
        root.put(change.path, mode, blob.id)
        modes[change.path] = mode
    return root.write() or _empty_tree(store)


def _path_bytes(path: str) -> bytes:
    """A patch's path as a tree entry's bytes: a name that is not UTF-8 keeps its bytes (`patching.patch_text`)."""
    return path.encode("utf-8", errors="surrogateescape")


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
        *folders, name = _path_bytes(path).split(b"/")
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


class CheckoutBudget:
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


def write_tree_to_folder(store: BaseObjectStore, tree_id: ObjectID, folder: Path, budget: CheckoutBudget) -> None:
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
            write_tree_to_folder(store, item.sha, target, budget)
        elif S_ISGITLINK(item.mode):
            target.mkdir()  # a submodule: an empty folder, as a clone without --recurse-submodules leaves it
        else:
            inflating(cached_size(store, item.sha))
            blob: ShaFile = store[item.sha]
            assert isinstance(blob, Blob)
            budget.spend(len(blob.data))
            if stat.S_ISLNK(item.mode):
                os.symlink(blob.data, target)
            else:
                target.write_bytes(blob.data)
                if item.mode & 0o111:
                    target.chmod(0o755)
