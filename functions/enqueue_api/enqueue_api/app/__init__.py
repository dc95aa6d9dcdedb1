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
                         200 {"workspaces": [status of each HALTED or RESUMING workspace], "nextToken"}; 400 a
                         nextToken this API did not issue for the caller's list; 422 another state or a bad limit;
                         403 no usable tenant

Tenancy: the caller's tenant comes from `caller_tenant` and nowhere else. It is the `tenant_id` claim of the verified
JWT that the API's JWT authorizer puts at `requestContext.authorizer.jwt.claims` (API Gateway itself answers 401 to a
request without a valid token, before this function runs; under `sam local start-api`, which skips the authorizer, the
function does its checks itself: `sam_local`). A request without an authorizer context is refused (401);
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

from http import HTTPStatus
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.exceptions import ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as AwsConnectionError

from . import openapi, routes_halts, routes_jobs, routes_workspaces
from .bodies import JSON_MEDIA_TYPE, body_limit_bytes, checked_body, json_object
from .context import http_event, logger, metrics, reset_services, services, tracer
from .errors import RequestRefused, json_response, refusal_proxy_response, refusal_response, unavailable_response
from .openapi import OPENAPI_PATH
from .sam_local import with_local_authorizer
from .schemas import MAX_FIELD_ERRORS
from .tenancy import OPERATOR_SCOPE
from .validation import validation_refusal
from .views import PUBLIC_JOB_FIELDS, PUBLIC_WORKSPACE_FIELDS, PUBLIC_WORKSPACE_STATE_FIELDS

__all__ = [
    "MAX_FIELD_ERRORS",
    "OPERATOR_SCOPE",
    "PUBLIC_JOB_FIELDS",
    "PUBLIC_WORKSPACE_FIELDS",
    "PUBLIC_WORKSPACE_STATE_FIELDS",
    "app",
    "body_limit_bytes",
    "lambda_handler",
    "logger",
    "metrics",
    "openapi_document",
    "reset_services",
    "services",
]


def _read_body(text: str) -> dict[str, Any]:
    return json_object(text, http_event(app))


# Powertools validates each route's typed path, query and body parameters (and serializes the response model it
# returns); its refusals are answered in this API's own words by `refused`. The body is parsed once, by `_read_body`.
app = APIGatewayHttpResolver(enable_validation=True, json_body_deserializer=_read_body)
app.include_router(routes_jobs.router)
app.include_router(routes_workspaces.router)
app.include_router(routes_halts.router)


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of every registered route, built once per environment."""
    return openapi.openapi_document(app)


@app.get(
    OPENAPI_PATH,
    operation_id="readOpenApiDocument",
    summary="This API's OpenAPI document",
    responses={
        200: {"description": "The OpenAPI 3.1 document.", "content": {JSON_MEDIA_TYPE: {"schema": {"type": "object"}}}}
    },
    openapi_extensions={"security": []},
    enable_validation=False,  # no parameters to validate
)
def read_openapi_document() -> Response[Any]:
    """Public: no tenant is derived and nothing is read but the registered routes."""
    metrics.add_metric(name="OpenApiDocumentsRead", unit=MetricUnit.Count, value=1)
    return json_response(HTTPStatus.OK, openapi_document())


@app.exception_handler([RequestRefused, RequestValidationError])  # type: ignore[untyped-decorator]
def refused(error: RequestRefused | RequestValidationError) -> Response[Any]:
    """Every refusal in the API's words: a route's own, or Powertools' validation of the route's typed parameters."""
    if isinstance(error, RequestValidationError):
        error = validation_refusal(error.errors(), http_event(app))
    return refusal_response(error)


@app.exception_handler([ClientError, AwsConnectionError, HTTPClientError])  # type: ignore[untyped-decorator]
def aws_unavailable(error: Exception) -> Response[Any]:
    return unavailable_response(error, app.current_event)


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_HTTP, clear_state=True)
@tracer.capture_lambda_handler(capture_response=False)
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    try:
        event = checked_body(event, lambda: services().settings)
    except RequestRefused as refused:
        return refusal_proxy_response(refused)
    return app.resolve(with_local_authorizer(event, services().settings), context)
