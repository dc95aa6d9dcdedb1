"""Halted workspaces: an operator's resume decision, and the list of the caller's halted workspaces."""

# Annotations here are evaluated when the route is defined (no `from __future__ import annotations`): Powertools
# reads a handler's signature, and the Depends() of its caller parameter, through the tracer's wrapper, whose
# module could not resolve names of this one.

from http import HTTPStatus
from typing import Any, Final

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.metrics import MetricUnit

from agent_jobs.guard import ResumeOutcome
from agent_jobs.models import ResumeRequest, WorkspaceState
from agent_jobs.resume import resume_workspace

from .context import http_event, logger, metrics, services, tracer
from .cursors import decode_halted_token, encode_halted_token
from .errors import RequestRefused, json_response
from .openapi import answers, json_request_body, page_query_parameters, query_parameters
from .parsing import page_limit, parse_resume_request, valid_path_id
from .schemas import HaltedWorkspacesView, ResumeConflictView, WorkspaceStatusView
from .tenancy import CallerTenant, OperatorTenant, caller_name
from .views import workspace_item_view

router = Router()  # type: ignore[no-untyped-call]  # Powertools leaves it unannotated


HALTED_LIST_DEFAULT: Final = 50
HALTED_LIST_MAX: Final = 100


_RESUME_CONFLICTS: Final = (ResumeOutcome.NOT_HALTED, ResumeOutcome.HALTING_JOB_CHANGED, ResumeOutcome.RETRY_REFUSED)


@router.post(
    "/workspaces/<workspace_id>/resume",
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
    openapi_extensions=json_request_body(
        ResumeRequest, "The decision for the job that halted the workspace, named by the workspace's haltingJobId."
    ),
)
@tracer.capture_method(capture_response=False)
def resume(workspace_id: str, tenant: OperatorTenant) -> Response[Any]:
    svc = services()
    workspace_id = valid_path_id("workspaceId", workspace_id)
    logger.append_keys(workspace_id=workspace_id)
    request = parse_resume_request(http_event(router), svc.settings)
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
    view = workspace_item_view(workspace_id, result.workspace or {})
    if result.outcome in _RESUME_CONFLICTS:
        logger.info("resume refused", extra={"outcome": str(result.outcome)})
        metrics.add_metric(name="ResumesRefused", unit=MetricUnit.Count, value=1)
        return json_response(HTTPStatus.CONFLICT, {"message": result.reason, "workspace": view})
    logger.info("workspace resume begun", extra={"outcome": str(result.outcome), "decision": str(request.decision)})
    metrics.add_metric(name="WorkspacesResumeBegun", unit=MetricUnit.Count, value=1)
    return json_response(HTTPStatus.ACCEPTED, view, headers={"Location": f"/workspaces/{workspace_id}"})


@router.get(
    "/workspaces",
    summary="List the caller's halted workspaces (HALTED or RESUMING), a page at a time",
    responses=answers({200: ("A page of halted workspaces.", HaltedWorkspacesView)}, (400, 401, 403, 422, 503)),
    openapi_extensions=query_parameters(
        {
            "name": "state",
            "required": True,
            "description": "HALTED: the workspaces halted or resuming (the only state listed).",
            "schema": {"type": "string", "enum": [str(WorkspaceState.HALTED)]},
        },
        *page_query_parameters("Workspaces", default=HALTED_LIST_DEFAULT, maximum=HALTED_LIST_MAX),
    ),
)
@tracer.capture_method(capture_response=False)
def list_halted_workspaces(tenant: CallerTenant) -> Response[Any]:
    svc = services()
    query = http_event(router).query_string_parameters or {}
    if query.get("state") != str(WorkspaceState.HALTED):
        raise RequestRefused(
            HTTPStatus.UNPROCESSABLE_ENTITY,
            "list workspaces with GET /workspaces?state=HALTED (halted and resuming workspaces)",
            [{"field": "state", "message": "only HALTED is supported"}],
        )
    limit = page_limit(query.get("limit"), default=HALTED_LIST_DEFAULT, maximum=HALTED_LIST_MAX)
    start_key = decode_halted_token(query.get("nextToken"), tenant)
    page = svc.guard.list_halted(tenant, limit=limit, start_key=start_key)
    views = [workspace_item_view(str(item.get("workspaceId")), item) for item in page.workspaces]
    metrics.add_metric(name="HaltedWorkspacesListed", unit=MetricUnit.Count, value=1)
    return json_response(
        HTTPStatus.OK, {"workspaces": views, "nextToken": encode_halted_token(page.next_key) if page.next_key else None}
    )
