"""Which remote and branch a git workspace is: the url, the branches, the credentials and who registered it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from dulwich.refs import Ref, check_ref_format


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
    # folder of the remotes root; see `jobs.git.confinement`). Empty: the remote is read as git reads it.
    confined_to: str = ""
    # The PEM of the one CA this remote's TLS certificate must chain to instead of the system's (the `sam local` git
    # server's local CA). Empty: the system's CAs.
    ca_pem: str = field(default="", repr=False)

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
