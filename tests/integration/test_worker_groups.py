"""The group-parallel worker: the message groups (workspaces) of one batch run at once on a bounded pool, the records
of one group strictly in order, and partial failure stays per group (Powertools' skip_group_on_error).

Concurrency is shown with barriers, never with timings: a barrier of two jobs of different groups is passed only when
both jobs run at the same time (run one after the other, the first waits in vain and its job fails).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from agent_jobs.models import JobStatus, WorkspaceState
from job_worker.jobs.errors import OutOfTimeError, RetryableJobError
from tests.conftest import Stack, enqueue, make_job

BARRIER_SECONDS = 10  # generous: the barrier either opens at once (concurrent) or never (sequential)


def _failed(response: dict[str, Any]) -> list[str]:
    return [item["itemIdentifier"] for item in response["batchItemFailures"]]


def _with_concurrency(stack: Stack, group_concurrency: int) -> Stack:
    settings = stack.settings.model_copy(update={"group_concurrency": group_concurrency})
    return replace(stack, settings=settings, services=replace(stack.services, settings=settings))


def _fail_once(hooks: Any, job_id: str) -> None:
    def fail() -> None:
        hooks.before_commit.pop(job_id)
        raise RetryableJobError("remote unavailable")

    hooks.before_commit[job_id] = fail


def _message_ids(event: dict[str, Any]) -> dict[str, str]:
    """jobId -> messageId of the event's records."""
    return {json.loads(r["body"])["jobId"]: r["messageId"] for r in event["Records"]}


def test_worker_runs_groups_at_once_and_each_group_in_order(any_stack, make_worker, workspaces, hooks, lambda_context):
    # Given three jobs in each of two workspaces, interleaved on the queue, and a barrier that the first job of each
    # workspace must pass together
    a = [make_job(f"a-{i}", workspace_id="ws-a") for i in range(3)]
    b = [make_job(f"b-{i}", workspace_id="ws-b") for i in range(3)]
    enqueue(any_stack, *[job for pair in zip(a, b, strict=True) for job in pair])
    both_first = threading.Barrier(2, timeout=BARRIER_SECONDS)
    started: list[str] = []
    lock = threading.Lock()

    def record(job_id: str, barrier: threading.Barrier | None = None) -> None:
        with lock:
            started.append(job_id)
        if barrier is not None:
            barrier.wait()

    for job in a + b:
        hooks.before_commit[job.job_id] = (
            (lambda j=job.job_id: record(j, both_first))
            if job.job_id.endswith("-0")
            else (lambda j=job.job_id: record(j))
        )

    # When one batch holds all six
    event = any_stack.receive(10)
    assert len(event["Records"]) == 6
    response = make_worker(any_stack).handle(event, lambda_context())

    # Then the two first jobs met at the barrier (the groups ran at the same time), and everything succeeded in its
    # workspace's order
    assert _failed(response) == []
    assert [j for j in started if j.startswith("a-")] == ["a-0", "a-1", "a-2"]
    assert [j for j in started if j.startswith("b-")] == ["b-0", "b-1", "b-2"]
    assert workspaces.commits("ws-a") == ["a-0", "a-1", "a-2"]
    assert workspaces.commits("ws-b") == ["b-0", "b-1", "b-2"]
    for job in a + b:
        assert any_stack.job(job.job_id)["status"] == JobStatus.SUCCEEDED


def test_worker_failure_stops_its_own_group_while_another_group_goes_on(
    any_stack, make_worker, workspaces, hooks, lambda_context
):
    # Given two workspaces' jobs interleaved; the first job of ws-a fails while ws-b's first job is running (both
    # hold a barrier), and ws-b's jobs finish after ws-a's group has stopped
    a = [make_job(f"fa-{i}", workspace_id="ws-a") for i in range(3)]
    b = [make_job(f"fb-{i}", workspace_id="ws-b") for i in range(3)]
    enqueue(any_stack, *[job for pair in zip(a, b, strict=True) for job in pair])
    together = threading.Barrier(2, timeout=BARRIER_SECONDS)
    a_failed = threading.Event()
    ran: list[str] = []

    def fail_a() -> None:
        ran.append("fa-0")
        together.wait()
        a_failed.set()
        raise RetryableJobError("remote unavailable")

    def first_b() -> None:
        ran.append("fb-0")
        together.wait()
        assert a_failed.wait(BARRIER_SECONDS)

    hooks.before_commit["fa-0"] = fail_a
    hooks.before_commit["fb-0"] = first_b
    for job_id in ("fa-1", "fa-2", "fb-1", "fb-2"):
        hooks.before_commit[job_id] = lambda j=job_id: ran.append(j)

    # When one batch holds all six
    event = any_stack.receive(10)
    ids = _message_ids(event)
    response = make_worker(any_stack).handle(event, lambda_context())

    # Then ws-a's failure reported it and the rest of its group (never run), in the event's order; ws-b ran through
    assert _failed(response) == [ids["fa-0"], ids["fa-1"], ids["fa-2"]]
    assert "fa-1" not in ran
    assert "fa-2" not in ran
    assert workspaces.commits("ws-a") == []
    assert workspaces.commits("ws-b") == ["fb-0", "fb-1", "fb-2"]
    assert any_stack.job("fa-0")["status"] == JobStatus.FAILED
    assert any_stack.job("fa-1")["status"] == JobStatus.QUEUED


def test_worker_reports_failures_in_the_events_order_whichever_group_finishes_first(
    any_stack, make_worker, hooks, lambda_context
):
    # Given two failing workspaces whose records interleave; ws-b's group fails and finishes before ws-a's does
    a = [make_job(f"oa-{i}", workspace_id="ws-a") for i in range(2)]
    b = [make_job(f"ob-{i}", workspace_id="ws-b") for i in range(2)]
    enqueue(any_stack, *[job for pair in zip(a, b, strict=True) for job in pair])
    b_done = threading.Event()

    def fail_a_after_b() -> None:
        assert b_done.wait(BARRIER_SECONDS)
        raise RetryableJobError("later")

    def fail_b() -> None:
        raise RetryableJobError("first")

    hooks.before_commit["oa-0"] = fail_a_after_b
    hooks.before_commit["ob-0"] = fail_b
    worker = make_worker(any_stack)
    original = worker._process_group

    def process_group(records: list[dict[str, Any]], delays: dict[str, int], context: Any, *rest: Any) -> set[str]:
        failed: set[str] = original(records, delays, context, *rest)
        if "ws-b" in records[0]["attributes"]["MessageGroupId"]:
            b_done.set()
        return failed

    worker._process_group = process_group

    # When the batch runs
    event = any_stack.receive(10)
    response = worker.handle(event, lambda_context())

    # Then all four come back, listed in the event's order
    assert _failed(response) == [r["messageId"] for r in event["Records"]]
    assert [json.loads(r["body"])["jobId"] for r in event["Records"]] == ["oa-0", "ob-0", "oa-1", "ob-1"]


def test_worker_log_lines_of_concurrent_jobs_carry_their_own_job_id(
    stack, make_worker, workspaces, hooks, lambda_context
):
    # Given two jobs of two workspaces that log from inside their run while both are running
    enqueue(stack, make_job("log-a", workspace_id="ws-a"), make_job("log-b", workspace_id="ws-b"))
    worker = make_worker(stack)
    both = threading.Barrier(2, timeout=BARRIER_SECONDS)

    def log_inside(job_id: str) -> None:
        both.wait()  # both jobs have set their log keys
        worker.logger.info("inside the job", extra={"expectedJobId": job_id})
        both.wait()  # neither has removed its keys yet

    for job_id in ("log-a", "log-b"):
        hooks.before_commit[job_id] = lambda j=job_id: log_inside(j)
    # (The worker's log lines as its formatter writes them; its own handler keeps the stream of its first test.)
    captured = io.StringIO()
    handler = logging.StreamHandler(captured)
    handler.setFormatter(worker.logger.registered_formatter)
    logging.getLogger(worker.logger.name).addHandler(handler)

    # When the batch runs
    try:
        response = worker.handle(stack.receive(10), lambda_context())
    finally:
        logging.getLogger(worker.logger.name).removeHandler(handler)
    lines = [json.loads(line) for line in captured.getvalue().splitlines()]

    # Then every line a job logged names that job (and its workspace), and nothing is left on the logger afterwards
    assert _failed(response) == []
    inside = [line for line in lines if line.get("message") == "inside the job"]
    assert sorted(line["expectedJobId"] for line in inside) == ["log-a", "log-b"]
    for line in inside:
        assert line["jobId"] == line["expectedJobId"]
        assert line["workspaceId"] == {"log-a": "ws-a", "log-b": "ws-b"}[line["jobId"]]
    succeeded = {line["jobId"]: line["messageId"] for line in lines if line.get("message") == "job succeeded"}
    assert set(succeeded) == {"log-a", "log-b"}
    assert worker.logger.thread_safe_get_current_keys() == {}
    assert "jobId" not in worker.logger.get_current_keys()


@pytest.mark.parametrize("group_concurrency", [1, 2])
def test_worker_runs_at_most_group_concurrency_groups_at_once(
    stack, make_worker, hooks, lambda_context, group_concurrency
):
    # Given one job in each of four workspaces and a counter of the jobs running at once
    jobs = [make_job(f"cap-{i}", workspace_id=f"ws-{i}") for i in range(4)]
    enqueue(stack, *jobs)
    lock = threading.Lock()
    running = {"now": 0, "most": 0}

    def count() -> None:
        with lock:
            running["now"] += 1
            running["most"] = max(running["most"], running["now"])
        time.sleep(0.05)  # stays running a moment, so groups allowed to overlap do (the check is a count, not a time)
        with lock:
            running["now"] -= 1

    for job in jobs:
        hooks.before_commit[job.job_id] = count

    # When the batch runs with the setting
    limited = _with_concurrency(stack, group_concurrency)
    response = make_worker(limited).handle(limited.receive(10), lambda_context())

    # Then never more groups ran at once than the setting allows
    assert _failed(response) == []
    assert 1 <= running["most"] <= group_concurrency


class _RecordingXRay:
    """Stands for the X-Ray recorder: keeps the current entity per thread, as X-Ray does, and records which entity
    each job's subsegment was opened under."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.opened: dict[str, object] = {}

    def get_trace_entity(self) -> object:
        return getattr(self.local, "entity", None)

    def set_trace_entity(self, entity: object) -> None:
        self.local.entity = entity

    def clear_trace_entities(self) -> None:
        self.local.__dict__.pop("entity", None)

    @contextlib.contextmanager
    def in_subsegment(self, name: str) -> Iterator[None]:
        self.local.pending = name
        yield

    def put_annotation(self, key: str, value: str) -> None:
        if key == "jobId":
            self.opened[value] = self.get_trace_entity()


class _RecordingTracer:
    disabled = False

    def __init__(self) -> None:
        self.provider = _RecordingXRay()

    def put_annotation(self, key: str, value: str) -> None:
        self.provider.put_annotation(key, value)


def test_worker_traces_jobs_of_concurrent_groups_under_the_handlers_entity(stack, make_worker, lambda_context):
    # Given jobs of three workspaces and a tracer whose handler entity is open on this thread only
    enqueue(stack, *[make_job(f"tr-{i}", workspace_id=f"ws-{i}") for i in range(3)])
    worker = make_worker(stack)
    tracer = _RecordingTracer()
    worker.tracer = tracer
    handler_entity = object()
    tracer.provider.set_trace_entity(handler_entity)

    # When the batch runs its groups on other threads
    response = worker.handle(stack.receive(10), lambda_context())

    # Then every job's subsegment hangs under the handler's entity, not under nothing
    assert _failed(response) == []
    assert tracer.provider.opened == {f"tr-{i}": handler_entity for i in range(3)}


class _WriteRecorder(io.StringIO):
    """stdout that remembers each write call: a line split over two writes can be cut by another thread's line."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)


def test_worker_writes_each_metric_document_whole_in_one_write(stack, make_worker, lambda_context, monkeypatch) -> None:
    # Given jobs of two workspaces, run at once
    enqueue(stack, make_job("emf-a", workspace_id="ws-a"), make_job("emf-b", workspace_id="ws-b"))
    worker = make_worker(stack)
    stdout = _WriteRecorder()
    monkeypatch.setattr("sys.stdout", stdout)

    # When the batch runs
    response = worker.handle(stack.receive(10), lambda_context())
    monkeypatch.undo()

    # Then every metric document (JobsSucceeded, JobDuration of each job, and the tenant's TenantShareInUse) went out
    # as one whole line in one write
    assert _failed(response) == []
    documents = [text for text in stdout.writes if "_aws" in text]
    assert len(documents) == 4 + 1
    for text in documents:
        assert text.endswith("\n")
        assert "CloudWatchMetrics" in json.loads(text)["_aws"]


# ---- near the delivery limit: a record is parked only for its own failure ----------------------------------------


def _received(event: dict[str, Any], receives: dict[str, int]) -> None:
    """Give the event's records the receive counts a busy queue left them with (jobId -> ApproximateReceiveCount)."""
    for record in event["Records"]:
        record["attributes"]["ApproximateReceiveCount"] = str(receives[json.loads(record["body"])["jobId"]])


def _visible_again(stack: Stack, event: dict[str, Any], job_ids: set[str]) -> None:
    """The records of `job_ids` made visible now, as their visibility timeout running out would."""
    stack.services.sqs.change_message_visibility_batch(
        QueueUrl=stack.queue_url,
        Entries=[
            {"Id": str(n), "ReceiptHandle": record["receiptHandle"], "VisibilityTimeout": 0}
            for n, record in enumerate(event["Records"])
            if json.loads(record["body"])["jobId"] in job_ids
        ],
    )


def _not_halted(stack: Stack, workspace_id: str) -> bool:
    workspace = stack.workspace(workspace_id)
    return workspace is None or workspace["state"] == WorkspaceState.ACTIVE


def test_worker_never_parks_into_a_halt_a_record_that_waited_behind_its_groups_failure(
    stack, make_worker, workspaces, hooks, lambda_context
):
    # Given ws-a's a-1, which fails once (its second receive), with a-2 behind it on one of its last receives (the
    # batches that skipped it and its tenant's deferrals spent the others), and ws-b's b-1 on its last receive
    enqueue(stack, make_job("a-1", "ws-a"), make_job("a-2", "ws-a"), make_job("b-1", "ws-b"))
    event = stack.receive()
    ids = _message_ids(event)
    last = stack.settings.max_receive_count
    _received(event, {"a-1": 2, "a-2": last - 1, "b-1": last})
    _fail_once(hooks, "a-1")

    # When the worker runs the batch
    response = make_worker(stack).handle(event, lambda_context())
    stack.settle(event, response)

    # Then a-1 failed on its own, and a-2 never got its turn: neither is parked and ws-a is not halted; b-1 ran
    assert _failed(response) == [ids["a-1"], ids["a-2"]]
    assert (stack.job("a-1")["status"], stack.job("a-2")["status"]) == (JobStatus.FAILED, JobStatus.QUEUED)
    assert _not_halted(stack, "ws-a")
    assert workspaces.commits("ws-b") == ["b-1"]
    # and ws-a's records are handed back for the longest backoff, not received again at once (these settings' backoff
    # is otherwise 0 s): a-2's last receives wait for what took its turns to pass
    assert stack.receive()["Records"] == []

    # When they come back, both run, in order
    _visible_again(stack, event, {"a-1", "a-2"})
    again = stack.receive()
    assert _failed(make_worker(stack).handle(again, lambda_context())) == []
    assert workspaces.commits("ws-a") == ["a-1", "a-2"]


def test_worker_never_parks_into_a_halt_records_handed_back_for_the_invocations_time(
    stack, make_worker, workspaces, lambda_context
):
    # Given jobs of two workspaces on one of their last receives, and an invocation with less time left than the
    # worker's safety margin (2 s in these settings)
    enqueue(stack, make_job("x-1", "ws-x"), make_job("y-1", "ws-y"))
    event = stack.receive()
    near = stack.settings.max_receive_count - 1
    _received(event, {"x-1": near, "y-1": near})

    # When the worker gets them
    response = make_worker(stack).handle(event, lambda_context(timeout_seconds=1))

    # Then neither started, neither is parked and nothing is halted: the invocation's time is no fault of theirs
    assert sorted(_failed(response)) == sorted(r["messageId"] for r in event["Records"])
    assert (stack.job("x-1")["status"], stack.job("y-1")["status"]) == (JobStatus.QUEUED, JobStatus.QUEUED)
    assert _not_halted(stack, "ws-x")
    assert _not_halted(stack, "ws-y")
    # and they come back only after the longest backoff, so a crowded queue does not spend their last receives at once
    assert stack.receive()["Records"] == []


def test_worker_never_parks_into_a_halt_a_run_cut_short_by_the_invocations_time(
    stack, make_worker, workspaces, hooks, lambda_context
):
    # Given a job on one of its last receives whose run the invocation's time cuts short (it started late)
    enqueue(stack, make_job("late-1", "ws-late"))
    event = stack.receive()
    _received(event, {"late-1": stack.settings.max_receive_count - 1})

    def out_of_time() -> None:
        raise OutOfTimeError("the tests were stopped after 2.0 s, the time left in this invocation")

    hooks.before_commit["late-1"] = out_of_time

    # When the worker runs it
    response = make_worker(stack).handle(event, lambda_context())

    # Then the run is retried (its failure recorded, as any retry) but the record is not parked: nothing is halted
    assert _failed(response) == [event["Records"][0]["messageId"]]
    assert stack.job("late-1")["status"] == JobStatus.FAILED
    assert _not_halted(stack, "ws-late")


def test_worker_still_parks_and_halts_for_a_records_own_failure_near_its_limit(
    stack, make_worker, workspaces, hooks, lambda_context
):
    # Given ws-a's a-1, failing on one of its last receives, a-2 behind it, and ws-b's b-1 run by the same batch
    enqueue(stack, make_job("a-1", "ws-a"), make_job("a-2", "ws-a"), make_job("b-1", "ws-b"))
    event = stack.receive()
    near = stack.settings.max_receive_count - 1
    _received(event, {"a-1": near, "a-2": near, "b-1": near})
    _fail_once(hooks, "a-1")

    # When the worker runs the batch
    response = make_worker(stack).handle(event, lambda_context())

    # Then a-1 is parked and halts ws-a (the queue will not dead-letter it and run a-2 first); a-2 is parked behind
    # that halt; b-1 ran
    assert _failed(response) == []
    assert (stack.job("a-1")["status"], stack.job("a-2")["status"]) == (JobStatus.PARKED, JobStatus.PARKED)
    workspace = stack.workspace("ws-a")
    assert (workspace["state"], workspace["haltingJobId"]) == (WorkspaceState.HALTED, "a-1")
    assert workspaces.commits("ws-b") == ["b-1"]
