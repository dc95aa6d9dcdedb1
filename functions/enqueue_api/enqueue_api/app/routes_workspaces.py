"""Workspaces: register one, read its registration and state, read its timeline of jobs."""

# Annotations here are evaluated when the route is defined (no `from __future__ import annotations`): Powertools
# reads a handler's signature, and the Depends() of its caller parameter, through the tracer's wrapper, whose
# module could not resolve names of this one.

from http import HTTPStatus
from typing import Annotated

from aws_lambda_powertools.event_handler import Response, content_types
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body
from aws_lambda_powertools.metrics import MetricUnit

from agent_jobs.models import WorkspaceState
from agent_jobs.registration import WorkspaceRegistration
from agent_jobs.services import Services
from agent_jobs.workspaces import WorkspaceOwnedElsewhereError, WorkspaceQuotaError, WorkspaceStatus

from .context import logger, metrics, registration_checks, services, tracer, workspace_registry
from .cursors import decode_timeline_token, encode_timeline_token
from .errors import RequestRefused
from .openapi import answers
from .params import TIMELINE_LIMIT_DEFAULT, PageToken, TimelineLimit, WorkspaceIdInPath
from .rules import check_registration
from .schemas import JobTimelineView, WorkspaceStatusView, WorkspaceView
from .tenancy import CallerTenant
from .views import STORED_JOB_FIELDS, public_job_view, public_workspace_view, workspace_state_view

router = Router()  # type: ignore[no-untyped-call]  # Powertools leaves it unannotated

RegistrationBody = Annotated[
    WorkspaceRegistration, Body(embed=False, description="The git branch of a git remote the workspace works on.")
]


@router.put(
    "/workspaces/<workspaceId>",
    operation_id="registerWorkspace",
    summary="Register a workspace (or update its registration)",
    responses=answers(
        {201: ("Registered.", WorkspaceView), 200: ("Registration updated.", WorkspaceView)},
        (400, 401, 403, 413, 415, 422, 429, 503),
        descriptions={
            422: "A field is invalid, names what the tenant may not use (another tenant's token or remote, a private "
            "host), or names a file-system remote that is no git repository where the API sees the remotes (the "
            "local runtime); `errors` names each field."
        },
    ),
)
@tracer.capture_method(capture_response=False)
def register_workspace(
    workspace_id: WorkspaceIdInPath, registration: RegistrationBody, tenant: CallerTenant
) -> Response[WorkspaceView]:
    svc = services()
    logger.append_keys(workspace_id=workspace_id)
    check_registration(registration, tenant, svc.settings)
    try:
        outcome = workspace_registry(svc).register(workspace_id, registration, tenant)
    except WorkspaceOwnedElsewhereError as owned:
        raise RequestRefused(HTTPStatus.FORBIDDEN, str(owned)) from None
    except WorkspaceQuotaError as quota:
        logger.info("workspace quota used up", extra={"limit": quota.limit})
        raise RequestRefused(HTTPStatus.TOO_MANY_REQUESTS, str(quota)) from None
    registration_checks().keep(outcome.workspace)  # this process checks the next jobs against what it just stored
    metrics.add_metric(
        name="WorkspacesRegistered" if outcome.created else "WorkspacesUpdated", unit=MetricUnit.Count, value=1
    )
    logger.info("workspace registered" if outcome.created else "workspace registration updated")
    return Response(
        HTTPStatus.CREATED if outcome.created else HTTPStatus.OK,
        content_types.APPLICATION_JSON,
        public_workspace_view(outcome.workspace),
        headers={"Location": f"/workspaces/{workspace_id}"},
    )


@router.get(
    "/workspaces/<workspaceId>",
    operation_id="readWorkspace",
    summary="Read a workspace's registration, state and last applied job",
    responses=answers({200: ("The workspace.", WorkspaceStatusView)}, (401, 403, 404, 422, 503)),
)
@tracer.capture_method(capture_response=False)
def read_workspace(workspace_id: WorkspaceIdInPath, tenant: CallerTenant) -> WorkspaceStatusView:
    """The workspace's registration and state, and `lastAppliedJobId`: derived at read time (the worker writes
    nothing for it), at the cost of one Query of the GSI `byWorkspace` besides the GetItem of the workspace item
    (`workspace_state_view`, as every answer that shows a workspace)."""
    svc = services()
    logger.append_keys(workspace_id=workspace_id)
    status = visible_workspace(svc, workspace_id, tenant)
    metrics.add_metric(name="WorkspacesRead", unit=MetricUnit.Count, value=1)
    return workspace_state_view(svc.guard, status, tenant)


@router.get(
    "/workspaces/<workspaceId>/jobs",
    operation_id="listWorkspaceJobs",
    summary="Read a workspace's timeline: its jobs, oldest accepted first, a page at a time",
    responses=answers({200: ("A page of the timeline.", JobTimelineView)}, (400, 401, 403, 404, 422, 503)),
)
@tracer.capture_method(capture_response=False)
def list_workspace_jobs(
    workspace_id: WorkspaceIdInPath,
    tenant: CallerTenant,
    limit: TimelineLimit = TIMELINE_LIMIT_DEFAULT,
    next_token: PageToken = None,
) -> JobTimelineView:
    """The workspace's jobs in the order the API accepted them (the GSI `byWorkspace`, sorted by acceptedAt).

    acceptedAt, not the queue's SequenceNumber, is the order: every job record has it from the moment it is
    recorded (a SequenceNumber only once sent; a rejected message's record has none), so no accepted job is left out
    of the timeline, and it needs no second index. The price: acceptedAt is the producer's clock, taken just before
    the send, so two jobs submitted to one workspace at the same moment by different callers can be listed in the
    other order than the queue runs them, and ties keep an arbitrary but stable order. Jobs submitted one after the
    other (each after the previous one's 202) are listed in queue order, and so are the jobs of one batch, whose
    acceptedAt the store spaces a millisecond apart in batch order (`record_accepted_batch`). Each view carries its
    `sequenceNumber`, the order jobs take effect in.
    """
    svc = services()
    logger.append_keys(workspace_id=workspace_id)
    start_key = decode_timeline_token(next_token, workspace_id)
    visible_workspace(svc, workspace_id, tenant)
    page = svc.guard.workspace_jobs(
        workspace_id, tenant, limit=limit, start_key=start_key, attributes=STORED_JOB_FIELDS
    )
    metrics.add_metric(name="TimelinesRead", unit=MetricUnit.Count, value=1)
    return JobTimelineView(
        jobs=[public_job_view(item) for item in page.items],
        next_token=encode_timeline_token(workspace_id, page.next_key) if page.next_key is not None else None,
    )


def visible_workspace(svc: Services, workspace_id: str, tenant: str) -> WorkspaceStatus:
    """The workspace's status if `tenant` owns it, else 404: another tenant's workspace is answered word for word as
    one nobody registered, so that the answer tells nothing about other tenants' workspace ids."""
    status = workspace_registry(svc).status(workspace_id)
    # An item nobody owns (halted by a message that named no tenant) is shown to no one until a tenant registers it.
    if (
        status is None
        or status.tenant_id != tenant
        or (status.registered is None and status.state is WorkspaceState.ACTIVE)
    ):
        raise RequestRefused(
            HTTPStatus.NOT_FOUND, f"no workspace '{workspace_id}'; register it with PUT /workspaces/{workspace_id}"
        )
    return status
