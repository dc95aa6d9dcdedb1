"""`make local`'s stand-in for GitHub's pull-request API, so that a user's workspaces can run open_pr jobs: a folder
per tenant, `https://127.0.0.1:<port>/<tenantId>/github`, served over TLS by the local git server
(`git_server.GitHttpsServer`, no repositories) with the local CA.

The stack's functions get the server as LOCAL_GIT_SERVER and its CA as LOCAL_GIT_CA, the variables `sam local`'s git
server uses (the local runtime runs its functions as SAM CLI does, AWS_SAM_LOCAL=true). So the same tenant rules hold
(`agent_jobs.tenancy.TenantBounds`): the API accepts a registration's githubApiUrl on this server only as its own
tenant's folder, and the worker checks each request again; every other loopback or private host stays refused, as
nothing is added to ALLOWED_PRIVATE_HOSTS. Each tenant's folder is a `FakeGitHub` of its own, made on the first
request, in which every repository exists: no tenant sees another's pull requests, and none need be set up first.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Final

from agent_jobs.models import ID_PATTERN
from agent_jobs.tenancy import LOCAL_GITHUB_FOLDER
from agent_jobs_local.fake_github import FakeGitHub, FakePull
from agent_jobs_local.git_server import GitHttpsServer, LocalCa, local_ca, local_ca_path
from agent_jobs_local.runtime_files import LOOPBACK

# The most tenant folders one stand-in keeps: anyone on this machine can call it, and each folder is memory.
MAX_TENANTS: Final = 1000
_TENANT_FOLDER: Final = re.compile(rf"^/({ID_PATTERN[1:-1]})/{LOCAL_GITHUB_FOLDER}$")


class TenantGitHubs:
    """A GitHub stand-in per tenant, made on first use, at the git server's `/<tenantId>/github` (`api_url(tenantId)`
    as its clients name it)."""

    def __init__(self, api_url: Callable[[str], str], max_tenants: int = MAX_TENANTS) -> None:
        self.api_url = api_url
        self.max_tenants = max_tenants
        self._by_tenant: dict[str, FakeGitHub] = {}
        self._lock = threading.Lock()

    def get(self, key: str, /) -> FakeGitHub | None:
        """The stand-in of the tenant whose folder `key` (`/<tenantId>/github`) is; None for any other path."""
        match = _TENANT_FOLDER.match(key)
        if match is None or len(match.group(1)) > 64:
            return None
        tenant_id = match.group(1)
        with self._lock:
            github = self._by_tenant.get(tenant_id)
            if github is None and len(self._by_tenant) < self.max_tenants:
                github = FakeGitHub(any_repository=True, served_at=self.api_url(tenant_id))
                self._by_tenant[tenant_id] = github
            return github

    def pulls(self, tenant_id: str) -> list[FakePull]:
        """The pull requests opened in `tenant_id`'s folder, in the order they were opened."""
        with self._lock:
            github = self._by_tenant.get(tenant_id)
        return github.list_pulls() if github is not None else []


class GitHubStandIn:
    """The stand-in served on loopback over TLS: `start()`/`stop()` or a context manager. `function_env` is what the
    stack's functions need to admit and trust it; `api_url(tenant)` is a tenant's githubApiUrl."""

    def __init__(
        self, host: str = LOOPBACK, ca: LocalCa | None = None, ca_certificate_path: Path | None = None
    ) -> None:
        self.host = host
        self.ca = ca or local_ca()
        self.ca_certificate_path = ca_certificate_path or local_ca_path().with_suffix(".crt")
        self.tenants = TenantGitHubs(self.api_url)
        self._server: GitHttpsServer | None = None

    def start(self) -> GitHubStandIn:
        self._server = GitHttpsServer({}, self.host, ca=self.ca, github_apis=self.tenants).start()
        # The CA's certificate alone (its file beside the development key also holds the key), for a client such as
        # `curl --cacert`.
        self.ca_certificate_path.parent.mkdir(parents=True, exist_ok=True)
        self.ca_certificate_path.write_text(self.ca.certificate_pem, encoding="utf-8")
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    @property
    def netloc(self) -> str:
        """host:port, as the functions' LOCAL_GIT_SERVER names it."""
        if self._server is None:
            raise RuntimeError("the GitHub stand-in is not started")
        return f"{self.host}:{self._server.port}"

    def api_url(self, tenant_id: str) -> str:
        """The githubApiUrl of `tenant_id`'s workspaces: its own folder of the stand-in."""
        return f"https://{self.netloc}/{tenant_id}/{LOCAL_GITHUB_FOLDER}"

    @property
    def function_env(self) -> dict[str, str]:
        """LOCAL_GIT_SERVER and LOCAL_GIT_CA for the stack's functions on this machine."""
        return {"LOCAL_GIT_SERVER": self.netloc, "LOCAL_GIT_CA": self.ca.certificate_pem}

    def __enter__(self) -> GitHubStandIn:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()


__all__ = ["MAX_TENANTS", "GitHubStandIn", "TenantGitHubs"]
