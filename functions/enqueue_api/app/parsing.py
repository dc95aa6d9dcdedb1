"""Each route's request, parsed and validated: the job, the batch, the registration, the resume decision, the path
ids and the page limit, or a refusal that names each field to fix."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any, Final
from urllib.parse import unquote

from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEventV2
from pydantic import TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from agent_jobs.models import (
    ApplyPatchJob,
    JobId,
    JobType,
    OpenPrJob,
    ResumeRequest,
    RunTestsJob,
    WorkspaceId,
    job_request_adapter,
)
from agent_jobs.patch_limits import PatchLimits, patch_bytes_error, patch_hunks_error
from agent_jobs.producer import MAX_BATCH_JOBS
from agent_jobs.registration import WorkspaceRegistration, test_commands_size_error
from agent_jobs.settings import Settings
from agent_jobs.tenancy import TenantBounds

from .bodies import batch_body_limit_bytes, json_kind, json_object_body, too_large_advice
from .errors import MAX_FIELD_ERRORS, RequestRefused

_JOB_SHAPE: Final = '{"jobId", "workspaceId", "type", "payload"}'
_WORKSPACE_SHAPE: Final = '{"remoteUrl", "branch", ...}'
_ALLOWED_TYPES: Final = ", ".join(job_type.value for job_type in JobType)
_ID_RULE: Final = "letters, digits, '.', '_' and '-', starting with a letter or digit"
ID_FIELDS: Final[dict[str, TypeAdapter[str]]] = {"jobId": TypeAdapter(JobId), "workspaceId": TypeAdapter(WorkspaceId)}


Job = ApplyPatchJob | RunTestsJob | OpenPrJob


def parse_job_request(event: APIGatewayProxyEventV2, settings: Settings) -> Job:
    """The job in the request body, or RequestRefused (415, 413, 400 or 422) naming what to fix."""
    document = json_object_body(event, settings, shape=f"a job: {_JOB_SHAPE}", too_large=too_large_advice(settings))
    job = _validate_job(document)
    errors = _patch_limit_errors(job, settings)
    if errors:
        raise RequestRefused(
            HTTPStatus.UNPROCESSABLE_ENTITY,
            "the job is invalid (1 error); fix the fields listed in 'errors' and send it again",
            errors,
        )
    return job


def _patch_limit_errors(job: Job, settings: Settings, prefix: str = "") -> list[dict[str, str]]:
    """An apply_patch job's patch over PATCH_MAX_BYTES or PATCH_MAX_HUNKS, as a field error: refused here rather than
    accepted to end DEAD in the worker."""
    if not isinstance(job, ApplyPatchJob):
        return []
    limits = PatchLimits.from_settings(settings)
    error = patch_bytes_error(job.payload.patch, limits) or patch_hunks_error(job.payload.patch, limits)
    return [{"field": f"{prefix}payload.patch", "message": error}] if error else []


def parse_job_batch(event: APIGatewayProxyEventV2, settings: Settings) -> list[Job]:
    """The jobs of a batch request body `{"jobs": [...]}`, or RequestRefused (415, 413, 400 or 422) naming what to
    fix; a job's field errors are named by its place in the batch (`jobs.3.payload.patch`). Two jobs with the same
    jobId are refused (422): a batch holds distinct jobs."""
    shape = f'{{"jobs": [1 to {MAX_BATCH_JOBS} jobs, each {_JOB_SHAPE}]}}'
    document = json_object_body(
        event,
        settings,
        shape=shape,
        too_large=too_large_advice(settings).replace("a job must", "each job must"),
        limit=batch_body_limit_bytes(settings),
    )
    errors = [{"field": key, "message": "unknown field; remove it"} for key in document if key != "jobs"]
    items = document.get("jobs")
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH_JOBS:
        got = "missing" if "jobs" not in document else f"a JSON {json_kind(items)}"
        if isinstance(items, list):
            got = f"an array of {len(items)} jobs"
        errors.append({"field": "jobs", "message": f"send an array of 1 to {MAX_BATCH_JOBS} jobs (got {got})"})
        items = []
    jobs: list[Job] = []
    first_index: dict[str, int] = {}
    uncounted = 0  # errors of a job beyond the MAX_FIELD_ERRORS its refusal kept
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            errors.append({"field": f"jobs.{index}", "message": f"a job is a JSON object: {_JOB_SHAPE}"})
            continue
        try:
            job = _validate_job(item)
        except RequestRefused as refused:
            errors.extend(
                {"field": f"jobs.{index}.{entry['field']}", "message": entry["message"]}
                for entry in refused.errors or []
            )
            uncounted += refused.more_errors
            continue
        if job.job_id in first_index:
            errors.append(
                {
                    "field": f"jobs.{index}.jobId",
                    "message": f"jobId '{job.job_id}' is also the jobId of jobs.{first_index[job.job_id]}; give each "
                    "job of a batch its own jobId",
                }
            )
        first_index.setdefault(job.job_id, index)
        errors.extend(_patch_limit_errors(job, settings, f"jobs.{index}."))
        jobs.append(job)
    if errors:
        total = len(errors) + uncounted
        refusal = RequestRefused(
            HTTPStatus.UNPROCESSABLE_ENTITY,
            f"the batch is invalid ({total} {'error' if total == 1 else 'errors'}); nothing was accepted: "
            "fix the fields listed in 'errors' and send the batch again",
            errors,
        )
        refusal.more_errors += uncounted
        raise refusal
    return jobs


def parse_workspace_registration(event: APIGatewayProxyEventV2, settings: Settings) -> WorkspaceRegistration:
    """The workspace registration in the request body, or RequestRefused (415, 413, 400 or 422) naming what to fix.

    Parsed like a job: the same content type, size limit and JSON rules, and 422 errors named by camelCase path
    (`testCommands.unit.0`). The tenant is not part of the body: `tenantId` there is an unknown field.
    """
    document = json_object_body(
        event,
        settings,
        shape=f"a workspace registration: {_WORKSPACE_SHAPE}",
        too_large="(the same limit as a job's); send fewer or shorter test commands",
    )
    try:
        registration = WorkspaceRegistration.model_validate(document)
        too_large = test_commands_size_error(registration)
        errors = [{"field": "testCommands", "message": too_large}] if too_large else []
        uncounted = 0
    except ValidationError as error:
        errors, uncounted = _field_errors(error)
    if errors:
        total = len(errors) + uncounted
        raise RequestRefused(
            HTTPStatus.UNPROCESSABLE_ENTITY,
            f"the workspace registration is invalid ({total} {'error' if total == 1 else 'errors'}); fix "
            "the fields listed in 'errors' and send it again",
            errors,
            uncounted,
        )
    return registration


def _validate_job(document: dict[str, Any]) -> Job:
    try:
        return job_request_adapter.validate_python(document)
    except ValidationError as error:
        errors, uncounted = _field_errors(error)
        if any(entry["field"] == "type" for entry in errors):
            # An unknown type stops validation at the discriminator: still report the ids in the same answer.
            errors.extend(_id_errors(document))
        total = len(errors) + uncounted
        raise RequestRefused(
            HTTPStatus.UNPROCESSABLE_ENTITY,
            f"the job is invalid ({total} {'error' if total == 1 else 'errors'}); fix the fields listed "
            "in 'errors' and send it again",
            errors,
            uncounted,
        ) from None


def _field_errors(error: ValidationError) -> tuple[list[dict[str, str]], int]:
    """The first MAX_FIELD_ERRORS field errors of `error`, and how many more there are: a body of 200,000 bad fields
    costs no more than counting them."""
    details = error.errors(include_input=False, include_url=False)
    return [_field_error(detail) for detail in details[:MAX_FIELD_ERRORS]], max(0, len(details) - MAX_FIELD_ERRORS)


def _field_error(detail: ErrorDetails) -> dict[str, str]:
    kind = detail["type"]
    if kind == "union_tag_invalid":
        tag = (detail.get("ctx") or {}).get("tag")
        return {"field": "type", "message": f"unknown job type '{tag}'; use one of: {_ALLOWED_TYPES}"}
    if kind == "union_tag_not_found":
        return {"field": "type", "message": f"Field required; use one of: {_ALLOWED_TYPES}"}
    loc = [str(part) for part in detail["loc"]]
    if loc and loc[0] in {job_type.value for job_type in JobType}:
        loc = loc[1:]  # the discriminated union puts the job type first; the API's field path does not have it
    field = ".".join(loc) or "(body)"
    message = detail["msg"]
    if kind == "extra_forbidden":
        message = "unknown field; remove it"
        if field == "tenantId":
            message = "unknown field; the tenant comes from your credentials, never from the body"
    elif field in ID_FIELDS and kind.startswith("string_"):
        message = f"{message}; a {field} is {_id_length_rule(field)} {_ID_RULE}"
    return {"field": field, "message": message}


def _id_length_rule(field: str) -> str:
    schema = ID_FIELDS[field].json_schema()
    return f"{schema['minLength']} to {schema['maxLength']} characters:"


def _id_errors(document: dict[str, Any]) -> list[dict[str, str]]:
    errors = []
    for field, adapter in ID_FIELDS.items():
        try:
            adapter.validate_python(document.get(field))
        except ValidationError as error:
            detail = error.errors(include_input=False, include_url=False)[0]
            message = "Field required" if field not in document else detail["msg"]
            errors.append({"field": field, "message": f"{message}; a {field} is {_id_length_rule(field)} {_ID_RULE}"})
    return errors


def valid_path_id(field: str, raw: str) -> str:
    """A jobId or workspaceId from the URL path (percent-decoded), or a 422 naming it."""
    value = unquote(raw)
    try:
        return ID_FIELDS[field].validate_python(value)
    except ValidationError as error:
        detail = error.errors(include_input=False, include_url=False)[0]
        raise RequestRefused(
            HTTPStatus.UNPROCESSABLE_ENTITY,
            f"the {field} in the path is invalid",
            [{"field": field, "message": f"{detail['msg']}; a {field} is {_id_length_rule(field)} {_ID_RULE}"}],
        ) from None


def check_tenant_bounds(registration: WorkspaceRegistration, tenant: str, settings: Settings) -> None:
    """A 422 naming each token, remote or host of `registration` outside `tenant`'s bounds (`agent_jobs.tenancy`)."""
    errors = TenantBounds.from_settings(settings).registration_errors(registration, tenant)
    if errors:
        raise RequestRefused(
            HTTPStatus.UNPROCESSABLE_ENTITY,
            f"the workspace registration names what this tenant may not use ({len(errors)} "
            f"{'error' if len(errors) == 1 else 'errors'}); fix the fields listed in 'errors' and send it again",
            errors,
        )


PAGE_LIMIT_DEFAULT: Final = 25
PAGE_LIMIT_MAX: Final = 100


def page_limit(raw: str | None, *, default: int = PAGE_LIMIT_DEFAULT, maximum: int = PAGE_LIMIT_MAX) -> int:
    """The `limit` query parameter of a listing: 1..maximum, `default` when absent; otherwise a 422 naming the rule
    (checked as ASCII digits before it is read as a number: `int` refuses some Unicode digits and very long numbers
    with an error)."""
    if raw is None or raw == "":
        return default
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 3 and 1 <= int(raw) <= maximum):
        raise RequestRefused(
            HTTPStatus.UNPROCESSABLE_ENTITY,
            "the limit query parameter is invalid",
            [
                {
                    "field": "limit",
                    "message": f"limit is a whole number from 1 to {maximum} (default {default}); got '{raw[:20]}'",
                }
            ],
        )
    return int(raw)


_RESUME_SHAPE: Final = '{"decision": "retry"|"skip", "haltingJobId": "<the workspace\'s haltingJobId>"}'


def parse_resume_request(event: APIGatewayProxyEventV2, settings: Settings) -> ResumeRequest:
    """The resume decision in the request body, or RequestRefused (415, 413, 400 or 422) naming what to fix."""
    document = json_object_body(
        event, settings, shape=f"a resume decision: {_RESUME_SHAPE}", too_large="(a resume decision is a few bytes)"
    )
    try:
        return ResumeRequest.model_validate(document)
    except ValidationError as error:
        errors, uncounted = _field_errors(error)
        raise RequestRefused(
            HTTPStatus.UNPROCESSABLE_ENTITY, f"the resume request is invalid; send {_RESUME_SHAPE}", errors, uncounted
        ) from None
