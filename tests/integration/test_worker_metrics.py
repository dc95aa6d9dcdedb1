"""The worker's CloudWatch metrics as Powertools prints them (EMF on stdout): job-level metrics carry the job's type
even when one batch mixes types, and every halt the worker causes is counted with the dimensions its alarm names."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from aws_lambda_powertools import Logger, Metrics

from agent_jobs.models import JobStatus, WorkspaceState
from job_worker.jobs.errors import PermanentJobError, RetryableJobError
from job_worker.processing import JOB_TYPE_DIMENSION, UNKNOWN_JOB_TYPE, WORKSPACES_HALTED, BatchWorker
from tests.conftest import Stack, enqueue, make_job, make_message

NAMESPACE = "AgentJobsMetricsTest"
SERVICE = "agent-jobs-metrics-test"


@dataclass(frozen=True)
class Emitted:
    namespace: str
    name: str
    unit: str
    value: float
    dimensions: dict[str, str]


def emitted_metrics(out: str) -> list[Emitted]:
    """Every metric of every EMF document in `out`, with the dimensions CloudWatch would file it under."""
    found: list[Emitted] = []
    for line in out.splitlines():
        if not line.startswith("{"):
            continue
        document = json.loads(line)
        if "_aws" not in document:
            continue
        for directive in document["_aws"]["CloudWatchMetrics"]:
            (dimension_names,) = directive["Dimensions"]  # one dimension set per document
            dimensions = {name: document[name] for name in dimension_names}
            for metric in directive["Metrics"]:
                value = document[metric["Name"]]  # Powertools writes a list of values
                total = sum(value) if isinstance(value, list) else value
                found.append(Emitted(directive["Namespace"], metric["Name"], metric["Unit"], total, dimensions))
    return found


def named(metrics: list[Emitted], name: str) -> list[Emitted]:
    return [metric for metric in metrics if metric.name == name]


@pytest.fixture
def worker(stack: Stack, workspaces: Any) -> BatchWorker:
    """A worker whose Metrics has its own namespace and service, as the deployed one gets them from the environment."""
    return BatchWorker(
        services=stack.services,
        workspaces=workspaces,
        logger=Logger(service=SERVICE),
        metrics=Metrics(namespace=NAMESPACE, service=SERVICE),
    )


def _fail_with(hooks: Any, job_id: str, error: Exception) -> None:
    def fail() -> None:
        raise error

    hooks.before_commit[job_id] = fail


def test_worker_metrics_carry_each_job_type_in_a_batch_of_mixed_types(
    stack, worker, hooks, lambda_context, capsys
) -> None:
    # Given one batch with an apply_patch that fails for now, and a run_tests and an open_pr that succeed
    enqueue(
        stack,
        make_job("m-patch", "ws-a", "apply_patch"),
        make_job("m-tests", "ws-b", "run_tests"),
        make_job("m-pr", "ws-c", "open_pr"),
    )
    _fail_with(hooks, "m-patch", RetryableJobError("remote unavailable"))
    capsys.readouterr()

    # When the worker runs it
    worker.handle(stack.receive(), lambda_context())

    # Then each job-level metric is filed under its own job's type, in the worker's namespace, next to `service`
    metrics = emitted_metrics(capsys.readouterr().out)
    succeeded = named(metrics, "JobsSucceeded")
    assert sorted(m.dimensions[JOB_TYPE_DIMENSION] for m in succeeded) == ["open_pr", "run_tests"]
    for metric in succeeded:
        assert metric.dimensions == {JOB_TYPE_DIMENSION: metric.dimensions[JOB_TYPE_DIMENSION], "service": SERVICE}
        assert (metric.namespace, metric.unit, metric.value) == (NAMESPACE, "Count", 1)
    assert [m.dimensions for m in named(metrics, "JobsFailed")] == [
        {JOB_TYPE_DIMENSION: "apply_patch", "service": SERVICE}
    ]
    durations = named(metrics, "JobDuration")
    assert sorted(m.dimensions[JOB_TYPE_DIMENSION] for m in durations) == ["open_pr", "run_tests"]
    assert all(m.unit == "Milliseconds" and m.value >= 0 for m in durations)
    assert named(metrics, WORKSPACES_HALTED) == []  # failures with attempts left halt nothing


def test_worker_counts_a_dead_job_by_type_and_the_halt_it_causes(stack, worker, hooks, lambda_context, capsys) -> None:
    # Given an apply_patch job that fails permanently
    enqueue(stack, make_job("dead-1", "ws-d", "apply_patch"))
    _fail_with(hooks, "dead-1", PermanentJobError("the test command does not exist"))
    capsys.readouterr()

    # When the worker runs it
    worker.handle(stack.receive(), lambda_context())

    # Then the job is DEAD and its workspace HALTED, and both are counted
    assert stack.job("dead-1")["status"] == JobStatus.DEAD
    assert stack.workspace("ws-d")["state"] == WorkspaceState.HALTED
    metrics = emitted_metrics(capsys.readouterr().out)
    (dead,) = named(metrics, "JobsDead")
    assert dead.dimensions == {JOB_TYPE_DIMENSION: "apply_patch", "service": SERVICE}
    (halted,) = named(metrics, WORKSPACES_HALTED)
    assert (halted.namespace, halted.unit, halted.value) == (NAMESPACE, "Count", 1)
    assert halted.dimensions == {"service": SERVICE}


def test_worker_counts_a_job_dead_after_its_last_attempt_and_the_halt(stack, worker, hooks, lambda_context, capsys):
    # Given an apply_patch job that always fails, delivered until its attempts are used up
    enqueue(stack, make_job("dead-2", "ws-e", "apply_patch"))
    _fail_with(hooks, "dead-2", RetryableJobError("remote unavailable"))
    capsys.readouterr()
    for _ in range(stack.settings.max_attempts):
        event = stack.receive()
        stack.settle(event, worker.handle(event, lambda_context()))

    # Then it failed max_attempts times, died once and halted its workspace once
    metrics = emitted_metrics(capsys.readouterr().out)
    assert stack.job("dead-2")["status"] == JobStatus.DEAD
    assert len(named(metrics, "JobsFailed")) == stack.settings.max_attempts
    assert [m.dimensions[JOB_TYPE_DIMENSION] for m in named(metrics, "JobsDead")] == ["apply_patch"]
    assert [m.dimensions for m in named(metrics, WORKSPACES_HALTED)] == [{"service": SERVICE}]


def test_worker_counts_rejections_by_the_type_they_name_or_unknown(
    stack, worker, lambda_context, sqs_fifo_record, capsys
) -> None:
    # Given a body that is not JSON, and a run_tests job whose payload is invalid, in two workspaces
    invalid = make_message("rej-2", workspace_id="ws-r2").model_dump(mode="json", by_alias=True)
    invalid.update(type="run_tests", payload={"suite": 7})
    records = [sqs_fifo_record("ws#ws-r1", "{not json"), sqs_fifo_record("ws#ws-r2", invalid)]
    capsys.readouterr()

    # When the worker runs them
    worker.handle({"Records": records}, lambda_context())

    # Then both are rejected, each workspace halted, and the rejections are filed under unknown and run_tests
    assert stack.workspace("ws-r1")["state"] == WorkspaceState.HALTED
    assert stack.workspace("ws-r2")["state"] == WorkspaceState.HALTED
    metrics = emitted_metrics(capsys.readouterr().out)
    # (the two groups run on threads of their own, so their metrics come in either order)
    rejected = sorted(m.dimensions[JOB_TYPE_DIMENSION] for m in named(metrics, "JobsRejected"))
    assert rejected == sorted([UNKNOWN_JOB_TYPE, "run_tests"])
    assert [m.dimensions for m in named(metrics, WORKSPACES_HALTED)] == [{"service": SERVICE}] * 2


def test_worker_rejection_never_takes_a_dimension_value_from_the_message(
    stack, worker, lambda_context, sqs_fifo_record, capsys
) -> None:
    # A type that is no job type would be a new metric per bad message: it counts as unknown
    record = sqs_fifo_record("ws#ws-r3", {"jobId": "rej-3", "type": "drop table"})
    capsys.readouterr()
    worker.handle({"Records": [record]}, lambda_context())
    (rejected,) = named(emitted_metrics(capsys.readouterr().out), "JobsRejected")
    assert rejected.dimensions[JOB_TYPE_DIMENSION] == UNKNOWN_JOB_TYPE


def test_worker_counts_a_halt_for_parking_on_a_last_delivery_once_per_halt(
    stack, worker, hooks, lambda_context, capsys
) -> None:
    # Given two apply_patch jobs of ws-f delivered for the last time before the queue's redrive, the first failing
    enqueue(stack, make_job("park-1", "ws-f"), make_job("park-2", "ws-f"))
    event = stack.receive()
    for record in event["Records"]:
        record["attributes"]["ApproximateReceiveCount"] = str(stack.settings.max_receive_count)
    _fail_with(hooks, "park-1", RetryableJobError("remote unavailable"))
    capsys.readouterr()

    # When the batch fails at park-1
    stack.settle(event, worker.handle(event, lambda_context()))

    # Then both are parked with their type; the first park halted the workspace (one halt counted), the second
    # parked behind that halt without halting it again
    assert stack.workspace("ws-f")["state"] == WorkspaceState.HALTED
    metrics = emitted_metrics(capsys.readouterr().out)
    assert [m.dimensions for m in named(metrics, "JobsParked")] == [
        {JOB_TYPE_DIMENSION: "apply_patch", "service": SERVICE}
    ] * 2
    assert len(named(metrics, WORKSPACES_HALTED)) == 1

    # And when a later job of the halted workspace arrives, it is parked without a new halt
    enqueue(stack, make_job("park-3", "ws-f"))
    worker.handle(stack.receive(), lambda_context())
    metrics = emitted_metrics(capsys.readouterr().out)
    assert stack.job("park-3")["status"] == JobStatus.PARKED
    assert len(named(metrics, "JobsParked")) == 1
    assert named(metrics, WORKSPACES_HALTED) == []


def test_worker_counts_a_halt_when_a_failed_last_delivery_cannot_be_parked(
    stack, worker, hooks, lambda_context, capsys, monkeypatch
) -> None:
    # Given a job whose run fails on its last delivery before the queue's redrive, and a park the table refuses
    enqueue(stack, make_job("lease-1", "ws-l"))
    event = stack.receive()
    for record in event["Records"]:
        record["attributes"]["ApproximateReceiveCount"] = str(stack.settings.max_receive_count)
    _fail_with(hooks, "lease-1", RetryableJobError("remote unavailable"))
    monkeypatch.setattr(worker.services.guard, "park", lambda *_, **__: False)
    capsys.readouterr()
    # When the worker can neither run it nor park it, Then it halts the workspace and counts that halt
    worker.handle(event, lambda_context())
    assert stack.workspace("ws-l")["state"] == WorkspaceState.HALTED
    assert len(named(emitted_metrics(capsys.readouterr().out), WORKSPACES_HALTED)) == 1


def test_worker_counts_no_halt_for_a_last_delivery_of_a_job_running_elsewhere(
    stack, worker, lambda_context, sqs_fifo_record, capsys
) -> None:
    # Given a job leased by another worker, delivered near the queue's redrive limit
    message = make_message("lease-2", workspace_id="ws-l")
    stack.guard.claim(message, message_id="other", sequence_number=None, remaining_ms=60_000)
    record = sqs_fifo_record(
        "ws#ws-l", message.model_dump_json(by_alias=True), receive_count=stack.settings.max_receive_count
    )
    capsys.readouterr()
    # When the worker cannot run it, Then nothing of its own failed: no halt, none counted
    worker.handle({"Records": [record]}, lambda_context())
    assert stack.workspace("ws-l") is None or stack.workspace("ws-l")["state"] == WorkspaceState.ACTIVE
    assert named(emitted_metrics(capsys.readouterr().out), WORKSPACES_HALTED) == []


def test_worker_counts_a_duplicate_delivery_by_type(stack, worker, lambda_context, capsys) -> None:
    enqueue(stack, make_job("dup-m", "ws-g", "apply_patch"))
    event = stack.receive()
    worker.handle(event, lambda_context())
    capsys.readouterr()
    worker.handle(event, lambda_context())  # the same delivery again, after it took effect
    (duplicate,) = named(emitted_metrics(capsys.readouterr().out), "JobsDuplicate")
    assert duplicate.dimensions == {JOB_TYPE_DIMENSION: "apply_patch", "service": SERVICE}
