"""Tenancy and authentication over HTTP: the local API's JWT authorizer (API Gateway's checks, the development key)
in front of the real producer, on the queue and table of template.yaml in moto's server."""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac
import json
import os
import stat
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from agent_jobs_local import auth
from agent_jobs_local.__main__ import main
from agent_jobs_local.api_server import LocalApiServer
from agent_jobs_local.auth import LOCAL_AUDIENCE, LOCAL_ISSUER, OPERATOR_SCOPE, mint_token, sign_claims
from agent_jobs_local.template import TemplateModel
from enqueue_api import app
from tests.conftest import Stack, register_workspace
from tests.local_runtime.test_api_server import job_body

REMOTES_ROOT = "/srv/git"  # the API's WORKSPACES_REMOTE_ROOT here


def registration(workspace_id: str, tenant: str = "tenant-a") -> dict[str, Any]:
    """A registration of `tenant`'s remote, in its folder of the remotes root."""
    remote = f"{REMOTES_ROOT}/{tenant}/{workspace_id}.git"
    return {"remoteUrl": remote, "branch": f"agent/{workspace_id}", "testCommands": {}}


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any
    headers: dict[str, str]


@dataclass
class Api:
    server: LocalApiServer
    events: list[dict[str, Any]] = field(default_factory=list)

    def call(self, method: str, path: str, body: Any = None, authorization: str | None = None) -> Answer:
        headers = {"Content-Type": "application/json"}
        if authorization is not None:
            headers["Authorization"] = authorization
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.server.url}{path}", data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, raw, response_headers = response.status, response.read(), response.headers
        except urllib.error.HTTPError as error:
            status, raw, response_headers = error.code, error.read(), error.headers
        return Answer(status, json.loads(raw) if raw else None, {k.lower(): v for k, v in response_headers.items()})

    def as_tenant(self, tenant: str, *scopes: str) -> Callable[..., Answer]:
        token = mint_token(tenant, scopes=scopes)
        return lambda method, path, body=None: self.call(method, path, body, f"Bearer {token}")


def serve(stack: Stack, model: TemplateModel, monkeypatch: pytest.MonkeyPatch) -> Generator[Api]:
    for name, value in {**stack.env("EnqueueApiFunction"), "WORKSPACES_REMOTE_ROOT": REMOTES_ROOT}.items():
        monkeypatch.setenv(name, value)
    app.reset_services()
    # A warm environment: these tests check the authorizer, and a cold build of the clients on a busy machine must not
    # run an authorized request past the function's Timeout (the local API then answers 500, as API Gateway does).
    app.services()
    events: list[dict[str, Any]] = []

    def handler(event: dict[str, Any], context: Any) -> Any:
        events.append(json.loads(json.dumps(event)))
        return app.lambda_handler(event, context)

    # The server's default authorizer: nothing injects claims here.
    server = LocalApiServer(model, handler).start()
    try:
        yield Api(server, events)
    finally:
        server.stop()
        app.reset_services()


@pytest.fixture
def api(server_stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    yield from serve(server_stack, server_stack.model, monkeypatch)


def claims(**overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    base: dict[str, Any] = {
        "iss": LOCAL_ISSUER,
        "aud": LOCAL_AUDIENCE,
        "sub": "local:tenant-a",
        "tenant_id": "tenant-a",
        "scope": "",
        "iat": now,
        "nbf": now,
        "exp": now + 600,
    }
    base.update(overrides)
    return {name: value for name, value in base.items() if value is not None}


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hs256_with_the_public_key_as_secret() -> str:
    """The algorithm-confusion forgery: HS256 keyed with the verifier's public key (PEM), which anyone can read."""
    key = auth.dev_signing_key()
    secret = key.public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    signing_input = f"{_b64(json.dumps({'alg': 'HS256', 'typ': 'JWT', 'kid': key.kid}).encode())}."
    signing_input += _b64(json.dumps(claims()).encode())
    signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{_b64(signature)}"


def forged_with_another_key() -> str:
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return jwt.encode(claims(), other, algorithm="RS256", headers={"kid": auth.dev_signing_key().kid})


def unsigned() -> str:
    header = {"alg": "none", "typ": "JWT", "kid": auth.dev_signing_key().kid}
    return f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims()).encode())}."


def hs256_with_a_secret() -> str:
    return jwt.encode(claims(), "s" * 32, algorithm="HS256", headers={"kid": auth.dev_signing_key().kid})


def rs512() -> str:
    key = auth.dev_signing_key()
    return jwt.encode(claims(), key.private_key, algorithm="RS512", headers={"kid": key.kid})


def unknown_kid() -> str:
    key = auth.dev_signing_key()
    return jwt.encode(claims(), key.private_key, algorithm="RS256", headers={"kid": "another-key"})


REFUSED_TOKENS: list[tuple[str, Callable[[], str | None]]] = [
    ("missing", lambda: None),
    ("empty", lambda: "Bearer "),
    ("not-a-jwt", lambda: "Bearer not.a.token"),
    ("expired", lambda: f"Bearer {sign_claims(claims(iat=int(time.time()) - 7200, exp=int(time.time()) - 3600))}"),
    ("not-yet-valid", lambda: f"Bearer {sign_claims(claims(nbf=int(time.time()) + 3600))}"),
    ("issued-in-the-future", lambda: f"Bearer {sign_claims(claims(iat=int(time.time()) + 3600))}"),
    ("no-expiry", lambda: f"Bearer {sign_claims(claims(exp=None))}"),
    ("forged-by-another-key", lambda: f"Bearer {forged_with_another_key()}"),
    ("alg-none", lambda: f"Bearer {unsigned()}"),
    ("hs256", lambda: f"Bearer {hs256_with_a_secret()}"),
    ("hs256-public-key-as-secret", lambda: f"Bearer {hs256_with_the_public_key_as_secret()}"),
    ("rs512", lambda: f"Bearer {rs512()}"),
    ("unknown-kid", lambda: f"Bearer {unknown_kid()}"),
    ("wrong-issuer", lambda: f"Bearer {sign_claims(claims(iss='https://issuer.example.com'))}"),
    ("wrong-audience", lambda: f"Bearer {sign_claims(claims(aud='another-api'))}"),
    ("no-audience", lambda: f"Bearer {sign_claims(claims(aud=None))}"),
    ("wrong-client-id", lambda: f"Bearer {sign_claims(claims(aud=None, client_id='another-client'))}"),
]


@pytest.mark.parametrize("make_authorization", [t[1] for t in REFUSED_TOKENS], ids=[t[0] for t in REFUSED_TOKENS])
def test_auth_refused_token_is_401_and_the_function_is_not_invoked(
    api: Api, server_stack: Stack, make_authorization: Callable[[], str | None]
) -> None:
    answer = api.call("POST", "/jobs", job_body("job-1"), make_authorization())

    assert answer.status == 401
    assert answer.body == {"message": "Unauthorized"}
    assert api.events == []
    assert server_stack.queue_depth() == 0
    assert server_stack.job("job-1") is None


@pytest.mark.parametrize(
    "make_authorization",
    [
        lambda: f"Bearer {mint_token('tenant-a')}",
        lambda: mint_token("tenant-a"),  # API Gateway takes the token without the Bearer prefix too
        lambda: f"bearer {mint_token('tenant-a')}",
        lambda: f"Bearer {sign_claims(claims(aud=None, client_id=LOCAL_AUDIENCE))}",  # Cognito access tokens
        lambda: f"Bearer {sign_claims(claims(aud=['elsewhere', LOCAL_AUDIENCE]))}",
        lambda: f"Bearer {sign_claims(claims(exp=int(time.time()) - 5))}",  # within the clock-skew leeway
    ],
    ids=["bearer", "bare", "lower-case-bearer", "client-id", "audience-list", "leeway"],
)
def test_auth_valid_token_reaches_the_function_with_its_claims(
    api: Api, server_stack: Stack, make_authorization: Callable[[], str]
) -> None:
    register_workspace(server_stack, "ws-a", "tenant-a")
    answer = api.call("POST", "/jobs", job_body("job-1"), make_authorization())

    assert answer.status == 202, answer.body
    assert server_stack.job("job-1")["tenantId"] == "tenant-a"
    authorizer = api.events[-1]["requestContext"]["authorizer"]
    assert authorizer["jwt"]["claims"]["tenant_id"] == "tenant-a"
    # As API Gateway passes them: strings only, and no scopes on a route without AuthorizationScopes
    assert all(isinstance(value, str) for value in authorizer["jwt"]["claims"].values())
    assert authorizer["jwt"]["claims"]["iss"] == LOCAL_ISSUER
    assert authorizer["jwt"]["scopes"] is None


# ---- a route's AuthorizationScopes --------------------------------------------------------------------------------


@pytest.fixture
def scoped_api(server_stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    """The template with `GET /jobs/{jobId}` needing one of two scopes (a route model: real routes get them later)."""
    template = copy.deepcopy(server_stack.model.template)
    template["Resources"]["EnqueueApiFunction"]["Properties"]["Events"]["GetJob"]["Properties"]["Auth"] = {
        "AuthorizationScopes": [OPERATOR_SCOPE, "agent-jobs/audit"]
    }
    model = TemplateModel(template, stack_name=server_stack.model.stack_name)
    yield from serve(server_stack, model, monkeypatch)


def test_auth_route_scopes_refuse_a_token_without_one_of_them_403(scoped_api: Api) -> None:
    # Given a job of tenant-a (POST /jobs has no scopes)
    assert scoped_api.as_tenant("tenant-a")("PUT", "/workspaces/ws-a", registration("ws-a")).status == 201
    assert scoped_api.as_tenant("tenant-a")("POST", "/jobs", job_body("job-1")).status == 202
    invoked = len(scoped_api.events)

    # When tenant-a reads it with a token lacking both of the route's scopes
    answer = scoped_api.as_tenant("tenant-a", "agent-jobs/read")("GET", "/jobs/job-1")

    # Then API Gateway's 403, and the function never ran
    assert answer.status == 403
    assert answer.body == {"message": "Forbidden"}
    assert len(scoped_api.events) == invoked


def test_auth_route_scopes_admit_a_token_with_one_of_them(scoped_api: Api) -> None:
    assert scoped_api.as_tenant("tenant-a")("PUT", "/workspaces/ws-a", registration("ws-a")).status == 201
    assert scoped_api.as_tenant("tenant-a")("POST", "/jobs", job_body("job-1")).status == 202

    answer = scoped_api.as_tenant("tenant-a", "agent-jobs/read", OPERATOR_SCOPE)("GET", "/jobs/job-1")

    assert answer.status == 200
    assert answer.body["jobId"] == "job-1"
    jwt_context = scoped_api.events[-1]["requestContext"]["authorizer"]["jwt"]
    assert jwt_context["scopes"] == ["agent-jobs/read", OPERATOR_SCOPE]
    assert jwt_context["claims"]["scope"] == f"agent-jobs/read {OPERATOR_SCOPE}"


def test_auth_route_scopes_are_still_behind_the_token_check(scoped_api: Api) -> None:
    answer = scoped_api.call("GET", "/jobs/job-1", authorization=None)
    assert (answer.status, answer.body) == (401, {"message": "Unauthorized"})


def test_auth_public_route_needs_no_token(server_stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a route that opts out of the authorizer, as the OpenAPI document's does
    template = copy.deepcopy(server_stack.model.template)
    template["Resources"]["EnqueueApiFunction"]["Properties"]["Events"]["GetJob"]["Properties"]["Auth"] = {
        "Authorizer": "NONE"
    }
    model = TemplateModel(template, stack_name=server_stack.model.stack_name)
    public = serve(server_stack, model, monkeypatch)
    api = next(public)
    try:
        answer = api.call("GET", "/jobs/job-1", authorization=None)
    finally:
        public.close()

    # Then the function runs without an authorizer context, and the producer itself refuses the anonymous read
    assert answer.status == 401
    assert answer.body["message"] == "authentication required: send a bearer token for your tenant"
    assert "authorizer" not in api.events[-1]["requestContext"]


# ---- tenancy ------------------------------------------------------------------------------------------------------


def test_auth_enqueue_to_another_tenants_workspace_is_404_and_records_nothing(api: Api, server_stack: Stack) -> None:
    # Given ws-a registered by tenant-a
    assert api.as_tenant("tenant-a")("PUT", "/workspaces/ws-a", registration("ws-a")).status == 201

    # When tenant-b sends a job for it, and one for a workspace nobody registered
    answer = api.as_tenant("tenant-b")("POST", "/jobs", job_body("job-b", "ws-a"))
    nobodys = api.as_tenant("tenant-b")("POST", "/jobs", job_body("job-b", "ws-z"))

    # Then it is refused with what to do, in the very words of the unregistered one (no oracle of tenant-a's ids),
    # and nothing is recorded or queued
    assert (answer.status, nobodys.status) == (404, 404)
    assert answer.body["message"].replace("ws-a", "ws-z") == nobodys.body["message"]
    assert "PUT /workspaces/ws-a" in answer.body["message"]
    assert server_stack.job("job-b") is None
    assert server_stack.queue_depth() == 0
    assert server_stack.workspace("ws-a")["tenantId"] == "tenant-a"


def test_auth_enqueue_to_a_workspace_halted_for_another_tenant_is_404(api: Api, server_stack: Stack) -> None:
    # Given ws-h halted by a job of tenant-a, never registered
    server_stack.guard.halt_workspace("ws-h", tenant_id="tenant-a", job_id="job-0", reason="job job-0 is DEAD")

    answer = api.as_tenant("tenant-b")("POST", "/jobs", job_body("job-b", "ws-h"))

    assert answer.status == 404
    assert server_stack.job("job-b") is None
    assert server_stack.queue_depth() == 0


def test_auth_the_owning_tenant_enqueues_reads_and_updates(api: Api, server_stack: Stack) -> None:
    tenant_a = api.as_tenant("tenant-a")
    assert tenant_a("PUT", "/workspaces/ws-a", registration("ws-a")).status == 201

    accepted = tenant_a("POST", "/jobs", job_body("job-a", "ws-a"))
    job = tenant_a("GET", "/jobs/job-a")
    workspace = tenant_a("GET", "/workspaces/ws-a")
    updated = tenant_a("PUT", "/workspaces/ws-a", registration("ws-a"))
    unregistered = tenant_a("POST", "/jobs", job_body("job-free", "ws-free"))

    assert accepted.status == 202
    assert (job.status, job.body["tenantId"]) == (200, "tenant-a")
    assert (workspace.status, workspace.body["tenantId"]) == (200, "tenant-a")
    assert updated.status == 200
    assert unregistered.status == 404  # a workspace nobody registered takes no jobs: register it first
    assert "PUT /workspaces/ws-free" in unregistered.body["message"]
    assert server_stack.queue_depth() == 1


def test_auth_cross_tenant_reads_are_404_and_registration_403(api: Api, server_stack: Stack) -> None:
    # Given tenant-a's workspace and job
    tenant_a, tenant_b = api.as_tenant("tenant-a"), api.as_tenant("tenant-b")
    assert tenant_a("PUT", "/workspaces/ws-a", registration("ws-a")).status == 201
    assert tenant_a("POST", "/jobs", job_body("job-a", "ws-a")).status == 202

    job = tenant_b("GET", "/jobs/job-a")
    workspace = tenant_b("GET", "/workspaces/ws-a")
    timeline = tenant_b("GET", "/workspaces/ws-a/jobs")
    takeover = tenant_b("PUT", "/workspaces/ws-a", registration("ws-a", "tenant-b"))

    # Then the reads are answered as for ids nobody used: tenant-b learns nothing of tenant-a's ids
    assert (job.status, job.body) == (404, {**tenant_b("GET", "/jobs/job-z").body, "message": job.body["message"]})
    assert job.body["message"] == tenant_b("GET", "/jobs/job-z").body["message"].replace("job-z", "job-a")
    assert "status" not in job.body
    assert workspace.status == timeline.status == 404
    assert workspace.body["message"] == tenant_b("GET", "/workspaces/ws-z").body["message"].replace("ws-z", "ws-a")
    assert "remoteUrl" not in workspace.body
    # A registration cannot take the name over; it is the one answer that says a workspaceId is taken
    assert takeover.status == 403
    assert server_stack.workspace("ws-a")["remoteUrl"] == "/srv/git/tenant-a/ws-a.git"


def test_auth_operator_token_of_another_tenant_reads_nothing(api: Api) -> None:
    # The operator scope acts on the caller's own tenant only
    assert api.as_tenant("tenant-a")("PUT", "/workspaces/ws-a", registration("ws-a")).status == 201
    assert api.as_tenant("tenant-a")("POST", "/jobs", job_body("job-a")).status == 202
    assert api.as_tenant("tenant-b", OPERATOR_SCOPE)("GET", "/jobs/job-a").status == 404


# ---- the development key and the token command --------------------------------------------------------------------


@pytest.fixture
def key_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "keys" / "dev.pem"
    monkeypatch.setenv(auth.DEV_KEY_ENV, str(path))
    return path


def test_auth_dev_key_is_created_private_with_a_stable_kid(key_path: Path) -> None:
    first = auth.dev_signing_key()

    assert first.path == key_path.resolve()
    assert stat.S_IMODE(os.stat(key_path).st_mode) == 0o600
    assert first.private_key.key_size == 2048
    # Read again from the file (as another process would): the same key and kid
    auth._keys.clear()
    again = auth.dev_signing_key()
    assert again.kid == first.kid
    assert auth.key_id(again.public_key) == first.kid
    assert list(key_path.parent.iterdir()) == [key_path]  # no temporary file left behind


def test_auth_mint_token_carries_the_contract_claims(key_path: Path) -> None:
    token = mint_token("acme", scopes=(OPERATOR_SCOPE, "x"), ttl_seconds=120)

    header = jwt.get_unverified_header(token)
    verified = auth.verify_authorization({"authorization": f"Bearer {token}"})
    assert header == {"alg": "RS256", "typ": "JWT", "kid": auth.dev_signing_key().kid}
    assert verified is not None
    assert (verified["iss"], verified["aud"], verified["tenant_id"]) == (LOCAL_ISSUER, LOCAL_AUDIENCE, "acme")
    assert verified["scope"] == f"{OPERATOR_SCOPE} x"
    assert verified["exp"] - verified["iat"] == 120
    assert verified["nbf"] == verified["iat"]
    assert verified["sub"]


def test_auth_operator_scope_is_the_apis(key_path: Path) -> None:
    assert OPERATOR_SCOPE == app.OPERATOR_SCOPE


def test_auth_token_command_prints_a_token_the_api_accepts(key_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["token", "--tenant", "acme", "--operator", "--ttl", "60"]) == 0

    token = capsys.readouterr().out.strip()
    verified = auth.verify_authorization({"authorization": token})
    assert verified is not None
    assert (verified["tenant_id"], verified["scope"]) == ("acme", OPERATOR_SCOPE)
    assert verified["exp"] - verified["iat"] == 60


def test_auth_token_command_refuses_what_the_api_would_refuse(
    key_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["token", "--tenant", "not a tenant"]) == 2
    assert main(["token", "--tenant", "acme", "--ttl", "0"]) == 2
    output = capsys.readouterr()
    assert output.out == ""
    assert "is not a tenant id" in output.err


# ---- operator actions: resume ---------------------------------------------------------------------------------------


def halted_workspace_of(api: Api, server_stack: Stack, tenant: str, workspace_id: str) -> None:
    """A workspace registered by `tenant` and halted by one of its jobs (as a DEAD job halts it)."""
    assert api.as_tenant(tenant)("PUT", f"/workspaces/{workspace_id}", registration(workspace_id, tenant)).status == 201
    server_stack.guard.halt_workspace(workspace_id, tenant_id=tenant, job_id="job-0", reason="job job-0 is DEAD")


def test_auth_resume_of_another_tenants_workspace_is_404_and_changes_nothing(api: Api, server_stack: Stack) -> None:
    # Given tenant-a's halted workspace
    halted_workspace_of(api, server_stack, "tenant-a", "ws-a")

    # When an operator of tenant-b resumes it
    answer = api.as_tenant("tenant-b", OPERATOR_SCOPE)(
        "POST", "/workspaces/ws-a/resume", {"decision": "skip", "haltingJobId": "job-0"}
    )

    # Then it is refused as for a workspace that does not exist, and the workspace stays halted by the same job
    assert answer.status == 404
    assert "another tenant" not in answer.body["message"]
    workspace = server_stack.workspace("ws-a")
    assert (workspace["state"], workspace["haltingJobId"]) == ("HALTED", "job-0")


def test_auth_resume_needs_the_operator_scope_at_the_api(api: Api, server_stack: Stack) -> None:
    # Given tenant-a's halted workspace
    halted_workspace_of(api, server_stack, "tenant-a", "ws-a")
    body = {"decision": "skip", "haltingJobId": "job-0"}
    invocations = len(api.events)

    # When the owner resumes it with a token without the operator scope, then with one
    without_scope = api.as_tenant("tenant-a")("POST", "/workspaces/ws-a/resume", body)
    refused_invocations = len(api.events) - invocations
    with_scope = api.as_tenant("tenant-a", OPERATOR_SCOPE)("POST", "/workspaces/ws-a/resume", body)

    # Then API Gateway refuses the first (the route's scope, read from template.yaml) without running the function,
    # and the operator's resume is accepted
    assert (without_scope.status, without_scope.body) == (403, {"message": "Forbidden"})
    assert refused_invocations == 0
    assert with_scope.status == 202
    assert server_stack.workspace("ws-a")["state"] in ("ACTIVE", "RESUMING")
