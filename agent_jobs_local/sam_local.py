"""The sample workspaces of `events/` (`agent-jobs local --sam-local`): bare git remotes whose first commits are what
the events' patches expect, registered for the events' tenant through the local API, with a fake GitHub for their
pull requests (http_put_workspace.json registers a fourth, repo-delta, itself).

Every events/ file names the tenant `tenant-demo`: the SQS events' jobs run on repo-alpha and repo-beta, the HTTP
events' job goes to repo-gamma (so that the queue's workers, which run it, never stand in the way of the SQS
events' jobs). The remotes lie in the tenant's folder of the stack's remotes root (WORKSPACES_REMOTE_ROOT). A function
that `sam local invoke` runs in a container sees none of this machine's folders, so repo-alpha and repo-beta, the
SQS events' workspaces, are registered with https:// remotes on the local git server (`git_server.GitHttpsServer`),
which serves those same folders where containers reach this machine, with their GitHub API (a fake GitHub of that
server's own, at `/tenant-demo/github`); repo-gamma, whose jobs the stack's own workers run on this machine (where
host.docker.internal means nothing), keeps its file-system remote and the fake GitHub's loopback URL
(docs/local-runtime.md). The worker's run_tests jobs reach the test sandbox where `sam local start-lambda` serves it
(`container_values`).
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Final
from urllib.parse import urlsplit

from agent_jobs_local.fake_github import FakeGitHub
from agent_jobs_local.git_server import GitHttpsServer
from agent_jobs_local.runtime_files import CONTAINER_HOST
from agent_jobs_local.workload_plan import GITHUB_OWNER
from agent_jobs_local.workload_remotes import create_remote, register_workspaces, remote_path

# The tenant of every events/ file.
SAMPLE_TENANT: Final = "tenant-demo"
# Each sample workspace and the files of its first commit.
SAMPLE_WORKSPACES: Final[Mapping[str, Mapping[str, bytes]]] = {
    "repo-alpha": {"src/app.py": b"old\n"},
    "repo-beta": {"README.md": b"old\n"},
    "repo-gamma": {"README.md": b"# demo\n"},
}
# The workspaces that `sam local invoke JobWorkerFunction` runs jobs of (the SQS events'): served over HTTPS.
SERVED_OVER_HTTPS: Final = ("repo-alpha", "repo-beta")
# The function the worker's TEST_SANDBOX_FUNCTION names, as `sam local start-lambda` serves it (its logical id).
SANDBOX_FUNCTION: Final = "TestSandboxFunction"


class SampleWorkspaces:
    """The sample workspaces' remotes under `remotes_root` (the stack's WORKSPACES_REMOTE_ROOT) and their fake GitHub.
    `start()` creates the remotes anew (a new stack starts from the first commits) and serves the fake GitHub, which
    the stack must allow (`allowed_private_hosts`); `register(api_url)` registers every workspace through the local
    API for SAMPLE_TENANT. Given a `git_host` (the address `sam local`'s containers reach this machine at), the
    SERVED_OVER_HTTPS workspaces are served there over HTTPS and registered with that server's URLs; `sam_local_env`
    then names the server and its CA for the functions (LOCAL_GIT_SERVER, LOCAL_GIT_CA)."""

    def __init__(self, remotes_root: Path, git_host: str | None = None) -> None:
        self.remotes_root = remotes_root
        self.github = FakeGitHub()
        self.remotes: dict[str, Path] = {}
        self.git_host = git_host
        self.git_server: GitHttpsServer | None = None
        # The git server's GitHub API: apart from the loopback one, which ALLOWED_PRIVATE_HOSTS admits for every tenant.
        self.container_github = FakeGitHub()

    def start(self) -> SampleWorkspaces:
        for workspace_id, files in SAMPLE_WORKSPACES.items():
            path = remote_path(self.remotes_root, workspace_id, SAMPLE_TENANT)
            if path.exists():
                shutil.rmtree(path)
            self.remotes[workspace_id] = create_remote(path, workspace_id, files)
            self.github.add_repository(GITHUB_OWNER, workspace_id)
        self.github.start()
        if self.git_host is not None:
            for workspace_id in SERVED_OVER_HTTPS:
                self.container_github.add_repository(GITHUB_OWNER, workspace_id)
            self.container_github.start()
            served = {self.served_path(workspace_id): self.remotes[workspace_id] for workspace_id in SERVED_OVER_HTTPS}
            apis = {f"/{SAMPLE_TENANT}/github": self.container_github}
            self.git_server = GitHttpsServer(served, self.git_host, github_apis=apis).start()
        return self

    def stop(self) -> None:
        if self.git_server is not None:
            self.git_server.stop()
            self.container_github.stop()
        self.github.stop()

    @staticmethod
    def served_path(workspace_id: str) -> str:
        """Where the git server serves a workspace's remote: in the tenant's own folder, as the functions require."""
        return f"/{SAMPLE_TENANT}/{workspace_id}.git"

    @property
    def remote_urls(self) -> dict[str, Path | str]:
        """Workspace -> the remote it is registered with: the git server's URL if served there, else its folder."""
        if self.git_server is None:
            return dict(self.remotes)
        server = self.git_server
        return {
            workspace_id: server.container_url(self.served_path(workspace_id))
            if workspace_id in SERVED_OVER_HTTPS
            else path
            for workspace_id, path in self.remotes.items()
        }

    @property
    def sam_local_env(self) -> dict[str, str]:
        """LOCAL_GIT_SERVER and LOCAL_GIT_CA of the git server (nothing without one), for the functions that declare
        them: the API to accept the registrations, the worker to reach and trust the server."""
        if self.git_server is None:
            return {}
        return {
            "LOCAL_GIT_SERVER": self.git_server.container_netloc,
            "LOCAL_GIT_CA": self.git_server.ca.certificate_pem,
        }

    @staticmethod
    def container_values(lambda_port: int) -> dict[str, str]:
        """The worker's test sandbox as a container reaches it: `sam local start-lambda --port <lambda_port>` on the
        address the stack serves (AWS_ENDPOINT_URL_LAMBDA), under the name that command gives it
        (TEST_SANDBOX_FUNCTION)."""
        return {
            "AWS_ENDPOINT_URL_LAMBDA": f"http://{CONTAINER_HOST}:{lambda_port}",
            "TEST_SANDBOX_FUNCTION": SANDBOX_FUNCTION,
        }

    @property
    def allowed_private_hosts(self) -> list[str]:
        """The fake GitHub's host:port, which the stack's ALLOWED_PRIVATE_HOSTS must name for the registrations."""
        return [urlsplit(self.github.url).netloc]

    def register(self, api_url: str) -> dict[str, int]:
        """Register every sample workspace through the API at `api_url`; workspace -> status (201, or 200)."""
        remotes = self.remote_urls
        statuses: dict[str, int] = {}
        if self.git_server is not None:
            # repo-alpha and repo-beta: their remotes and their GitHub API on the git server, as containers reach it
            served = {workspace_id: remotes.pop(workspace_id) for workspace_id in SERVED_OVER_HTTPS}
            github = self.git_server.container_url(f"/{SAMPLE_TENANT}/github")
            statuses.update(register_workspaces(api_url, served, github, tenant_id=SAMPLE_TENANT))
        statuses.update(register_workspaces(api_url, remotes, self.github.url, tenant_id=SAMPLE_TENANT))
        return statuses

    def __enter__(self) -> SampleWorkspaces:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()


__all__ = [
    "SAMPLE_TENANT",
    "SAMPLE_WORKSPACES",
    "SANDBOX_FUNCTION",
    "SERVED_OVER_HTTPS",
    "SampleWorkspaces",
]
