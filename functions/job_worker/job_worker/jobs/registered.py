"""Workspaces as registered through `PUT /workspaces/{workspaceId}`: git branches of git remotes.

The registration (remote, branch, base branch, test commands, token, GitHub repository) is read from the table once
per workspace and kept for a minute in this execution environment, so a job costs no read on the happy path while a
changed registration is seen soon. The git side is `jobs.git_workspace`, with its warm bare caches under `cache_root`
(one per tenant, workspace and remote, within `cache_budget_bytes` in all).

What a registration names is checked again here, at use, against the owner's bounds (`agent_jobs.tenancy`): a
registration stored before a bound existed, a symlink made since, or a name that resolves elsewhere by now is a
PermanentJobError saying what to fix, and the token or remote is never touched.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from agent_jobs.models import ID_PATTERN
from agent_jobs.patch_limits import PatchLimits
from agent_jobs.tenancy import TenantBounds
from job_worker.jobs.context import JobContext
from job_worker.jobs.errors import PermanentJobError

if TYPE_CHECKING:
    from agent_jobs.registration import RegisteredWorkspace
    from agent_jobs.workspaces import WorkspaceRegistry
    from job_worker.jobs.git_workspace import GitRemote, GitWorkspace, GitWorkspaceStore
    from job_worker.jobs.limits import GitLimits

REGISTRATION_CACHE_SECONDS = 60


class RegisteredWorkspaceStore:
    """The worker's workspaces (`job_worker.jobs.workspace.JobWorkspaceStore`): each belongs to the tenant that
    registered it."""

    binds_tenants = True

    def __init__(
        self,
        registry: WorkspaceRegistry,
        cache_root: Path,
        *,
        tokens: Callable[[str], str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        bounds: TenantBounds | None = None,
        limits: GitLimits | None = None,
        cache_budget_bytes: int | None = None,
        patch_limits: PatchLimits | None = None,
    ) -> None:
        self._registry = registry
        self._limits = limits
        self._cache_budget_bytes = cache_budget_bytes
        self.patch_limits = patch_limits or PatchLimits()
        self.bounds = bounds or TenantBounds()
        self._tokens = tokens or _read_token
        self._clock = clock
        self._cached: dict[str, tuple[float, RegisteredWorkspace]] = {}
        self._cache_root = cache_root
        self._git_store: GitWorkspaceStore | None = None

    @property
    def _git(self) -> GitWorkspaceStore:
        # Built on the first job, so an environment imports the git library only when it runs a job on a workspace.
        if self._git_store is None:
            from job_worker.jobs.git_workspace import GitWorkspaceStore

            self._git_store = GitWorkspaceStore(
                self._cache_root,
                limits=self._limits,
                cache_budget_bytes=self._cache_budget_bytes,
                patch_limits=self.patch_limits,
            )
        return self._git_store

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
        """The workspace's git workspace on the remote its registration names (checked against the tenant's bounds
        here, so the git store never reads a registration)."""
        if not re.fullmatch(ID_PATTERN, workspace_id):
            raise ValueError(f"not a workspace id: {workspace_id!r}")
        return self._git.open_remote(workspace_id, self._remote(workspace_id))

    def owner(self, workspace_id: str) -> str | None:
        """The tenant that registered `workspace_id` (cached per execution environment); None when nobody did, or
        when the name is no workspace id at all (then nothing is read)."""
        if not re.fullmatch(ID_PATTERN, workspace_id):
            return None
        try:
            return self.registration(workspace_id).tenant_id
        except PermanentJobError:
            return None  # not registered

    def direct_producers(self, workspace_id: str) -> list[str] | None:
        """The senders the owner bound to `workspace_id` (cached with its registration, so a changed binding is seen
        within REGISTRATION_CACHE_SECONDS); None when it bound none or nobody registered the workspace."""
        if not re.fullmatch(ID_PATTERN, workspace_id):
            return None
        try:
            return self.registration(workspace_id).registration.direct_producers
        except PermanentJobError:
            return None  # not registered

    def job_context(self, workspace_id: str, context: JobContext) -> JobContext:
        """`context` with the workspace's registration, its token (read on demand) and the owner's host check; an
        unregistered workspace raises PermanentJobError: its job ends DEAD saying to register it."""
        registered = self.registration(workspace_id)
        tenant_id = registered.tenant_id
        return replace(
            context,
            registration=registered,
            token=lambda: self.token(workspace_id),
            check_host=lambda url, field_name: self.check_host(url, field_name, tenant_id),
            trusted_ca=self.trusted_ca,
        )

    def token(self, workspace_id: str) -> str | None:
        registered = self.registration(workspace_id)
        reference = registered.registration.token_parameter
        if not reference:
            return None
        refused = self.bounds.token_parameter_error(reference, registered.tenant_id)
        if refused:
            raise PermanentJobError(
                f"workspace {workspace_id!r} names token {reference!r}, which is not its tenant's: {refused}; "
                f"register it again with PUT /workspaces/{workspace_id}, then resume the workspace"
            )
        return self._tokens(reference)

    def check_host(self, url: str, field_name: str, tenant_id: str) -> str | None:
        """Why `url`, of a registration of `tenant_id`, may not be called now (`TenantBounds.host_error`), or None.
        Under `sam local`, a GitHub API request to the local git server must stay in the tenant's own folder."""
        if field_name == "githubApiUrl" and self.bounds.is_local_git_remote(url):
            return self.bounds.local_github_api_error(url, tenant_id, request=True)
        return self.bounds.host_error(url, field_name)

    def trusted_ca(self, url: str) -> str | None:
        """The `sam local` git server's CA for a URL of that server (under `sam local` only), else None."""
        return self.bounds.local_git_ca if self.bounds.is_local_git_remote(url) else None

    def _remote(self, workspace_id: str) -> GitRemote:
        from job_worker.jobs.git_workspace import GitCredentials, GitRemote

        registered = self.registration(workspace_id)
        registration = registered.registration
        remote = registration.remote_url
        file_remote = remote.startswith("/") or remote.lower().startswith("file:")
        local_git = not file_remote and self.bounds.is_local_git_remote(remote)
        if file_remote:
            refused = self.bounds.file_remote_error(remote, registered.tenant_id)
        elif local_git:
            refused = self.bounds.local_git_remote_error(remote, registered.tenant_id)
        else:
            refused = self.bounds.host_error(remote, "remoteUrl")
        if refused:
            raise PermanentJobError(
                f"workspace {workspace_id!r} cannot use its remote {remote!r}: {refused}; register it again with "
                f"PUT /workspaces/{workspace_id}, then resume the workspace"
            )
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
            owner=registered.tenant_id,  # a cache of its own per tenant and remote
            # A file-system remote stays inside its tenant's folder, also through git's own pointers.
            confined_to=(self.bounds.tenant_remote_root(registered.tenant_id) or "") if file_remote else "",
            # Trusted for this remote only: the `sam local` git server's CA.
            ca_pem=(self.bounds.local_git_ca or "") if local_git else "",
        )


def _read_token(reference: str) -> str:
    # Powertools Parameters load with the first HTTPS remote that has a token, not with every cold start.
    from job_worker.jobs.tokens import read_token

    return read_token(reference)
