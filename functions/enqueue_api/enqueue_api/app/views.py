"""What a tenant may see of its jobs and workspaces."""

from __future__ import annotations

from typing import Any, Final

from agent_jobs.guard import ATTEMPTS_BEFORE_RETRY, JobGuard
from agent_jobs.registration import RegisteredWorkspace
from agent_jobs.workspaces import WorkspaceStatus, workspace_status

from .schemas import JobView, WorkspaceStatusView, WorkspaceView

PUBLIC_JOB_FIELDS: Final = (
    "jobId",
    "workspaceId",
    "tenantId",
    "type",
    "status",
    "attempt",
    "failures",
    "acceptedAt",
    "updatedAt",
    "finishedAt",
    "messageId",
    "sequenceNumber",
    "result",
    "error",
    "history",
)
# What a job's view is made of: its public fields, and the claims made before an operator's retry, which its `attempt`
# counts too.
STORED_JOB_FIELDS: Final = (*PUBLIC_JOB_FIELDS, ATTEMPTS_BEFORE_RETRY)
PUBLIC_WORKSPACE_FIELDS: Final = (
    "workspaceId",
    "tenantId",
    "remoteUrl",
    "branch",
    "baseBranch",
    "testCommands",
    "tokenParameter",
    "githubRepository",
    "githubApiUrl",
    "directProducers",
    "registeredAt",
)
PUBLIC_WORKSPACE_STATE_FIELDS: Final = ("state", "haltingJobId", "haltReason", "lastAppliedJobId", "lastResume")


def public_job_view(item: dict[str, Any]) -> JobView:
    """What a tenant may see of its job: never the lease owner or stored message bodies. Its `attempt` is every claim
    of the job's life: the store counts the claims since an operator's retry apart (the bound on claims)."""
    view = {name: item.get(name) for name in PUBLIC_JOB_FIELDS}
    if item.get(ATTEMPTS_BEFORE_RETRY):
        view["attempt"] = int(item.get("attempt") or 0) + int(item[ATTEMPTS_BEFORE_RETRY])
    return JobView.model_validate(view)


def public_workspace_view(workspace: RegisteredWorkspace) -> WorkspaceView:
    """A registration as its owner sees it (the token's location, never a token)."""
    return WorkspaceView.model_validate(_registration_fields(workspace))


def public_workspace_status_view(
    status: WorkspaceStatus, last_applied_job_id: str | None = None
) -> WorkspaceStatusView:
    """The registration (its fields null when the workspace only carries halt state), the workspace's state, the
    last job that took effect on it (null when unknown or none) and the last resume decision (null when none)."""
    if status.registered is not None:
        view = _registration_fields(status.registered)
    else:
        view = dict.fromkeys(PUBLIC_WORKSPACE_FIELDS)
        view.update(workspaceId=status.workspace_id, tenantId=status.tenant_id)
    view.update(
        state=str(status.state),
        haltingJobId=status.halting_job_id,
        haltReason=status.halt_reason,
        lastAppliedJobId=last_applied_job_id,
        lastResume=status.last_resume,
    )
    return WorkspaceStatusView.model_validate(view)


def workspace_state_view(guard: JobGuard, status: WorkspaceStatus, tenant: str) -> WorkspaceStatusView:
    """`public_workspace_status_view` with the workspace's `lastAppliedJobId`, from its one source for every answer
    that shows a workspace: derived at read time from the `byWorkspace` index (`JobGuard.last_succeeded_job`: one
    Query, as the worker writes nothing for it)."""
    last_applied = guard.last_succeeded_job(status.workspace_id, tenant)
    return public_workspace_status_view(status, last_applied.get("jobId") if last_applied else None)


def workspace_item_view(guard: JobGuard, workspace_id: str, item: dict[str, Any], tenant: str) -> WorkspaceStatusView:
    """`workspace_state_view` of a workspace item as the store answered it."""
    return workspace_state_view(guard, workspace_status(workspace_id, item), tenant)


def _registration_fields(workspace: RegisteredWorkspace) -> dict[str, Any]:
    registration = workspace.registration.model_dump(by_alias=True)
    view = {"workspaceId": workspace.workspace_id, "tenantId": workspace.tenant_id, **registration}
    view["registeredAt"] = workspace.registered_at
    return {name: view.get(name) for name in PUBLIC_WORKSPACE_FIELDS}
