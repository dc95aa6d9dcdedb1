"""A job's place in its workspace's order is the place it takes effect at, whatever happened to its send: the answer
to a send lost before it was recorded, a retry within or after the deduplication window, a send never confirmed, and
every delivery of the first message dead-lettered before a handler ran. Through the API as a client calls it and
the worker as the queue delivers, on moto in-process and on moto's server (the emulator's SQS)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from agent_jobs.guard import JobGuard
from agent_jobs.models import JobStatus, ResumeDecision, WorkspaceState
from agent_jobs.resume import resume_workspace
from agent_jobs.store.queries import PRODUCER_CLOCK_MARGIN_MS
from agent_jobs_cli.deadletters import DeadLetterQueue, RedriveOutcome, registered_owners
from agent_jobs_local.emulator import (
    DEDUPLICATION_WINDOW_SECONDS,
    patch_atomic_table_operations,
)
from tests.conftest import REGION, ManualClock, Stack, WindowClock, deduplicate_on
from tests.conftest import _make_stack as make_stack
from tests.integration.test_enqueue_api import Api, ApiResponse, api_on, job_body, use_environment
from tests.integration.test_resume_worker import deliver, run_until_empty, worker_for

RETRY, SKIP = ResumeDecision.RETRY, ResumeDecision.SKIP
TENANT = "tenant-demo"  # the tenant of the API's sample event, which `job_body` requests are sent as


def resume(stack: Stack, halting: str, decision: ResumeDecision = RETRY) -> Any:
    return resume_workspace(
        "ws-a",
        tenant_id=TENANT,
        halting_job_id=halting,
        decision=decision,
        operator="alice",
        guard=stack.guard,
        sqs=stack.services.sqs,
        queue_url=stack.queue_url,
    )


def come_back_now(stack: Stack, delivery: dict[str, Any]) -> None:
    """The records a worker handed back come back at once, instead of after the delay it asked for."""
    for record in delivery["event"]["Records"]:
        if record["messageId"] in delivery["failed"]:
            stack.services.sqs.change_message_visibility(
                QueueUrl=stack.queue_url, ReceiptHandle=record["receiptHandle"], VisibilityTimeout=0
            )


class LostAnswers:
    """Makes the next `count` writes recording a send's answer fail, as a throttled or timed-out UpdateItem does
    after SendMessage succeeded: the client gets 503 and is told to retry the same request."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        original = JobGuard.record_sent

        def record_sent(guard: JobGuard, *args: Any, **kwargs: Any) -> Any:
            if self.count > 0:
                self.count -= 1
                from botocore.exceptions import ClientError

                raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}, "UpdateItem")
            return original(guard, *args, **kwargs)

        monkeypatch.setattr(JobGuard, "record_sent", record_sent)

    def next(self, count: int = 1) -> None:
        self.count = count


@pytest.fixture
def lost_answers(monkeypatch: pytest.MonkeyPatch) -> LostAnswers:
    return LostAnswers(monkeypatch)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def worker_on(stack: Stack, workspaces: Any, clock: ManualClock) -> Any:
    """The worker with a clock the test moves (the grace an unconfirmed job ahead gets is counted on it)."""
    guard = JobGuard(stack.services.dynamodb, stack.table_name, max_attempts=3, clock=clock)
    return worker_for(stack, workspaces, guard)


@pytest.fixture
def worker(any_stack: Stack, workspaces: Any, clock: ManualClock) -> Any:
    return worker_on(any_stack, workspaces, clock)


@pytest.fixture
def window_stack(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Stack, WindowClock]]:
    """The template's resources in moto in this process, its FIFO deduplication window on a clock the test turns
    (the emulator's corrections applied afresh to moto's own methods, and restored afterwards)."""
    window = WindowClock()
    patch_atomic_table_operations()
    deduplicate_on(window, monkeypatch)
    with mock_aws():
        yield make_stack("in-process", boto3.Session(region_name=REGION)), window


def unanswered_then_next(api: Api, lost_answers: LostAnswers) -> ApiResponse:
    """L1 sent, the write recording its send's answer failed (503); then L2 accepted on the same workspace (202)."""
    lost_answers.next()
    assert api.post(job_body("L1", "ws-a")).status == 503
    second = api.post(job_body("L2", "ws-a"))
    assert second.status == 202
    return second


def dead_letter_head(stack: Stack, expected_job_id: str) -> None:
    """Every delivery of the group's head message dies before a handler runs (an init crash, an OOM): received one
    at a time and let go, until the queue moves it to the dead-letter queue."""
    sqs = stack.services.sqs
    for _ in range(50):
        messages = sqs.receive_message(
            QueueUrl=stack.queue_url, MaxNumberOfMessages=1, AttributeNames=["All"], MessageAttributeNames=["All"]
        ).get("Messages", [])
        if messages:  # let it go again at once
            sqs.change_message_visibility(
                QueueUrl=stack.queue_url, ReceiptHandle=messages[0]["ReceiptHandle"], VisibilityTimeout=0
            )
        if not messages or f'"{expected_job_id}"' not in messages[0]["Body"]:
            break  # the head moved on: the dead message is gone
    dead = sqs.receive_message(QueueUrl=stack.dlq_url, MaxNumberOfMessages=10, VisibilityTimeout=0)
    assert any(f'"{expected_job_id}"' in m["Body"] for m in dead.get("Messages", [])), "not dead-lettered"


def redrive(stack: Stack) -> list[RedriveOutcome]:
    """`agent-jobs dlq redrive --workspace ws-a`."""
    redriven = DeadLetterQueue(stack.services.sqs, stack.dlq_url).redrive(
        stack.guard,
        select_workspace=lambda workspace_id: workspace_id == "ws-a",
        owner_of=registered_owners(stack.services.dynamodb, stack.table_name),
    )
    return [result.outcome for result in redriven]


@pytest.fixture
def commits(workspaces: Any) -> Callable[[], list[str]]:
    return lambda: workspaces.commits("ws-a")


def halted_naming(stack: Stack, job_id: str) -> dict[str, Any]:
    workspace = stack.workspace("ws-a")
    assert workspace["state"] == WorkspaceState.HALTED
    assert workspace["haltingJobId"] == job_id
    assert job_id in workspace["haltReason"]
    return workspace  # type: ignore[no-any-return]


def test_a_retry_within_the_window_keeps_the_first_place_and_a_dead_lettered_first_copy_halts(
    api: Api, lost_answers: LostAnswers, worker: Any, lambda_context: Any, commits: Callable[[], list[str]]
) -> None:
    stack = api.stack
    # L1's send succeeds, the write recording its answer fails: 503, retry the same request
    second = unanswered_then_next(api, lost_answers)
    # The retry within the deduplication window: the queue answers with the first message, which it holds
    retried = api.post(job_body("L1", "ws-a"))
    assert retried.status == 202
    assert int(retried.body["sequenceNumber"]) < int(second.body["sequenceNumber"])  # L1's place is its first send's
    assert stack.job("L1")["sequenceNumber"] == retried.body["sequenceNumber"]

    # Every delivery of L1's message dies before a handler runs: the queue dead-letters it
    dead_letter_head(stack, "L1")
    # L2 does not run while L1, ahead of it, never ran: parked, the workspace halted naming L1
    deliver(stack, worker, lambda_context)
    assert commits() == []
    assert stack.job("L2")["status"] == JobStatus.PARKED
    halted_naming(stack, "L1")

    # Resumable in order: the redrive parks L1, the retry runs L1 then L2, each at the place its 202 named
    assert redrive(stack) == [RedriveOutcome.PARKED]
    assert resume(stack, "L1", RETRY).outcome == "RESUMING"
    run_until_empty(stack, worker, lambda_context)
    assert commits() == ["L1", "L2"]
    assert [stack.job(j)["sequenceNumber"] for j in ("L1", "L2")] == [
        retried.body["sequenceNumber"],
        second.body["sequenceNumber"],
    ]


def test_a_retry_after_the_window_is_a_later_place_and_the_first_copy_dead_lettered_halts_until_it_comes(
    window_stack: tuple[Stack, WindowClock],
    lost_answers: LostAnswers,
    workspaces: Any,
    clock: ManualClock,
    lambda_context: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stack, window = window_stack
    api, worker = api_on(stack, monkeypatch), worker_on(stack, workspaces, clock)
    # L1 is sent, its answer lost (503); L2 is accepted after it; every delivery of L1's message dies unseen
    second = unanswered_then_next(api, lost_answers)
    dead_letter_head(stack, "L1")

    # L2 waits for L1 through the grace, then parks and halts the workspace naming it
    clock.advance(stack.settings.unplaced_grace_seconds + 1)
    deliver(stack, worker, lambda_context)
    assert workspaces.commits("ws-a") == []
    assert stack.job("L2")["status"] == JobStatus.PARKED
    halted_naming(stack, "L1")

    # The client retries L1 after the deduplication window: a second message, later than L2, and the 202 says so
    window.advance(DEDUPLICATION_WINDOW_SECONDS + 1)
    retried = api.post(job_body("L1", "ws-a"))
    assert retried.status == 202
    assert int(retried.body["sequenceNumber"]) > int(second.body["sequenceNumber"])
    assert stack.job("L1")["sequenceNumber"] == retried.body["sequenceNumber"]
    deliver(stack, worker, lambda_context)
    assert stack.job("L1")["status"] == JobStatus.PARKED
    # Its first message, redriven from the dead-letter queue, is only deleted: it does not move L1 to its place
    assert redrive(stack) == [RedriveOutcome.ALREADY_SETTLED]
    assert stack.queue_depth(stack.dlq_url) == 0
    assert stack.job("L1")["sequenceNumber"] == retried.body["sequenceNumber"]

    # Resumed: each runs once, in the order of the places their 202s named
    assert resume(stack, "L1", RETRY).outcome == "RESUMING"
    run_until_empty(stack, worker, lambda_context)
    assert workspaces.commits("ws-a") == ["L2", "L1"]
    assert [stack.job(j)["status"] for j in ("L1", "L2")] == [JobStatus.SUCCEEDED, JobStatus.SUCCEEDED]


def test_a_job_whose_send_was_never_recorded_runs_before_a_job_accepted_after_that_send(
    api: Api, lost_answers: LostAnswers, worker: Any, lambda_context: Any, commits: Callable[[], list[str]]
) -> None:
    stack = api.stack
    # L1 and L2 are each sent and their answers lost; L2 was accepted after L1's message was sent
    lost_answers.next()
    assert api.post(job_body("L1", "ws-a")).status == 503
    time.sleep(PRODUCER_CLOCK_MARGIN_MS / 1000 + 0.1)  # past the margin allowed for the clocks of queue and producers
    lost_answers.next()
    assert api.post(job_body("L2", "ws-a")).status == 503

    # L1's copy is the message its place is: the queue's SentTimestamp says L2 came after it, so L1 runs, then L2
    deliver(stack, worker, lambda_context)
    assert commits() == ["L1", "L2"]
    assert stack.workspace("ws-a").get("state", WorkspaceState.ACTIVE) == WorkspaceState.ACTIVE


def test_an_unconfirmed_job_ahead_is_waited_for_then_halts_its_workspace_naming_it(
    api: Api,
    lost_answers: LostAnswers,
    worker: Any,
    clock: ManualClock,
    lambda_context: Any,
    commits: Callable[[], list[str]],
) -> None:
    stack = api.stack
    # L1 is accepted and sent, the answer is lost, and its client gives up; every delivery of L1 dies unseen
    unanswered_then_next(api, lost_answers)
    assert "sequenceNumber" not in stack.job("L1")
    dead_letter_head(stack, "L1")

    # While L1 may still be confirmed, L2 waits for it: handed back, nothing halted
    first = deliver(stack, worker, lambda_context)
    assert first["failed"]  # handed back to the queue
    assert stack.job("L2")["status"] == JobStatus.QUEUED
    assert stack.workspace("ws-a").get("state", WorkspaceState.ACTIVE) == WorkspaceState.ACTIVE
    assert commits() == []
    come_back_now(stack, first)

    # Once the grace is over, L1 is a job the queue lost: L2 parks and the workspace halts naming L1
    clock.advance(stack.settings.unplaced_grace_seconds + 1)
    deliver(stack, worker, lambda_context)
    assert commits() == []
    assert stack.job("L2")["status"] == JobStatus.PARKED
    halted_naming(stack, "L1")

    # Resumable in order: the redrive parks L1 at its message's place, then the retry runs L1 and L2
    assert redrive(stack) == [RedriveOutcome.PARKED]
    assert resume(stack, "L1", RETRY).outcome == "RESUMING"
    run_until_empty(stack, worker, lambda_context)
    assert commits() == ["L1", "L2"]
    assert int(stack.job("L1")["sequenceNumber"]) < int(stack.job("L2")["sequenceNumber"])


def test_a_send_never_made_stops_the_jobs_after_it_until_the_client_sends_it_or_it_is_skipped(
    api: Api,
    lost_answers: LostAnswers,
    worker: Any,
    clock: ManualClock,
    lambda_context: Any,
    commits: Callable[[], list[str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stack = api.stack
    # L1 is recorded but the queue refuses its send (503), and its client moves on to L2
    good_url = stack.queue_url
    use_environment(monkeypatch, {"QUEUE_URL": good_url.rsplit("/", 1)[0] + "/no-such-queue.fifo"})
    assert api.post(job_body("L1", "ws-a")).status == 503
    use_environment(monkeypatch, {"QUEUE_URL": good_url})
    second = api.post(job_body("L2", "ws-a"))
    assert second.status == 202

    clock.advance(stack.settings.unplaced_grace_seconds + 1)
    deliver(stack, worker, lambda_context)
    assert commits() == []
    assert stack.job("L2")["status"] == JobStatus.PARKED
    halted_naming(stack, "L1")

    # The client sends L1 again, later: it is queued behind L2 (its 202 says so) and parked behind the halt
    retried = api.post(job_body("L1", "ws-a"))
    assert retried.status == 202
    assert int(retried.body["sequenceNumber"]) > int(second.body["sequenceNumber"])
    deliver(stack, worker, lambda_context)
    assert stack.job("L1")["status"] == JobStatus.PARKED

    # The operator retries it: both run, in the order of their places (the order their 202s named)
    assert resume(stack, "L1", RETRY).outcome == "RESUMING"
    run_until_empty(stack, worker, lambda_context)
    assert commits() == ["L2", "L1"]


def test_an_earlier_copy_behind_the_recorded_place_is_acknowledged_without_effect(
    api: Api, worker: Any, lambda_context: Any, commits: Callable[[], list[str]]
) -> None:
    stack = api.stack
    first = api.post(job_body("L1", "ws-a"))
    assert first.status == 202
    # A copy of L1 the queue still holds from a send older than its recorded place (sent again after the window)
    stale = stack.services.sqs.receive_message(QueueUrl=stack.queue_url, MaxNumberOfMessages=1)["Messages"][0]
    stack.services.sqs.change_message_visibility(
        QueueUrl=stack.queue_url, ReceiptHandle=stale["ReceiptHandle"], VisibilityTimeout=0
    )
    # The record names a later place than this copy's
    item = stack.job("L1")
    later = str(int(item["sequenceNumber"]) + 1).rjust(len(item["sequenceNumber"]), "0")
    _move_place(stack, "L1", later)

    run_until_empty(stack, worker, lambda_context)
    assert commits() == []  # acknowledged, not run: the job takes effect at its recorded place only
    assert stack.job("L1")["status"] == JobStatus.QUEUED
    assert stack.queue_depth() == 0


def _move_place(stack: Stack, job_id: str, sequence_number: str) -> None:
    from agent_jobs.keys import job_key, parked_sequence

    stack.services.dynamodb.update_item(
        TableName=stack.table_name,
        Key={"pk": {"S": job_key(TENANT, job_id)}},
        UpdateExpression="SET sequenceNumber = :s, queueSeq = :q",
        ExpressionAttributeValues={":s": {"S": sequence_number}, ":q": {"S": parked_sequence(sequence_number, 0)}},
    )
