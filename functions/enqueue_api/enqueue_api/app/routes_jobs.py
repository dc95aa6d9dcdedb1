"""Jobs: submit one, submit a batch, read one."""

# Annotations here are evaluated when the route is defined (no `from __future__ import annotations`): Powertools
# reads a handler's signature, and the Depends() of its caller parameter, through the tracer's wrapper, whose
# module could not resolve names of this one.

from http import HTTPStatus
from typing import Annotated, Final

from aws_lambda_powertools.event_handler import Response, content_types
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body
from aws_lambda_powertools.metrics import MetricUnit

from agent_jobs.models import JobRequest
from agent_jobs.producer import (
    JobConflictError,
    PayloadTooLargeError,
    WorkspaceForbiddenError,
    WorkspaceUnregisteredError,
    enqueue_job,
    enqueue_jobs,
)
from agent_jobs.quotas import QuotaExceededError

from .context import logger, metrics, producer, registration_checks, services, tracer
from .errors import RequestRefused
from .openapi import answers
from .params import JobIdInPath
from .rules import check_batch, check_batch_fits, check_job, check_job_fits
from .schemas import BatchItemView, ConflictView, JobAcceptedView, JobBatchRequest, JobBatchView, JobView
from .tenancy import CallerTenant
from .views import public_job_view

JobBody = Annotated[
    JobRequest, Body(embed=False, description="A job: its jobId, workspaceId, type and the type's payload.")
]
BatchBody = Annotated[
    JobBatchRequest, Body(embed=False, description="1 to 10 jobs, each as POST /jobs takes it, with distinct jobIds.")
]

JOB_REFUSED: Final = (
    "A field is invalid, or the job does not fit its workspace: a run_tests suite the registration lacks, an open_pr "
    "on a workspace without githubRepository, an apply_patch patch that is no diff or is over PATCH_MAX_BYTES or "
    "PATCH_MAX_HUNKS. `errors` names each field; the message says what to fix. Nothing was accepted."
)
BATCH_REFUSED: Final = (
    "A job of the batch is invalid or does not fit its workspace (as POST /jobs refuses it), or a jobId appears "
    "twice: `errors` names each field as `jobs.<index>.<field>`. Nothing was accepted."
)

router = Router()  # type: ignore[no-untyped-call]  # Powertools leaves it unannotated


@router.post(
    "/jobs",
    operation_id="submitJob",
    summary="Submit a job to a workspace",
    responses=answers(
        {202: ("Accepted, or already accepted with the same payload (`created` false).", JobAcceptedView)},
        (400, 401, 403, 404, 409, 413, 415, 422, 429, 503),
        models={409: ConflictView},
        retry_after=(HTTPStatus.TOO_MANY_REQUESTS, HTTPStatus.SERVICE_UNAVAILABLE),
        descriptions={422: JOB_REFUSED},
    ),
)
@tracer.capture_method(capture_response=False)
def submit_job(job: JobBody, tenant: CallerTenant) -> Response[JobAcceptedView]:
    svc = services()
    check_job(job, svc.settings)
    check_job_fits(job, tenant, registration_checks())
    logger.append_keys(job_id=job.job_id, workspace_id=job.workspace_id, job_type=str(job.type))
    tracer.put_annotation("jobId", job.job_id)
    try:
        result = enqueue_job(job, tenant, **producer(svc))
    except QuotaExceededError as quota:
        logger.info("job quota used up", extra={"parameter": quota.parameter, "limit": quota.limit})
        metrics.add_metric(name="JobsRefusedByQuota", unit=MetricUnit.Count, value=1)
        raise RequestRefused(
            HTTPStatus.TOO_MANY_REQUESTS, str(quota), headers={"Retry-After": str(quota.retry_after)}
        ) from None
    except PayloadTooLargeError as too_large:
        raise RequestRefused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, str(too_large)) from None
    except JobConflictError as conflict:
        logger.info("jobId already taken by another job")
        metrics.add_metric(name="JobsConflict", unit=MetricUnit.Count, value=1)
        answer = ConflictView(message=str(conflict), job_id=job.job_id)
        raise RequestRefused(HTTPStatus.CONFLICT, str(conflict), answer=answer) from None
    except WorkspaceForbiddenError as forbidden:
        logger.info("workspace belongs to another tenant")  # answered as an unregistered workspace: no oracle
        raise RequestRefused(HTTPStatus.NOT_FOUND, str(forbidden)) from None
    except WorkspaceUnregisteredError as unregistered:
        logger.info("workspace not registered")
        raise RequestRefused(HTTPStatus.NOT_FOUND, str(unregistered)) from None
    metrics.add_metric(name="JobsAccepted" if result.created else "JobsResubmitted", unit=MetricUnit.Count, value=1)
    logger.info("job accepted" if result.created else "job already accepted", extra={"status": result.status})
    return Response(
        HTTPStatus.ACCEPTED,
        content_types.APPLICATION_JSON,
        JobAcceptedView.model_validate(result.as_response()),
        headers={"Location": f"/jobs/{job.job_id}"},
    )


@router.post(
    "/jobs:batch",
    operation_id="submitJobBatch",
    summary="Submit up to 10 jobs at once",
    responses=answers(
        {200: ("The batch was processed: one result per job, each with its own statusCode.", JobBatchView)},
        (400, 401, 403, 413, 415, 422, 503),
        descriptions={422: BATCH_REFUSED},
    ),
)
@tracer.capture_method(capture_response=False)
def submit_jobs(batch: BatchBody, tenant: CallerTenant) -> Response[JobBatchView]:
    svc = services()
    jobs = batch.jobs
    check_batch(jobs, svc.settings)
    check_batch_fits(jobs, tenant, registration_checks())
    logger.append_keys(job_ids=[job.job_id for job in jobs])
    results = enqueue_jobs(jobs, tenant, **producer(svc))
    counts = {
        "JobsAccepted": sum(1 for r in results if r.accepted and r.created),
        "JobsResubmitted": sum(1 for r in results if r.accepted and not r.created),
        "JobsConflict": sum(1 for r in results if r.status_code == HTTPStatus.CONFLICT),
        "JobsRefusedByQuota": sum(1 for r in results if r.status_code == HTTPStatus.TOO_MANY_REQUESTS),
    }
    for name, value in counts.items():
        if value:
            metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)
    logger.info("batch processed", extra={"statusCodes": [r.status_code for r in results]})
    waits = [r.retry_after for r in results if r.retry_after is not None]
    headers = {"Retry-After": str(max(waits))} if waits else None
    view = JobBatchView(results=[BatchItemView.model_validate(r.as_response()) for r in results])
    return Response(HTTPStatus.OK, content_types.APPLICATION_JSON, view, headers=headers)


@router.get(
    "/jobs/<jobId>",
    operation_id="readJob",
    summary="Read a job's state and history",
    responses=answers({200: ("The job.", JobView)}, (401, 403, 404, 422, 503)),
)
@tracer.capture_method(capture_response=False)
def read_job(job_id: JobIdInPath, tenant: CallerTenant) -> JobView:
    svc = services()
    logger.append_keys(job_id=job_id)
    # Keyed by the caller's tenant: another tenant's job of the same jobId is not the caller's job, and is answered
    # exactly as a jobId nobody used (404), so the answer tells nothing about other tenants' jobIds.
    item = svc.guard.get_job(tenant, job_id)
    if item is None:
        raise RequestRefused(HTTPStatus.NOT_FOUND, f"no job '{job_id}'; check the jobId returned when it was accepted")
    metrics.add_metric(name="JobsRead", unit=MetricUnit.Count, value=1)
    return public_job_view(item)
