"""The producer API fuzzed from its own OpenAPI document: schemathesis generates requests for every operation that
`GET /openapi.json` lists (valid and invalid ones), sends them over HTTP to the local HTTP API in front of the real
handler and moto's server, and checks that no answer is a server error and that every answer is one the document
declares (status code, content type, body schema).

The requests carry real bearer tokens (RS256, minted with the local development key for the fuzz tenant, with the
operator scope) that the local API verifies as API Gateway's JWT authorizer does, so a missing or bad token is
checked to be a 401 too. The fuzz tenant's workspaces are seeded, one of them halted, so that the answers that need
data (a workspace, its timeline, a job, a conflicting resume, a page of halted workspaces) are generated and checked;
a resume that goes through (202) and one refused after it (409) are sent explicitly and checked the same way.

Bounded and derandomized: the same requests on every run, so a failure here is a defect, not noise."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.auths import AuthStorage
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from agent_jobs.guard import FailOutcome
from agent_jobs.models import job_message
from agent_jobs.registration import WorkspaceRegistration
from agent_jobs.workspaces import WorkspaceRegistry
from agent_jobs_local.api_server import LocalApiServer
from agent_jobs_local.auth import mint_token
from enqueue_api import app
from tests.conftest import Stack, enqueue, make_job, make_message

FUZZ_TENANT = "fuzz-tenant"
OPERATOR_SCOPE = "agent-jobs/operator"
MAX_EXAMPLES = 30
SEEDED_IDS = ("0", "A", "a")
# One of the seeded workspaces is halted by a DEAD job (its body kept, so it can be retried or skipped).
HALTED_ID = "a"
HALTING_JOB_ID = "a-halting"
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
    ignored_auth,  # a request without a token, or with a bad one, is a 401
]
# For requests built here rather than generated: whether each answer is one the document declares.
CONFORMANCE_CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def bearer_token() -> str:
    """An operator token of the fuzz tenant, signed with the local development key the local API verifies."""
    return mint_token(FUZZ_TENANT, scopes=[OPERATOR_SCOPE])


def seed_workspaces(stack: Stack) -> None:
    """Registered workspaces of the fuzz tenant with jobs, one of them applied, under the ids generation tries first,
    so that the 200 answers (a workspace, its timeline, a job) are generated and checked too; one of them halted, so
    that the halted list has a workspace to show and a resume of it is refused (409) unless it names its halting
    job."""
    registry = WorkspaceRegistry(stack.services.dynamodb, stack.table_name)
    registration = WorkspaceRegistration.model_validate({"remoteUrl": "/srv/git/fuzz.git", "branch": "agent/fuzz"})
    for workspace_id in SEEDED_IDS:
        registry.register(workspace_id, registration, FUZZ_TENANT)
        jobs = [make_job(f"{workspace_id}{n}" if n else workspace_id, workspace_id) for n in range(3)]
        enqueue(stack, *jobs, tenant_id=FUZZ_TENANT)
        place = stack.job(jobs[0].job_id, FUZZ_TENANT)["sequenceNumber"]  # the copy at the job's place
        lease = stack.guard.claim(
            job_message(jobs[0], FUZZ_TENANT),
            message_id=f"m-{workspace_id}",
            sequence_number=place,
            remaining_ms=60_000,
        ).lease
        assert lease is not None
        stack.guard.complete(lease, {"commit": "0" * 40})
    halting = make_message(HALTING_JOB_ID, HALTED_ID, tenant_id=FUZZ_TENANT)
    lease = stack.guard.claim(halting, message_id="m-halting", sequence_number="2", remaining_ms=60_000).lease
    assert lease is not None
    body = halting.model_dump_json(by_alias=True)
    assert stack.guard.fail(lease, "patch does not apply", permanent=True, body=body) is FailOutcome.DEAD
    assert stack.workspace(HALTED_ID)["state"] == "HALTED"


@pytest.fixture
def fuzzed_api(server_stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalApiServer]:
    """The producer's real handler with the environment template.yaml gives it, behind the local HTTP API, on the
    queue and table of template.yaml in moto's server."""
    for name, value in server_stack.env("EnqueueApiFunction").items():
        monkeypatch.setenv(name, value)
    # No open access: a request without a token is refused (401), as API Gateway's JWT authorizer refuses it.
    monkeypatch.setenv("OPEN_ACCESS_TENANT", "")
    app.reset_services()
    seed_workspaces(server_stack)
    # The local API's own verifier: the JWT authorizer's checks, and the route scopes of template.yaml.
    server = LocalApiServer(server_stack.model, app.lambda_handler).start()
    try:
        yield server
    finally:
        server.stop()
        app.reset_services()


class BearerToken:
    """Every request carries `Authorization: Bearer <token>`, as a client of the deployed API sends it."""

    def get(self, case: schemathesis.Case[Any], context: schemathesis.AuthContext) -> str:
        return bearer_token()

    def set(self, case: schemathesis.Case[Any], data: str, context: schemathesis.AuthContext) -> None:
        case.headers["Authorization"] = f"Bearer {data}"


def fuzz_operation(
    operation: Any, mode: GenerationMode, auth: AuthStorage[str], base_url: str, checks: list[Any]
) -> None:
    """`MAX_EXAMPLES` requests of `mode` for one operation, each checked; hypothesis shrinks a failure to its simplest
    request and raises it."""

    @given(case=operation.as_strategy(generation_mode=mode, auth_storage=auth))
    @settings(
        max_examples=MAX_EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    def run(case: schemathesis.Case[Any]) -> None:
        case.call_and_validate(base_url=base_url, checks=checks, timeout=30)

    run()


def operation_named(operations: list[Any], method: str, path: str) -> Any:
    (operation,) = [op for op in operations if (op.method.upper(), op.path) == (method, path)]
    return operation


def call_as_documented(operation: Any, base_url: str, **parts: Any) -> Any:
    """One request built from `parts` (path_parameters, query, body), with the fuzz tenant's token, checked against
    the document; its response."""
    headers = {"Authorization": f"Bearer {bearer_token()}"}
    case = operation.Case(headers=headers, **parts)
    if "body" in parts:
        case.media_type = "application/json"
    return case.call_and_validate(base_url=base_url, checks=CONFORMANCE_CHECKS, timeout=30)


def test_api_fuzz_answers_every_operation_as_documented(fuzzed_api: LocalApiServer) -> None:
    # Given the document as the API serves it: over HTTP, without credentials
    schema = schemathesis.openapi.from_url(f"{fuzzed_api.url}/openapi.json", timeout=30)
    schema.auth()(BearerToken)
    operations = [result.ok() for result in schema.get_all_operations() if isinstance(result, Ok)]
    assert len(operations) == len(list(schema.get_all_operations()))  # none the loader could not read
    # (schemathesis leaves out the operation that serves the document it was loaded from)
    assert {f"{op.method.upper()} {op.path}" for op in operations} == {
        "POST /jobs",
        "POST /jobs:batch",
        "GET /jobs/{jobId}",
        "PUT /workspaces/{workspaceId}",
        "GET /workspaces/{workspaceId}",
        "GET /workspaces/{workspaceId}/jobs",
        "POST /workspaces/{workspaceId}/resume",
        "GET /workspaces",
    }

    # When every operation gets valid and invalid requests; Then each answer is one the document declares
    failures: dict[str, str] = {}
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                fuzz_operation(operation, mode, schema.auth, fuzzed_api.url, CHECKS)
            except (Exception, BaseExceptionGroup) as failure:  # every operation runs before the test reports
                failures[f"{operation.method.upper()} {operation.path} ({mode.value})"] = str(failure)[:3000]
    assert not failures, "\n\n".join(f"{operation}:\n{failure}" for operation, failure in failures.items())

    # And the halted workspace is listed, a page at a time, as the document says
    halted_list = operation_named(operations, "GET", "/workspaces")
    page = call_as_documented(halted_list, fuzzed_api.url, query={"state": "HALTED", "limit": 1})
    assert page.status_code == 200
    assert [(view["workspaceId"], view["state"]) for view in page.json()["workspaces"]] == [(HALTED_ID, "HALTED")]
    assert page.json()["workspaces"][0]["haltingJobId"] == HALTING_JOB_ID
    # And resuming it with the decision for its halting job is a 202, a resume after it a 409, both as documented
    resume = operation_named(operations, "POST", "/workspaces/{workspaceId}/resume")
    path = {"workspaceId": HALTED_ID}
    begun = call_as_documented(resume, fuzzed_api.url, path_parameters=path, body=_decision("skip"))
    assert (begun.status_code, begun.json()["state"]) == (202, "ACTIVE")
    refused = call_as_documented(resume, fuzzed_api.url, path_parameters=path, body=_decision("retry"))
    assert (refused.status_code, refused.json()["workspace"]["state"]) == (409, "ACTIVE")
    empty = call_as_documented(halted_list, fuzzed_api.url, query={"state": "HALTED"})
    assert (empty.status_code, empty.json()) == (200, {"workspaces": [], "nextToken": None})
    # And queries generation seldom makes are refused as documented: digits `int` cannot read (422), an edited
    # nextToken that is no start key of the index (DynamoDB would refuse it: not a 503, a 400 as on every listing)
    forged = base64.urlsafe_b64encode(json.dumps({"haltedTenant": FUZZ_TENANT}).encode()).decode().rstrip("=")
    for query, status in (
        ({"limit": "²"}, 422),
        ({"limit": "9" * 5000}, 422),
        ({"nextToken": forged}, 400),
        ({"nextToken": "W" * 3000}, 400),
    ):
        answer = call_as_documented(halted_list, fuzzed_api.url, query={"state": "HALTED", **query})
        assert answer.status_code == status, query


def _decision(decision: str) -> dict[str, str]:
    return {"decision": decision, "haltingJobId": HALTING_JOB_ID}
