"""Batch enqueue: `enqueue_jobs` in the layer and `POST /jobs:batch`, against the queue and table of template.yaml
in moto (in-process and moto's server over HTTP): one transaction and one SendMessageBatch for the batch, per-item
results for partial failure, the order of a group kept, and an idempotent repeat of the whole batch."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from agent_jobs.keys import workspace_key
from agent_jobs.models import JobStatus
from agent_jobs.producer import BatchItemResult, InvalidBatchError, enqueue_jobs
from tests.conftest import Stack, enqueue, make_job, register_workspace
from tests.integration.test_enqueue_api import Api, job_body, post_event

TENANT = "tenant-1"


def submit(stack: Stack, jobs: list[Any], *, sqs: Any = None, tenant_id: str = TENANT) -> list[BatchItemResult]:
    for workspace_id in dict.fromkeys(job.workspace_id for job in jobs):
        register_workspace(stack, workspace_id, tenant_id)
    return enqueue_jobs(
        jobs,
        tenant_id,
        guard=stack.guard,
        sqs=sqs or stack.services.sqs,
        queue_url=stack.queue_url,
        payloads=stack.services.payloads,
        inline_limit_bytes=stack.settings.inline_message_limit_bytes,
    )


class Calls:
    """Counts the AWS calls a client makes, by operation."""

    def __init__(self, *clients: Any) -> None:
        self.counts: Counter[str] = Counter()
        self._clients = clients

    def _count(self, model: Any, **_: Any) -> None:
        self.counts[model.name] += 1

    def __enter__(self) -> Calls:
        for client in self._clients:
            client.meta.events.register("before-call", self._count)
        return self

    def __exit__(self, *_: object) -> None:
        for client in self._clients:
            client.meta.events.unregister("before-call", self._count)


class RefusingOneEntry:
    """The queue client, except that SendMessageBatch fails the entry of one jobId (as SQS may fail an entry with
    an internal error) and sends the others."""

    def __init__(self, sqs: Any, job_id: str) -> None:
        self._sqs = sqs
        self._job_id = job_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sqs, name)

    def send_message_batch(self, *, QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        refused = [e for e in Entries if json.loads(e["MessageBody"])["jobId"] == self._job_id]
        kept = [e for e in Entries if e not in refused]
        response = dict(self._sqs.send_message_batch(QueueUrl=QueueUrl, Entries=kept)) if kept else {}
        response["Failed"] = [
            {"Id": e["Id"], "SenderFault": False, "Code": "InternalError", "Message": "try again"} for e in refused
        ]
        return response


def drain(stack: Stack) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    while batch := stack.receive()["Records"]:
        for record in batch:
            stack.services.sqs.delete_message(QueueUrl=stack.queue_url, ReceiptHandle=record["receiptHandle"])
        records.extend(batch)
    return records


def give_workspace_to(stack: Stack, workspace_id: str, tenant_id: str) -> None:
    stack.services.dynamodb.put_item(
        TableName=stack.table_name,
        Item={
            "pk": {"S": workspace_key(workspace_id)},
            "workspaceId": {"S": workspace_id},
            "tenantId": {"S": tenant_id},
        },
    )


# ---- enqueue_jobs --------------------------------------------------------------------------------------------------


def test_enqueue_jobs_accepts_ten_jobs_with_one_transaction_one_send_and_one_record_write(any_stack: Stack) -> None:
    jobs = [make_job(f"job-{n}", f"ws-{n % 3}") for n in range(10)]

    with Calls(any_stack.services.sqs, any_stack.services.dynamodb) as calls:
        results = submit(any_stack, jobs)

    assert [r.status_code for r in results] == [202] * 10
    assert all(r.created and r.status == JobStatus.QUEUED for r in results)
    assert calls.counts == {"SendMessageBatch": 1, "TransactWriteItems": 2}
    records = {json.loads(r["body"])["jobId"]: r for r in drain(any_stack)}
    assert set(records) == {f"job-{n}" for n in range(10)}
    for result in results:
        record = records[result.job_id]
        stored = any_stack.job(result.job_id)
        assert (stored["messageId"], stored["sequenceNumber"]) == (result.message_id, result.sequence_number)
        assert record["messageId"] == result.message_id
        assert record["attributes"]["MessageGroupId"] == f"ws#{stored['workspaceId']}"
        assert record["messageAttributes"]["tenantId"]["stringValue"] == TENANT


def test_enqueue_jobs_keeps_the_order_of_a_group_as_in_the_batch(any_stack: Stack) -> None:
    jobs = [make_job(f"job-{n}", "ws-a" if n % 2 else "ws-b") for n in range(10)]

    results = submit(any_stack, jobs)

    if any_stack.kind == "moto-server":  # in-process moto numbers messages at random; the emulator as SQS does
        for workspace in ("ws-a", "ws-b"):
            in_batch = [r for r, job in zip(results, jobs, strict=True) if job.workspace_id == workspace]
            sequence = [int(r.sequence_number or 0) for r in in_batch]
            assert sequence == sorted(sequence)
            assert len(set(sequence)) == len(sequence)
    received = [
        json.loads(r["body"])["jobId"] for r in drain(any_stack) if r["attributes"]["MessageGroupId"] == "ws#ws-a"
    ]
    assert received == [job.job_id for job in jobs if job.workspace_id == "ws-a"]


def test_enqueue_jobs_repeat_of_the_whole_batch_is_idempotent(any_stack: Stack) -> None:
    jobs = [make_job(f"job-{n}", f"ws-{n % 2}") for n in range(4)]
    first = submit(any_stack, jobs)

    again = submit(any_stack, jobs)

    assert [r.status_code for r in again] == [202] * 4
    assert [r.created for r in again] == [False] * 4
    assert [(r.message_id, r.sequence_number) for r in again] == [(r.message_id, r.sequence_number) for r in first]
    assert len(drain(any_stack)) == 4


def test_enqueue_jobs_partial_failure_gives_each_job_its_outcome(any_stack: Stack) -> None:
    # Given a job already accepted, another job holding a jobId, and a workspace of another tenant
    enqueue(any_stack, make_job("existing", "ws-a"), tenant_id=TENANT)
    enqueue(any_stack, make_job("taken", "ws-a"), tenant_id=TENANT)
    give_workspace_to(any_stack, "ws-theirs", "tenant-other")
    drain(any_stack)
    jobs = [
        make_job("new-1", "ws-a"),
        make_job("existing", "ws-a"),
        make_job("taken", "ws-a", payload={"patch": "--- a/g\n+++ b/g\n@@ -0,0 +1 @@\n+x\n", "commitMessage": "m"}),
        make_job("theirs", "ws-theirs"),
        make_job("new-2", "ws-b"),
    ]

    # When they come in one batch
    with Calls(any_stack.services.sqs, any_stack.services.dynamodb) as calls:
        results = submit(any_stack, jobs)

    # Then each job has its own answer, and only the new ones are sent
    assert [(r.job_id, r.status_code, r.created) for r in results] == [
        ("new-1", 202, True),
        ("existing", 202, False),
        ("taken", 409, False),
        ("theirs", 404, False),
        ("new-2", 202, True),
    ]
    assert "is not registered" in (results[3].message or "")  # as a workspace nobody registered: no oracle
    assert "different workspace, type or payload" in (results[2].message or "")
    assert any_stack.job("theirs") is None
    assert sorted(json.loads(r["body"])["jobId"] for r in drain(any_stack)) == ["new-1", "new-2"]
    # one cancelled transaction, one that records the new jobs, one send, one write of the message ids
    assert calls.counts == {"TransactWriteItems": 3, "SendMessageBatch": 1}


def test_enqueue_jobs_a_failed_entry_is_a_per_item_503_and_a_retry_sends_it_once(any_stack: Stack) -> None:
    jobs = [make_job(f"job-{n}", "ws-a") for n in range(3)]

    results = submit(any_stack, jobs, sqs=RefusingOneEntry(any_stack.services.sqs, "job-1"))

    assert [r.status_code for r in results] == [202, 503, 202]
    assert "send the same job again" in (results[1].message or "")
    stored = any_stack.job("job-1")
    assert stored["status"] == JobStatus.QUEUED
    assert "messageId" not in stored  # recorded, not sent
    # When the client sends the batch again, the refused job is sent (once) and the others are answered as repeats
    again = submit(any_stack, jobs)
    assert [(r.status_code, r.created) for r in again] == [(202, False), (202, False), (202, False)]
    assert again[1].message_id is not None
    received = [json.loads(r["body"])["jobId"] for r in drain(any_stack)]
    assert sorted(received) == ["job-0", "job-1", "job-2"]
    assert any_stack.job("job-1")["messageId"] == again[1].message_id


def large_jobs(count: int) -> list[Any]:
    """Jobs of one workspace whose messages (about 240 KB each) fill a SendMessageBatch call at the fourth."""
    return [
        make_job(f"big-{n}", "ws-a", payload={"patch": "x" * 240_000, "commitMessage": f"m{n}"}) for n in range(count)
    ]


def submit_inline(stack: Stack, jobs: list[Any], *, sqs: Any = None) -> list[BatchItemResult]:
    for workspace_id in dict.fromkeys(job.workspace_id for job in jobs):
        register_workspace(stack, workspace_id, TENANT)
    return enqueue_jobs(
        jobs,
        TENANT,
        guard=stack.guard,
        sqs=sqs or stack.services.sqs,
        queue_url=stack.queue_url,
        inline_limit_bytes=262_144,
    )


def test_enqueue_jobs_above_one_call_of_payload_sends_in_calls_that_keep_the_order(any_stack: Stack) -> None:
    jobs = large_jobs(6)

    with Calls(any_stack.services.sqs) as calls:
        results = submit_inline(any_stack, jobs)

    assert [r.status_code for r in results] == [202] * 6
    assert calls.counts == {"SendMessageBatch": 2}
    received = [json.loads(r["body"])["jobId"] for r in drain(any_stack)]
    assert received == [job.job_id for job in jobs]


def test_enqueue_jobs_after_a_refused_entry_sends_no_later_call_of_its_workspace(any_stack: Stack) -> None:
    # Given a batch that takes two calls, and a queue that fails the second job's entry in the first call
    jobs = large_jobs(6)

    results = submit_inline(any_stack, jobs, sqs=RefusingOneEntry(any_stack.services.sqs, "big-1"))

    # Then the jobs of the same call were taken, those of the later call wait (their record kept, nothing sent)
    assert [r.status_code for r in results] == [202, 503, 202, 202, 503, 503]
    assert "a job before it in its workspace was not taken" in (results[4].message or "")
    assert [json.loads(r["body"])["jobId"] for r in drain(any_stack)] == ["big-0", "big-2", "big-3"]


def test_enqueue_jobs_refuses_a_batch_naming_a_job_id_twice(any_stack: Stack) -> None:
    with pytest.raises(InvalidBatchError, match="appears twice"):
        submit(any_stack, [make_job("job-1", "ws-a"), make_job("job-1", "ws-b")])
    with pytest.raises(InvalidBatchError, match="1 to 10"):
        submit(any_stack, [make_job(f"job-{n}") for n in range(11)])
    assert any_stack.job("job-1") is None


def test_enqueue_jobs_a_too_large_job_without_a_payload_store_is_a_per_item_413(stack: Stack) -> None:
    jobs = [make_job("small", "ws-a"), make_job("big", "ws-a", payload={"patch": "x" * 5000, "commitMessage": "m"})]
    register_workspace(stack, "ws-a", TENANT)

    results = enqueue_jobs(
        jobs, TENANT, guard=stack.guard, sqs=stack.services.sqs, queue_url=stack.queue_url, inline_limit_bytes=2048
    )

    assert [r.status_code for r in results] == [202, 413]
    assert stack.job("big") is None


# ---- POST /jobs:batch ----------------------------------------------------------------------------------------------


def batch_event(body: Any, **kwargs: Any) -> dict[str, Any]:
    event = post_event(body, **kwargs)
    event["rawPath"] = event["requestContext"]["http"]["path"] = "/jobs:batch"
    event["routeKey"] = "POST /jobs:batch"
    return event


def test_submit_jobs_answers_each_job_in_request_order(api: Api) -> None:
    give_workspace_to(api.stack, "ws-theirs", "tenant-other")
    body = {"jobs": [job_body("job-1", "ws-a"), job_body("job-2", "ws-theirs"), job_body("job-3", "ws-a")]}

    response = api.invoke(batch_event(body))

    assert response.status == 200
    results = response.body["results"]
    assert [(r["jobId"], r["statusCode"]) for r in results] == [("job-1", 202), ("job-2", 404), ("job-3", 202)]
    assert set(results[0]) == {"jobId", "statusCode", "status", "messageId", "sequenceNumber", "created", "message"}
    assert results[0]["created"] is True
    assert results[0]["message"] is None
    assert api.stack.job("job-1")["tenantId"] == "tenant-demo"

    repeat = api.invoke(batch_event(body))
    assert [(r["statusCode"], r["created"]) for r in repeat.body["results"]] == [
        (202, False),
        (404, False),
        (202, False),
    ]


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"jobs": []}, 422, "jobs"),
        ({"jobs": [job_body(f"j-{n}") for n in range(11)]}, 422, "jobs"),
        ({"jobs": [job_body("j-1"), job_body("j-1", "ws-b")]}, 422, "jobs.1.jobId"),
        ({"jobs": [job_body("j-1"), job_body("j-2", type="deploy")]}, 422, "jobs.1.type"),
        ({"jobs": [job_body("j-1"), {**job_body("j-2"), "tenantId": "x"}]}, 422, "jobs.1.tenantId"),
        ({"jobs": [job_body("j-1"), "not a job"]}, 422, "jobs.1"),
        ({"jobs": [job_body("j-1")], "extra": 1}, 422, "extra"),
        ({"job": job_body("j-1")}, 422, "jobs"),
    ],
)
def test_submit_jobs_refuses_a_malformed_batch_naming_the_item_and_field(
    api: Api, body: dict[str, Any], status: int, field: str
) -> None:
    response = api.invoke(batch_event(body))

    assert response.status == status
    assert field in response.field_errors(), response.body
    assert "nothing was accepted" in response.body["message"]
    assert api.items() == []


def test_a_batch_job_naming_a_tenant_is_told_where_the_tenant_comes_from(api: Api) -> None:
    response = api.invoke(batch_event({"jobs": [job_body("j-1"), {**job_body("j-2"), "tenantId": "x"}]}))

    # Then it is worded as for a single job: the tenant comes from the credentials
    assert response.status == 422
    assert "from your credentials" in response.field_errors()["jobs.1.tenantId"]
    assert api.items() == []


def test_submit_jobs_refuses_a_body_that_is_not_a_batch(api: Api) -> None:
    assert api.invoke(batch_event(None, raw="[1, 2]")).status == 400
    assert api.invoke(batch_event(None, raw="{")).status == 400
    assert api.invoke(batch_event({"jobs": [job_body()]}, content_type="text/plain")).status == 415
    assert api.items() == []
