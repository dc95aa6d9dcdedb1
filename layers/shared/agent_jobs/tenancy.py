"""What a tenant's workspace registration may name: tokens only in its own folder under the token prefix, file-system
remotes only in its own folder under the remotes root, and only hosts that resolve to public addresses.

The API checks a registration against these bounds before storing it (a 422 naming the field), and the worker checks
again when it uses what a registration names (a registration stored before a bound existed, a name that resolves
elsewhere by now, a symlink created since), so a registration never reaches another tenant's secrets, remotes or the
network inside the deployment.

Under `sam local` only (AWS_SAM_LOCAL is "true", see `Settings.local_git_server_settings`) one more private host is
admitted: the local git server of the sample workspaces, and there only the registering tenant's own folder (a remote
`https://<host:port>/<tenantId>/<name>.git`, a GitHub API `https://<host:port>/<tenantId>/github`), so that no tenant
reaches another's remotes or pull requests through it.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:
    from agent_jobs.registration import WorkspaceRegistration
    from agent_jobs.settings import Settings

RESOLVE_TIMEOUT_SECONDS = 2.0
# Names that mean this machine whatever a resolver says.
_LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
# Shared address space (carrier-grade NAT): not private in the ipaddress module's sense, never a public service.
_SHARED_ADDRESS_SPACE = ipaddress.ip_network("100.64.0.0/10")

# A repository name on the `sam local` git server: one path segment, never '.' or '..'.
_LOCAL_GIT_REPOSITORY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}\.git$")
# Where the `sam local` git server serves a tenant's GitHub API stand-in, in the tenant's folder.
LOCAL_GITHUB_FOLDER = "github"
# A path segment below it (repos, an owner, a repository, pulls): never '.', '..' or an escape.
_LOCAL_GITHUB_SEGMENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")

Resolver = Callable[[str, int | None], list[str]]


class UnresolvableHostError(Exception):
    """A host name that does not resolve (now): accepted when registering, checked again when used."""


def resolve_host(host: str, port: int | None) -> list[str]:
    """The addresses `host` resolves to, waiting at most RESOLVE_TIMEOUT_SECONDS (getaddrinfo has no timeout)."""
    found: list[str] = []
    failed: list[BaseException] = []

    def lookup() -> None:
        try:
            found.extend(str(info[4][0]) for info in socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP))
        except (OSError, UnicodeError) as error:
            failed.append(error)

    thread = threading.Thread(target=lookup, name="resolve-host", daemon=True)
    thread.start()
    thread.join(RESOLVE_TIMEOUT_SECONDS)
    if thread.is_alive() or failed or not found:
        raise UnresolvableHostError(host)
    return found


def non_public_reason(address: str) -> str | None:
    """What `address` is when it is not a public unicast address ("a loopback address" ...), or None if it is one."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is not None:
            reason = non_public_reason(str(embedded))
            return f"{reason} (IPv4 {embedded} inside)" if reason else None
    checks = (
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("unspecified", ip.is_unspecified),
        ("multicast", ip.is_multicast),
        ("shared (100.64.0.0/10)", isinstance(ip, ipaddress.IPv4Address) and ip in _SHARED_ADDRESS_SPACE),
        ("private", ip.is_private),
        ("reserved", ip.is_reserved),
        ("not globally routable", not ip.is_global),
    )
    return next((f"a {name} address" for name, hit in checks if hit), None)


@dataclass(frozen=True)
class TenantBounds:
    """The names a tenant's registration may use (from the settings of the function that checks them)."""

    token_prefix: str = "agent-jobs"
    remote_root: str | None = None
    allowed_private_hosts: frozenset[str] = frozenset()
    # The `sam local` git server (host:port) and the PEM of its CA; None outside `sam local`.
    local_git_server: str | None = None
    local_git_ca: str | None = field(default=None, repr=False)
    # None: `resolve_host`, looked up when used.
    resolve: Resolver | None = field(default=None, compare=False)

    @classmethod
    def from_settings(cls, settings: Settings) -> TenantBounds:
        local_git = settings.local_git_server_settings
        return cls(
            token_prefix=settings.workspace_token_prefix,
            remote_root=settings.workspaces_remote_root,
            allowed_private_hosts=settings.private_hosts,
            local_git_server=local_git[0] if local_git else None,
            local_git_ca=local_git[1] if local_git else None,
        )

    # ---- tokens ------------------------------------------------------------------------------------------------------

    def token_names(self, tenant_id: str) -> str:
        return f"ssm:/{self.token_prefix}/{tenant_id}/... or secretsmanager:{self.token_prefix}/{tenant_id}/..."

    def token_parameter_error(self, reference: str, tenant_id: str) -> str | None:
        """None if `reference` names a parameter or secret in `tenant_id`'s own folder; else what to name instead."""
        store, _, name = reference.partition(":")
        folder = {"ssm": f"/{self.token_prefix}/{tenant_id}/", "secretsmanager": f"{self.token_prefix}/{tenant_id}/"}
        expected = folder.get(store)
        if expected is not None and name.startswith(expected):
            rest = name[len(expected) :].split("/")
            if all(part not in ("", ".", "..") for part in rest):
                return None
        return f"tokenParameter must name {self.token_names(tenant_id)} (this tenant's tokens, by name, not ARN)"

    # ---- file-system remotes ---------------------------------------------------------------------------------------

    def tenant_remote_root(self, tenant_id: str) -> str | None:
        if not self.remote_root:
            return None
        return f"{self.remote_root.rstrip('/')}/{tenant_id}"

    def file_remote_error(self, remote_url: str, tenant_id: str) -> str | None:
        """None if the file-system remote `remote_url` lies inside `tenant_id`'s folder of the remotes root (symlinks
        resolved when the path exists on this machine); else why not and what would be accepted."""
        tenant_root = self.tenant_remote_root(tenant_id)
        if tenant_root is None:
            return (
                "file-system remotes are not enabled here: use an https:// remote, or set the WorkspacesRemoteRoot "
                "parameter (WORKSPACES_REMOTE_ROOT) to a shared file system such as an EFS mount (/mnt/remotes); "
                "each tenant's remotes then lie under <root>/<tenantId>/"
            )
        allowed = f"remoteUrl must be a path under {tenant_root}/ (this tenant's remotes), e.g. {tenant_root}/repo.git"
        path = unquote(urlsplit(remote_url).path) if not remote_url.startswith("/") else remote_url
        if not path.startswith("/") or "//" in path or "\\" in path:
            return allowed
        parts = path.rstrip("/").split("/")[1:]
        if any(part in ("", ".", "..") for part in parts):
            return f"{allowed}; '.' and '..' are not allowed in it"
        path = "/" + "/".join(parts)
        if not path.startswith(tenant_root + "/"):
            return allowed
        # Symlinks in the part of the path that exists on this machine (realpath resolves as far as it can).
        real, real_root = os.path.realpath(path), os.path.realpath(tenant_root)
        if not real.startswith(real_root.rstrip("/") + "/"):
            return f"{allowed}; {path} leads outside it through a symbolic link"
        return None

    # ---- the `sam local` git server --------------------------------------------------------------------------------

    def is_local_git_remote(self, url: str) -> bool:
        """Whether `url` names the `sam local` git server's host and port (never outside `sam local`)."""
        if not self.local_git_server:
            return False
        parts = urlsplit(url)
        host = (parts.hostname or "").lower().rstrip(".")
        try:
            port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
        except ValueError:
            return False
        return f"{host}:{port}" == self.local_git_server

    def local_git_remote_error(self, url: str, tenant_id: str) -> str | None:
        """None if `url` is a repository in `tenant_id`'s own folder of the `sam local` git server, else what to name
        instead."""
        allowed = f"remoteUrl must be https://{self.local_git_server}/{tenant_id}/<name>.git (this tenant's remotes)"
        parts = urlsplit(url)
        if parts.scheme.lower() != "https" or "@" in parts.netloc or parts.query or parts.fragment:
            return allowed
        folder, _, name = parts.path.removeprefix("/").partition("/")
        if folder != tenant_id or not _LOCAL_GIT_REPOSITORY.match(name):
            return allowed
        return None

    def local_github_api_error(self, url: str, tenant_id: str, *, request: bool = False) -> str | None:
        """None if `url` is `tenant_id`'s GitHub API on the `sam local` git server (`https://<host:port>/<tenantId>/github`),
        or, with `request`, a request below it (a path of plain segments, any query), else what to name instead."""
        allowed = (
            f"githubApiUrl must be https://{self.local_git_server}/{tenant_id}/{LOCAL_GITHUB_FOLDER}"
            " (this tenant's GitHub stand-in)"
        )
        parts = urlsplit(url)
        if parts.scheme.lower() != "https" or "@" in parts.netloc or parts.fragment or (parts.query and not request):
            return allowed
        folder, _, rest = parts.path.removeprefix("/").partition("/")
        api, _, below = rest.partition("/")
        if folder != tenant_id or api != LOCAL_GITHUB_FOLDER:
            return allowed
        if below and (not request or not all(_LOCAL_GITHUB_SEGMENT.match(part) for part in below.split("/"))):
            return allowed
        return None

    # ---- hosts -------------------------------------------------------------------------------------------------------

    def host_error(self, url: str, field_name: str) -> str | None:
        """None if `url`'s host may be called: a host of ALLOWED_PRIVATE_HOSTS, or one that names and resolves only
        to public addresses. A name that does not resolve (now) is accepted: it cannot be reached either, and the
        worker checks it again right before each use."""
        parts = urlsplit(url)
        host = (parts.hostname or "").lower().rstrip(".")
        try:
            port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
        except ValueError:
            return f"{field_name} has an invalid port"
        if host in self.allowed_private_hosts or f"{host}:{port}" in self.allowed_private_hosts:
            return None
        refused = f"{field_name} must name a public host"
        if parts.scheme.lower() != "https":
            return f"{field_name} must be an https:// URL (http only for a host of ALLOWED_PRIVATE_HOSTS)"
        if host in _LOCAL_NAMES or host.endswith(".localhost") or not host:
            return f"{refused}; {host or 'an empty host'} is this machine"
        try:
            addresses = [str(ipaddress.ip_address(host.split("%", 1)[0]))]
        except ValueError:
            try:
                addresses = (self.resolve or resolve_host)(host, port)
            except UnresolvableHostError:
                return None
        for address in addresses:
            reason = non_public_reason(address)
            if reason:
                return (
                    f"{refused}; {host} is {reason}"
                    if host == address
                    else f"{refused}; {host} resolves to {address}, {reason}"
                )
        return None

    # ---- a whole registration --------------------------------------------------------------------------------------

    def registration_errors(self, registration: WorkspaceRegistration, tenant_id: str) -> list[dict[str, str]]:
        """One {"field", "message"} per name of `registration` outside `tenant_id`'s bounds (the API's 422 shape)."""
        errors = []
        remote = registration.remote_url
        if remote.startswith("/") or remote.lower().startswith("file:"):
            problem = self.file_remote_error(remote, tenant_id)
        elif self.is_local_git_remote(remote):
            problem = self.local_git_remote_error(remote, tenant_id)
        else:
            problem = self.host_error(remote, "remoteUrl")
        if problem:
            errors.append({"field": "remoteUrl", "message": problem})
        if registration.token_parameter is not None:
            problem = self.token_parameter_error(registration.token_parameter, tenant_id)
            if problem:
                errors.append({"field": "tokenParameter", "message": problem})
        if registration.github_api_url is not None:
            api_url = registration.github_api_url
            if self.is_local_git_remote(api_url):
                problem = self.local_github_api_error(api_url, tenant_id)
            else:
                problem = self.host_error(api_url, "githubApiUrl")
            if problem:
                errors.append({"field": "githubApiUrl", "message": problem})
        return errors
