"""The producer API's Lambda handler driven with HTTP API (payload 2.0) events, against the queue and table of
template.yaml in moto (in-process and moto's server over HTTP)."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent_jobs.models import ID_PATTERN, ApplyPatchJob, JobMessage, JobStatus, JobType, job_message
from agent_jobs_local.event_source import LambdaContextStub
from enqueue_api import app
from tests.conftest import Stack, enqueue, make_job, register_workspace
from tests.naive.producer import naive_enqueue

EVENTS = Path(__file__).resolve().parents[2] / "events"
PATCH = "--- a/f.txt\n+++ b/f.txt\n@@ -0,0 +1 @@\n+hello\n"
PUBLIC_FIELDS = set(app.PUBLIC_JOB_FIELDS)


def _is_id(value: str) -> bool:
    return bool(re.match(ID_PATTERN, value)) and len(value) <= 64


def load_event(name: str) -> dict[str, Any]:
    return json.loads((EVENTS / name).read_text())  # type: ignore[no-any-return]


def job_body(job_id: str = "job-1", workspace_id: str = "ws-a", **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "jobId": job_id,
        "workspaceId": workspace_id,
        "type": "apply_patch",
        "payload": {"patch": PATCH, "commitMessage": f"change for {job_id}"},
    }
    body.update(overrides)
    return body


@dataclass(frozen=True)
class ApiResponse:
    status: int
    body: dict[str, Any]
    headers: dict[str, str]

    def field_errors(self) -> dict[str, str]:
        return {entry["field"]: entry["message"] for entry in self.body.get("errors", [])}


def _with_claims(event: dict[str, Any], claims: dict[str, str] | None) -> dict[str, Any]:
    if claims is not None:
        # What an HTTP API JWT authorizer adds once it has verified the token.
        event["requestContext"]["authorizer"] = {"jwt": {"claims": claims, "scopes": None}}
    return event


def without_authorizer(event: dict[str, Any]) -> dict[str, Any]:
    """The sample event as a route without the authorizer would deliver it (or a direct invocation)."""
    event["requestContext"].pop("authorizer", None)
    event["headers"].pop("authorization", None)
    return event


def with_lambda_authorizer(event: dict[str, Any], context: dict[str, str]) -> dict[str, Any]:
    """What an HTTP API Lambda authorizer (simple responses) adds instead of JWT claims."""
    event["requestContext"]["authorizer"] = {"lambda": context}
    return event


def post_event(
    body: Any = None,
    *,
    raw: str | None = None,
    claims: dict[str, str] | None = None,
    content_type: str | None = "application/json",
    base64_encoded: bool = False,
) -> dict[str, Any]:
    """events/http_post_job.json with another body (a document, or `raw` text as sent), headers and claims."""
    event = load_event("http_post_job.json")
    text = raw if raw is not None else json.dumps(job_body() if body is None else body)
    event["requestContext"]["requestId"] = uuid.uuid4().hex
    event["headers"]["content-length"] = str(len(text.encode("utf-8", "surrogatepass")))
    event["headers"].pop("content-type")
    if content_type is not None:
        event["headers"]["content-type"] = content_type
    event["body"] = base64.b64encode(text.encode()).decode() if base64_encoded else text
    event["isBase64Encoded"] = base64_encoded
    return _with_claims(event, claims)


def get_event(job_id: str, *, claims: dict[str, str] | None = None) -> dict[str, Any]:
    """events/http_get_job.json for another jobId (`job_id` as it appears in the URL path)."""
    event = load_event("http_get_job.json")
    event["requestContext"]["requestId"] = uuid.uuid4().hex
    event["rawPath"] = event["requestContext"]["http"]["path"] = f"/jobs/{job_id}"
    event["pathParameters"] = {"jobId": job_id}
    return _with_claims(event, claims)


class Api:
    """The function as API Gateway invokes it, plus what a test needs to see of the stack behind it."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.registered: set[str] = set()  # workspaces `invoke` registered for the caller before a job request

    def invoke(self, event: dict[str, Any], *, register: bool = True) -> ApiResponse:
        """Invoke the function with `event`; a job's workspace is registered for the caller's tenant first (unless
        `register` is False, or the workspace is registered or another tenant's), as a tenant does before sending."""
        if register:
            self._register_workspaces_of(event)
        context = LambdaContextStub(timeout_seconds=10, function_name="EnqueueApiFunction")
        response = app.lambda_handler(copy.deepcopy(event), context)
        assert response.get("isBase64Encoded") is False
        body = json.loads(response["body"]) if response.get("body") else {}
        return ApiResponse(status=response["statusCode"], body=body, headers=response.get("headers", {}))

    def _register_workspaces_of(self, event: dict[str, Any]) -> None:
        if event["requestContext"]["http"]["method"] != "POST" or not event["rawPath"].startswith("/jobs"):
            return
        claims = ((event["requestContext"].get("authorizer") or {}).get("jwt") or {}).get("claims") or {}
        tenant = claims.get("tenant_id")
        try:
            document = json.loads(base64.b64decode(event["body"]) if event.get("isBase64Encoded") else event["body"])
        except (ValueError, TypeError):
            return
        jobs = document.get("jobs") if isinstance(document, dict) and "jobs" in document else [document]
        workspaces = [job.get("workspaceId") for job in jobs or [] if isinstance(job, dict)]
        for workspace_id in dict.fromkeys(workspaces):
            if isinstance(tenant, str) and _is_id(tenant) and isinstance(workspace_id, str) and _is_id(workspace_id):
                register_workspace(self.stack, workspace_id, tenant)
                self.registered.add(workspace_id)

    def post(self, body: Any = None, **kwargs: Any) -> ApiResponse:
        return self.invoke(post_event(body, **kwargs))

    def get(self, job_id: str, **kwargs: Any) -> ApiResponse:
        return self.invoke(get_event(job_id, **kwargs))

    def items(self) -> list[dict[str, Any]]:
        """The table's items, but for the registrations `invoke` made (and their tenants' counts)."""
        made = {f"ws#{workspace_id}" for workspace_id in self.registered}
        return [
            item
            for item in self.stack.services.dynamodb.scan(TableName=self.stack.table_name)["Items"]
            if not (item["pk"]["S"] in made or (self.registered and item["pk"]["S"].startswith("tenant#")))
        ]

    def drain(self) -> list[dict[str, Any]]:
        """Receive and delete everything on the queue (as a worker would), returning the Lambda-shaped records."""
        records: list[dict[str, Any]] = []
        while batch := self.stack.receive()["Records"]:
            for record in batch:
                self.stack.services.sqs.delete_message(
                    QueueUrl=self.stack.queue_url, ReceiptHandle=record["receiptHandle"]
                )
            records.extend(batch)
        return records


def use_environment(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    app.reset_services()


def api_on(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Api:
    """The enqueue function with the environment template.yaml gives it on `stack`, no services cached (the caller
    calls `app.reset_services()` after the test)."""
    use_environment(monkeypatch, stack.env("EnqueueApiFunction"))
    # Powertools reads the namespace when the module is imported; Lambda sets it before that, the test run after.
    monkeypatch.setattr(app.metrics, "namespace", "AgentJobsTest")
    return Api(stack)


@pytest.fixture
def api(any_stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    """The function's environment from the stack (as template.yaml sets it), and no services cached from before."""
    use_environment(monkeypatch, any_stack.env())
    # Powertools reads the namespace when the module is imported; Lambda sets it before that, the test run after.
    monkeypatch.setattr(app.metrics, "namespace", "AgentJobsTest")
    yield Api(any_stack)
    app.reset_services()


# ---- POST /jobs: accepted ------------------------------------------------------------------------------------------


def test_submit_job_accepts_and_sends_it_to_the_workspace_group(api: Api) -> None:
    response = api.post(job_body("job-1", "ws-a"))

    assert response.status == 202
    assert response.body["jobId"] == "job-1"
    assert response.body["status"] == JobStatus.QUEUED
    assert response.body["created"] is True
    assert response.headers["Location"] == "/jobs/job-1"
    (record,) = api.stack.receive()["Records"]
    assert record["attributes"]["MessageGroupId"] == "ws#ws-a"
    deduplication_id = hashlib.sha256(b"tenant-demo:job-1:apply_patch").hexdigest()
    assert record["attributes"]["MessageDeduplicationId"] == deduplication_id
    assert record["messageAttributes"]["tenantId"]["stringValue"] == "tenant-demo"
    assert record["messageAttributes"]["type"]["stringValue"] == "apply_patch"
    message = JobMessage.model_validate_json(record["body"])
    assert (message.job_id, message.tenant_id) == ("job-1", "tenant-demo")
    assert message.request().payload.model_dump(by_alias=True)["patch"] == PATCH
    assert response.body["messageId"] == record["messageId"]
    assert response.body["sequenceNumber"] == record["attributes"]["SequenceNumber"]
    stored = api.stack.job("job-1")
    assert stored is not None
    assert stored["status"] == JobStatus.QUEUED
    assert stored["payloadHash"] == message.payload_hash
    assert (stored["messageId"], stored["sequenceNumber"]) == (record["messageId"], response.body["sequenceNumber"])


def test_submit_job_logs_with_the_request_id_as_correlation_id(api: Api) -> None:
    event = post_event(job_body("job-1"))

    api.invoke(event)

    assert app.logger.get_correlation_id() == event["requestContext"]["requestId"]


def test_submit_job_takes_the_tenant_from_jwt_claims(api: Api) -> None:
    response = api.post(job_body("job-1"), claims={"sub": "agent-7", "tenant_id": "acme"})

    assert response.status == 202
    (record,) = api.stack.receive()["Records"]
    assert record["messageAttributes"]["tenantId"]["stringValue"] == "acme"
    assert JobMessage.model_validate_json(record["body"]).tenant_id == "acme"
    stored = api.stack.job("job-1")
    assert stored is not None
    assert stored["tenantId"] == "acme"


@pytest.mark.parametrize("claims", [{"sub": "agent-7"}, {"sub": "agent-7", "tenant_id": "not a tenant"}])
def test_submit_job_with_claims_but_no_usable_tenant_is_forbidden(api: Api, claims: dict[str, str]) -> None:
    # Given a verified token that does not name a usable tenant: never fall back to some tenant
    response = api.post(job_body("job-1"), claims=claims)

    assert response.status == 403
    assert "tenant_id" in response.body["message"]
    assert api.stack.queue_depth() == 0
    assert api.items() == []


def test_submit_job_through_another_kind_of_authorizer_is_forbidden(api: Api) -> None:
    # Given a request that an authorizer let through without JWT claims: it must not become any tenant
    event = with_lambda_authorizer(post_event(job_body("job-1")), {"tenant_id": "acme"})

    response = api.invoke(event)

    assert response.status == 403
    assert api.stack.queue_depth() == 0
    assert api.items() == []


def test_submit_job_without_an_authorizer_context_is_401(api: Api) -> None:
    # Given a request that reached the function without an authorizer (no route runs without one when deployed)
    response = api.invoke(without_authorizer(post_event(job_body("job-1"))))

    assert response.status == 401
    assert response.body["message"] == "authentication required: send a bearer token for your tenant"
    assert api.stack.queue_depth() == 0
    assert api.items() == []


def test_submit_job_accepts_a_body_of_the_configured_maximum_and_sends_a_pointer(api: Api) -> None:
    # Given a patch that makes the request body exactly MAX_REQUEST_BYTES long
    limit = app.body_limit_bytes(api.stack.settings)
    assert limit == api.stack.settings.max_request_bytes
    header = "--- /dev/null\n+++ b/big.txt\n@@ -0,0 +1 @@\n+"  # one line of a new file, as long as the limit allows
    empty = len(json.dumps(job_body("job-big", payload={"patch": header + "\n", "commitMessage": "big"})))
    body = job_body("job-big", payload={"patch": header + "x" * (limit - empty) + "\n", "commitMessage": "big"})
    assert len(json.dumps(body)) == limit

    response = api.post(body)

    # Then the payload is an object in the bucket and the message a pointer to it
    assert response.status == 202
    (record,) = api.stack.receive()["Records"]
    message = JobMessage.model_validate_json(record["body"])
    assert message.payload is None
    assert message.payload_ref is not None
    assert message.payload_ref.bucket == api.stack.settings.payload_bucket
    assert len(record["body"]) < 1024


def test_submit_job_accepts_a_base64_encoded_body(api: Api) -> None:
    response = api.post(job_body("job-1"), base64_encoded=True)

    assert response.status == 202
    assert api.stack.queue_depth() == 1


def test_submit_job_accepts_a_base64_patch_and_the_worker_gets_its_bytes(api: Api) -> None:
    # A diff of a Latin-1 file: its bytes are not UTF-8, so they cannot travel as JSON text
    diff = b"--- a/legacy.txt\n+++ b/legacy.txt\n@@ -1 +1 @@\n-caf\xe9\n+cr\xe8me\n"
    payload = {"patch": base64.b64encode(diff).decode(), "patchEncoding": "base64", "commitMessage": "m"}

    response = api.post(job_body("job-1", payload=payload))

    assert response.status == 202, response.body
    (record,) = api.stack.receive()["Records"]
    request = JobMessage.model_validate_json(record["body"]).request()
    assert isinstance(request, ApplyPatchJob)
    assert request.payload.patch_content() == diff


def test_submit_job_a_text_patch_keeps_its_payload_hash_without_a_patch_encoding(api: Api) -> None:
    # patchEncoding "text" is the default: sent or not, the job is the same job (an idempotent resubmission)
    first = api.post(job_body("job-1", payload={"patch": PATCH, "commitMessage": "m"}))
    again = api.post(job_body("job-1", payload={"patch": PATCH, "commitMessage": "m", "patchEncoding": "text"}))

    assert (first.status, again.status) == (202, 202), again.body
    assert (first.body["created"], again.body["created"]) == (True, False)
    assert api.stack.queue_depth() == 1


@pytest.mark.parametrize("patch", ["not base64!", "YWJj=", "===="], ids=["not-base64", "bad-padding", "no-bytes"])
def test_submit_job_a_base64_patch_that_does_not_decode_is_422_saying_what_to_send(api: Api, patch: str) -> None:
    response = api.post(job_body("job-1", payload={"patch": patch, "patchEncoding": "base64", "commitMessage": "m"}))

    assert response.status == 422
    (message,) = response.field_errors().values()
    assert "base64" in message
    assert api.stack.queue_depth() == 0
    assert api.items() == []


def test_submit_job_a_base64_patch_is_measured_by_its_bytes_against_patch_max_bytes(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_environment(monkeypatch, {"PATCH_MAX_BYTES": "3000"})
    diff = b"--- a/f\n+++ b/f\n@@ -0,0 +1 @@\n+" + b"\xff" * 2400 + b"\n"  # 2,432 bytes; 3,244 in base64
    payload = {"patch": base64.b64encode(diff).decode(), "patchEncoding": "base64", "commitMessage": "m"}

    assert api.post(job_body("job-1", payload=payload)).status == 202
    too_large = b"--- a/f\n+++ b/f\n@@ -0,0 +1 @@\n+" + b"\xff" * 3000 + b"\n"
    payload["patch"] = base64.b64encode(too_large).decode()
    response = api.post(job_body("job-2", payload=payload))
    assert response.status == 422
    assert "PATCH_MAX_BYTES" in response.field_errors()["payload.patch"]


def test_submit_job_a_lone_surrogate_says_to_send_the_patch_as_base64(api: Api) -> None:
    response = api.post(raw=json.dumps(job_body("job-1", payload={"patch": "\udce9", "commitMessage": "m"})))

    assert response.status == 400
    assert '"patchEncoding": "base64"' in response.body["message"]


# ---- POST /jobs: resubmission and conflict -------------------------------------------------------------------------


def test_submit_job_resubmission_with_same_payload_is_idempotent(api: Api) -> None:
    first = api.post(job_body("job-1"))
    stored_before = api.stack.job("job-1")

    again = api.post(job_body("job-1"))

    assert first.status == again.status == 202
    assert (first.body["created"], again.body["created"]) == (True, False)
    assert again.body["messageId"] == first.body["messageId"]
    assert again.body["sequenceNumber"] == first.body["sequenceNumber"]
    assert api.stack.queue_depth() == 1
    assert api.stack.job("job-1") == stored_before


def test_submit_job_resubmission_after_the_message_was_consumed_is_not_sent_again(api: Api) -> None:
    # Given a job accepted, delivered and deleted (once SQS's deduplication window is over, the queue would take its
    # deduplication id as a new message: only the job's record keeps a resubmission from running it twice)
    first = api.post(job_body("job-1"))
    assert [record["messageId"] for record in api.drain()] == [first.body["messageId"]]
    queue_calls: list[str] = []
    app.services().sqs.meta.events.register("before-call.sqs", lambda model, **_: queue_calls.append(model.name))

    again = api.post(job_body("job-1"))

    assert again.status == 202
    assert again.body["created"] is False
    assert again.body["messageId"] == first.body["messageId"]
    assert queue_calls == []  # answered from the record, never sent to the queue again
    assert api.stack.queue_depth() == 0
    # Control: a new job is sent, and the count sees it.
    assert api.post(job_body("job-2")).status == 202
    assert queue_calls == ["SendMessage"]


def test_submit_job_resubmission_reports_the_current_status(api: Api) -> None:
    # Given a job a worker already claimed
    api.post(job_body("job-1"))
    (record,) = api.stack.receive()["Records"]
    message = JobMessage.model_validate_json(record["body"])
    claim = api.stack.guard.claim(message, message_id=record["messageId"], sequence_number=None, remaining_ms=60_000)
    assert claim.claimed

    again = api.post(job_body("job-1"))

    assert again.status == 202
    assert again.body["status"] == JobStatus.IN_FLIGHT
    assert again.body["created"] is False


@pytest.mark.parametrize(
    "change",
    [
        {"payload": {"patch": PATCH + "+more\n", "commitMessage": "change for job-1"}},
        {"workspaceId": "ws-b"},
        {"type": "run_tests", "payload": {"suite": "unit"}},
    ],
    ids=["payload", "workspace", "type"],
)
def test_submit_job_same_job_id_with_another_job_conflicts(api: Api, change: dict[str, Any]) -> None:
    api.post(job_body("job-1"))
    stored_before = api.stack.job("job-1")

    response = api.post(job_body("job-1", **change))

    assert response.status == 409
    assert "new jobId" in response.body["message"]
    assert api.stack.job("job-1") == stored_before
    assert len(api.drain()) == 1


def test_submit_job_id_taken_first_by_another_tenant_is_still_the_tenants_own(api: Api) -> None:
    # Given tenant-b took "job-1" first, for its own workspace (squatting on a jobId tenant-a will use)
    squat = api.post(job_body("job-1", "ws-b"), claims={"tenant_id": "tenant-b"})
    assert squat.status == 202
    squatted = api.stack.job("job-1", "tenant-b")

    # When tenant-a sends its job-1, and each tenant retries its own
    response = api.post(job_body("job-1", "ws-a"), claims={"tenant_id": "tenant-a"})
    retry_a = api.post(job_body("job-1", "ws-a"), claims={"tenant_id": "tenant-a"})
    retry_b = api.post(job_body("job-1", "ws-b"), claims={"tenant_id": "tenant-b"})

    # Then tenant-a's job is accepted and queued as a job of its own; neither job touched the other
    assert (response.status, response.body["created"]) == (202, True)
    assert (retry_a.status, retry_a.body["created"]) == (202, False)
    assert (retry_b.status, retry_b.body["created"]) == (202, False)
    assert api.stack.job("job-1", "tenant-b") == squatted
    assert api.stack.job("job-1", "tenant-a")["workspaceId"] == "ws-a"
    records = api.drain()
    assert sorted(record["attributes"]["MessageGroupId"] for record in records) == ["ws#ws-a", "ws#ws-b"]
    # And each tenant reads only its own job under that jobId
    assert api.get("job-1", claims={"tenant_id": "tenant-a"}).body["workspaceId"] == "ws-a"
    assert api.get("job-1", claims={"tenant_id": "tenant-b"}).body["workspaceId"] == "ws-b"


# ---- POST /jobs: refused requests send nothing and write nothing ---------------------------------------------------

OVERSIZE = object()  # marker: a body just over the limit, built from the stack's settings


@pytest.mark.parametrize(
    ("request_kwargs", "status", "fields"),
    [
        pytest.param({"raw": '{"jobId": "job-1", '}, 400, {}, id="malformed-json"),
        pytest.param({"raw": ""}, 400, {}, id="empty-body"),
        pytest.param({"raw": "  \n"}, 400, {}, id="blank-body"),
        pytest.param({"raw": "[1, 2]"}, 400, {}, id="array-body"),
        pytest.param({"raw": '"apply_patch"'}, 400, {}, id="string-body"),
        pytest.param({"raw": "[" * 5000 + "]" * 5000}, 400, {}, id="deeply-nested"),
        pytest.param(
            {"raw": json.dumps(job_body("job-1", payload={"patch": "\ud800", "commitMessage": "m"}))},
            400,
            {},
            id="lone-surrogate",
        ),
        pytest.param({"raw": "!not base64!", "base64_encoded": True}, 400, {}, id="bad-base64"),
        pytest.param({"content_type": "text/plain"}, 415, {}, id="not-json-content-type"),
        pytest.param({"body": OVERSIZE}, 413, {}, id="oversize"),
        pytest.param(
            {"body": {}},
            422,
            {"jobId": "Field required", "workspaceId": "Field required", "type": "Field required"},
            id="empty-object",
        ),
        pytest.param(
            {"body": job_body(payload={"commitMessage": "m"})}, 422, {"payload.patch": "Field required"}, id="no-patch"
        ),
        pytest.param(
            {"body": job_body(payload={"patch": PATCH})},
            422,
            {"payload.commitMessage": "Field required"},
            id="no-commit-message",
        ),
        pytest.param(
            {"body": job_body(type="delete_repo")}, 422, {"type": "apply_patch, run_tests, open_pr"}, id="unknown-type"
        ),
        pytest.param(
            {"body": job_body(type="delete_repo", jobId="bad id")},
            422,
            {"type": "delete_repo", "jobId": "pattern"},
            id="unknown-type-and-bad-job-id",
        ),
        pytest.param({"body": job_body("job/1")}, 422, {"jobId": "letters, digits"}, id="job-id-charset"),
        pytest.param({"body": job_body("j" * 65)}, 422, {"jobId": "at most 64"}, id="job-id-length"),
        pytest.param({"body": job_body(jobId=7)}, 422, {"jobId": "string"}, id="job-id-number"),
        pytest.param({"body": job_body(workspace_id="ws#a")}, 422, {"workspaceId": "pattern"}, id="ws-id-charset"),
        pytest.param({"body": job_body(workspace_id="w" * 101)}, 422, {"workspaceId": "at most 100"}, id="ws-length"),
        pytest.param(
            {"body": job_body(tenantId="tenant-b")}, 422, {"tenantId": "never from the body"}, id="tenant-in-body"
        ),
        pytest.param(
            {"body": job_body(payload={"patch": PATCH, "commitMessage": "m", "force": True})},
            422,
            {"payload.force": "unknown field"},
            id="unknown-payload-field",
        ),
        pytest.param(
            {"body": job_body(type="open_pr", payload={"title": ""})}, 422, {"payload.title": "at least 1"}, id="pr"
        ),
    ],
)
def test_submit_job_refuses_bad_input_without_side_effects(
    api: Api, request_kwargs: dict[str, Any], status: int, fields: dict[str, str]
) -> None:
    if request_kwargs.get("body") is OVERSIZE:
        limit = app.body_limit_bytes(api.stack.settings)
        request_kwargs = {"body": job_body(payload={"patch": "x" * limit, "commitMessage": "m"})}

    response = api.post(**request_kwargs)

    assert response.status == status, response.body
    assert response.body["message"]
    errors = response.field_errors()
    assert set(errors) == set(fields)
    for field, fragment in fields.items():
        assert fragment in errors[field], (field, errors[field])
    assert api.stack.queue_depth() == 0
    assert api.items() == []


def test_submit_job_oversize_message_names_the_limit_why_and_what_to_do(api: Api) -> None:
    limit = api.stack.settings.max_request_bytes

    response = api.post(job_body(payload={"patch": "x" * limit, "commitMessage": "m"}))

    assert response.status == 413
    message = response.body["message"]
    assert f"the limit is {limit} bytes (MAX_REQUEST_BYTES)" in message
    assert "synchronous Lambda invocation" in message  # why
    assert "6 MB" in message
    assert "split a large patch into several apply_patch jobs" in message  # what to do
    assert api.stack.queue_depth() == 0
    assert api.items() == []


def test_submit_job_without_a_payload_bucket_limits_bodies_to_one_queue_message(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a producer without PAYLOAD_BUCKET
    use_environment(monkeypatch, {"PAYLOAD_BUCKET": ""})
    limit = api.stack.settings.inline_message_limit_bytes

    response = api.post(job_body(payload={"patch": "x" * limit, "commitMessage": "m"}))

    assert response.status == 413
    assert f"the limit is {limit} bytes (INLINE_MESSAGE_LIMIT_BYTES" in response.body["message"]
    assert "configure a payload bucket" in response.body["message"]
    assert api.stack.queue_depth() == 0


def test_submit_job_unknown_type_lists_the_allowed_types(api: Api) -> None:
    response = api.post(job_body(type="delete_repo"))

    assert response.status == 422
    message = response.field_errors()["type"]
    assert all(job_type.value in message for job_type in JobType)


# ---- POST /jobs: AWS unavailable -----------------------------------------------------------------------------------


def test_submit_job_answers_503_when_the_table_is_unavailable(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    use_environment(monkeypatch, {"TABLE_NAME": "no-such-table"})

    response = api.post(job_body("job-1"))

    assert response.status == 503
    assert "same jobId" in response.body["message"]
    assert response.headers["Retry-After"]
    assert api.stack.queue_depth() == 0
    assert api.items() == []


def test_submit_job_retry_after_a_failed_send_sends_exactly_once(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a send that failed after the job was recorded (the queue URL is wrong for this invocation)
    good_url = api.stack.queue_url
    use_environment(monkeypatch, {"QUEUE_URL": good_url.rsplit("/", 1)[0] + "/no-such-queue.fifo"})
    assert api.post(job_body("job-1")).status == 503

    # When the client retries the same request once the queue is reachable
    use_environment(monkeypatch, {"QUEUE_URL": good_url})
    response = api.post(job_body("job-1"))

    # Then the job is sent once and its record points at that message
    assert response.status == 202
    (record,) = api.drain()
    stored = api.stack.job("job-1")
    assert stored is not None
    assert stored["messageId"] == record["messageId"] == response.body["messageId"]


# ---- GET /jobs/{jobId} ---------------------------------------------------------------------------------------------


def test_read_job_returns_the_public_view(api: Api) -> None:
    # Given a job accepted through the API and claimed by a worker (so the record holds a lease owner)
    accepted = api.post(job_body("job-1"))
    (record,) = api.stack.receive()["Records"]
    claim = api.stack.guard.claim(
        JobMessage.model_validate_json(record["body"]),
        message_id=record["messageId"],
        sequence_number=record["attributes"]["SequenceNumber"],
        remaining_ms=60_000,
    )
    assert claim.claimed
    assert "leaseOwner" in (api.stack.job("job-1") or {})

    response = api.get("job-1")

    assert response.status == 200
    assert set(response.body) == PUBLIC_FIELDS
    assert response.body["jobId"] == "job-1"
    assert response.body["workspaceId"] == "ws-a"
    assert response.body["tenantId"] == "tenant-demo"
    assert response.body["type"] == "apply_patch"
    assert response.body["status"] == JobStatus.IN_FLIGHT
    assert response.body["attempt"] == 1
    assert response.body["messageId"] == accepted.body["messageId"]
    assert [entry["status"] for entry in response.body["history"]] == [JobStatus.QUEUED, JobStatus.IN_FLIGHT]


def test_read_job_never_shows_a_stored_body(api: Api) -> None:
    # Given a job parked with its message body (as the worker does while its workspace is halted)
    job = make_job("job-9", "ws-a", "open_pr")
    message = job_message(job, "tenant-demo")
    api.stack.guard.halt_workspace("ws-a", tenant_id="tenant-demo", job_id="job-8", reason="job-8 is DEAD")
    parked = api.stack.guard.park(
        message, message_id="m-1", sequence_number="1", body=message.model_dump_json(by_alias=True), reason="halted"
    )
    assert parked
    assert "body" in (api.stack.job("job-9") or {})

    response = api.get("job-9")

    assert response.status == 200
    assert response.body["status"] == JobStatus.PARKED
    assert "body" not in response.body
    assert "title" not in json.dumps(response.body)


def test_read_job_unknown_is_404(api: Api) -> None:
    response = api.get("job-unknown")

    assert response.status == 404
    assert "job-unknown" in response.body["message"]


@pytest.mark.parametrize("raw_job_id", ["bad%20id", "-dash", "j" * 65])
def test_read_job_malformed_job_id_is_422(api: Api, raw_job_id: str) -> None:
    response = api.get(raw_job_id)

    assert response.status == 422
    assert set(response.field_errors()) == {"jobId"}


def test_the_request_body_is_parsed_once(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a registered workspace, and every JSON document decoded in this process counted from then on
    register_workspace(api.stack, "ws-a", "tenant-demo")
    body = json.dumps(job_body("job-parsed-once", "ws-a"))
    decoded: list[str] = []
    decode = json.JSONDecoder.decode

    def counted(self: json.JSONDecoder, text: str, *args: Any, **kwargs: Any) -> Any:
        decoded.append(text)
        return decode(self, text, *args, **kwargs)

    monkeypatch.setattr(json.JSONDecoder, "decode", counted)

    response = api.invoke(post_event(raw=body), register=False)

    # Then the job is accepted, its body (up to MAX_REQUEST_BYTES of it) decoded once, not once per reader
    assert response.status == 202, response.body
    assert decoded.count(body) == 1


def test_read_job_by_a_percent_encoded_job_id(api: Api) -> None:
    # Given a job whose jobId a client percent-encodes in the URL (API Gateway routes on the raw path)
    enqueue(api.stack, make_job("job-1.a", "ws-a"), tenant_id="tenant-demo")

    response = api.get("job%2D1%2Ea")

    # Then the path id is read as the client meant it
    assert response.status == 200, response.body
    assert response.body["jobId"] == "job-1.a"


def test_read_job_of_another_tenant_is_answered_as_an_unknown_job(api: Api) -> None:
    # Given a job that tenant-a enqueued through the layer
    enqueue(api.stack, make_job("job-a", "ws-a"), tenant_id="tenant-a")

    other = api.get("job-a", claims={"tenant_id": "tenant-b"})
    unknown = api.get("job-z", claims={"tenant_id": "tenant-b"})
    owner = api.get("job-a", claims={"tenant_id": "tenant-a"})
    anonymous = api.invoke(without_authorizer(get_event("job-a")))

    # Then tenant-b cannot tell tenant-a's jobId from one nobody used: the same status and the same words
    assert (other.status, unknown.status) == (404, 404)
    assert other.body["message"].replace("job-a", "job-z") == unknown.body["message"]
    assert set(other.body) == set(unknown.body)
    assert "jobId" not in other.body
    assert owner.status == 200
    assert owner.body["tenantId"] == "tenant-a"
    assert anonymous.status == 401
    assert "jobId" not in anonymous.body


# ---- the sample events ---------------------------------------------------------------------------------------------


def test_sample_events_run_unchanged(api: Api) -> None:
    posted = api.invoke(load_event("http_post_job.json"))
    read = api.invoke(load_event("http_get_job.json"))
    invalid = api.invoke(load_event("http_post_job_invalid.json"))

    assert posted.status == 202
    assert read.status == 200
    assert read.body["jobId"] == posted.body["jobId"]
    assert invalid.status == 422
    assert {"jobId", "tenantId", "payload.commitMessage"} <= set(invalid.field_errors())
    assert api.stack.queue_depth() == 1


# ---- a resend with another payload: 409, never a silent drop -------------------------------------------------------


def _second_payload_outcome(api: Api, submit: Any, job_id: str) -> str:
    """Submit a job, then the same jobId with another payload; say what became of the second one."""
    first, second = job_body(job_id), job_body(job_id, payload={"patch": PATCH, "commitMessage": "other"})
    submit(first)
    refused = submit(second) is False
    delivered = [json.loads(record["body"])["payload"]["commitMessage"] for record in api.drain()]
    assert first["payload"]["commitMessage"] in delivered
    if refused:
        return "refused"
    if second["payload"]["commitMessage"] in delivered:
        return "delivered"
    return "silently dropped"


def test_naive_producer_silently_drops_a_resend_with_another_payload_while_the_api_refuses_it(api: Api) -> None:
    # Given the naive producer: a plain SendMessage whose every call "succeeds"
    sqs, queue_url = api.stack.services.sqs, api.stack.queue_url

    def naive(body: dict[str, Any]) -> bool:
        return bool(naive_enqueue(sqs, queue_url, body, "tenant-demo"))

    def product(body: dict[str, Any]) -> bool:
        return api.post(body).status == 202

    # Then on the same queue the naive producer loses the second job without telling anyone; the API says 409
    assert _second_payload_outcome(api, naive, "job-naive") == "silently dropped"
    assert _second_payload_outcome(api, product, "job-product") == "refused"
