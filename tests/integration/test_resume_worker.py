"""The worker's drain of a resumed workspace, against moto's server (whose FIFO SequenceNumbers grow as SQS's do, which
the drain's order relies on; in-process moto draws them at random): order, bounded rounds, failures during the drain,
stale and malformed markers, a marker near its last delivery, and a lagging parked index."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from aws_lambda_powertools import Logger, Metrics

from agent_jobs.guard import FailOutcome, JobGuard
from agent_jobs.models import DrainMarker, JobStatus, ResumeDecision, WorkspaceState
from agent_jobs.resume import resume_workspace, send_drain_marker
from agent_jobs_cli.deadletters import DeadLetterQueue, RedriveOutcome, registered_owners
from enqueue_api import app
from job_worker.jobs.errors import PermanentJobError, RetryableJobError
from job_worker.processing import BatchWorker
from tests.conftest import HookedWorkspaceStore, Hooks, Stack, enqueue, make_job, make_message
from tests.integration.test_enqueue_api import Api, use_environment

RETRY, SKIP = ResumeDecision.RETRY, ResumeDecision.SKIP


@pytest.fixture
def stack(server_stack: Stack) -> Stack:
    return server_stack


def worker_for(stack: Stack, workspaces: HookedWorkspaceStore, guard: JobGuard | None = None, **settings: Any) -> Any:
    """A worker whose drain settings are the test's (no lag delay, so a retried marker comes back at once)."""
    overrides = {"drain_lag_retry_seconds": 0, **settings}
    services = replace(stack.services, settings=stack.settings.model_copy(update=overrides))
    if guard is not None:
        services = replace(services, guard=guard)
    return BatchWorker(
        services=services,
        workspaces=workspaces,
        logger=Logger(service="agent-jobs-test"),
        metrics=Metrics(namespace="AgentJobsTest"),
    )


def deliver(stack: Stack, worker: Any, lambda_context: Any) -> dict[str, Any]:
    event = stack.receive(10)
    response = worker.handle(event, lambda_context())
    stack.settle(event, response)
    return {"event": event, "failed": [f["itemIdentifier"] for f in response["batchItemFailures"]]}


def run_until_empty(
    stack: Stack, worker: Any, lambda_context: Any, *, after_each: Callable[[dict[str, Any]], None] | None = None
) -> list[dict[str, Any]]:
    deliveries: list[dict[str, Any]] = []
    for _ in range(60):
        if stack.queue_depth() == 0:
            return deliveries
        delivery = deliver(stack, worker, lambda_context)
        deliveries.append(delivery)
        if after_each:
            after_each(delivery)
    raise AssertionError("the queue did not empty")


def markers(delivery: dict[str, Any]) -> list[DrainMarker]:
    return [
        DrainMarker.model_validate_json(record["body"])
        for record in delivery["event"]["Records"]
        if record["messageAttributes"].get("type", {}).get("stringValue") == "drain"
    ]


def fail_with(hooks: Hooks, job_id: str, error: Exception, times: int | None = None) -> None:
    """Fail `job_id`'s commit with `error`, `times` times (None: until the hook is removed)."""
    calls = {"n": 0}

    def fail() -> None:
        calls["n"] += 1
        if times is None or calls["n"] <= times:
            raise error

    hooks.before_commit[job_id] = fail


def halted_with_parked(stack: Stack, worker: Any, hooks: Hooks, lambda_context: Any, parked: int) -> list[str]:
    """ws-a halted by d1 (DEAD, a patch that does not apply), p1..p<parked> PARKED behind it; ws-b done."""
    fail_with(hooks, "d1", PermanentJobError("patch does not apply"))
    jobs = ["d1", *[f"p{n}" for n in range(1, parked + 1)]]
    enqueue(stack, *[make_job(job_id, "ws-a") for job_id in jobs], make_job("b1", "ws-b"))
    run_until_empty(stack, worker, lambda_context)
    assert stack.job("d1")["status"] == JobStatus.DEAD
    assert stack.workspace("ws-a").get("parkedCount", 0) == parked
    del hooks.before_commit["d1"]
    return jobs


def resume(stack: Stack, halting: str, decision: ResumeDecision = RETRY) -> Any:
    return resume_workspace(
        "ws-a",
        tenant_id="tenant-1",
        halting_job_id=halting,
        decision=decision,
        operator="alice",
        guard=stack.guard,
        sqs=stack.services.sqs,
        queue_url=stack.queue_url,
    )


def test_drain_runs_retried_and_parked_jobs_in_order_then_active(stack, workspaces, hooks, lambda_context):
    worker = worker_for(stack, workspaces)
    jobs = halted_with_parked(stack, worker, hooks, lambda_context, parked=3)
    assert workspaces.commits("ws-a") == []
    assert workspaces.commits("ws-b") == ["b1"]  # the other workspace did not wait

    # When the operator retries d1, and a new job arrives after the resume
    assert resume(stack, "d1").outcome == "RESUMING"
    enqueue(stack, make_job("n1", "ws-a"))
    run_until_empty(stack, worker, lambda_context)

    # Then d1 first, the parked jobs in queue order, then the new one; each once; the workspace ACTIVE again
    assert workspaces.commits("ws-a") == [*jobs, "n1"]
    assert {stack.job(job_id)["status"] for job_id in [*jobs, "n1"]} == {JobStatus.SUCCEEDED}
    workspace = stack.workspace("ws-a")
    assert workspace["state"] == WorkspaceState.ACTIVE
    assert workspace["parkedCount"] == 0
    assert not {"haltedTenant", "resumeId", "drainingJobId", "haltingJobId"} & set(workspace)
    assert stack.queue_depth(stack.dlq_url) == 0


def test_drain_is_bounded_per_marker_and_parks_new_jobs_behind(stack, workspaces, hooks, lambda_context):
    worker = worker_for(stack, workspaces, drain_jobs_per_marker=2)
    jobs = halted_with_parked(stack, worker, hooks, lambda_context, parked=4)
    assert resume(stack, "d1").outcome == "RESUMING"
    # a job sent during the resume lands between two markers of the drain: it is parked behind the others
    enqueue(stack, make_job("n1", "ws-a"))
    applied_per_marker: list[int] = []
    rounds: list[int] = []

    def count(delivery: dict[str, Any]) -> None:
        rounds.extend(marker.round for marker in markers(delivery))
        applied_per_marker.append(len(workspaces.commits("ws-a")))

    run_until_empty(stack, worker, lambda_context, after_each=count)

    assert workspaces.commits("ws-a") == [*jobs, "n1"]
    assert stack.job("n1")["history"][0]["status"] == "QUEUED"
    assert [h["status"] for h in stack.job("n1")["history"]][-3:] == ["PARKED", "IN_FLIGHT", "SUCCEEDED"]
    assert rounds == [0, 1, 2]
    steps = [b - a for a, b in zip([0, *applied_per_marker], applied_per_marker, strict=False)]
    assert max(steps) <= 2
    assert stack.workspace("ws-a")["state"] == WorkspaceState.ACTIVE


def test_drain_failure_parks_the_job_again_and_retries_from_it(stack, workspaces, hooks, lambda_context):
    worker = worker_for(stack, workspaces)
    jobs = halted_with_parked(stack, worker, hooks, lambda_context, parked=3)
    fail_with(hooks, "p2", RetryableJobError("remote unavailable"), times=1)
    assert resume(stack, "d1").outcome == "RESUMING"

    # When the marker's first delivery fails at p2
    first = deliver(stack, worker, lambda_context)
    assert len(first["failed"]) == 1
    assert workspaces.commits("ws-a") == ["d1", "p1"]
    p2 = stack.job("p2")
    assert (p2["status"], p2["attempt"]) == (JobStatus.PARKED, 1)
    assert stack.workspace("ws-a")["parkedCount"] == 2
    assert stack.workspace("ws-a")["state"] == WorkspaceState.RESUMING

    # Then the next delivery runs p2 before p3
    run_until_empty(stack, worker, lambda_context)
    assert workspaces.commits("ws-a") == jobs
    assert stack.job("p2")["attempt"] == 2
    assert stack.workspace("ws-a")["state"] == WorkspaceState.ACTIVE


def test_drain_exhaustion_halts_again_and_a_second_resume_skips(stack, workspaces, hooks, lambda_context):
    worker = worker_for(stack, workspaces)
    halted_with_parked(stack, worker, hooks, lambda_context, parked=3)
    fail_with(hooks, "p2", RetryableJobError("remote unavailable"))
    assert resume(stack, "d1").outcome == "RESUMING"

    run_until_empty(stack, worker, lambda_context)

    # p2 used its attempts during the drain: DEAD with its body, the workspace HALTED by it, p3 still parked
    assert workspaces.commits("ws-a") == ["d1", "p1"]
    p2 = stack.job("p2")
    assert (p2["status"], p2["attempt"]) == (JobStatus.DEAD, stack.settings.max_attempts)
    assert json.loads(p2["body"])["jobId"] == "p2"
    workspace = stack.workspace("ws-a")
    assert (workspace["state"], workspace["haltingJobId"]) == (WorkspaceState.HALTED, "p2")
    assert stack.job("p3")["status"] == JobStatus.PARKED
    assert stack.queue_depth(stack.dlq_url) == 0

    # When the operator skips p2, p3 runs and the workspace is ACTIVE
    assert resume(stack, "p2", SKIP).outcome == "RESUMING"
    run_until_empty(stack, worker, lambda_context)
    assert workspaces.commits("ws-a") == ["d1", "p1", "p3"]
    assert stack.job("p2")["status"] == JobStatus.SKIPPED
    assert stack.workspace("ws-a")["state"] == WorkspaceState.ACTIVE


def test_drain_retry_of_a_job_that_keeps_failing_halts_again(stack, workspaces, hooks, lambda_context):
    worker = worker_for(stack, workspaces)
    halted_with_parked(stack, worker, hooks, lambda_context, parked=1)
    fail_with(hooks, "d1", PermanentJobError("patch does not apply"))
    assert resume(stack, "d1").outcome == "RESUMING"
    run_until_empty(stack, worker, lambda_context)
    workspace = stack.workspace("ws-a")
    assert (workspace["state"], workspace["haltingJobId"]) == (WorkspaceState.HALTED, "d1")
    assert stack.job("p1")["status"] == JobStatus.PARKED
    assert workspaces.commits("ws-a") == []


def test_job_retried_by_an_operator_that_succeeds_reads_as_a_success_of_its_second_attempt(
    stack, workspaces, hooks, lambda_context, monkeypatch
):
    # Given d1 DEAD after an attempt that failed, and the workspace halted by it
    worker = worker_for(stack, workspaces)
    halted_with_parked(stack, worker, hooks, lambda_context, parked=1)
    dead = stack.job("d1")
    assert (dead["attempt"], dead["error"]) == (1, "patch does not apply")

    # When the operator retries it and it succeeds
    assert resume(stack, "d1").outcome == "RESUMING"
    run_until_empty(stack, worker, lambda_context)
    assert workspaces.commits("ws-a") == ["d1", "p1"]

    # Then the agent reading it sees a success after two attempts, with no current error; its history keeps the
    # failed attempt with its error
    use_environment(monkeypatch, stack.env("EnqueueApiFunction"))
    view = Api(stack).get("d1", claims={"tenant_id": "tenant-1"}).body
    app.reset_services()
    assert (view["status"], view["attempt"], view["error"]) == (JobStatus.SUCCEEDED, 2, None)
    assert [(entry["status"], entry.get("error")) for entry in view["history"] if entry["status"] == "DEAD"] == [
        (JobStatus.DEAD, "patch does not apply")
    ]
    assert [entry["status"] for entry in view["history"]][-2:] == ["IN_FLIGHT", "SUCCEEDED"]


def test_drained_job_that_failed_once_then_succeeded_shows_no_error(stack, workspaces, hooks, lambda_context):
    worker = worker_for(stack, workspaces)
    halted_with_parked(stack, worker, hooks, lambda_context, parked=2)
    fail_with(hooks, "p1", RetryableJobError("remote unavailable"), times=1)
    assert resume(stack, "d1").outcome == "RESUMING"

    run_until_empty(stack, worker, lambda_context)

    p1 = stack.job("p1")
    assert (p1["status"], p1["attempt"], p1.get("error")) == (JobStatus.SUCCEEDED, 2, None)
    assert "remote unavailable" in [entry.get("error") for entry in p1["history"] if entry["status"] == "PARKED"][-1]


def test_stale_marker_is_acknowledged_without_effect(stack, workspaces, hooks, lambda_context):
    worker = worker_for(stack, workspaces)
    halted_with_parked(stack, worker, hooks, lambda_context, parked=1)
    before = stack.workspace("ws-a")

    # A marker of no current resume, on a HALTED workspace
    send_drain_marker(stack.services.sqs, stack.queue_url, DrainMarker(workspace_id="ws-a", resume_id="old"))
    assert deliver(stack, worker, lambda_context)["failed"] == []
    assert stack.workspace("ws-a") == before

    # and an old marker while another resume is running
    result = resume(stack, "d1", SKIP)
    assert result.outcome == "RESUMING"
    stale = DrainMarker(workspace_id="ws-a", resume_id="old", round=5)
    send_drain_marker(stack.services.sqs, stack.queue_url, stale)
    first = deliver(stack, worker, lambda_context)  # the current resume's marker, then the stale one
    assert first["failed"] == []
    assert workspaces.commits("ws-a") == ["p1"]
    assert stack.workspace("ws-a")["state"] == WorkspaceState.ACTIVE
    assert stack.queue_depth() == 0


def test_malformed_marker_is_never_rejected(stack, workspaces, lambda_context, sqs_fifo_record):
    record = sqs_fifo_record("ws#ws-a", {"drain": "parked", "workspaceId": "ws-a"})  # no resumeId
    record["messageAttributes"]["type"] = {"stringValue": "drain", "dataType": "String"}
    response = worker_for(stack, workspaces).handle({"Records": [record]}, lambda_context())
    assert response["batchItemFailures"] == []
    assert stack.workspace("ws-a") is None  # not halted
    assert stack.item(f"msg#{record['messageId']}") is None  # not rejected


def test_marker_near_its_last_delivery_is_replaced_not_rejected(stack, workspaces, hooks, lambda_context):
    # Given a resume whose marker keeps failing (the parked index lags) until its last deliveries
    lagging = LaggingGuard(stack, hide={"d1"})
    worker = worker_for(stack, workspaces, guard=lagging)
    halted_with_parked(stack, worker, hooks, lambda_context, parked=1)
    result = resume(stack, "d1")
    event = stack.receive(10)
    (record,) = event["Records"]
    record["attributes"]["ApproximateReceiveCount"] = str(stack.settings.max_receive_count)

    # When it fails once more
    response = worker.handle(event, lambda_context())
    stack.settle(event, response)

    # Then it is acknowledged, a fresh marker of the same resume takes its place, and nothing was rejected or run
    assert response["batchItemFailures"] == []
    replacement = stack.receive(10)["Records"]
    assert [DrainMarker.model_validate_json(r["body"]).resume_id for r in replacement] == [result.resume_id]
    assert replacement[0]["attributes"]["ApproximateReceiveCount"] == "1"
    assert stack.item(f"msg#{record['messageId']}") is None
    workspace = stack.workspace("ws-a")
    assert workspace["state"] == WorkspaceState.RESUMING
    assert workspaces.commits("ws-a") == []


class LaggingGuard(JobGuard):
    """A guard whose parked index does not show some jobs yet (as an eventually consistent GSI may not)."""

    def __init__(self, stack: Stack, hide: set[str]) -> None:
        super().__init__(stack.services.dynamodb, stack.table_name, max_attempts=stack.settings.max_attempts)
        self.hide = hide
        client = stack.services.dynamodb
        real_query = client.query

        def query(**kwargs: Any) -> Any:
            response = real_query(**kwargs)
            if kwargs.get("IndexName") == "parkedByWorkspace":
                response["Items"] = [i for i in response["Items"] if i["jobId"]["S"] not in self.hide]
            return response

        self._client = _ClientWithQuery(client, query)  # type: ignore[assignment]


class _ClientWithQuery:
    def __init__(self, client: Any, query: Callable[..., Any]) -> None:
        self._inner, self.query = client, query

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.mark.parametrize("hidden", [{"d1"}, {"p1"}])
def test_lagging_index_never_makes_the_workspace_active_or_breaks_order(
    stack, workspaces, hooks, lambda_context, hidden
):
    # Given a resume whose parked index does not show yet one parked job (the retried one, first in order, or another)
    lagging = LaggingGuard(stack, hide=set())
    worker = worker_for(stack, workspaces, guard=lagging)
    jobs = halted_with_parked(stack, worker, hooks, lambda_context, parked=2)
    assert resume(stack, "d1").outcome == "RESUMING"
    lagging.hide = hidden

    # When the marker is delivered while the index lags
    for _ in range(3):
        assert len(deliver(stack, worker, lambda_context)["failed"]) == 1

    # Then nothing ran out of order, and the workspace is not ACTIVE
    assert workspaces.commits("ws-a") == []
    assert stack.workspace("ws-a")["state"] == WorkspaceState.RESUMING

    # and once the index caught up, the drain completes in order
    lagging.hide = set()
    run_until_empty(stack, worker, lambda_context)
    assert workspaces.commits("ws-a") == jobs
    assert stack.workspace("ws-a")["state"] == WorkspaceState.ACTIVE


def test_drain_resumes_a_job_whose_drain_never_came_back(stack, workspaces, hooks, lambda_context):
    # Given a drain that claimed d1 and died (its invocation crashed before any outcome was written)
    worker = worker_for(stack, workspaces)
    jobs = halted_with_parked(stack, worker, hooks, lambda_context, parked=2)
    result = resume(stack, "d1")
    parked = stack.guard.list_parked("ws-a", after_seq=None, expected=3) or []
    assert stack.guard.claim_parked(parked[0], resume_id=str(result.resume_id), remaining_ms=0).claimed
    assert stack.workspace("ws-a")["drainingJobId"] == "d1"

    # When the marker is delivered (again)
    run_until_empty(stack, worker, lambda_context)

    # Then d1 is run before anything behind it, once
    assert workspaces.commits("ws-a") == jobs
    assert stack.job("d1")["attempt"] == 2
    assert stack.workspace("ws-a")["state"] == WorkspaceState.ACTIVE


class ResumedDuringClaimGuard(JobGuard):
    """A guard whose first claim that finds the workspace halted lets an operator's resume (skip, nothing parked)
    land right after it, before the worker parks the job."""

    def __init__(self, stack: Stack) -> None:
        super().__init__(stack.services.dynamodb, stack.table_name, max_attempts=stack.settings.max_attempts)
        self.raced = False

    def claim(self, message: Any, **kwargs: Any) -> Any:
        result = super().claim(message, **kwargs)
        if result.outcome == "WORKSPACE_HALTED" and not self.raced:
            self.raced = True
            halting = str((result.workspace or {})["haltingJobId"])
            begun = self.begin_resume("ws-a", tenant_id="tenant-1", halting_job_id=halting, decision=SKIP, operator="o")
            assert begun.outcome == "ACTIVE"
        return result


def test_job_whose_workspace_resumed_before_it_could_park_runs_under_its_claim(
    stack, workspaces, hooks, lambda_context
):
    # Given ws-a halted by d1 with nothing parked, and a job n1 whose claim sees the halt just before a resume
    worker = worker_for(stack, workspaces)
    halted_with_parked(stack, worker, hooks, lambda_context, parked=0)
    guard = ResumedDuringClaimGuard(stack)
    racing = worker_for(stack, workspaces, guard=guard)
    enqueue(stack, make_job("n1", "ws-a"))

    # When the worker cannot park n1 (the workspace is ACTIVE again)
    first = deliver(stack, racing, lambda_context)

    # Then n1 is not acknowledged as if parked: it still holds its claim, so it runs in this very delivery, once
    assert guard.raced
    assert first["failed"] == []
    assert workspaces.commits("ws-a") == ["n1"]
    job = stack.job("n1")
    assert (job["status"], job["attempt"]) == (JobStatus.SUCCEEDED, 1)
    run_until_empty(stack, racing, lambda_context)
    assert workspaces.commits("ws-a") == ["n1"]


def test_a_halt_that_lands_right_after_a_claims_write_parks_the_job_instead_of_running_it(
    stack, workspaces, lambda_context
):
    # Given ws-a ACTIVE, and a halt (an operator's redrive of a dead-lettered job ahead, say) that lands right after
    # the claim of n1 wrote its lease and before anything else
    worker = worker_for(stack, workspaces)
    enqueue(stack, make_job("n1", "ws-a"))
    halted: list[str] = []

    def remember(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["claim"] = "leaseOwner = :owner" in str(params.get("UpdateExpression", ""))

    def halt_after_the_claim(context: dict[str, Any], **_: Any) -> None:
        if context.get("claim") and not halted:
            halted.append("n1")
            stack.guard.halt_workspace("ws-a", tenant_id="tenant-1", job_id="r0", reason="redriven from the DLQ")

    events = stack.services.dynamodb.meta.events
    events.register("before-parameter-build.dynamodb.UpdateItem", remember)
    events.register("after-call.dynamodb.UpdateItem", halt_after_the_claim)
    try:
        delivered = deliver(stack, worker, lambda_context)
    finally:
        events.unregister("before-parameter-build.dynamodb.UpdateItem", remember)
        events.unregister("after-call.dynamodb.UpdateItem", halt_after_the_claim)

    # Then n1 did not run: it is parked behind the halt, with its claim taken back, and its message acknowledged
    assert halted == ["n1"]
    assert delivered["failed"] == []
    assert workspaces.commits("ws-a") == []
    job = stack.job("n1")
    assert (job["status"], job["attempt"]) == (JobStatus.PARKED, 0)
    workspace = stack.workspace("ws-a")
    assert (workspace["state"], workspace["parkedCount"]) == (WorkspaceState.HALTED, 1)


def test_drain_never_passes_a_drained_job_left_dead_under_another_halt(stack, workspaces, hooks, lambda_context):
    # Given a drain running d1 when a DLQ redrive parks an earlier job r0 and halts ws-a (the resume ends), and d1
    # then fails permanently: d1 is DEAD and still the drain's cursor, but the workspace names r0 (first halt wins)
    worker = worker_for(stack, workspaces)
    halted_with_parked(stack, worker, hooks, lambda_context, parked=2)
    first = resume(stack, "d1")
    parked = stack.guard.list_parked("ws-a", after_seq=None, expected=3) or []
    claim = stack.guard.claim_parked(parked[0], resume_id=str(first.resume_id), remaining_ms=60_000)
    assert claim.lease is not None
    r0 = make_message("r0")
    assert stack.guard.park(
        r0,
        message_id="m-r0",
        sequence_number="1",
        body=r0.model_dump_json(by_alias=True),
        reason="dead-lettered by the queue; redriven",
        halt_workspace=True,
    )
    assert stack.guard.fail(claim.lease, "patch does not apply", permanent=True, body="{}") is FailOutcome.DEAD
    assert stack.workspace("ws-a")["haltingJobId"] == "r0"

    # When the operator skips r0 (d1 is undecided too: the workspace stays HALTED by it) and the worker runs
    assert resume(stack, "r0", SKIP).outcome == "DECIDED"
    run_until_empty(stack, worker, lambda_context)

    # Then nothing behind d1 took effect while d1 is DEAD (halt on failure): d1 halts the workspace for a decision
    assert workspaces.commits("ws-a") == []
    workspace = stack.workspace("ws-a")
    assert (workspace["state"], workspace["haltingJobId"]) == (WorkspaceState.HALTED, "d1")
    # and once d1 is skipped, the jobs behind it run in order
    assert resume(stack, "d1", SKIP).outcome == "RESUMING"
    run_until_empty(stack, worker, lambda_context)
    assert workspaces.commits("ws-a") == ["p1", "p2"]
    assert stack.workspace("ws-a")["state"] == WorkspaceState.ACTIVE


def test_record_behind_a_retried_marker_near_its_limit_is_parked_without_ending_the_resume(
    stack, workspaces, hooks, lambda_context
):
    # Given a resume whose marker fails (the parked index lags) with a new job n1 behind it in the same batch, n1 at
    # the receive count where the worker parks a failed record rather than let the queue dead-letter it
    lagging = LaggingGuard(stack, hide={"d1"})
    worker = worker_for(stack, workspaces, guard=lagging)
    halted_with_parked(stack, worker, hooks, lambda_context, parked=1)
    result = resume(stack, "d1")
    enqueue(stack, make_job("n1", "ws-a"))
    event = stack.receive(10)
    _marker, n1 = event["Records"]
    assert json.loads(n1["body"])["jobId"] == "n1"
    n1["attributes"]["ApproximateReceiveCount"] = str(stack.settings.max_receive_count)

    # When the batch fails at the marker
    response = worker.handle(event, lambda_context())
    stack.settle(event, response)

    # Then n1 is parked behind the others and the resume goes on (n1 did not halt the workspace: it never failed)
    assert stack.job("n1")["status"] == JobStatus.PARKED
    workspace = stack.workspace("ws-a")
    assert (workspace["state"], workspace["resumeId"]) == (WorkspaceState.RESUMING, result.resume_id)
    assert "haltingJobId" not in workspace
    lagging.hide = set()
    run_until_empty(stack, worker, lambda_context)
    assert workspaces.commits("ws-a") == ["d1", "p1", "n1"]
    assert stack.workspace("ws-a")["state"] == WorkspaceState.ACTIVE


def test_dlq_redrive_of_a_stale_drain_marker_deletes_it_without_halting(stack, workspaces, hooks, lambda_context):
    # Given a resume that finished (ws-a ACTIVE) and a drain marker of it in the DLQ (its delivery crashed until the
    # queue moved it)
    worker = worker_for(stack, workspaces)
    halted_with_parked(stack, worker, hooks, lambda_context, parked=1)
    result = resume(stack, "d1", SKIP)
    run_until_empty(stack, worker, lambda_context)
    assert stack.workspace("ws-a")["state"] == WorkspaceState.ACTIVE
    send_drain_marker(
        stack.services.sqs, stack.dlq_url, DrainMarker(workspace_id="ws-a", resume_id=str(result.resume_id))
    )

    # When the operator redrives the DLQ
    (redriven,) = DeadLetterQueue(stack.services.sqs, stack.dlq_url).redrive(
        stack.guard,
        select_workspace=lambda _: True,
        owner_of=registered_owners(stack.services.dynamodb, stack.table_name),
    )

    # Then the marker is deleted without effect, as the worker acknowledges a stale marker: nothing rejected or halted
    assert (redriven.outcome, redriven.deleted) == (RedriveOutcome.STALE_MARKER, True)
    assert stack.item(f"msg#{redriven.message_id}") is None
    assert stack.workspace("ws-a")["state"] == WorkspaceState.ACTIVE
    assert stack.queue_depth(stack.dlq_url) == 0


def test_drain_stops_before_a_parked_job_whose_predecessor_left_the_queue_unsettled(
    stack, workspaces, hooks, lambda_context
):
    # Given ws-a halted by d1, then m1 and p1 accepted behind it; m1's message leaves the queue unseen (dead-lettered
    # while the workspace was halted) and p1 is parked
    worker = worker_for(stack, workspaces)
    fail_with(hooks, "d1", PermanentJobError("patch does not apply"))
    enqueue(stack, make_job("d1", "ws-a"))
    run_until_empty(stack, worker, lambda_context)
    enqueue(stack, make_job("m1", "ws-a"), make_job("p1", "ws-a"))
    event = stack.receive(10)
    gone = [r for r in event["Records"] if json.loads(r["body"])["jobId"] == "m1"]
    assert len(gone) == 1
    stack.services.sqs.delete_message(QueueUrl=stack.queue_url, ReceiptHandle=gone[0]["receiptHandle"])
    event = {"Records": [r for r in event["Records"] if r not in gone]}
    stack.settle(event, worker.handle(event, lambda_context()))
    assert stack.job("p1")["status"] == JobStatus.PARKED
    assert stack.job("m1")["status"] == JobStatus.QUEUED

    # When the operator skips d1 and the drain runs
    assert resume(stack, "d1", SKIP).outcome == "RESUMING"
    run_until_empty(stack, worker, lambda_context)

    # Then p1 never runs ahead of m1: the drain halts the workspace by m1 and p1 stays parked in its place
    assert workspaces.commits("ws-a") == []
    assert stack.job("p1")["status"] == JobStatus.PARKED
    workspace = stack.workspace("ws-a")
    assert workspace["state"] == WorkspaceState.HALTED
    assert workspace["haltingJobId"] == "m1"
    assert "dlq redrive" in workspace["haltReason"]


def test_a_job_claimed_just_before_its_predecessor_is_redriven_parks_instead_of_running(
    stack, workspaces, hooks, lambda_context
):
    # Given m1 and p1 accepted on ws-a; m1's message leaves the queue unseen (dead-lettered) while m1 is QUEUED
    worker = worker_for(stack, workspaces)
    enqueue(stack, make_job("m1", "ws-a"), make_job("p1", "ws-a"))
    event = stack.receive(10)
    gone = [r for r in event["Records"] if json.loads(r["body"])["jobId"] == "m1"]
    assert len(gone) == 1
    stack.services.sqs.delete_message(QueueUrl=stack.queue_url, ReceiptHandle=gone[0]["receiptHandle"])
    event = {"Records": [r for r in event["Records"] if r not in gone]}

    # When the operator's redrive parks m1 and halts ws-a after p1's claim and before p1's check of the jobs ahead
    guard = worker.services.guard
    check = guard.jobs_ahead

    def redrive_lands_first(*args: Any, **kwargs: Any) -> Any:
        if guard.get_job("tenant-1", "m1")["status"] == JobStatus.QUEUED:
            assert stack.job("p1")["status"] == JobStatus.IN_FLIGHT  # p1 is claimed
            parked = guard.park(
                make_message("m1"),
                message_id=gone[0]["messageId"],
                sequence_number=gone[0]["attributes"]["SequenceNumber"],
                body=gone[0]["body"],
                reason="dead-lettered by the queue after 10 receives; redriven",
                halt_workspace=True,
            )
            assert parked
        return check(*args, **kwargs)

    guard.jobs_ahead = redrive_lands_first
    stack.settle(event, worker.handle(event, lambda_context()))

    # Then p1 does not take effect ahead of m1: it parks behind the halt, in its place, and m1 halts ws-a
    assert workspaces.commits("ws-a") == []
    assert stack.job("m1")["status"] == JobStatus.PARKED
    assert stack.job("p1")["status"] == JobStatus.PARKED
    workspace = stack.workspace("ws-a")
    assert workspace["state"] == WorkspaceState.HALTED
    assert workspace["haltingJobId"] == "m1"
    assert int(workspace["parkedCount"]) == 2

    # And a resume that retries m1 runs both, in order
    assert resume(stack, "m1", RETRY).outcome == "RESUMING"
    run_until_empty(stack, worker, lambda_context)
    assert workspaces.commits("ws-a") == ["m1", "p1"]
