"""The producer API fuzzed from its own OpenAPI document: schemathesis generates requests for every operation that
`GET /openapi.json` lists (valid and invalid ones), sends them over HTTP to the local HTTP API in front of the real
handler and moto's server, and checks that no answer is a server error and that every answer is one the document
declares (status code, content type, body schema).

Bounded and derandomized: the same requests on every run, so a failure here is a defect, not noise."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
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

from agent_jobs.models import WorkspaceRegistration, job_message
from agent_jobs.workspaces import WorkspaceRegistry
from agent_jobs_local.api_server import LocalApiServer
from enqueue_api import app
from tests.conftest import Stack, enqueue, make_job

FUZZ_TENANT = "fuzz-tenant"
OPERATOR_SCOPE = "agent-jobs/operator"
MAX_EXAMPLES = 30
SEEDED_IDS = ("0", "A", "a")
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


def bearer_token() -> str | None:
    """A token of the local development key when the local runtime can mint one, else None (claims are injected)."""
    try:
        auth = importlib.import_module("agent_jobs_local.auth")
    except ModuleNotFoundError:
        return None
    token: str = auth.mint_token(FUZZ_TENANT, scopes=[OPERATOR_SCOPE])
    return token


def injected_claims(headers: Mapping[str, str]) -> Mapping[str, Any] | None:
    """A stand-in verifier: a request with a bearer token is the fuzz tenant's; one without has no claims."""
    if not headers.get("authorization", "").startswith("Bearer "):
        return None
    return {"tenant_id": FUZZ_TENANT, "scope": OPERATOR_SCOPE}


def seed_workspaces(stack: Stack) -> None:
    """Registered workspaces of the fuzz tenant with jobs, one of them applied, under the ids generation tries first,
    so that the 200 answers (a workspace, its timeline, a job) are generated and checked too."""
    registry = WorkspaceRegistry(stack.services.dynamodb, stack.table_name)
    registration = WorkspaceRegistration.model_validate({"remoteUrl": "/srv/git/fuzz.git", "branch": "agent/fuzz"})
    for workspace_id in SEEDED_IDS:
        registry.register(workspace_id, registration, FUZZ_TENANT)
        jobs = [make_job(f"{workspace_id}{n}" if n else workspace_id, workspace_id) for n in range(3)]
        enqueue(stack, *jobs, tenant_id=FUZZ_TENANT)
        lease = stack.guard.claim(
            job_message(jobs[0], FUZZ_TENANT), message_id=f"m-{workspace_id}", sequence_number="1", remaining_ms=60_000
        ).lease
        assert lease is not None
        stack.guard.complete(lease, {"commit": "0" * 40})


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
    server = LocalApiServer(server_stack.model, app.lambda_handler).start()
    if bearer_token() is None:
        server.authorizer_claims = injected_claims
    try:
        yield server
    finally:
        server.stop()
        app.reset_services()


class BearerToken:
    """Every request carries `Authorization: Bearer <token>`, as a client of the deployed API sends it."""

    def get(self, case: schemathesis.Case[Any], context: schemathesis.AuthContext) -> str:
        return bearer_token() or "fuzz-token"

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


def test_api_fuzz_answers_every_operation_as_documented(fuzzed_api: LocalApiServer) -> None:
    # Given the document as the API serves it: over HTTP, without credentials
    schema = schemathesis.openapi.from_url(f"{fuzzed_api.url}/openapi.json", timeout=30)
    schema.auth()(BearerToken)
    operations = [result.ok() for result in schema.get_all_operations() if isinstance(result, Ok)]
    assert len(operations) == len(list(schema.get_all_operations()))  # none the loader could not read
    # (schemathesis leaves out the operation that serves the document it was loaded from)
    assert {f"{op.method.upper()} {op.path}" for op in operations} >= {
        "POST /jobs",
        "GET /workspaces/{workspaceId}/jobs",
    }

    # With a real verifier (tokens of the local development key), also check that a bad or missing token is a 401
    checks = [*CHECKS, ignored_auth] if bearer_token() is not None else CHECKS

    # When every operation gets valid and invalid requests; Then each answer is one the document declares
    failures: dict[str, str] = {}
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                fuzz_operation(operation, mode, schema.auth, fuzzed_api.url, checks)
            except (Exception, BaseExceptionGroup) as failure:  # every operation runs before the test reports
                failures[f"{operation.method.upper()} {operation.path} ({mode.value})"] = str(failure)[:3000]
    assert not failures, "\n\n".join(f"{operation}:\n{failure}" for operation, failure in failures.items())
