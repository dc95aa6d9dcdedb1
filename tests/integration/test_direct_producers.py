"""Producers that send to the queue directly, with boto3's send_message: `payloadHash` may be left out (the worker
derives it) or be the hash of the payload exactly as sent; a hash of anything else is REJECTED on the first
delivery, saying so."""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

import pytest

from agent_jobs.guard import AcceptOutcome
from agent_jobs.keys import workspace_group_id
from agent_jobs.models import JobStatus, job_message, parse_queue_message
from agent_jobs.payloads import resolve_payload
from tests.conftest import Stack, make_job, register_workspace

PATCH = "--- a/f.txt\n+++ b/f.txt\n@@ -0,0 +1 @@\n+direct\n"


def direct_body(job_id: str, **fields: Any) -> dict[str, Any]:
    """A message as a direct producer writes it: no payloadHash, no field the job model fills in by default."""
    return {
        "jobId": job_id,
        "workspaceId": "ws-a",
        "tenantId": "tenant-1",
        "type": "apply_patch",
        "payload": {"patch": PATCH, "commitMessage": "direct"},
        **fields,
    }


def hash_as_sent(body: dict[str, Any]) -> str:
    """sha256 of the canonical document of the payload exactly as the producer sent it."""
    document = {"workspaceId": body["workspaceId"], "type": body["type"], "payload": body["payload"]}
    return hashlib.sha256(json.dumps(document, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def send(stack: Stack, body: dict[str, Any]) -> None:
    stack.services.sqs.send_message(
        QueueUrl=stack.queue_url,
        MessageBody=json.dumps(body),
        MessageGroupId=workspace_group_id(body["workspaceId"]),
        MessageDeduplicationId=hashlib.sha256(f"{body['jobId']}:{body['type']}".encode()).hexdigest(),
        MessageAttributes={"tenantId": {"DataType": "String", "StringValue": "tenant-1"}},
    )


@pytest.mark.parametrize(
    "hashed",
    [pytest.param(False, id="without-payloadHash"), pytest.param(True, id="hash-of-the-payload-as-sent")],
)
def test_a_direct_message_is_applied_with_the_canonical_hash(
    stack: Stack, make_worker: Any, workspaces: Any, lambda_context: Any, hashed: bool
) -> None:
    # Given a registered workspace and a message sent straight to the queue, as a direct producer writes it
    register_workspace(stack, "ws-a", "tenant-1")
    body = direct_body("direct-1")
    if hashed:
        body["payloadHash"] = hash_as_sent(body)

    # When the worker takes it
    send(stack, body)
    response = make_worker(stack).handle(stack.receive(), lambda_context())

    # Then it is applied once, and its record holds the hash the API would have recorded for the same job
    assert response == {"batchItemFailures": []}
    assert workspaces.commits("ws-a") == ["direct-1"]
    canonical = job_message(make_job("direct-1", payload=body["payload"]), "tenant-1").payload_hash
    job = stack.job("direct-1", "tenant-1")
    assert (job["status"], job["payloadHash"]) == (JobStatus.SUCCEEDED, canonical)
    # And the same job sent again through the API is the same job: nothing new is accepted
    again = stack.guard.record_accepted(job_message(make_job("direct-1", payload=body["payload"]), "tenant-1"))
    assert again.outcome is AcceptOutcome.EXISTING


def test_a_direct_message_with_a_wrong_hash_is_rejected_on_its_first_delivery(
    stack: Stack, make_worker: Any, workspaces: Any, lambda_context: Any
) -> None:
    register_workspace(stack, "ws-a", "tenant-1")
    send(stack, direct_body("direct-2", payloadHash="0" * 64))

    response = make_worker(stack).handle(stack.receive(), lambda_context())

    assert response == {"batchItemFailures": []}  # acknowledged: it can never run as sent
    job = stack.job("direct-2", "tenant-1")
    assert job["status"] == JobStatus.REJECTED
    assert "payloadHash does not match the payload" in job["error"]
    assert workspaces.commits("ws-a") == []


def test_parse_queue_message_derives_or_checks_the_hash() -> None:
    body = direct_body("p-1")
    canonical = job_message(make_job("p-1", payload=body["payload"]), "tenant-1").payload_hash

    assert parse_queue_message(json.dumps(body)).payload_hash == canonical
    assert parse_queue_message(json.dumps({**body, "payloadHash": hash_as_sent(body)})).payload_hash == canonical
    assert parse_queue_message(json.dumps({**body, "payloadHash": canonical})).payload_hash == canonical
    with pytest.raises(ValueError, match="payloadHash does not match"):
        parse_queue_message(json.dumps({**body, "payloadHash": "f" * 64}))
    with pytest.raises(ValueError, match="patch"):  # a payload that is no job is refused for what is wrong with it
        parse_queue_message(json.dumps({**body, "payload": {"commitMessage": "no patch"}}))


@pytest.mark.parametrize("group", ["ws#", "orders-7", "ws#not a workspace"])
def test_a_record_whose_group_names_no_workspace_is_recorded_and_acknowledged_without_a_halt(
    stack: Stack,
    make_worker: Any,
    workspaces: Any,
    lambda_context: Any,
    sqs_fifo_record: Any,
    caplog: pytest.LogCaptureFixture,
    group: str,
) -> None:
    # Given a valid job of a registered workspace, sent in a group that names no workspace
    register_workspace(stack, "ws-a", "tenant-1")
    message_id = stack.services.sqs.send_message(
        QueueUrl=stack.queue_url,
        MessageBody=json.dumps(direct_body("lost-1")),
        MessageGroupId=group,
        MessageDeduplicationId="lost-1",
    )["MessageId"]

    # When the worker takes it
    event = stack.receive()
    with caplog.at_level(logging.ERROR):
        response = make_worker(stack).handle(event, lambda_context())
    stack.settle(event, response)  # as Lambda's event source mapping deletes what the response does not list

    # Then it is acknowledged on its first delivery, recorded REJECTED under its message id with its group and why,
    # logged at ERROR, and nothing ran or halted (the body names ws-a: it is not trusted to say where it belongs)
    assert response == {"batchItemFailures": []}
    record = stack.item(f"msg#{message_id}")
    assert (record["status"], record["groupId"], "workspaceId" in record) == (JobStatus.REJECTED, group, False)
    assert "names no workspace" in record["error"]
    assert int(record["ttl"]) > 0  # collected like a finished job: it halts nothing an operator must decide
    assert stack.job("lost-1", "tenant-1") is None
    assert stack.workspace("ws-a")["state"] == "ACTIVE"
    assert workspaces.commits("ws-a") == []
    logged = [r for r in caplog.records if r.getMessage() == "message rejected: its group names no workspace"]
    assert [getattr(r, "messageId", None) for r in logged] == [message_id]
    assert stack.queue_depth() == 0

    # And a second delivery of the same message (its delete lost) writes the same record again, not an error
    again = sqs_fifo_record(group, direct_body("lost-1"), message_id=message_id, receive_count=2, tenant_id=None)
    assert make_worker(stack).handle({"Records": [again]}, lambda_context()) == {"batchItemFailures": []}
    assert stack.item(f"msg#{message_id}")["status"] == JobStatus.REJECTED


def test_a_parked_direct_job_too_large_for_a_record_keeps_its_payload_whole(
    stack: Stack, make_worker: Any, workspaces: Any, lambda_context: Any
) -> None:
    # Given a halted workspace and a valid 900 KB job of three-byte characters sent to it directly
    register_workspace(stack, "ws-a", "tenant-1")
    stack.guard.halt_workspace("ws-a", tenant_id="tenant-1", job_id="earlier", reason="halted for the test")
    lines = "".join(f"+{'€' * 100}\n" for _ in range(3000))
    payload = {"patch": f"--- a/f.txt\n+++ b/f.txt\n@@ -0,0 +1,3000 @@\n{lines}", "commitMessage": "large"}
    body = json.dumps(direct_body("large-1", payload=payload), ensure_ascii=False)
    assert len(body.encode()) > 900_000
    stack.services.sqs.send_message(
        QueueUrl=stack.queue_url, MessageBody=body, MessageGroupId="ws#ws-a", MessageDeduplicationId="large-1"
    )

    # When the worker parks it
    response = make_worker(stack).handle(stack.receive(), lambda_context())

    # Then its record holds a pointer to the whole payload, stored in the payload bucket under the job's hash, and
    # the pointer resolves to the payload as sent (what a resume will run)
    assert response == {"batchItemFailures": []}
    job = stack.job("large-1", "tenant-1")
    assert job["status"] == JobStatus.PARKED
    stored = parse_queue_message(job["body"])
    assert stored.payload is None
    assert stored.payload_ref is not None
    assert stored.payload_hash == job["payloadHash"]
    resolved = resolve_payload(stored, stack.services.payloads)
    assert resolved.payload is not None
    assert resolved.payload["patch"] == payload["patch"]
