"""Large payloads through the producer and the worker, against the queue, table and payload bucket of template.yaml
in moto (in-process, and moto's server over HTTP where the wire matters)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from botocore.exceptions import ClientError

from agent_jobs.models import JobMessage, JobStatus, WorkspaceState, payload_hash
from agent_jobs.payloads import payload_key
from agent_jobs.producer import JobConflictError, PayloadTooLargeError, enqueue_job
from tests.conftest import Stack, enqueue, make_job


def large_job(job_id: str, workspace_id: str = "ws-a", lines: int = 4000, marker: str = "x") -> Any:
    """An apply_patch job whose message is above the default inline limit (about 200 KB)."""
    body = "".join(f"+{marker} line {n:06d} of a large generated file, long enough to add up\n" for n in range(lines))
    patch = f"--- a/big.txt\n+++ b/big.txt\n@@ -0,0 +1,{lines} @@\n{body}"
    return make_job(job_id, workspace_id, payload={"patch": patch, "commitMessage": f"large change {job_id}"})


def queued_messages(stack: Stack) -> list[JobMessage]:
    records = stack.receive()["Records"]
    # put them back at once, so a later deliver() sees them
    stack.services.sqs.change_message_visibility_batch(
        QueueUrl=stack.queue_url,
        Entries=[
            {"Id": str(n), "ReceiptHandle": r["receiptHandle"], "VisibilityTimeout": 0} for n, r in enumerate(records)
        ],
    )
    return [JobMessage.model_validate_json(record["body"]) for record in records]


def objects(stack: Stack) -> list[str]:
    payloads = stack.services.payloads
    listed = payloads.client.list_objects_v2(Bucket=str(payloads.bucket)).get("Contents", [])
    return [obj["Key"] for obj in listed]


def deliver(stack: Stack, worker: Any, lambda_context: Any) -> list[str]:
    event = stack.receive()
    response = worker.handle(event, lambda_context())
    stack.settle(event, response)
    return [item["itemIdentifier"] for item in response["batchItemFailures"]]


# ---- producer ----------------------------------------------------------------------------------------------------


def test_producer_stores_a_large_payload_and_sends_a_pointer(any_stack):
    job = large_job("big-1")

    (result,) = enqueue(any_stack, job)

    # Then one object, one small pointer message, and a QUEUED record with the real payload's hash
    assert result.created
    (message,) = queued_messages(any_stack)
    assert message.payload is None
    assert message.payload_ref is not None
    assert message.payload_ref.key == payload_key(message)
    assert len(message.model_dump_json(by_alias=True)) < 1024
    assert objects(any_stack) == [message.payload_ref.key]
    record = any_stack.job("big-1")
    assert record["status"] == JobStatus.QUEUED
    assert record["payloadHash"] == message.payload_hash == payload_hash(job)


def test_producer_keeps_a_small_payload_inline(stack):
    enqueue(stack, make_job("small-1"))

    (message,) = queued_messages(stack)
    assert message.payload is not None
    assert message.payload_ref is None
    assert objects(stack) == []


def test_producer_repeat_of_a_large_job_is_idempotent_and_restores_a_lost_object(any_stack):
    # Given a large job accepted once, whose object was then lost
    job = large_job("big-1")
    (first,) = enqueue(any_stack, job)
    (key,) = objects(any_stack)
    any_stack.services.payloads.client.delete_object(Bucket=str(any_stack.services.payloads.bucket), Key=key)

    # When the client submits the same job again
    (again,) = enqueue(any_stack, job)

    # Then it is the same accepted job, no second message, and the object is back
    assert (again.created, again.message_id) == (False, first.message_id)
    assert any_stack.queue_depth() == 1
    assert objects(any_stack) == [key]


def test_producer_refuses_another_large_payload_under_an_accepted_job_id(any_stack):
    enqueue(any_stack, large_job("big-1"))

    with pytest.raises(JobConflictError):
        enqueue(any_stack, large_job("big-1", marker="y"))

    # The accepted job's object is untouched (another payload has another key); one message only
    assert any_stack.queue_depth() == 1
    assert payload_key(queued_messages(any_stack)[0]) in objects(any_stack)


def test_producer_without_a_bucket_refuses_a_message_too_large_for_the_queue(stack):
    with pytest.raises(PayloadTooLargeError, match="no payload bucket is configured"):
        enqueue_job(
            large_job("big-1"), "tenant-1", guard=stack.guard, sqs=stack.services.sqs, queue_url=stack.queue_url
        )

    assert stack.job("big-1") is None
    assert stack.queue_depth() == 0


# ---- worker ------------------------------------------------------------------------------------------------------


def test_worker_runs_a_job_whose_payload_is_a_pointer(any_stack, make_worker, workspaces, lambda_context):
    job = large_job("big-1")
    enqueue(any_stack, job)

    failed = deliver(any_stack, make_worker(any_stack), lambda_context)

    assert failed == []
    assert any_stack.job("big-1")["status"] == JobStatus.SUCCEEDED
    (commit,) = workspaces.inner.open("ws-a").history()
    assert (commit.job_id, commit.patch) == ("big-1", job.payload.patch)


@pytest.mark.parametrize("tamper", ["delete", "overwrite"])
def test_worker_never_runs_a_tampered_or_missing_payload_the_job_ends_dead(
    stack, make_worker, workspaces, lambda_context, tamper
):
    # Given a large job and a job behind it in the same workspace, and the large job's object lost or changed
    enqueue(stack, large_job("big-1"), make_job("after-1"))
    (key,) = objects(stack)
    client, bucket = stack.services.payloads.client, str(stack.services.payloads.bucket)
    if tamper == "delete":
        client.delete_object(Bucket=bucket, Key=key)
    else:
        client.put_object(Bucket=bucket, Key=key, Body=b'{"payload":{"patch":"rm -rf"}}')

    # When the worker runs them
    failed = deliver(stack, make_worker(stack), lambda_context)

    # Then the large job ran nothing and is DEAD (not REJECTED: it can be retried once its payload is stored again),
    # its reason says what to do; its workspace is halted and the next job parked behind it
    assert failed == []
    job = stack.job("big-1")
    assert job["status"] == JobStatus.DEAD
    assert "submit the same job again (same jobId and payload)" in job["error"]
    assert "resume the workspace with retry" in job["error"]
    workspace = stack.workspace("ws-a")
    assert (workspace["state"], workspace["haltingJobId"]) == (WorkspaceState.HALTED, "big-1")
    assert stack.job("after-1")["status"] == JobStatus.PARKED
    assert workspaces.commits("ws-a") == []
    assert stack.queue_depth() == 0


def test_worker_parks_a_pointer_on_a_halted_workspace_even_if_its_object_is_gone(
    stack, make_worker, workspaces, lambda_context
):
    # Given a halted workspace and a large job for it whose object is gone
    stack.guard.halt_workspace("ws-a", tenant_id="tenant-1", job_id="earlier", reason="operator")
    enqueue(stack, large_job("big-1"))
    (key,) = objects(stack)
    stack.services.payloads.client.delete_object(Bucket=str(stack.services.payloads.bucket), Key=key)

    failed = deliver(stack, make_worker(stack), lambda_context)

    # Then it waits in order behind the halt, with its pointer as the stored body, instead of ending DEAD out of order
    assert failed == []
    parked = stack.job("big-1")
    assert parked["status"] == JobStatus.PARKED
    assert json.loads(parked["body"])["payloadRef"]["key"] == key
    assert stack.workspace("ws-a")["haltingJobId"] == "earlier"


def test_worker_acknowledges_a_duplicate_of_a_succeeded_job_whose_object_expired(
    stack, make_worker, workspaces, lambda_context, sqs_fifo_record
):
    # Given a large job that succeeded, and its object expired since
    enqueue(stack, large_job("big-1"))
    event = stack.receive()
    (record,) = event["Records"]
    assert deliver_event(stack, make_worker(stack), event, lambda_context) == []
    (key,) = objects(stack)
    stack.services.payloads.client.delete_object(Bucket=str(stack.services.payloads.bucket), Key=key)

    # When the same message is delivered again
    duplicate = sqs_fifo_record("ws#ws-a", record["body"], message_id="dup-1")
    failed = make_worker(stack).handle({"Records": [duplicate]}, lambda_context())

    # Then it is a duplicate: acknowledged, the job stays SUCCEEDED and the workspace active
    assert _failed(failed) == []
    assert stack.job("big-1")["status"] == JobStatus.SUCCEEDED
    assert stack.workspace("ws-a")["state"] == "ACTIVE"
    assert workspaces.commits("ws-a") == ["big-1"]


def test_worker_retries_a_pointer_when_s3_is_unavailable(stack, make_worker, workspaces, lambda_context, monkeypatch):
    # Given S3 throttling every read
    enqueue(stack, large_job("big-1"))

    def throttled(**_: Any) -> Any:
        raise ClientError({"Error": {"Code": "SlowDown", "Message": "slow down"}}, "GetObject")

    monkeypatch.setattr(stack.services.payloads.client, "get_object", throttled)

    failed = deliver(stack, make_worker(stack), lambda_context)

    # Then the record comes back later; nothing is rejected, dead or halted
    assert len(failed) == 1
    assert stack.job("big-1")["status"] == JobStatus.QUEUED
    assert stack.workspace("ws-a")["state"] == "ACTIVE"
    assert stack.queue_depth() == 1


def test_worker_parks_a_pointer_s3_keeps_refusing_on_its_last_delivery(stack, make_worker, workspaces, lambda_context):
    # Given a large job S3 refuses to serve (throttling, or a policy that denies the worker), on its last delivery
    enqueue(stack, large_job("big-1"), make_job("after-1"))
    event = stack.receive()
    for record in event["Records"]:
        record["attributes"]["ApproximateReceiveCount"] = str(stack.settings.max_receive_count)

    def refused(**_: Any) -> Any:
        raise ClientError({"Error": {"Code": "AccessDenied", "Message": "denied"}}, "GetObject")

    stack.services.payloads.client.get_object = refused

    response = make_worker(stack).handle(event, lambda_context())

    # Then it is not left for the queue to dead-letter (the next job would run without it): parked, workspace halted
    assert _failed(response) == []
    assert stack.job("big-1")["status"] == JobStatus.PARKED
    assert json.loads(stack.job("big-1")["body"])["payloadRef"]
    assert stack.job("after-1")["status"] == JobStatus.PARKED
    assert stack.workspace("ws-a")["state"] == WorkspaceState.HALTED
    assert workspaces.commits("ws-a") == []


def deliver_event(stack: Stack, worker: Any, event: dict[str, Any], lambda_context: Any) -> list[str]:
    response = worker.handle(event, lambda_context())
    stack.settle(event, response)
    return _failed(response)


def _failed(response: dict[str, Any]) -> list[str]:
    return [item["itemIdentifier"] for item in response["batchItemFailures"]]
