"""The sample workspaces of `events/` (`agent-jobs local --sam-local`): bare git remotes whose first commits are what
the events' patches expect, registered for the events' tenant through the local API, with a fake GitHub for their
pull requests (http_put_workspace.json registers a fourth, repo-delta, itself).

Every events/ file names the tenant `tenant-demo`: the SQS events' jobs run on repo-alpha and repo-beta, the HTTP
events' job goes to repo-gamma (so that the queue's workers, which run it, never stand in the way of the SQS
events' jobs). The remotes lie in the tenant's folder of the stack's remotes root (WORKSPACES_REMOTE_ROOT), where
this stack's workers reach them; a function that `sam local invoke` runs in a container sees none of this machine's
folders, so the SQS events' jobs there fail to reach their remote, retryably (see docs/local-runtime.md).
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Final
from urllib.parse import urlsplit

from agent_jobs_local.fake_github import FakeGitHub
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


class SampleWorkspaces:
    """The sample workspaces' remotes under `remotes_root` (the stack's WORKSPACES_REMOTE_ROOT) and their fake GitHub.
    `start()` creates the remotes anew (a new stack starts from the first commits) and serves the fake GitHub, which
    the stack must allow (`allowed_private_hosts`); `register(api_url)` registers every workspace through the local
    API for SAMPLE_TENANT."""

    def __init__(self, remotes_root: Path) -> None:
        self.remotes_root = remotes_root
        self.github = FakeGitHub()
        self.remotes: dict[str, Path] = {}

    def start(self) -> SampleWorkspaces:
        for workspace_id, files in SAMPLE_WORKSPACES.items():
            path = remote_path(self.remotes_root, workspace_id, SAMPLE_TENANT)
            if path.exists():
                shutil.rmtree(path)
            self.remotes[workspace_id] = create_remote(path, workspace_id, files)
            self.github.add_repository(GITHUB_OWNER, workspace_id)
        self.github.start()
        return self

    def stop(self) -> None:
        self.github.stop()

    @property
    def allowed_private_hosts(self) -> list[str]:
        """The fake GitHub's host:port, which the stack's ALLOWED_PRIVATE_HOSTS must name for the registrations."""
        return [urlsplit(self.github.url).netloc]

    def register(self, api_url: str) -> dict[str, int]:
        """Register every sample workspace through the API at `api_url`; workspace -> status (201, or 200)."""
        return register_workspaces(api_url, self.remotes, self.github.url, tenant_id=SAMPLE_TENANT)

    def __enter__(self) -> SampleWorkspaces:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()


__all__ = ["SAMPLE_TENANT", "SAMPLE_WORKSPACES", "SampleWorkspaces"]
