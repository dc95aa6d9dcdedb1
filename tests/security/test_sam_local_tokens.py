"""The producer under `sam local start-api`, which skips the HTTP API's JWT authorizer: the function verifies the
bearer token itself, against the local development key, only when SAM CLI runs it (AWS_SAM_LOCAL=true) and the env file
gives the key; every other request stays unauthenticated (401), whatever it claims.

The events are shaped as `sam local start-api` sends them: events/http_post_job.json without its authorizer context.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from agent_jobs.bearer_tokens import key_id, public_key_pem
from agent_jobs_local.auth import DevSigningKey, mint_token, sign_claims
from agent_jobs_local.event_source import LambdaContextStub
from agent_jobs_local.template import TemplateModel
from enqueue_api import app
from tests.conftest import Stack, register_workspace

EVENTS = Path(__file__).resolve().parents[2] / "events"
TENANT = "tenant-demo"
WORKSPACE = "repo-gamma"
PATCH = "--- a/f.txt\n+++ b/f.txt\n@@ -0,0 +1 @@\n+hello\n"


def start_api_event(headers: dict[str, str], job_id: str = "job-1") -> dict[str, Any]:
    """A POST /jobs as `sam local start-api` passes it: no authorizer context, the client's headers as sent."""
    event: dict[str, Any] = json.loads((EVENTS / "http_post_job.json").read_text())
    del event["requestContext"]["authorizer"]
    payload = {"patch": PATCH, "commitMessage": "hello"}
    body = json.dumps({"jobId": job_id, "workspaceId": WORKSPACE, "type": "apply_patch", "payload": payload})
    event["headers"] = {"content-type": "application/json", "content-length": str(len(body)), **headers}
    event["requestContext"]["requestId"] = uuid.uuid4().hex
    event["body"] = body
    return event


def invoke(event: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    response = app.lambda_handler(copy.deepcopy(event), LambdaContextStub(timeout_seconds=10))
    return response["statusCode"], json.loads(response["body"]) if response.get("body") else {}


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@pytest.fixture
def dev_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DevSigningKey:
    """A development key of this test's own (AGENT_JOBS_DEV_KEY), as `make local` creates one."""
    from agent_jobs_local.auth import dev_signing_key

    monkeypatch.setenv("AGENT_JOBS_DEV_KEY", str(tmp_path / "dev-key.pem"))
    return dev_signing_key()


@pytest.fixture
def sam_local(stack: Stack, dev_key: DevSigningKey, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    """The producer as `sam local start-api` runs it with env.local.json: AWS_SAM_LOCAL=true (SAM CLI sets it) and
    LOCAL_JWT_PUBLIC_KEY the development key's public half; the sample workspace registered for the sample tenant."""
    for name, value in stack.env("EnqueueApiFunction").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_SAM_LOCAL", "true")
    monkeypatch.setenv("LOCAL_JWT_PUBLIC_KEY", public_key_pem(dev_key.public_key))
    monkeypatch.setattr(app.metrics, "namespace", "AgentJobsTest")
    app.reset_services()
    register_workspace(stack, WORKSPACE, TENANT)
    yield stack
    app.reset_services()


def queued(stack: Stack) -> int:
    return stack.queue_depth()


def test_sam_local_accepts_a_valid_token_of_the_tenant(sam_local: Stack) -> None:
    status, body = invoke(start_api_event(bearer(mint_token(TENANT))))

    assert (status, body["jobId"], body["status"]) == (202, "job-1", "QUEUED")
    assert sam_local.job("job-1", TENANT)["tenantId"] == TENANT
    assert queued(sam_local) == 1


def test_sam_local_takes_operator_scopes_from_the_verified_token(sam_local: Stack) -> None:
    # Given a halted workspace, whose resume needs the operator scope
    sam_local.guard.halt_workspace(WORKSPACE, tenant_id=TENANT, job_id="job-9", reason="job-9 is DEAD")
    event = start_api_event(bearer(mint_token(TENANT)))
    event["rawPath"] = event["requestContext"]["http"]["path"] = f"/workspaces/{WORKSPACE}/resume"
    event["routeKey"] = event["requestContext"]["routeKey"] = "POST /workspaces/{workspaceId}/resume"
    event["pathParameters"] = {"workspaceId": WORKSPACE}
    event["body"] = json.dumps({"decision": "skip", "haltingJobId": "job-9"})
    event["headers"]["content-length"] = str(len(event["body"]))

    without_scope, _ = invoke(event)
    event["headers"].update(bearer(mint_token(TENANT, scopes=("agent-jobs/operator",))))
    with_scope, _ = invoke(event)

    assert without_scope == 403
    assert with_scope != 403  # past the scope check: the resume itself decides (202 or 409)


@pytest.mark.parametrize("value", [None, "false", "1", "TRUE", "True", " true"])
def test_outside_sam_local_a_token_is_never_verified_by_the_function(
    sam_local: Stack, monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    # Given everything but AWS_SAM_LOCAL exactly "true" (Lambda never sets it; API Gateway verifies tokens there)
    assert_a_valid_token_is_refused(sam_local, monkeypatch, "AWS_SAM_LOCAL", value)


@pytest.mark.parametrize("value", [None, "", "   "])
def test_sam_local_without_a_public_key_verifies_nothing(
    sam_local: Stack, monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    assert_a_valid_token_is_refused(sam_local, monkeypatch, "LOCAL_JWT_PUBLIC_KEY", value)


def assert_a_valid_token_is_refused(
    sam_local: Stack, monkeypatch: pytest.MonkeyPatch, variable: str, value: str | None
) -> None:
    """With `variable` set to `value` (None: unset), a valid token of the tenant gets 401 and queues nothing."""
    if value is None:
        monkeypatch.delenv(variable)
    else:
        monkeypatch.setenv(variable, value)
    app.reset_services()

    status, _ = invoke(start_api_event(bearer(mint_token(TENANT))))

    assert status == 401
    assert queued(sam_local) == 0


def hs256_token(claims: dict[str, Any], secret: bytes, kid: str) -> str:
    """A token signed with HMAC-SHA256 and `secret` (PyJWT itself refuses a public key as an HMAC secret)."""

    def part(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    signing_input = (
        f"{part(json.dumps({'alg': 'HS256', 'typ': 'JWT', 'kid': kid}).encode())}.{part(json.dumps(claims).encode())}"
    )
    return f"{signing_input}.{part(hmac.new(secret, signing_input.encode(), hashlib.sha256).digest())}"


@pytest.mark.parametrize(
    "value",
    ["-----BEGIN PUBLIC KEY-----\nbm90IGEga2V5\n-----END PUBLIC KEY-----\n", "not a key at all"],
    ids=["broken PEM", "no PEM"],
)
def test_sam_local_with_an_unusable_key_verifies_nothing(
    sam_local: Stack, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("LOCAL_JWT_PUBLIC_KEY", value)
    app.reset_services()

    status, body = invoke(start_api_event(bearer(mint_token(TENANT))))

    assert status == 401, body
    assert queued(sam_local) == 0


def forged_tokens(dev_key: DevSigningKey) -> dict[str, str]:
    """Tokens an attacker can make without the development key's private half."""
    now = int(time.time())
    claims = {
        "iss": "agent-jobs-local",
        "aud": "agent-jobs",
        "sub": "local:tenant-demo",
        "tenant_id": TENANT,
        "scope": "",
        "iat": now,
        "nbf": now,
        "exp": now + 600,
    }
    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    other = DevSigningKey(private_key=other_key, kid=key_id(other_key.public_key()), path=Path("/nonexistent"))
    public_pem = public_key_pem(dev_key.public_key).encode()
    header, payload, _ = sign_claims(claims, dev_key).split(".")
    return {
        "another key, the dev key's kid": jwt.encode(
            claims, other_key, algorithm="RS256", headers={"kid": dev_key.kid}
        ),
        "another key, its own kid": sign_claims(claims, other),
        "alg none": jwt.encode(claims, "", algorithm="none", headers={"kid": dev_key.kid}),
        "HS256 with the public key as secret": hs256_token(claims, public_pem, dev_key.kid),
        "valid header and claims, no signature": f"{header}.{payload}.",
        "expired": sign_claims({**claims, "iat": now - 7200, "nbf": now - 7200, "exp": now - 3600}, dev_key),
        "another issuer": sign_claims({**claims, "iss": "https://issuer.example.com"}, dev_key),
        "another audience": sign_claims({**claims, "aud": "someone-else"}, dev_key),
        "not a token": "tenant-demo",
    }


def test_sam_local_refuses_every_forged_token(sam_local: Stack, dev_key: DevSigningKey) -> None:
    answers = {name: invoke(start_api_event(bearer(token)))[0] for name, token in forged_tokens(dev_key).items()}

    assert answers == dict.fromkeys(answers, 401)
    assert queued(sam_local) == 0


def test_sam_local_never_takes_a_tenant_from_headers(sam_local: Stack) -> None:
    # Given no token, and headers that name the tenant or its claims as API Gateway's context would
    injected = {
        "x-tenant-id": TENANT,
        "tenant_id": TENANT,
        "x-amzn-oidc-data": json.dumps({"tenant_id": TENANT}),
        "x-apigateway-context": json.dumps({"authorizer": {"jwt": {"claims": {"tenant_id": TENANT}}}}),
    }

    status, _ = invoke(start_api_event(injected))

    assert status == 401
    assert queued(sam_local) == 0


def test_sam_local_a_token_of_another_tenant_reaches_only_that_tenant(sam_local: Stack) -> None:
    # When tenant-b, with its own valid token, sends a job to tenant-demo's workspace
    status, body = invoke(start_api_event(bearer(mint_token("tenant-b"))))

    # Then it is the workspace of nobody tenant-b knows: 404, nothing recorded or queued
    assert status == 404
    assert "not registered" in body["message"]
    assert queued(sam_local) == 0


def test_sam_local_a_verified_token_without_a_tenant_is_403(sam_local: Stack, dev_key: DevSigningKey) -> None:
    now = int(time.time())
    claims = {"iss": "agent-jobs-local", "aud": "agent-jobs", "sub": "x", "iat": now, "nbf": now, "exp": now + 600}

    status, _ = invoke(start_api_event({**bearer(sign_claims(claims, dev_key)), "x-tenant-id": TENANT}))

    assert status == 403
    assert queued(sam_local) == 0


def test_sam_local_leaves_an_events_authorizer_context_as_api_gateway_made_it(sam_local: Stack) -> None:
    # Given `sam local invoke -e events/http_post_job.json`: the event carries the context API Gateway adds (and a
    # made-up token, which the function does not read then)
    event = json.loads((EVENTS / "http_post_job.json").read_text())

    status, body = invoke(event)

    assert (status, body["jobId"]) == (202, "job-0001")
    assert sam_local.job("job-0001", TENANT)["tenantId"] == TENANT


def test_template_declares_the_local_public_key_only_for_sam_local() -> None:
    # Deployed (EndpointUrl empty) the variable is absent, so no value can reach the function in AWS
    deployed = TemplateModel.from_path()
    local = TemplateModel.from_path(parameter_overrides={"EndpointUrl": "http://host.docker.internal:5000"})

    def declared(model: TemplateModel, function_id: str) -> Any:
        variables = (model.function_properties(function_id).get("Environment") or {}).get("Variables") or {}
        return model.resolve(variables["LOCAL_JWT_PUBLIC_KEY"]) if "LOCAL_JWT_PUBLIC_KEY" in variables else None

    assert declared(deployed, "EnqueueApiFunction") is None
    assert declared(local, "EnqueueApiFunction") == ""
    for function_id in ("JobWorkerFunction", "TestSandboxFunction"):
        assert declared(local, function_id) is None
