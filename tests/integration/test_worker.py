"""The worker against moto (in-process and moto's server over HTTP), each failure mode of the naive pattern shown
twice: the product keeps the guarantee, and the naive pattern (tests/naive) breaks it in the same scenario."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import pytest

from agent_jobs.guard import JobGuard
from agent_jobs.keys import job_key
from agent_jobs.models import JobStatus, WorkspaceState
from job_worker.jobs.errors import RetryableJobError
from tests.conftest import ManualClock, Stack, count_dynamodb_calls, enqueue, make_job, make_message
from tests.naive.worker import NaiveWorker

READ_OPERATIONS = {"GetItem", "BatchGetItem", "Query", "Scan", "TransactGetItems"}


class SimulatedCrashError(BaseException):
    """The process dies here: like a killed Lambda, nothing after this point runs and nothing is caught."""


def deliver(stack: Stack, worker: Any, lambda_context: Any, batch_size: int = 10) -> dict[str, Any]:
    """One poll of Lambda's event source: receive, invoke, delete what the function did not report failed."""
    event = stack.receive(batch_size)
    response = worker.handle(event, lambda_context())
    stack.settle(event, response)
    return {"event": event, "response": response, "failed": _failed(response)}


def _failed(response: dict[str, Any]) -> list[str]:
    return [item["itemIdentifier"] for item in response["batchItemFailures"]]


# ---- happy path and cost -----------------------------------------------------------------------------------------


def test_worker_happy_path_costs_two_writes_one_read_and_one_index_query_per_job(
    any_stack, make_worker, workspaces, lambda_context
):
    # Given five jobs over two workspaces on the queue
    jobs = [make_job(f"job-{i}", workspace_id="ws-a" if i % 2 else "ws-b") for i in range(5)]
    enqueue(any_stack, *jobs)
    calls = count_dynamodb_calls(any_stack)

    # When the worker runs the batch
    result = deliver(any_stack, make_worker(any_stack), lambda_context)

    # Then every job succeeded with exactly one claim (a plain conditional write, no transaction), one consistent
    # read of its workspace (halted?), one query of the pending index (for jobs ahead of it that left the queue
    # unsettled: none) and one complete; and, once for the batch's one tenant, the template's tenant share checked
    # (a query of the running index, and a read of the tenant's own share, kept a minute)
    assert result["failed"] == []
    assert len(result["event"]["Records"]) == 5
    assert calls == Counter({"UpdateItem": 10, "GetItem": 5 + 1, "Query": 5 + 1})
    for job in jobs:
        assert any_stack.job(job.job_id)["status"] == JobStatus.SUCCEEDED
    assert workspaces.commits("ws-a") == ["job-1", "job-3"]
    assert workspaces.commits("ws-b") == ["job-0", "job-2", "job-4"]
    assert any_stack.queue_depth() == 0


def test_worker_duplicate_delivery_after_success_is_one_failed_write_and_no_effect(
    any_stack, make_worker, workspaces, lambda_context
):
    # Given a job that already succeeded
    enqueue(any_stack, make_job("dup-1"))
    event = any_stack.receive()
    worker = make_worker(any_stack)
    assert _failed(worker.handle(event, lambda_context())) == []
    calls = count_dynamodb_calls(any_stack)

    # When the same message is delivered again (the delete was lost, or the visibility timeout expired)
    response = worker.handle(event, lambda_context())

    # Then it is acknowledged without effect, for one (failed) conditional write and no read of the job; the batch's
    # tenant share is checked before any claim (a deferral writes nothing), one query of the running index per tenant
    assert _failed(response) == []
    assert calls == Counter({"UpdateItem": 1, "Query": 1})
    assert workspaces.commits("ws-a") == ["dup-1"]
    assert any_stack.job("dup-1")["attempt"] == 1


def test_worker_duplicate_delivery_without_a_tenant_share_is_one_failed_write(
    stack, make_worker, workspaces, lambda_context
):
    from agent_jobs.tenant_shares import CACHE_SECONDS
    from tests.integration.test_tenant_shares import with_share

    # Given a stack without tenant shares (WorkerTenantShare 0), and a job that already succeeded
    unshared = with_share(stack, 0, cache_seconds=CACHE_SECONDS)
    enqueue(unshared, make_job("dup-2"))
    event = unshared.receive()
    worker = make_worker(unshared)
    assert _failed(worker.handle(event, lambda_context())) == []
    calls = count_dynamodb_calls(unshared)

    # When it is delivered again, then one failed conditional write is all it costs (the tenant's own share, read
    # with the first delivery, is kept a minute)
    assert _failed(worker.handle(event, lambda_context())) == []
    assert calls == Counter({"UpdateItem": 1})


def test_naive_duplicate_delivery_reads_before_it_writes(stack, workspaces, lambda_context):
    enqueue(stack, make_job("dup-1"))
    event = stack.receive()
    naive = NaiveWorker(stack.services.dynamodb, stack.table_name, workspaces)
    naive.handle(event)
    calls = count_dynamodb_calls(stack)
    naive.handle(event)
    assert READ_OPERATIONS & set(calls)  # the naive check-then-act pays a read on every delivery


def test_worker_duplicate_is_still_detected_after_its_ttl_passed(stack, make_worker, workspaces, lambda_context):
    # Given a succeeded job whose ttl lies in the past (DynamoDB deletes such items only "within a few days")
    enqueue(stack, make_job("old-1"))
    event = stack.receive()
    worker = make_worker(stack)
    worker.handle(event, lambda_context())
    stack.services.dynamodb.update_item(
        TableName=stack.table_name,
        Key={"pk": {"S": job_key("tenant-1", "old-1")}},
        UpdateExpression="SET #ttl = :past",
        ExpressionAttributeNames={"#ttl": "ttl"},
        ExpressionAttributeValues={":past": {"N": "1"}},
    )
    # When it is delivered again, Then the guard does not read ttl as a lease or a verdict: still a duplicate
    assert _failed(worker.handle(event, lambda_context())) == []
    assert workspaces.commits("ws-a") == ["old-1"]


# ---- two deliveries of one job -----------------------------------------------------------------------------------


def test_worker_concurrent_second_delivery_does_not_apply_while_first_runs(
    any_stack, make_worker, workspaces, hooks, lambda_context
):
    # Given a job whose first delivery is still running when the queue hands it out again
    enqueue(any_stack, make_job("twice-1"))
    event = any_stack.receive()
    first, second = make_worker(any_stack), make_worker(any_stack)
    second_response: dict[str, Any] = {}

    def second_delivery_meanwhile() -> None:
        hooks.before_commit.pop("twice-1")
        second_response.update(second.handle(event, lambda_context()))

    hooks.before_commit["twice-1"] = second_delivery_meanwhile

    # When the first delivery reaches its side effect, the second runs in full
    first_response = first.handle(event, lambda_context())

    # Then the second saw a live lease and reported the record failed (never acknowledged), and the job applied once
    assert _failed(second_response) == [event["Records"][0]["messageId"]]
    assert _failed(first_response) == []
    assert workspaces.commits("ws-a") == ["twice-1"]
    assert any_stack.job("twice-1")["status"] == JobStatus.SUCCEEDED


def test_naive_concurrent_second_delivery_applies_twice(stack, workspaces, hooks):
    enqueue(stack, make_job("twice-1"))
    event = stack.receive()
    naive = NaiveWorker(stack.services.dynamodb, stack.table_name, workspaces)

    def second_delivery_meanwhile() -> None:
        hooks.before_commit.pop("twice-1")
        naive.handle(event)

    hooks.before_commit["twice-1"] = second_delivery_meanwhile
    naive.handle(event)
    assert workspaces.commits("ws-a") == ["twice-1", "twice-1"]  # IN_FLIGHT <> SUCCEEDED: both claimed


def test_worker_lease_takeover_applies_once_and_the_stale_worker_cannot_overwrite(
    any_stack, make_worker, workspaces, hooks, lambda_context
):
    # Given a worker whose lease expires while it is stalled just before its side effect
    clock = ManualClock()
    guard = JobGuard(any_stack.services.dynamodb, any_stack.table_name, max_attempts=3, clock=clock)
    enqueue(any_stack, make_job("stall-1"))
    event = any_stack.receive()
    stale, fresh = make_worker(any_stack, guard), make_worker(any_stack, guard)
    takeover: dict[str, Any] = {}

    def stall_past_lease_while_another_takes_over() -> None:
        hooks.before_commit.pop("stall-1")
        clock.advance(121)  # past the lease (remaining time of a 120 s invocation)
        takeover.update(fresh.handle(event, lambda_context()))

    hooks.before_commit["stall-1"] = stall_past_lease_while_another_takes_over

    # When the stale worker wakes up and carries on
    stale_response = stale.handle(event, lambda_context())

    # Then the new owner applied and completed the job; the stale worker found the commit, lost its complete,
    # and reported the record for redelivery instead of acknowledging an outcome it does not own
    assert _failed(takeover) == []
    assert _failed(stale_response) == [event["Records"][0]["messageId"]]
    assert workspaces.commits("ws-a") == ["stall-1"]
    job = any_stack.job("stall-1")
    assert job["status"] == JobStatus.SUCCEEDED
    assert job["attempt"] == 2
    assert job["result"]["alreadyApplied"] is False  # the owner's result, not the stale worker's


def test_worker_crash_after_side_effect_does_not_reapply(
    any_stack, make_worker, workspaces, lambda_context, monkeypatch
):
    # Given a worker that dies after committing but before recording SUCCEEDED
    clock = ManualClock()
    guard = JobGuard(any_stack.services.dynamodb, any_stack.table_name, max_attempts=3, clock=clock)
    enqueue(any_stack, make_job("crash-1"))
    event = any_stack.receive()
    crashing = make_worker(any_stack, guard)

    def crash(*_: Any, **__: Any) -> bool:
        raise SimulatedCrashError

    monkeypatch.setattr(guard, "complete", crash)
    with pytest.raises(SimulatedCrashError):
        crashing.handle(event, lambda_context())
    assert workspaces.commits("ws-a") == ["crash-1"]

    # When the message comes back after the lease expired
    clock.advance(121)
    retry_guard = JobGuard(any_stack.services.dynamodb, any_stack.table_name, max_attempts=3, clock=clock)
    response = make_worker(any_stack, retry_guard).handle(event, lambda_context())

    # Then the workspace check finds the job's own commit: success, no second commit
    assert _failed(response) == []
    assert workspaces.commits("ws-a") == ["crash-1"]
    job = any_stack.job("crash-1")
    assert job["status"] == JobStatus.SUCCEEDED
    assert job["result"]["alreadyApplied"] is True


def test_naive_crash_after_side_effect_reapplies(stack, workspaces, monkeypatch):
    enqueue(stack, make_job("crash-1"))
    event = stack.receive()
    naive = NaiveWorker(stack.services.dynamodb, stack.table_name, workspaces)

    def crash(_: Any) -> None:
        raise SimulatedCrashError

    monkeypatch.setattr(naive, "complete", crash)
    with pytest.raises(SimulatedCrashError):
        naive.handle(event)
    retry = NaiveWorker(stack.services.dynamodb, stack.table_name, workspaces)
    retry.handle(event)
    assert workspaces.commits("ws-a") == ["crash-1", "crash-1"]


# ---- order within a group, isolation between groups -------------------------------------------------------------


def _fail_once(hooks: Any, job_id: str) -> None:
    def fail() -> None:
        hooks.before_commit.pop(job_id)
        raise RetryableJobError("remote unavailable")

    hooks.before_commit[job_id] = fail


def test_worker_failure_stops_its_group_but_not_other_groups(any_stack, make_worker, workspaces, hooks, lambda_context):
    # Given a batch A1 A2 A3 B1 B2 in which A2 fails once
    jobs = [make_job("a1", "ws-a"), make_job("a2", "ws-a"), make_job("a3", "ws-a")]
    jobs += [make_job("b1", "ws-b"), make_job("b2", "ws-b")]
    enqueue(any_stack, *jobs)
    _fail_once(hooks, "a2")
    worker = make_worker(any_stack)

    # When the worker runs it
    first = deliver(any_stack, worker, lambda_context)

    # Then A stopped at A2 (A3 not started, both reported), B went on
    ids = {r["messageId"]: json.loads(r["body"])["jobId"] for r in first["event"]["Records"]}
    assert [ids[m] for m in first["failed"]] == ["a2", "a3"]
    assert workspaces.commits("ws-a") == ["a1"]
    assert workspaces.commits("ws-b") == ["b1", "b2"]
    assert any_stack.job("a3")["status"] == JobStatus.QUEUED

    # And the retry (visibility shortened by the worker, not 12 minutes) applies A2 then A3, in order
    second = deliver(any_stack, worker, lambda_context)
    assert second["failed"] == []
    assert workspaces.commits("ws-a") == ["a1", "a2", "a3"]
    assert any_stack.job("a2")["attempt"] == 2


def test_naive_failure_lets_later_records_of_the_group_apply(stack, workspaces, hooks):
    enqueue(stack, make_job("a1", "ws-a"), make_job("a2", "ws-a"), make_job("a3", "ws-a"))
    _fail_once(hooks, "a2")
    NaiveWorker(stack.services.dynamodb, stack.table_name, workspaces).handle(stack.receive())
    assert workspaces.commits("ws-a") == ["a1", "a3"]  # A3 landed on a tree without A2


def test_worker_shortens_visibility_of_failed_group_and_naive_does_not(
    stack, make_worker, workspaces, hooks, lambda_context
):
    # Given a failing first job followed by another of its group
    enqueue(stack, make_job("v1"), make_job("v2"))
    _fail_once(hooks, "v1")
    deliver(stack, make_worker(stack), lambda_context)
    # Then both are visible again at once (backoff base 0 in these settings), not after the queue's 720 s
    again = stack.receive()
    assert [json.loads(r["body"])["jobId"] for r in again["Records"]] == ["v1", "v2"]

    # While with the naive worker the failed records stay invisible for the queue's whole visibility timeout
    stack.services.sqs.change_message_visibility_batch(
        QueueUrl=stack.queue_url,
        Entries=[
            {"Id": str(i), "ReceiptHandle": r["receiptHandle"], "VisibilityTimeout": 0}
            for i, r in enumerate(again["Records"])
        ],
    )
    _fail_once(hooks, "v1")
    event = stack.receive()
    response = NaiveWorker(stack.services.dynamodb, stack.table_name, workspaces).handle(event)
    stack.settle(event, response)
    assert stack.receive()["Records"] == []


def test_worker_stops_starting_jobs_near_the_deadline(any_stack, make_worker, workspaces, lambda_context):
    # Given an invocation with less time left than the safety margin
    enqueue(any_stack, make_job("late-1", "ws-a"), make_job("late-2", "ws-b"))
    event = any_stack.receive()

    # When the worker gets the batch
    response = make_worker(any_stack).handle(event, lambda_context(timeout_seconds=1))

    # Then it starts nothing and reports every record, which come back at once
    assert len(_failed(response)) == 2
    assert workspaces.commits("ws-a") == []
    assert any_stack.job("late-1")["status"] == JobStatus.QUEUED
    any_stack.settle(event, response)
    assert len(any_stack.receive()["Records"]) == 2


# ---- poison, exhaustion, halt and park ---------------------------------------------------------------------------


def test_worker_rejects_poison_body_and_halts_its_workspace(
    any_stack, make_worker, workspaces, lambda_context, sqs_fifo_record
):
    # Given a batch with an unparseable body in ws-p, a valid job behind it in ws-p, and a job in ws-q
    good_p = make_job("p2", "ws-p")
    good_q = make_job("q1", "ws-q")
    enqueue(any_stack, good_p, good_q)
    real = any_stack.receive()["Records"]
    poison = sqs_fifo_record("ws#ws-p", "{not json", message_id="poison-1", sequence_number="1")
    event = {"Records": [poison, *real]}

    # When the worker runs it
    response = make_worker(any_stack).handle(event, lambda_context())

    # Then nothing is left to retry forever: the poison is REJECTED and acknowledged, ws-p HALTED, p2 PARKED,
    # ws-q unaffected
    assert _failed(response) == []
    rejected = any_stack.item("msg#poison-1")
    assert rejected["status"] == JobStatus.REJECTED
    assert "invalid job message" in rejected["error"]
    assert rejected["body"] == "{not json"
    workspace = any_stack.workspace("ws-p")
    assert workspace["state"] == WorkspaceState.HALTED
    assert workspace["haltingJobId"] == "msg#poison-1"
    parked = any_stack.job("p2")
    assert parked["status"] == JobStatus.PARKED
    assert parked["sequenceNumber"]
    assert json.loads(parked["body"])["jobId"] == "p2"
    assert "ttl" not in parked  # a parked job waits for an operator; TTL must not collect it
    assert workspaces.commits("ws-p") == []
    assert workspaces.commits("ws-q") == ["q1"]


def test_worker_rejects_a_valid_json_job_whose_payload_is_invalid(stack, make_worker, lambda_context, sqs_fifo_record):
    body = {
        "jobId": "bad-1",
        "workspaceId": "ws-p",
        "tenantId": "t",
        "type": "apply_patch",
        "payload": {},
        "payloadHash": "0" * 64,
    }
    response = make_worker(stack).handle({"Records": [sqs_fifo_record("ws#ws-p", body)]}, lambda_context())
    assert _failed(response) == []
    job = stack.job("bad-1")
    assert job["status"] == JobStatus.REJECTED
    assert "payload.patch" in job["error"]
    assert stack.workspace("ws-p")["state"] == WorkspaceState.HALTED


def test_naive_poison_body_fails_forever_and_the_group_moves_on(stack, workspaces, sqs_fifo_record):
    enqueue(stack, make_job("p2", "ws-p"))
    event = {"Records": [sqs_fifo_record("ws#ws-p", "{not json"), *stack.receive()["Records"]]}
    response = NaiveWorker(stack.services.dynamodb, stack.table_name, workspaces).handle(event)
    assert len(response["batchItemFailures"]) == 1  # retried until the DLQ takes it...
    assert workspaces.commits("ws-p") == ["p2"]  # ...while the job behind it already applied


def _always_fail(hooks: Any, job_id: str) -> None:
    def fail() -> None:
        raise RetryableJobError("remote unavailable")

    hooks.before_commit[job_id] = fail


def test_worker_exhausted_attempts_make_job_dead_halt_workspace_and_park_later_jobs(
    any_stack, make_worker, workspaces, hooks, lambda_context
):
    # Given a job in ws-a that always fails, a job behind it, and a job in ws-b
    enqueue(any_stack, make_job("d1", "ws-a"), make_job("d2", "ws-a"), make_job("e1", "ws-b"))
    _always_fail(hooks, "d1")
    worker = make_worker(any_stack)

    # When the queue keeps delivering (each failure shortens visibility, so retries come at once)
    for _ in range(any_stack.settings.max_attempts + 1):
        deliver(any_stack, worker, lambda_context)

    # Then d1 is DEAD after max attempts, ws-a HALTED by it, d2 PARKED (not applied), ws-b done
    dead = any_stack.job("d1")
    assert dead["status"] == JobStatus.DEAD
    assert dead["attempt"] == any_stack.settings.max_attempts
    assert "remote unavailable" in dead["error"]
    assert "ttl" not in dead
    workspace = any_stack.workspace("ws-a")
    assert workspace["state"] == WorkspaceState.HALTED
    assert workspace["haltingJobId"] == "d1"
    assert any_stack.job("d2")["status"] == JobStatus.PARKED
    assert workspaces.commits("ws-a") == []
    assert workspaces.commits("ws-b") == ["e1"]
    assert any_stack.queue_depth() == 0
    assert any_stack.queue_depth(any_stack.dlq_url) == 0  # nothing left for the queue's backstop


def lose_claims(stack: Stack, job_id: str, workspace_id: str, times: int) -> None:
    """What invocations that crashed or timed out with the job in flight leave: claims whose lease ran out."""
    message = make_message(job_id, workspace_id)
    for _ in range(times):
        assert stack.services.guard.claim(message, message_id="m-lost", sequence_number=None, remaining_ms=0).claimed
        time.sleep(0.002)  # past the lease (it ended when the claim was made)


def test_worker_runs_a_job_that_went_down_with_more_invocations_than_max_attempts(
    any_stack, make_worker, workspaces, lambda_context
):
    # Given a job in flight in max_attempts + 1 invocations that crashed or timed out (with groups running at once, an
    # invocation takes every job it holds down with it, not only the one at fault)
    enqueue(any_stack, make_job("c1", "ws-a"))
    lose_claims(any_stack, "c1", "ws-a", any_stack.settings.max_attempts + 1)

    # When its message is delivered to the worker (whose guard is built from Settings, as in Lambda)
    result = deliver(any_stack, make_worker(any_stack), lambda_context)

    # Then it runs and applies once: lost claims do not use up its failed attempts
    assert result["failed"] == []
    assert any_stack.job("c1")["status"] == JobStatus.SUCCEEDED
    assert workspaces.commits("ws-a") == ["c1"]


def test_worker_does_not_rerun_a_lost_claim_on_one_of_the_last_deliveries(
    any_stack, make_worker, workspaces, lambda_context
):
    # Given a job whose last claim never came back, and a job behind it
    enqueue(any_stack, make_job("c1", "ws-a"), make_job("c2", "ws-a"))
    lose_claims(any_stack, "c1", "ws-a", 1)

    # When its message comes back on the first of its last deliveries
    event = any_stack.receive()
    first_of_last = str(any_stack.settings.max_receive_count - 2)
    for record in event["Records"]:
        record["attributes"]["ApproximateReceiveCount"] = first_of_last
    any_stack.settle(event, make_worker(any_stack).handle(event, lambda_context()))

    # Then it is not run again (one more crash and the queue would dead-letter it and hand out c2): DEAD, ws-a halted
    # by it, c2 parked, nothing applied and nothing left for the queue's redrive
    job = any_stack.job("c1")
    assert job["status"] == JobStatus.DEAD
    assert "near its delivery limit" in job["error"]
    assert any_stack.workspace("ws-a")["haltingJobId"] == "c1"
    assert any_stack.job("c2")["status"] == JobStatus.PARKED
    assert workspaces.commits("ws-a") == []
    assert any_stack.queue_depth() == 0
    assert any_stack.queue_depth(any_stack.dlq_url) == 0


def test_naive_exhausted_job_dead_letters_and_the_next_job_applies(stack, workspaces, hooks):
    # The naive worker relies on the queue's redrive: after maxReceiveCount the job goes to the DLQ and the queue
    # hands out the next job of the group, which applies on a workspace that misses d1.
    enqueue(stack, make_job("d1", "ws-a"), make_job("d2", "ws-a"))
    _always_fail(hooks, "d1")
    naive = NaiveWorker(stack.services.dynamodb, stack.table_name, workspaces)
    for _ in range(stack.settings.max_receive_count + 2):
        event = stack.receive()
        response = naive.handle(event)
        for record in event["Records"]:
            if record["messageId"] in _failed(response):
                stack.services.sqs.change_message_visibility(
                    QueueUrl=stack.queue_url, ReceiptHandle=record["receiptHandle"], VisibilityTimeout=0
                )
        stack.settle(event, response)
    assert workspaces.commits("ws-a") == ["d2"]
    assert stack.queue_depth(stack.dlq_url) == 1


def test_worker_parks_a_record_on_its_last_delivery_instead_of_letting_it_dead_letter(
    stack, make_worker, workspaces, hooks, lambda_context, sqs_fifo_record
):
    # Given a job behind a failing one, delivered for the last time before the queue's redrive (its receive count
    # was raised by the batches that skipped it)
    enqueue(stack, make_job("f1", "ws-a"), make_job("f2", "ws-a"))
    records = stack.receive()["Records"]
    limit = stack.settings.max_receive_count
    for record in records:
        record["attributes"]["ApproximateReceiveCount"] = str(limit)
    _always_fail(hooks, "f1")

    # When the batch fails at f1
    response = make_worker(stack).handle({"Records": records}, lambda_context())

    # Then neither is left for the queue to dead-letter: both are PARKED (with their order) and ws-a is HALTED
    assert _failed(response) == []
    assert stack.job("f1")["status"] == JobStatus.PARKED
    assert stack.job("f2")["status"] == JobStatus.PARKED
    # each keeps the queue's SequenceNumber, the order a resume runs parked jobs in
    for job_id, record in zip(("f1", "f2"), records, strict=True):
        assert stack.job(job_id)["sequenceNumber"] == record["attributes"]["SequenceNumber"]
    assert stack.workspace("ws-a")["state"] == WorkspaceState.HALTED
    assert workspaces.commits("ws-a") == []


def test_worker_acknowledges_a_message_whose_payload_conflicts_with_the_accepted_job(
    stack, make_worker, workspaces, lambda_context, sqs_fifo_record
):
    # Given an accepted job, and a stray message reusing its jobId with another payload
    enqueue(stack, make_job("c1"))

    other = make_message("c1", payload={"patch": "--- a/x\n+++ b/x\n@@ -0,0 +1 @@\n+other\n", "commitMessage": "x"})
    record = sqs_fifo_record("ws#ws-a", other.model_dump_json(by_alias=True))
    # When it is delivered, Then it has no effect and is not retried
    assert _failed(make_worker(stack).handle({"Records": [record]}, lambda_context())) == []
    assert workspaces.commits("ws-a") == []
    assert stack.job("c1")["status"] == JobStatus.QUEUED


# ---- records that must never fail a whole batch or slip past a halt -----------------------------------------------


def test_worker_rejects_a_body_nested_too_deep_to_parse(stack, make_worker, lambda_context, sqs_fifo_record):
    body = '{"jobId": "deep-1", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    response = make_worker(stack).handle({"Records": [sqs_fifo_record("ws#ws-n", body)]}, lambda_context())
    assert _failed(response) == []
    assert stack.workspace("ws-n")["state"] == WorkspaceState.HALTED


def test_worker_rejects_a_job_sent_to_another_message_group(
    stack, make_worker, workspaces, lambda_context, sqs_fifo_record
):
    # A group without the ws# prefix would be a second FIFO group feeding workspace ws-z: two of its jobs at once.
    # It names no workspace, so it is recorded under its message id, and the job it names is not taken
    message = make_message("z1", workspace_id="ws-z")
    record = sqs_fifo_record("ws-z", message.model_dump_json(by_alias=True))
    assert _failed(make_worker(stack).handle({"Records": [record]}, lambda_context())) == []
    assert stack.item(f"msg#{record['messageId']}")["status"] == JobStatus.REJECTED
    assert stack.job("z1") is None
    assert workspaces.commits("ws-z") == []

    # and one of another workspace's group is REJECTED and halts that group's workspace
    other = sqs_fifo_record("ws#ws-y", message.model_dump_json(by_alias=True))
    assert _failed(make_worker(stack).handle({"Records": [other]}, lambda_context())) == []
    assert stack.job("z1")["status"] == JobStatus.REJECTED
    assert "is not workspace 'ws-z'" in stack.job("z1")["error"]
    assert stack.workspace("ws-y")["state"] == WorkspaceState.HALTED
    assert workspaces.commits("ws-z") == workspaces.commits("ws-y") == []


def test_worker_halts_the_workspace_when_a_failed_last_delivery_cannot_be_parked(
    stack, make_worker, workspaces, hooks, lambda_context, monkeypatch
):
    # Given a job whose run fails on its last delivery, and a park the table refuses (as for a job accepted with
    # another payload)
    enqueue(stack, make_job("l1", "ws-l"))
    (record,) = stack.receive()["Records"]
    record["attributes"]["ApproximateReceiveCount"] = str(stack.settings.max_receive_count)
    _always_fail(hooks, "l1")
    worker = make_worker(stack)
    monkeypatch.setattr(worker.services.guard, "park", lambda *_, **__: False)
    # When the worker cannot park it
    response = worker.handle({"Records": [record]}, lambda_context())
    # Then the record stays reported for the queue, and its workspace is halted so the next job cannot run past it
    assert _failed(response) == [record["messageId"]]
    assert stack.workspace("ws-l")["state"] == WorkspaceState.HALTED
    assert stack.job("l1")["status"] == JobStatus.FAILED


def test_worker_never_halts_for_a_last_delivery_of_a_job_running_elsewhere(
    stack, make_worker, workspaces, lambda_context, sqs_fifo_record
):
    # Given a job leased by another worker (its message came back while that worker runs it), delivered near the
    # queue's redrive limit
    message = make_message("l2", workspace_id="ws-l")
    stack.guard.claim(message, message_id="other", sequence_number=None, remaining_ms=60_000)
    limit = stack.settings.max_receive_count
    record = sqs_fifo_record("ws#ws-l", message.model_dump_json(by_alias=True), receive_count=limit)
    # When the worker cannot run it (live lease)
    response = make_worker(stack).handle({"Records": [record]}, lambda_context())
    # Then the record goes back to the queue and nothing is halted: nothing of this delivery failed, and the worker
    # holding the job settles it (were the message dead-lettered, the next job of ws-l would find the job unsettled
    # ahead of it and be parked behind it)
    assert _failed(response) == [record["messageId"]]
    assert stack.workspace("ws-l") is None or stack.workspace("ws-l")["state"] == WorkspaceState.ACTIVE
    assert stack.job("l2")["status"] == JobStatus.IN_FLIGHT


def test_worker_never_raises_when_parking_fails(stack, make_worker, hooks, lambda_context, monkeypatch):
    # Given a failing job on its last delivery and a table that refuses the park (throttled)
    from botocore.exceptions import ClientError

    enqueue(stack, make_job("t1", "ws-t"), make_job("u1", "ws-u"))
    records = stack.receive()["Records"]
    for record in records:
        record["attributes"]["ApproximateReceiveCount"] = str(stack.settings.max_receive_count)
    _always_fail(hooks, "t1")
    worker = make_worker(stack)

    def throttled(*_: Any, **__: Any) -> bool:
        raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "slow down"}}, "UpdateItem")

    monkeypatch.setattr(worker.services.guard, "park", throttled)
    # When the batch is handled, Then the handler answers (u1 done, t1 left to the queue) instead of raising
    response = worker.handle({"Records": records}, lambda_context())
    assert [json.loads(r["body"])["jobId"] for r in records if r["messageId"] in _failed(response)] == ["t1"]
    assert stack.job("u1")["status"] == JobStatus.SUCCEEDED
