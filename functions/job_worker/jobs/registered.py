"""Workspaces as registered through `PUT /workspaces/{workspaceId}`: git branches of git remotes.

The registration (remote, branch, base branch, test commands, token, GitHub repository) is read from the table once
per workspace and kept for a minute in this execution environment, so a job costs no read on the happy path while a
changed registration is seen soon. The git side is `jobs.git_workspace`, with its warm bare caches under `cache_root`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from jobs.errors import PermanentJobError
from jobs.git_workspace import GitCredentials, GitRemote, GitWorkspace, GitWorkspaceStore
from jobs.tokens import read_token

if TYPE_CHECKING:
    from agent_jobs.models import RegisteredWorkspace
    from agent_jobs.workspaces import WorkspaceRegistry

REGISTRATION_CACHE_SECONDS = 60


class RegisteredWorkspaceStore:
    def __init__(
        self,
        registry: WorkspaceRegistry,
        cache_root: Path,
        *,
        tokens: Callable[[str], str] = read_token,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._registry = registry
        self._tokens = tokens
        self._clock = clock
        self._cached: dict[str, tuple[float, RegisteredWorkspace]] = {}
        self._git = GitWorkspaceStore(cache_root, self._remote)

    def registration(self, workspace_id: str) -> RegisteredWorkspace:
        cached = self._cached.get(workspace_id)
        if cached is not None and self._clock() - cached[0] < REGISTRATION_CACHE_SECONDS:
            return cached[1]
        registered = self._registry.get(workspace_id)
        if registered is None:
            raise PermanentJobError(
                f"workspace {workspace_id!r} is not registered: register its git remote with"
                f" PUT /workspaces/{workspace_id}, then resume the workspace"
            )
        self._cached[workspace_id] = (self._clock(), registered)
        return registered

    def open(self, workspace_id: str) -> GitWorkspace:
        return self._git.open(workspace_id)

    def token(self, workspace_id: str) -> str | None:
        reference = self.registration(workspace_id).registration.token_parameter
        return self._tokens(reference) if reference else None

    def _remote(self, workspace_id: str) -> GitRemote:
        registration = self.registration(workspace_id).registration
        credentials = None
        if registration.remote_url.startswith("https://"):
            token = self.token(workspace_id)
            # GitHub, GitLab and CodeCommit-style token auth: any user name with the token as the password.
            credentials = GitCredentials("x-access-token", token) if token else None
        return GitRemote(
            url=registration.remote_url,
            branch=registration.branch,
            base_branch=registration.base_branch,
            credentials=credentials,
        )
