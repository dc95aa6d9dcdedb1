"""Producer API (HTTP API, payload format 2.0): accept a job for a workspace, and read a job's state.

    POST /jobs           body: {"jobId", "workspaceId", "type", "payload"}
                         202 accepted, or already accepted with the same payload ("created": false)
                         409 the jobId is taken by another job of the tenant; 404 a workspace the tenant has not
                         registered (another tenant's answers the same); 429 a job quota (the tenant's jobs per
                         second, the workspace's queued jobs) is used up: send again after Retry-After; 400, 413, 415,
                         422 a request to fix; 503 retry
    POST /jobs:batch     body: {"jobs": [1 to 10 jobs, each as POST /jobs takes it]}
                         200 {"results": [one per job, in request order: jobId, statusCode (202 accepted, "created"
                         false for a repeat; 409; 404; 413; 429 a quota, see Retry-After; 503 retry that job),
                         status, messageId, sequenceNumber, created, message]}; 400, 413, 415, 422 a batch to fix
                         (nothing accepted); 503 retry the batch
    GET  /jobs/{jobId}   200 the job's public state and history; 404 no job of the tenant by that id; 422 bad id
    PUT  /workspaces/{workspaceId}
                         body: {"remoteUrl", "branch", "baseBranch", "testCommands", "tokenParameter",
                         "githubRepository", "githubApiUrl"}; 201 registered, 200 updated; 403 another tenant's
                         workspace; 429 the tenant's workspace quota is used up; 400, 413, 415, 422 a request to
                         fix (422 also for a token, remote or host outside the tenant's bounds); 503 retry
                         (registering is idempotent)
    GET  /workspaces/{workspaceId}
                         200 the registration, the workspace's state (ACTIVE, HALTED, RESUMING) and lastAppliedJobId;
                         404 neither registered nor halted for the tenant; 422 bad id
    GET  /workspaces/{workspaceId}/jobs?limit=&nextToken=
                         200 {"jobs": [job views, oldest accepted first], "nextToken": str | null}; 400 a nextToken
                         this API did not issue for the workspace; 404 as above; 422 bad id or limit
    GET  /openapi.json   200 the OpenAPI document of these routes (no authentication)
    POST /workspaces/{workspaceId}/resume
                         body: {"decision": "retry"|"skip", "haltingJobId"}; operator scope, own tenant only.
                         202 the workspace's status (RESUMING, or ACTIVE when nothing was parked, or still HALTED by
                         the next undecided job); 409 not HALTED,
                         another halting job, or retry of a rejected message; 403 no operator scope; 404 no halted
                         workspace of the tenant; 400, 413, 415, 422 a request to fix; 503 retry (the same request is
                         safe)
    GET  /workspaces?state=HALTED[&limit=&nextToken=]
                         200 {"workspaces": [status of each HALTED or RESUMING workspace], "nextToken"}; 422 another
                         state, a bad limit or a nextToken this API did not give the caller; 403 no usable tenant

Tenancy: the caller's tenant comes from `caller_tenant` and nowhere else. It is the `tenant_id` claim of the verified
JWT that the API's JWT authorizer puts at `requestContext.authorizer.jwt.claims` (API Gateway itself answers 401 to a
request without a valid token, before this function runs). A request without an authorizer context is refused (401);
one whose authorizer gave no usable `tenant_id` claim is refused (403). A body never names a tenant: the job model
forbids unknown fields, so a body carrying `tenantId` is refused with 422. A job for a workspace the tenant has not
registered is refused with 404, nothing recorded or queued, whether nobody registered it or another tenant did: the
words are the same, so no answer tells one tenant which jobIds or workspaceIds another uses. JobIds are each tenant's
own names (the job's key holds the tenant). A registration names only the tenant's own tokens and file-system remotes
and only public hosts (`agent_jobs.tenancy`).

Repeating a request is always safe: a jobId is accepted at most once per tenant, and a repeat with the same payload
is answered from the job's record. The AWS clients are built on the first invocation and kept while the environment
is warm; `reset_services()` forgets them (tests call it after changing the environment).
"""

from __future__ import annotations

import base64
import binascii
import inspect
import json
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import unquote

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response, content_types
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEventV2
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.exceptions import ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as AwsConnectionError
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.alias_generators import to_camel
from pydantic_core import ErrorDetails

from agent_jobs.guard import ResumeOutcome
from agent_jobs.keys import workspace_key
from agent_jobs.models import (
    ApplyPatchJob,
    JobId,
    JobRequest,
    JobType,
    OpenPrJob,
    ResumeDecision,
    ResumeRequest,
    RunTestsJob,
    TenantId,
    WorkspaceId,
    WorkspaceState,
    job_request_adapter,
)
from agent_jobs.patch_limits import PatchLimits, patch_bytes_error, patch_hunks_error
from agent_jobs.producer import (
    MAX_BATCH_JOBS,
    JobConflictError,
    PayloadTooLargeError,
    WorkspaceForbiddenError,
    WorkspaceUnregisteredError,
    enqueue_job,
    enqueue_jobs,
)
from agent_jobs.quotas import JobQuotas, QuotaExceededError
from agent_jobs.registration import RegisteredWorkspace, WorkspaceRegistration, test_commands_size_error
from agent_jobs.resume import resume_workspace
from agent_jobs.services import Services, build_services
from agent_jobs.settings import Settings
from agent_jobs.tenancy import TenantBounds
from agent_jobs.workspaces import (
    WorkspaceOwnedElsewhereError,
    WorkspaceQuotaError,
    WorkspaceRegistry,
    WorkspaceStatus,
    workspace_status,
)

if TYPE_CHECKING:
    from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse

logger = Logger()
tracer = Tracer()
metrics = Metrics()
app = APIGatewayHttpResolver()

TENANT_CLAIM: Final = "tenant_id"
# Operator actions (resume, skip) need this scope in the token, for the caller's own tenant only.
OPERATOR_SCOPE: Final = "agent-jobs/operator"
# Why the request limit is what it is, for the 413: API Gateway's HTTP API accepts 10 MB, but it hands the request to
# the function as a synchronous invocation, whose event (the body JSON-escaped inside it) is capped at 6 MB.
REQUEST_LIMIT_REASON: Final = (
    "a request reaches this API's function as a synchronous Lambda invocation, whose event is capped at 6 MB "
    "(the body, escaped, inside it), below API Gateway's own 10 MB"
)
JSON_MEDIA_TYPE: Final = "application/json"
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
    "registeredAt",
)
PUBLIC_WORKSPACE_STATE_FIELDS: Final = ("state", "haltingJobId", "haltReason", "lastAppliedJobId", "lastResume")
_JOB_SHAPE: Final = '{"jobId", "workspaceId", "type", "payload"}'
_WORKSPACE_SHAPE: Final = '{"remoteUrl", "branch", ...}'
_ALLOWED_TYPES: Final = ", ".join(job_type.value for job_type in JobType)
_ID_RULE: Final = "letters, digits, '.', '_' and '-', starting with a letter or digit"
_ID_FIELDS: Final[dict[str, TypeAdapter[str]]] = {"jobId": TypeAdapter(JobId), "workspaceId": TypeAdapter(WorkspaceId)}
_tenant_id_adapter: TypeAdapter[str] = TypeAdapter(TenantId)

Job = ApplyPatchJob | RunTestsJob | OpenPrJob

_services: Services | None = None


def services() -> Services:
    """Built on the first invocation (settings from the environment) and reused while the environment is warm."""
    global _services  # noqa: PLW0603
    if _services is None:
        _services = build_services()
    return _services


def reset_services() -> None:
    """Forget the cached clients and settings; the next invocation builds them from the environment again."""
    global _services  # noqa: PLW0603
    _services = None


# A 422 lists at most this many field errors and counts the rest (`moreErrors`): the answer to a body with a great
# many bad fields stays small.
MAX_FIELD_ERRORS: Final = 20


class RequestRefused(Exception):
    """A request the API answers with a 4xx: the status and a message that says what to do. Of `errors`, the first
    MAX_FIELD_ERRORS are kept and the rest counted in `more_errors`."""

    def __init__(
        self, status: HTTPStatus, message: str, errors: list[dict[str, str]] | None = None, more_errors: int = 0
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.errors = None if errors is None else errors[:MAX_FIELD_ERRORS]
        self.more_errors = more_errors + (0 if errors is None else max(0, len(errors) - MAX_FIELD_ERRORS))


def _json_response(status: HTTPStatus, body: dict[str, Any], headers: dict[str, str] | None = None) -> Response[Any]:
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON, body=body, headers=headers)


# ---- tenancy -------------------------------------------------------------------------------------------------------


def caller_tenant(event: APIGatewayProxyEventV2, settings: Settings) -> str:
    """The tenant of the caller: the verified JWT's `tenant_id` claim. The only place a tenant is derived; the body
    is never consulted.

    Fails closed: a request without an authorizer context (a route deployed without the authorizer, a direct
    invocation) is 401; one that went through an authorizer without yielding a usable `tenant_id` claim (another
    authorizer kind, a token without the claim) is 403.
    """
    if not event.request_context.get("authorizer"):
        raise RequestRefused(HTTPStatus.UNAUTHORIZED, "authentication required: send a bearer token for your tenant")
    tenant = event.request_context.authorizer.jwt_claim.get(TENANT_CLAIM)
    if not isinstance(tenant, str) or not _is_valid_tenant(tenant):
        raise RequestRefused(
            HTTPStatus.FORBIDDEN,
            f"the access token has no usable '{TENANT_CLAIM}' claim; ask for a token issued for your tenant",
        )
    return tenant


def caller_scopes(event: APIGatewayProxyEventV2) -> frozenset[str]:
    """The scopes of the verified token: the authorizer's `jwt.scopes`, else its `scope` (space-separated) or `scp`
    claim. A request without an authorizer has none."""
    authorizer = (event.raw_event.get("requestContext") or {}).get("authorizer") or {}
    jwt = authorizer.get("jwt") or {}
    scopes = jwt.get("scopes")
    if not scopes:
        claims = jwt.get("claims") or {}
        scopes = claims.get("scope") or claims.get("scp") or []
    if isinstance(scopes, str):
        scopes = scopes.split()
    return frozenset(str(scope) for scope in scopes)


def require_operator(event: APIGatewayProxyEventV2, settings: Settings) -> str:
    """The caller's tenant, if the caller holds the operator scope (operator actions act only on its own tenant)."""
    tenant = caller_tenant(event, settings)
    if OPERATOR_SCOPE not in caller_scopes(event):
        raise RequestRefused(
            HTTPStatus.FORBIDDEN, f"this action needs the '{OPERATOR_SCOPE}' scope; ask for an operator token"
        )
    return tenant


def _is_valid_tenant(tenant: str) -> bool:
    try:
        _tenant_id_adapter.validate_python(tenant)
    except ValidationError:
        return False
    return True


# ---- request parsing -----------------------------------------------------------------------------------------------


def body_limit_bytes(settings: Settings) -> int:
    """The largest request body: MAX_REQUEST_BYTES; without a payload bucket, what fits in one queue message."""
    if settings.payload_bucket:
        return settings.max_request_bytes
    return min(settings.max_request_bytes, settings.inline_message_limit_bytes)


def _too_large_advice(settings: Settings) -> str:
    if not settings.payload_bucket:
        return (
            "(INLINE_MESSAGE_LIMIT_BYTES: without a payload bucket, PAYLOAD_BUCKET, a job must fit in one queue "
            "message); send a smaller payload or configure a payload bucket"
        )
    return (
        f"(MAX_REQUEST_BYTES) because {REQUEST_LIMIT_REASON}; send a smaller payload: split a large patch into "
        "several apply_patch jobs (they run in order), or leave generated files out of it"
    )


def parse_job_request(event: APIGatewayProxyEventV2, settings: Settings) -> Job:
    """The job in the request body, or RequestRefused (415, 413, 400 or 422) naming what to fix."""
    document = _json_object_body(event, settings, shape=f"a job: {_JOB_SHAPE}", too_large=_too_large_advice(settings))
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


def batch_body_limit_bytes(settings: Settings) -> int:
    """The largest batch body: MAX_REQUEST_BYTES; without a payload bucket, what fits in MAX_BATCH_JOBS messages."""
    if settings.payload_bucket:
        return settings.max_request_bytes
    return min(settings.max_request_bytes, MAX_BATCH_JOBS * settings.inline_message_limit_bytes)


def parse_job_batch(event: APIGatewayProxyEventV2, settings: Settings) -> list[Job]:
    """The jobs of a batch request body `{"jobs": [...]}`, or RequestRefused (415, 413, 400 or 422) naming what to
    fix; a job's field errors are named by its place in the batch (`jobs.3.payload.patch`). Two jobs with the same
    jobId are refused (422): a batch holds distinct jobs."""
    shape = f'{{"jobs": [1 to {MAX_BATCH_JOBS} jobs, each {_JOB_SHAPE}]}}'
    document = _json_object_body(
        event,
        settings,
        shape=shape,
        too_large=_too_large_advice(settings).replace("a job must", "each job must"),
        limit=batch_body_limit_bytes(settings),
    )
    errors = [{"field": key, "message": "unknown field; remove it"} for key in document if key != "jobs"]
    items = document.get("jobs")
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH_JOBS:
        got = "missing" if "jobs" not in document else f"a JSON {_json_kind(items)}"
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
    document = _json_object_body(
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


def _json_object_body(
    event: APIGatewayProxyEventV2, settings: Settings, *, shape: str, too_large: str, limit: int | None = None
) -> dict[str, Any]:
    """The request body as a JSON object: 415 not JSON, 413 over the limit (`body_limit_bytes` unless `limit` says
    otherwise), 400 empty, malformed or not an object."""
    _require_json_content_type(event)
    raw = _body_bytes(event)
    limit = body_limit_bytes(settings) if limit is None else limit
    if len(raw) > limit:
        raise RequestRefused(
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            f"the request body is {len(raw)} bytes; the limit is {limit} bytes {too_large}",
        )
    if not raw.strip():
        raise RequestRefused(HTTPStatus.BAD_REQUEST, f"the request body is empty; send {shape}")
    document = _parse_json(raw)
    if not isinstance(document, dict):
        raise RequestRefused(
            HTTPStatus.BAD_REQUEST, f"the request body is a JSON {_json_kind(document)}; send a JSON object: {shape}"
        )
    return document


def _json_kind(document: Any) -> str:
    kinds = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}
    return kinds.get(type(document), type(document).__name__)


def _require_json_content_type(event: APIGatewayProxyEventV2) -> None:
    content_type = event.headers.get("content-type")
    if content_type is None:
        return
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type != JSON_MEDIA_TYPE and not media_type.endswith("+json"):
        raise RequestRefused(
            HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
            f"Content-Type '{content_type}' is not JSON; send the body as {JSON_MEDIA_TYPE}",
        )


def _body_bytes(event: APIGatewayProxyEventV2) -> bytes:
    body = event.body or ""
    if event.is_base64_encoded:
        try:
            return base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            raise RequestRefused(HTTPStatus.BAD_REQUEST, "the request body is not valid base64") from None
    try:
        return body.encode("utf-8")
    except UnicodeEncodeError:
        raise RequestRefused(HTTPStatus.BAD_REQUEST, "the request body is not valid UTF-8 text") from None


def _parse_json(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RequestRefused(HTTPStatus.BAD_REQUEST, "the request body is not valid UTF-8 text") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise RequestRefused(
            HTTPStatus.BAD_REQUEST,
            f"the request body is not valid JSON ({error.msg} at line {error.lineno}, column {error.colno})",
        ) from None
    except (ValueError, RecursionError):  # numbers beyond the int digit limit; nesting beyond the recursion limit
        raise RequestRefused(HTTPStatus.BAD_REQUEST, "the request body is JSON this API cannot read") from None
    try:
        # "\ud800" escapes decode to lone surrogates, which cannot be hashed, stored or sent: refuse them here.
        dumped = json.dumps(document, ensure_ascii=False)
        dumped.encode("utf-8")
    except UnicodeEncodeError:
        raise RequestRefused(
            HTTPStatus.BAD_REQUEST, "the request body contains an unpaired surrogate escape; send valid Unicode text"
        ) from None
    if "\ufffe" in dumped or "\uffff" in dumped:
        # SQS refuses a message holding either (JSON escapes the other characters it refuses): never a 503 to retry.
        raise RequestRefused(
            HTTPStatus.BAD_REQUEST,
            "the request body contains U+FFFE or U+FFFF, which the job queue does not accept; remove them",
        )
    return document


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
    elif field in _ID_FIELDS and kind.startswith("string_"):
        message = f"{message}; a {field} is {_id_length_rule(field)} {_ID_RULE}"
    return {"field": field, "message": message}


def _id_length_rule(field: str) -> str:
    schema = _ID_FIELDS[field].json_schema()
    return f"{schema['minLength']} to {schema['maxLength']} characters:"


def _id_errors(document: dict[str, Any]) -> list[dict[str, str]]:
    errors = []
    for field, adapter in _ID_FIELDS.items():
        try:
            adapter.validate_python(document.get(field))
        except ValidationError as error:
            detail = error.errors(include_input=False, include_url=False)[0]
            message = "Field required" if field not in document else detail["msg"]
            errors.append({"field": field, "message": f"{message}; a {field} is {_id_length_rule(field)} {_ID_RULE}"})
    return errors


def _valid_path_id(field: str, raw: str) -> str:
    """A jobId or workspaceId from the URL path (percent-decoded), or a 422 naming it."""
    value = unquote(raw)
    try:
        return _ID_FIELDS[field].validate_python(value)
    except ValidationError as error:
        detail = error.errors(include_input=False, include_url=False)[0]
        raise RequestRefused(
            HTTPStatus.UNPROCESSABLE_ENTITY,
            f"the {field} in the path is invalid",
            [{"field": field, "message": f"{detail['msg']}; a {field} is {_id_length_rule(field)} {_ID_RULE}"}],
        ) from None


def public_job_view(item: dict[str, Any]) -> dict[str, Any]:
    """What a tenant may see of its job: never the lease owner or stored message bodies."""
    return {name: item.get(name) for name in PUBLIC_JOB_FIELDS}


def public_workspace_view(workspace: RegisteredWorkspace) -> dict[str, Any]:
    """A registration as its owner sees it (the token's location, never a token)."""
    registration = workspace.registration.model_dump(by_alias=True)
    view = {"workspaceId": workspace.workspace_id, "tenantId": workspace.tenant_id, **registration}
    view["registeredAt"] = workspace.registered_at
    return {name: view.get(name) for name in PUBLIC_WORKSPACE_FIELDS}


def public_workspace_status_view(status: WorkspaceStatus, last_applied_job_id: str | None = None) -> dict[str, Any]:
    """The registration (its fields null when the workspace only carries halt state), the workspace's state, the
    last job that took effect on it (null when unknown or none) and the last resume decision (null when none)."""
    if status.registered is not None:
        view = public_workspace_view(status.registered)
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
    return view


def job_quotas(svc: Services) -> JobQuotas:
    return JobQuotas(
        svc.dynamodb,
        svc.settings.table_name,
        jobs_per_second_per_tenant=svc.settings.max_jobs_per_second_per_tenant,
        queued_jobs_per_workspace=svc.settings.max_queued_jobs_per_workspace,
    )


def workspace_registry(svc: Services) -> WorkspaceRegistry:
    return WorkspaceRegistry(
        svc.dynamodb, svc.settings.table_name, max_workspaces_per_tenant=svc.settings.max_workspaces_per_tenant
    )


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


# ---- the workspace timeline ----------------------------------------------------------------------------------------

PAGE_LIMIT_DEFAULT: Final = 25
PAGE_LIMIT_MAX: Final = 100
_NEXT_TOKEN_VERSION: Final = 1
_NEXT_TOKEN_MAX_CHARS: Final = 2048
_NEXT_TOKEN_CHARS: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


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


def page_query_parameters(items: str, *, default: int, maximum: int) -> list[dict[str, Any]]:
    """The OpenAPI description of a listing's `limit` and `nextToken` query parameters."""
    return [
        {
            "name": "limit",
            "required": False,
            "description": f"{items} per page, 1 to {maximum}.",
            "schema": {"type": "integer", "minimum": 1, "maximum": maximum, "default": default},
        },
        {
            "name": "nextToken",
            "required": False,
            "description": "The previous page's nextToken (opaque); leave it out for the first page.",
            "schema": {"type": "string"},
        },
    ]


def encode_next_token(workspace_id: str, key: Mapping[str, Any]) -> str:
    """An opaque cursor: base64url JSON of where the index read stopped, bound to the workspace it was issued for."""
    document = {"v": _NEXT_TOKEN_VERSION, "ws": workspace_id, "pk": key["pk"], "at": key["acceptedAt"]}
    return base64.urlsafe_b64encode(json.dumps(document, separators=(",", ":")).encode()).decode().rstrip("=")


def decode_next_token(token: str | None, workspace_id: str) -> dict[str, Any] | None:
    """The index position a `nextToken` continues from, or a 400 when this API did not issue it for this workspace.

    The token is not signed: a client that edits one can only move its own cursor within this workspace (the query
    is always for the workspace in the path and the caller's own jobs), so what is checked is its shape and its
    binding to the workspace, which also keeps a malformed key from ever reaching DynamoDB.
    """
    if token is None or token == "":
        return None
    refused = RequestRefused(
        HTTPStatus.BAD_REQUEST,
        f"the nextToken is not one this API issued for workspace '{workspace_id}'; pass the nextToken of the previous "
        "page of this workspace's timeline unchanged, or leave it out to start from the oldest job",
    )
    if len(token) > _NEXT_TOKEN_MAX_CHARS or not set(token) <= _NEXT_TOKEN_CHARS:
        raise refused
    try:
        document = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (binascii.Error, ValueError):
        raise refused from None
    if not isinstance(document, dict) or set(document) != {"v", "ws", "pk", "at"}:
        raise refused
    pk, accepted_at = document["pk"], document["at"]
    if (
        document["v"] != _NEXT_TOKEN_VERSION
        or document["ws"] != workspace_id
        or not isinstance(pk, str)
        or not 0 < len(pk) <= 1024
        or not isinstance(accepted_at, int)
        or isinstance(accepted_at, bool)
        or not 0 <= accepted_at < 10**15
    ):
        raise refused
    return {"pk": pk, "workspaceId": workspace_id, "acceptedAt": accepted_at}


# ---- the OpenAPI document ------------------------------------------------------------------------------------------
#
# Generated by Powertools from the registered routes (so a route added later is listed without further work), with
# Powertools' request validation left off: the handlers parse their requests themselves and answer 400/413/415/422
# with their own messages and `errors` lists. What a handler parses itself is declared next to its route:
# `json_request_body(model, ...)` for a JSON body and `query_parameters(...)` for query parameters, both passed as the
# route's `openapi_extensions`; each answer is declared in the route's `responses` (`answers(...)`).

OPENAPI_PATH: Final = "/openapi.json"
SECURITY_SCHEME: Final = "bearerAuth"
_COMPONENT_REF: Final = "#/components/schemas/{model}"
_QUERY_PARAMETERS_KEY: Final = "x-query-parameters"
_body_schemas: dict[str, Any] = {}
_openapi_document: dict[str, Any] | None = None


class _View(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class FieldErrorView(_View):
    field: str = Field(description="The field's camelCase path in the body (`payload.patch`), or a parameter name.")
    message: str


class ErrorView(_View):
    message: str = Field(description="What went wrong and what to do about it.")
    errors: list[FieldErrorView] | None = Field(
        default=None, description=f"One entry per invalid field (422), the first {MAX_FIELD_ERRORS} of them."
    )
    more_errors: int | None = Field(
        default=None, description="How many more invalid fields there are than `errors` lists; absent when none."
    )


class ConflictView(_View):
    message: str
    job_id: str


class JobAcceptedView(_View):
    job_id: str
    status: str
    message_id: str | None
    sequence_number: str | None
    created: bool = Field(description="False when this repeated a job already accepted with the same payload.")


class JobBatchRequest(BaseModel):
    """A batch of jobs, each as `POST /jobs` takes it; a jobId at most once."""

    model_config = ConfigDict(extra="forbid")

    jobs: list[JobRequest] = Field(min_length=1, max_length=MAX_BATCH_JOBS)


class BatchItemView(_View):
    job_id: str
    status_code: int = Field(
        description="What POST /jobs would answer for this job alone: 202 accepted (`created` false: a repeat of a job "
        "already accepted with the same payload), 409 the jobId is taken by another job of the tenant, 404 a "
        "workspace the tenant has not registered (another tenant's is answered the same), 413 too large, 429 a "
        "quota refused it (send it again after the answer's Retry-After), 503 the queue did not take it (send the "
        "same job again)."
    )
    status: str | None
    message_id: str | None
    sequence_number: str | None = Field(description="The queue's SequenceNumber: the order jobs take effect in.")
    created: bool
    message: str | None = Field(description="Why the job was not accepted, and what to do; null when accepted.")


class JobBatchView(_View):
    results: list[BatchItemView] = Field(description="One per job, in the order of the request.")


class JobView(_View):
    """A job as its tenant sees it. Every field is present; a field not recorded yet is null."""

    job_id: str | None = Field(description="Null only for a rejected message that named no usable jobId.")
    workspace_id: str | None
    tenant_id: str | None
    type: str | None
    status: str | None = Field(description="QUEUED, IN_FLIGHT, SUCCEEDED, FAILED, DEAD, REJECTED, PARKED or SKIPPED.")
    attempt: int | None = Field(description="Claims by a worker, counting those of invocations that never came back.")
    failures: int | None = Field(description="Failed attempts recorded: MaxAttempts of them make the job DEAD.")
    accepted_at: int | None = Field(description="Epoch milliseconds.")
    updated_at: int | None
    finished_at: int | None
    message_id: str | None
    sequence_number: str | None = Field(description="The queue's SequenceNumber: the order jobs take effect in.")
    result: dict[str, Any] | None
    error: str | None
    history: list[dict[str, Any]] | None


class JobTimelineView(_View):
    jobs: list[JobView] = Field(description="Oldest accepted first.")
    next_token: str | None = Field(description="Pass as nextToken for the next page; null on the last page.")


class WorkspaceView(_View):
    workspace_id: str
    tenant_id: str
    remote_url: str
    branch: str
    base_branch: str
    test_commands: dict[str, list[str]]
    token_parameter: str | None
    github_repository: str | None
    github_api_url: str | None
    registered_at: int


class LastResumeView(_View):
    """An operator's resume decision. While the workspace is RESUMING it is the resume under way: sending the same
    decision and haltingJobId to the resume route again sends its drain marker again."""

    decision: ResumeDecision
    halting_job_id: str = Field(description="The job the decision was for.")
    at: int | None = Field(description="Epoch milliseconds.")
    by: str | None = Field(description="Who decided (the operator token's subject).")


class WorkspaceStatusView(_View):
    """The registration (null fields when the workspace only carries halt state) and the workspace's state."""

    workspace_id: str
    tenant_id: str | None
    remote_url: str | None
    branch: str | None
    base_branch: str | None
    test_commands: dict[str, list[str]] | None
    token_parameter: str | None
    github_repository: str | None
    github_api_url: str | None
    registered_at: int | None
    state: str = Field(description="ACTIVE, HALTED or RESUMING.")
    halting_job_id: str | None
    halt_reason: str | None
    last_applied_job_id: str | None = Field(description="The newest job that SUCCEEDED on the workspace.")
    last_resume: LastResumeView | None = Field(
        description="The last resume decision; while RESUMING, the resume under way (repeat it to resend its marker)."
    )


class ResumeConflictView(_View):
    """A resume refused because the workspace is not as the operator saw it: read `workspace` and decide again."""

    message: str = Field(
        description="Why: the workspace is not HALTED, is halted by another job, or its halting job cannot be retried."
    )
    workspace: WorkspaceStatusView = Field(description="The workspace as it is now.")


class HaltedWorkspacesView(_View):
    workspaces: list[WorkspaceStatusView] = Field(description="HALTED and RESUMING workspaces, by workspaceId.")
    next_token: str | None = Field(description="Pass as nextToken for the next page; null on the last page.")


_REFUSAL_DESCRIPTIONS: Final = {
    400: "The body or a query parameter cannot be read; the message says what to send.",
    401: "No valid bearer token.",
    403: "A token without the tenant or scope the action needs, or a registration of a workspaceId another tenant"
    " holds.",
    404: "Not found for the caller's tenant (another tenant's job or workspace is answered the same); the message says"
    " how to create it.",
    409: "Conflicts with what is recorded; the message says why.",
    413: "The body is over the size limit.",
    415: "The body is not JSON.",
    422: "A field or parameter is invalid; `errors` names each one.",
    429: (
        "A quota of the tenant is used up (workspaces, new jobs per second, jobs queued in the workspace); the "
        "message names it and how to raise it."
    ),
    503: "The job store or queue is unavailable; retry the same request (see Retry-After).",
}


def answers(
    success: Mapping[int, tuple[str, type[BaseModel]]],
    refusals: Sequence[int],
    models: Mapping[int, type[BaseModel]] | None = None,
    retry_after: Sequence[int] = (HTTPStatus.SERVICE_UNAVAILABLE,),
) -> dict[int, OpenAPIResponse]:
    """A route's `responses`: each success status with its description and model, then each refusal status with
    the API's error answer (`{"message", "errors"?}`) unless `models` names another model for it. The statuses of
    `retry_after` carry a Retry-After header."""
    documented: dict[int, OpenAPIResponse] = {}
    for status, (description, model) in success.items():
        documented[status] = {"description": description, "content": {JSON_MEDIA_TYPE: {"model": model}}}
    for status in refusals:
        model = (models or {}).get(status, ErrorView)
        documented[status] = {
            "description": _REFUSAL_DESCRIPTIONS[status],
            "content": {JSON_MEDIA_TYPE: {"model": model}},
        }
    for waiting_helps in retry_after:
        if waiting_helps in documented:
            documented[waiting_helps]["headers"] = {
                "Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "string"}}
            }
    return documented


def json_request_body(schema_type: Any, description: str) -> dict[str, Any]:
    """`openapi_extensions` declaring a route's JSON request body, for a handler that parses the body itself.

    `schema_type` is a pydantic model or type (a discriminated union of models, say); its schema, with the models it
    refers to, joins the document's components.
    """
    schema = TypeAdapter(schema_type).json_schema(ref_template=_COMPONENT_REF, by_alias=True)
    definitions = schema.pop("$defs", {})
    title = schema.get("title")
    if schema.get("type") == "object" and isinstance(title, str):
        definitions[title] = schema
        schema = {"$ref": _COMPONENT_REF.format(model=title)}
    for name, definition in definitions.items():
        if _body_schemas.setdefault(name, definition) != definition:
            raise ValueError(f"two request body schemas are named {name!r}; rename one of the models")
    return {
        "requestBody": {
            "required": True,
            "description": description,
            "content": {JSON_MEDIA_TYPE: {"schema": schema}},
        }
    }


def query_parameters(*parameters: Mapping[str, Any]) -> dict[str, Any]:
    """`openapi_extensions` declaring query parameters (OpenAPI parameter objects without `in`) that a handler reads
    from the event itself."""
    return {_QUERY_PARAMETERS_KEY: [{"in": "query", **parameter} for parameter in parameters]}


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of every registered route, built once per environment."""
    global _openapi_document  # noqa: PLW0603
    if _openapi_document is None:
        # Powertools' OpenAPI models take longer to import than the rest of this module: only this route needs them.
        from aws_lambda_powertools.event_handler.openapi.models import HTTPBearer

        _resolve_handler_annotations()
        generated = app.get_openapi_json_schema(
            title="Agent Jobs API",
            version="1",
            description=(
                "An ordered, exactly-once job queue for coding agents: submit jobs to a workspace, read their state "
                "and the workspace's timeline. Send `Authorization: Bearer <JWT>`; the token's `tenant_id` claim is "
                "the tenant."
            ),
            security_schemes={
                SECURITY_SCHEME: HTTPBearer(
                    bearerFormat="JWT", description="A JWT with the `tenant_id` claim (and `scope` for operators)."
                )
            },
            security=[{SECURITY_SCHEME: []}],
        )
        _openapi_document = _finish_document(json.loads(generated))
    return _openapi_document


def _resolve_handler_annotations() -> None:
    """Give each route handler wrapped by a decorator (the tracer's) its signature with annotations resolved.

    Powertools reads a handler's annotations through the wrapper, resolving the strings that `from __future__ import
    annotations` leaves in the wrapper's module (the tracer's), where `Response` is unknown; the signature of the
    wrapped function, evaluated in this module, is what the handler really has.
    """
    for route in app._static_routes + app._dynamic_routes:  # Powertools keeps no public list
        handler = route.func
        if hasattr(handler, "__wrapped__") and "__signature__" not in vars(handler):
            handler.__signature__ = inspect.signature(handler, eval_str=True)  # type: ignore[attr-defined]


def _finish_document(document: dict[str, Any]) -> dict[str, Any]:
    """What Powertools leaves to the handlers: path parameters named as API Gateway names them (`{jobId}`) with the
    id rules, the declared query parameters, and the request body models among the components."""
    components = document.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in _body_schemas.items():
        if components.setdefault(name, schema) != schema:
            raise ValueError(f"a request body schema and a response schema are both named {name!r}")
    paths: dict[str, Any] = {}
    for path, operations in (document.get("paths") or {}).items():
        for operation in operations.values():
            parameters = operation.get("parameters", [])
            for parameter in parameters:
                if parameter.get("in") == "path":
                    parameter["name"] = to_camel(parameter["name"])
                    if parameter["name"] in _ID_FIELDS:
                        parameter["schema"] = _ID_FIELDS[parameter["name"]].json_schema()
            parameters.extend(operation.pop(_QUERY_PARAMETERS_KEY, []))
            if parameters:
                operation["parameters"] = parameters
        segments = [
            f"{{{to_camel(segment[1:-1])}}}" if segment.startswith("{") else segment for segment in path.split("/")
        ]
        paths["/".join(segments)] = operations
    document["paths"] = paths
    _drop_unreferenced_schemas(document)
    return document


def _drop_unreferenced_schemas(document: dict[str, Any]) -> None:
    """Powertools adds its request validation error models even with validation off; this API never answers them."""
    schemas: dict[str, Any] = document["components"]["schemas"]
    while True:
        text = json.dumps({**document, "components": {**document["components"], "schemas": {}}})
        referenced = text + json.dumps(schemas)
        unused = [name for name in schemas if f'"{_COMPONENT_REF.format(model=name)}"' not in referenced]
        if not unused:
            return
        for name in unused:
            del schemas[name]


# ---- routes --------------------------------------------------------------------------------------------------------


@app.post(
    "/jobs",
    summary="Submit a job to a workspace",
    responses=answers(
        {202: ("Accepted, or already accepted with the same payload (`created` false).", JobAcceptedView)},
        (400, 401, 403, 404, 409, 413, 415, 422, 429, 503),
        models={409: ConflictView},
        retry_after=(HTTPStatus.TOO_MANY_REQUESTS, HTTPStatus.SERVICE_UNAVAILABLE),
    ),
    openapi_extensions=json_request_body(JobRequest, "A job: its jobId, workspaceId, type and the type's payload."),
)
@tracer.capture_method(capture_response=False)
def submit_job() -> Response[Any]:
    svc = services()
    tenant = caller_tenant(app.current_event, svc.settings)
    job = parse_job_request(app.current_event, svc.settings)
    logger.append_keys(job_id=job.job_id, workspace_id=job.workspace_id, tenant_id=tenant, job_type=str(job.type))
    tracer.put_annotation("jobId", job.job_id)
    try:
        result = enqueue_job(
            job,
            tenant,
            guard=svc.guard,
            sqs=svc.sqs,
            queue_url=svc.settings.queue_url,
            payloads=svc.payloads,
            inline_limit_bytes=svc.settings.inline_message_limit_bytes,
            quotas=job_quotas(svc),
        )
    except QuotaExceededError as quota:
        logger.info("job quota used up", extra={"parameter": quota.parameter, "limit": quota.limit})
        metrics.add_metric(name="JobsRefusedByQuota", unit=MetricUnit.Count, value=1)
        return _json_response(
            HTTPStatus.TOO_MANY_REQUESTS, {"message": str(quota)}, headers={"Retry-After": str(quota.retry_after)}
        )
    except PayloadTooLargeError as too_large:
        raise RequestRefused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, str(too_large)) from None
    except JobConflictError as conflict:
        logger.info("jobId already taken by another job")
        metrics.add_metric(name="JobsConflict", unit=MetricUnit.Count, value=1)
        return _json_response(HTTPStatus.CONFLICT, {"message": str(conflict), "jobId": job.job_id})
    except WorkspaceForbiddenError as forbidden:
        logger.info("workspace belongs to another tenant")  # answered as an unregistered workspace: no oracle
        raise RequestRefused(HTTPStatus.NOT_FOUND, str(forbidden)) from None
    except WorkspaceUnregisteredError as unregistered:
        logger.info("workspace not registered")
        raise RequestRefused(HTTPStatus.NOT_FOUND, str(unregistered)) from None
    metrics.add_metric(name="JobsAccepted" if result.created else "JobsResubmitted", unit=MetricUnit.Count, value=1)
    logger.info("job accepted" if result.created else "job already accepted", extra={"status": result.status})
    return _json_response(HTTPStatus.ACCEPTED, result.as_response(), headers={"Location": f"/jobs/{job.job_id}"})


@app.post(
    "/jobs:batch",
    summary="Submit up to 10 jobs at once",
    responses=answers(
        {200: ("The batch was processed: one result per job, each with its own statusCode.", JobBatchView)},
        (400, 401, 403, 413, 415, 422, 503),
    ),
    openapi_extensions=json_request_body(
        JobBatchRequest, "1 to 10 jobs, each as POST /jobs takes it, with distinct jobIds."
    ),
)
@tracer.capture_method(capture_response=False)
def submit_jobs() -> Response[Any]:
    svc = services()
    tenant = caller_tenant(app.current_event, svc.settings)
    jobs = parse_job_batch(app.current_event, svc.settings)
    logger.append_keys(tenant_id=tenant, job_ids=[job.job_id for job in jobs])
    results = enqueue_jobs(
        jobs,
        tenant,
        guard=svc.guard,
        sqs=svc.sqs,
        queue_url=svc.settings.queue_url,
        payloads=svc.payloads,
        inline_limit_bytes=svc.settings.inline_message_limit_bytes,
        quotas=job_quotas(svc),
    )
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
    return _json_response(HTTPStatus.OK, {"results": [r.as_response() for r in results]}, headers=headers)


@app.get(
    "/jobs/<job_id>",
    summary="Read a job's state and history",
    responses=answers({200: ("The job.", JobView)}, (401, 403, 404, 422, 503)),
)
@tracer.capture_method(capture_response=False)
def read_job(job_id: str) -> Response[Any]:
    svc = services()
    tenant = caller_tenant(app.current_event, svc.settings)
    job_id = _valid_path_id("jobId", job_id)
    logger.append_keys(job_id=job_id, tenant_id=tenant)
    # Keyed by the caller's tenant: another tenant's job of the same jobId is not the caller's job, and is answered
    # exactly as a jobId nobody used (404), so the answer tells nothing about other tenants' jobIds.
    item = svc.guard.get_job(tenant, job_id)
    if item is None:
        raise RequestRefused(HTTPStatus.NOT_FOUND, f"no job '{job_id}'; check the jobId returned when it was accepted")
    metrics.add_metric(name="JobsRead", unit=MetricUnit.Count, value=1)
    return _json_response(HTTPStatus.OK, public_job_view(item))


@app.put(
    "/workspaces/<workspace_id>",
    summary="Register a workspace (or update its registration)",
    responses=answers(
        {201: ("Registered.", WorkspaceView), 200: ("Registration updated.", WorkspaceView)},
        (400, 401, 403, 413, 415, 422, 429, 503),
    ),
    openapi_extensions=json_request_body(
        WorkspaceRegistration, "The git branch of a git remote the workspace works on."
    ),
)
@tracer.capture_method(capture_response=False)
def register_workspace(workspace_id: str) -> Response[Any]:
    svc = services()
    tenant = caller_tenant(app.current_event, svc.settings)
    workspace_id = _valid_path_id("workspaceId", workspace_id)
    logger.append_keys(workspace_id=workspace_id, tenant_id=tenant)
    registration = parse_workspace_registration(app.current_event, svc.settings)
    check_tenant_bounds(registration, tenant, svc.settings)
    try:
        outcome = workspace_registry(svc).register(workspace_id, registration, tenant)
    except WorkspaceOwnedElsewhereError as owned:
        raise RequestRefused(HTTPStatus.FORBIDDEN, str(owned)) from None
    except WorkspaceQuotaError as quota:
        logger.info("workspace quota used up", extra={"limit": quota.limit})
        raise RequestRefused(HTTPStatus.TOO_MANY_REQUESTS, str(quota)) from None
    metrics.add_metric(
        name="WorkspacesRegistered" if outcome.created else "WorkspacesUpdated", unit=MetricUnit.Count, value=1
    )
    logger.info("workspace registered" if outcome.created else "workspace registration updated")
    return _json_response(
        HTTPStatus.CREATED if outcome.created else HTTPStatus.OK,
        public_workspace_view(outcome.workspace),
        headers={"Location": f"/workspaces/{workspace_id}"},
    )


@app.get(
    "/workspaces/<workspace_id>",
    summary="Read a workspace's registration, state and last applied job",
    responses=answers({200: ("The workspace.", WorkspaceStatusView)}, (401, 403, 404, 422, 503)),
)
@tracer.capture_method(capture_response=False)
def read_workspace(workspace_id: str) -> Response[Any]:
    """The workspace's registration and state, and `lastAppliedJobId`: derived at read time (the worker writes
    nothing for it), at the cost of one Query of the GSI `byWorkspace` besides the GetItem of the workspace item
    (see `JobGuard.last_succeeded_job`)."""
    svc = services()
    tenant = caller_tenant(app.current_event, svc.settings)
    workspace_id = _valid_path_id("workspaceId", workspace_id)
    logger.append_keys(workspace_id=workspace_id, tenant_id=tenant)
    status = _visible_workspace(svc, workspace_id, tenant)
    last_applied = svc.guard.last_succeeded_job(workspace_id, tenant)
    metrics.add_metric(name="WorkspacesRead", unit=MetricUnit.Count, value=1)
    return _json_response(
        HTTPStatus.OK, public_workspace_status_view(status, last_applied.get("jobId") if last_applied else None)
    )


@app.get(
    "/workspaces/<workspace_id>/jobs",
    summary="Read a workspace's timeline: its jobs, oldest accepted first, a page at a time",
    responses=answers({200: ("A page of the timeline.", JobTimelineView)}, (400, 401, 403, 404, 422, 503)),
    openapi_extensions=query_parameters(
        *page_query_parameters("Jobs", default=PAGE_LIMIT_DEFAULT, maximum=PAGE_LIMIT_MAX)
    ),
)
@tracer.capture_method(capture_response=False)
def list_workspace_jobs(workspace_id: str) -> Response[Any]:
    """The workspace's jobs in the order the API accepted them (the GSI `byWorkspace`, sorted by acceptedAt).

    acceptedAt, not the queue's SequenceNumber, is the order: every job record has it from the moment it is
    recorded (a SequenceNumber only once sent; a rejected message's record has none), so no accepted job is left out
    of the timeline, and it needs no second index. The price: acceptedAt is the producer's clock, taken just before
    the send, so two jobs submitted to one workspace at the same moment by different callers can be listed in the
    other order than the queue runs them, and ties keep an arbitrary but stable order. Jobs submitted one after the
    other (each after the previous one's 202) are listed in queue order. Each view carries its `sequenceNumber`,
    the order jobs take effect in.
    """
    svc = services()
    tenant = caller_tenant(app.current_event, svc.settings)
    workspace_id = _valid_path_id("workspaceId", workspace_id)
    logger.append_keys(workspace_id=workspace_id, tenant_id=tenant)
    query = app.current_event.query_string_parameters or {}
    limit = page_limit(query.get("limit"))
    start_key = decode_next_token(query.get("nextToken"), workspace_id)
    _visible_workspace(svc, workspace_id, tenant)
    page = svc.guard.workspace_jobs(
        workspace_id, tenant, limit=limit, start_key=start_key, attributes=PUBLIC_JOB_FIELDS
    )
    next_token = encode_next_token(workspace_id, page.next_key) if page.next_key is not None else None
    metrics.add_metric(name="TimelinesRead", unit=MetricUnit.Count, value=1)
    return _json_response(
        HTTPStatus.OK, {"jobs": [public_job_view(item) for item in page.items], "nextToken": next_token}
    )


@app.get(
    OPENAPI_PATH,
    summary="This API's OpenAPI document",
    responses={
        200: {"description": "The OpenAPI 3.1 document.", "content": {JSON_MEDIA_TYPE: {"schema": {"type": "object"}}}}
    },
    openapi_extensions={"security": []},
)
def read_openapi_document() -> Response[Any]:
    """Public: no tenant is derived and nothing is read but the registered routes."""
    metrics.add_metric(name="OpenApiDocumentsRead", unit=MetricUnit.Count, value=1)
    return _json_response(HTTPStatus.OK, openapi_document())


def _visible_workspace(svc: Services, workspace_id: str, tenant: str) -> WorkspaceStatus:
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
            HTTPStatus.NOT_FOUND,
            f"no workspace '{workspace_id}'; register it with PUT /workspaces/{workspace_id}",
        )
    return status


# ---- resume --------------------------------------------------------------------------------------------------------

HALTED_LIST_DEFAULT: Final = 50
HALTED_LIST_MAX: Final = 100
_RESUME_SHAPE: Final = '{"decision": "retry"|"skip", "haltingJobId": "<the workspace\'s haltingJobId>"}'
_RESUME_CONFLICTS: Final = (
    ResumeOutcome.NOT_HALTED,
    ResumeOutcome.HALTING_JOB_CHANGED,
    ResumeOutcome.RETRY_REFUSED,
)


def caller_name(event: APIGatewayProxyEventV2, tenant: str) -> str:
    """Who acts, for a job's history: the token's subject, else the tenant's operator."""
    jwt = ((event.raw_event.get("requestContext") or {}).get("authorizer") or {}).get("jwt") or {}
    subject = (jwt.get("claims") or {}).get("sub")
    return str(subject) if isinstance(subject, str) and subject else f"operator of {tenant}"


def parse_resume_request(event: APIGatewayProxyEventV2, settings: Settings) -> ResumeRequest:
    """The resume decision in the request body, or RequestRefused (415, 413, 400 or 422) naming what to fix."""
    document = _json_object_body(
        event, settings, shape=f"a resume decision: {_RESUME_SHAPE}", too_large="(a resume decision is a few bytes)"
    )
    try:
        return ResumeRequest.model_validate(document)
    except ValidationError as error:
        errors, uncounted = _field_errors(error)
        raise RequestRefused(
            HTTPStatus.UNPROCESSABLE_ENTITY, f"the resume request is invalid; send {_RESUME_SHAPE}", errors, uncounted
        ) from None


def _workspace_view(workspace_id: str, item: dict[str, Any]) -> dict[str, Any]:
    return public_workspace_status_view(workspace_status(workspace_id, item))


@app.post(
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
def resume(workspace_id: str) -> Response[Any]:
    svc = services()
    tenant = require_operator(app.current_event, svc.settings)
    workspace_id = _valid_path_id("workspaceId", workspace_id)
    logger.append_keys(workspace_id=workspace_id, tenant_id=tenant)
    request = parse_resume_request(app.current_event, svc.settings)
    result = resume_workspace(
        workspace_id,
        tenant_id=tenant,
        halting_job_id=request.halting_job_id,
        decision=request.decision,
        operator=caller_name(app.current_event, tenant),
        guard=svc.guard,
        sqs=svc.sqs,
        queue_url=svc.settings.queue_url,
    )
    if result.outcome in (ResumeOutcome.NOT_FOUND, ResumeOutcome.OTHER_TENANT):
        # Another tenant's workspace is answered as one that does not exist: no oracle of other tenants' ids.
        raise RequestRefused(HTTPStatus.NOT_FOUND, f"no halted workspace '{workspace_id}'; check the workspaceId")
    view = _workspace_view(workspace_id, result.workspace or {})
    if result.outcome in _RESUME_CONFLICTS:
        logger.info("resume refused", extra={"outcome": str(result.outcome)})
        metrics.add_metric(name="ResumesRefused", unit=MetricUnit.Count, value=1)
        return _json_response(HTTPStatus.CONFLICT, {"message": result.reason, "workspace": view})
    logger.info("workspace resume begun", extra={"outcome": str(result.outcome), "decision": str(request.decision)})
    metrics.add_metric(name="WorkspacesResumeBegun", unit=MetricUnit.Count, value=1)
    return _json_response(HTTPStatus.ACCEPTED, view, headers={"Location": f"/workspaces/{workspace_id}"})


@app.get(
    "/workspaces",
    summary="List the caller's halted workspaces (HALTED or RESUMING), a page at a time",
    responses=answers({200: ("A page of halted workspaces.", HaltedWorkspacesView)}, (401, 403, 422, 503)),
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
def list_halted_workspaces() -> Response[Any]:
    svc = services()
    tenant = caller_tenant(app.current_event, svc.settings)
    query = app.current_event.query_string_parameters or {}
    if query.get("state") != str(WorkspaceState.HALTED):
        raise RequestRefused(
            HTTPStatus.UNPROCESSABLE_ENTITY,
            "list workspaces with GET /workspaces?state=HALTED (halted and resuming workspaces)",
            [{"field": "state", "message": "only HALTED is supported"}],
        )
    limit = page_limit(query.get("limit"), default=HALTED_LIST_DEFAULT, maximum=HALTED_LIST_MAX)
    start_key = _decode_next_token(query.get("nextToken"), tenant)
    page = svc.guard.list_halted(tenant, limit=limit, start_key=start_key)
    views = [_workspace_view(str(item.get("workspaceId")), item) for item in page.workspaces]
    metrics.add_metric(name="HaltedWorkspacesListed", unit=MetricUnit.Count, value=1)
    return _json_response(
        HTTPStatus.OK, {"workspaces": views, "nextToken": _encode_next_token(page.next_key) if page.next_key else None}
    )


def _encode_next_token(key: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(key, sort_keys=True).encode()).decode().rstrip("=")


def _decode_next_token(token: str | None, tenant: str) -> dict[str, Any] | None:
    """Where the caller's listing continues, or a 422 when the token is not one this API gave the caller.

    The token is not signed: it is checked to be the halted index's key (the table's `pk` of a workspace item, its
    `workspaceId`, and `haltedTenant`) of the caller's own tenant, so an edited token can only move the caller's own
    cursor and never reaches DynamoDB as a start key it refuses.
    """
    if not token:
        return None
    try:
        key = None
        if len(token) <= _NEXT_TOKEN_MAX_CHARS and set(token) <= _NEXT_TOKEN_CHARS:
            key = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (ValueError, RecursionError):  # binascii.Error and UnicodeDecodeError are ValueErrors
        key = None
    # A token only continues the caller's own listing.
    if not (
        isinstance(key, dict)
        and set(key) == {"pk", "workspaceId", "haltedTenant"}
        and key["haltedTenant"] == tenant
        and isinstance(key["workspaceId"], str)
        and 0 < len(key["workspaceId"]) <= _NEXT_TOKEN_MAX_CHARS
        and key["pk"] == workspace_key(key["workspaceId"])
    ):
        raise RequestRefused(
            HTTPStatus.UNPROCESSABLE_ENTITY,
            "nextToken is not one this API returned to you; list again without it",
            [{"field": "nextToken", "message": "use the nextToken of the previous page as given"}],
        )
    return dict(key)


@app.exception_handler(RequestRefused)  # type: ignore[untyped-decorator]  # Powertools leaves it unannotated
def refused(error: RequestRefused) -> Response[Any]:
    logger.info("request refused", extra={"status": int(error.status), "reason": error.message})
    metrics.add_metric(name="RequestsRefused", unit=MetricUnit.Count, value=1)
    body: dict[str, Any] = {"message": error.message}
    if error.errors is not None:
        body["errors"] = error.errors
    if error.more_errors:
        body["moreErrors"] = error.more_errors
    return _json_response(error.status, body)


def _is_item_too_large(error: Exception) -> bool:
    """DynamoDB refused a write for an item over its size limit: a request that can never succeed as sent."""
    if not isinstance(error, ClientError):
        return False
    details = error.response.get("Error", {})
    if details.get("Code") == "ValidationException":
        return "size" in str(details.get("Message", "")).lower()
    # In a transaction (a registration, a job's acceptance) DynamoDB cancels it, naming the item's reason instead.
    reasons: list[dict[str, Any]] = error.response.get("CancellationReasons") or []  # type: ignore[assignment]
    return details.get("Code") == "TransactionCanceledException" and any(
        reason.get("Code") == "ValidationError" and "size" in str(reason.get("Message", "")).lower()
        for reason in reasons
    )


@app.exception_handler([ClientError, AwsConnectionError, HTTPClientError])  # type: ignore[untyped-decorator]
def aws_unavailable(error: Exception) -> Response[Any]:
    if _is_item_too_large(error):
        # Never a 503: the same request would be refused again, and a client told to retry would retry forever.
        logger.exception("a record of this request is larger than a DynamoDB item")
        answer: Response[Any] = refused(
            RequestRefused(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                "the request makes a record larger than the job store holds (a DynamoDB item is at most 400 KB); "
                "send it smaller: shorter fields, fewer or shorter test commands",
            )
        )
        return answer
    logger.exception("AWS call failed")
    metrics.add_metric(name="ServiceUnavailable", unit=MetricUnit.Count, value=1)
    event = app.current_event
    path, method = event.path, event.request_context.http.method
    if path.startswith("/jobs") and method == "POST":
        message = (
            "the job store or queue is unavailable; retry the same request with the same jobId shortly "
            "(a jobId is accepted at most once, so a retry cannot create a duplicate)"
        )
    elif path.endswith("/resume"):
        message = (
            "the workspace store or queue is unavailable; retry the same resume shortly (repeating it is safe: "
            "a resume already begun answers 202 and sends its drain marker again)"
        )
    elif method == "PUT":
        message = "the workspace store is unavailable; retry the same request shortly (registering is idempotent)"
    else:
        message = "the job store is unavailable; retry the same request shortly (reading changes nothing)"
    return _json_response(HTTPStatus.SERVICE_UNAVAILABLE, {"message": message}, headers={"Retry-After": "2"})


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_HTTP, clear_state=True)
@tracer.capture_lambda_handler(capture_response=False)
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return app.resolve(event, context)
