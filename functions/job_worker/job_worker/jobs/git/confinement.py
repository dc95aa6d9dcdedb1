"""A file-system remote kept inside its tenant's folder, also through git's own pointers to other repositories."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

# How deep a local remote's alternates (objects/info/alternates) are followed, to check them or to read a size.
MAX_ALTERNATES_DEPTH = 5


def local_remote_escape(remote: Path, folder: str) -> str | None:
    """What of the local remote at `remote` leads outside `folder`, or None.

    A local remote is read and written in the worker's own process, following git's pointers as git does: a `.git`
    file or `commondir` file naming another repository, `objects/info/alternates` naming another object store, and
    symbolic links anywhere under `objects/` or `refs/` (or `packed-refs`, `HEAD`). Each must stay inside `folder`
    (symbolic links resolved), so that one tenant's remote can never hand another tenant's objects or refs to its
    workspace. Alternates inside `folder` are followed and checked in turn, at most MAX_ALTERNATES_DEPTH deep.
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
            if depth + 1 > MAX_ALTERNATES_DEPTH:
                return f"alternates more than {MAX_ALTERNATES_DEPTH} deep"
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
