"""Halted workspaces: an operator's resume decision, and the list of the caller's halted workspaces."""

# Annotations here are evaluated when the route is defined (no `from __future__ import annotations`): Powertools
# reads a handler's signature, and the Depends() of its caller parameter, through the tracer's wrapper, whose
# module could not resolve names of this one.

from http import HTTPStatus
from typing import Annotated, Final

from aws_lambda_powertools.event_handler import Response, content_types
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body
from aws_lambda_powertools.metrics import MetricUnit

from agent_jobs.guard import ResumeOutcome
from agent_jobs.models import ResumeRequest
from agent_jobs.resume import resume_workspace

from .context import http_event, logger, metrics, services, tracer
from .cursors import decode_halted_token, encode_halted_token
from .errors import RequestRefused
from .openapi import answers
from .params import HALTED_LIST_DEFAULT, HaltedListLimit, HaltedState, PageToken, WorkspaceIdInPath
from .schemas import HaltedWorkspacesView, ResumeConflictView, WorkspaceStatusView
from .tenancy import CallerTenant, OperatorTenant, caller_name
from .views import workspace_item_view

router = Router()  # type: ignore[no-untyped-call]  # Powertools leaves it unannotated

ResumeBody = Annotated[
    ResumeRequest,
    Body(
        embed=False,
        description="The decision for the job that halted the workspace, named by the workspace's haltingJobId.",
    ),
]

_RESUME_CONFLICTS: Final = (ResumeOutcome.NOT_HALTED, ResumeOutcome.HALTING_JOB_CHANGED, ResumeOutcome.RETRY_REFUSED)


@router.post(
    "/workspaces/<workspaceId>/resume",
    operation_id="resumeWorkspace",
    summary="Resume a halted workspace: retry or skip the job that halted it (operator scope)",
    responses=answers(
        {
            202: (
                "Resume begun (or already begun by the same decision): the workspace is RESUMING, its parked jobs run "
                "in order, or ACTIVE when nothing was parked. Or the job is decided and the workspace stays HALTED by "
                "another job that halted it meanwhile (its haltingJobId): decide that one next.",
                WorkspaceStatusView,
            )
        },
        (400, 401, 403, 404, 409, 413, 415, 422, 503),
        models={409: ResumeConflictView},
    ),
)
@tracer.capture_method(capture_response=False)
def resume(
    workspace_id: WorkspaceIdInPath, request: ResumeBody, tenant: OperatorTenant
) -> Response[WorkspaceStatusView]:
    svc = services()
    logger.append_keys(workspace_id=workspace_id)
    result = resume_workspace(
        workspace_id,
        tenant_id=tenant,
        halting_job_id=request.halting_job_id,
        decision=request.decision,
        operator=caller_name(http_event(router), tenant),
        guard=svc.guard,
        sqs=svc.sqs,
        queue_url=svc.settings.queue_url,
    )
    if result.outcome in (ResumeOutcome.NOT_FOUND, ResumeOutcome.OTHER_TENANT):
        # Another tenant's workspace is answered as one that does not exist: no oracle of other tenants' ids.
        raise RequestRefused(HTTPStatus.NOT_FOUND, f"no halted workspace '{workspace_id}'; check the workspaceId")
    view = workspace_item_view(svc.guard, workspace_id, result.workspace or {}, tenant)
    if result.outcome in _RESUME_CONFLICTS:
        logger.info("resume refused", extra={"outcome": str(result.outcome)})
        metrics.add_metric(name="ResumesRefused", unit=MetricUnit.Count, value=1)
        answer = ResumeConflictView(message=result.reason, workspace=view)
        raise RequestRefused(HTTPStatus.CONFLICT, result.reason, answer=answer)
    logger.info("workspace resume begun", extra={"outcome": str(result.outcome), "decision": str(request.decision)})
    metrics.add_metric(name="WorkspacesResumeBegun", unit=MetricUnit.Count, value=1)
    return Response(
        HTTPStatus.ACCEPTED, content_types.APPLICATION_JSON, view, headers={"Location": f"/workspaces/{workspace_id}"}
    )


@router.get(
    "/workspaces",
    operation_id="listHaltedWorkspaces",
    summary="List the caller's halted workspaces (HALTED or RESUMING), a page at a time",
    responses=answers({200: ("A page of halted workspaces.", HaltedWorkspacesView)}, (400, 401, 403, 422, 503)),
)
@tracer.capture_method(capture_response=False)
def list_halted_workspaces(
    tenant: CallerTenant,
    state: HaltedState,
    limit: HaltedListLimit = HALTED_LIST_DEFAULT,
    next_token: PageToken = None,
) -> HaltedWorkspacesView:
    svc = services()
    start_key = decode_halted_token(next_token, tenant)
    page = svc.guard.list_halted(tenant, limit=limit, start_key=start_key)
    metrics.add_metric(name="HaltedWorkspacesListed", unit=MetricUnit.Count, value=1)
    return HaltedWorkspacesView(
        workspaces=[
            workspace_item_view(svc.guard, str(item.get("workspaceId")), item, tenant) for item in page.workspaces
        ],
        next_token=encode_halted_token(page.next_key) if page.next_key else None,
    )
