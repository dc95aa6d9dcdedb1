"""A file-system remote that is not there, refused when it is registered, where the API can see it.

Under `make local` the API and the workers share this machine, and so its remotes root (WORKSPACES_REMOTE_ROOT): the
API sees whether the remote a tenant registers is a git repository. Deployed, it sees that only where the shared file
system of the remotes (an EFS mount) is mounted on the API function too, and it never calls an https:// remote (its
network reaches no tenant's git server). A remote it cannot see is found missing by the first job that uses it,
which fails at once (DEAD, the workspace halted) saying to fix the registration and resume the workspace.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlsplit


def missing_file_remote_error(remote_url: str, remote_root: str | None) -> str | None:
    """Why the file-system remote `remote_url` cannot be registered, when the remotes root is a folder on this machine
    and the remote is no git repository there; None otherwise (an https:// remote, or remotes this function cannot
    see). The tenant's bounds are checked first (`TenantBounds.file_remote_error`): the path lies in the tenant's own
    folder of the root, so this tells a tenant only about its own remotes."""
    if not remote_root or not os.path.isdir(remote_root):
        return None
    if remote_url.startswith("/"):
        path = Path(remote_url)
    elif remote_url.lower().startswith("file:"):
        path = Path(unquote(urlsplit(remote_url).path))
    else:
        return None
    if _is_git_repository(path):
        return None
    return (
        f"the remote at {remote_url} does not exist or is not a git repository; create it first (git init --bare "
        f"{path}), or register the path of a repository that exists"
    )


def _is_git_repository(path: Path) -> bool:
    """A bare repository (HEAD, objects/, refs/) or a work tree with its .git, read without following links out of
    it (the worker refuses such links in a remote anyway)."""
    if not path.is_dir():
        return False
    if os.path.lexists(path / ".git"):
        return True
    return _is(path / "HEAD", stat.S_ISREG) and _is(path / "objects", stat.S_ISDIR) and _is(path / "refs", stat.S_ISDIR)


def _is(path: Path, kind: Callable[[int], bool]) -> bool:
    """Whether `path` itself (a link is not followed) is of `kind`, e.g. `stat.S_ISDIR`."""
    try:
        return kind(os.lstat(path).st_mode)
    except OSError:
        return False
