"""The worker after invocations that died: a job whose claim died with a shared invocation runs alone, after the
groups that run at once, the ones that only shared a dead invocation before the one that died alone; and a job whose
predecessors left the queue unsettled is parked behind them, its workspace halted naming them."""

from __future__ import annotations

import json
import time
from typing import Any

from agent_jobs.models import JobStatus, WorkspaceState
from tests.conftest import Stack, enqueue, make_job, make_message


def _die_with_invocation(stack: Stack, job_id: str, workspace_id: str, *, alone: bool) -> None:
    """Leave `job_id` IN_FLIGHT under a lease that has expired, as an invocation that died with it leaves it."""
    claim = stack.guard.claim(
        make_message(job_id, workspace_id), message_id=f"m-{job_id}", sequence_number=None, remaining_ms=1, alone=alone
    )
    assert claim.claimed
    time.sleep(0.01)


def test_suspects_run_alone_after_the_others_the_culprit_last(
    any_stack, make_worker, workspaces, hooks, lambda_context
):
    # Given a batch of x-0 (its last claim died alone), b-0 and b-1 (b-0's claim died beside other jobs) and c-0
    enqueue(
        any_stack,
        make_job("x-0", workspace_id="ws-x"),
        make_job("b-0", workspace_id="ws-b"),
        make_job("b-1", workspace_id="ws-b"),
        make_job("c-0", workspace_id="ws-c"),
    )
    _die_with_invocation(any_stack, "x-0", "ws-x", alone=True)
    _die_with_invocation(any_stack, "b-0", "ws-b", alone=False)
    started: list[str] = []
    for job_id in ("x-0", "b-0", "b-1", "c-0"):
        hooks.before_commit[job_id] = lambda j=job_id: started.append(j)

    # When the worker runs it with its groups at once
    event = any_stack.receive(10)
    assert len(event["Records"]) == 4
    response = make_worker(any_stack).handle(event, lambda_context())

    # Then c-0 ran with the groups at once, and then, one at a time, ws-b from b-0 on and x-0 last
    assert response["batchItemFailures"] == []
    assert started == ["c-0", "b-0", "b-1", "x-0"]
    for job_id in started:
        assert any_stack.job(job_id)["status"] == JobStatus.SUCCEEDED
    assert any_stack.job("c-0")["leaseShared"] is True  # claimed beside the others
    assert not any("leaseShared" in any_stack.job(job_id) for job_id in ("b-0", "b-1", "x-0"))  # claimed alone
    assert any_stack.job("b-0")["attempt"] == 2


def test_a_job_whose_predecessors_left_the_queue_is_parked_and_halts_its_workspace(
    any_stack, make_worker, workspaces, lambda_context
):
    # Given a1, a2 and a3 accepted for ws-a, and a1 and a2 gone from the queue without the worker seeing them
    enqueue(any_stack, *(make_job(job_id, workspace_id="ws-a") for job_id in ("a1", "a2", "a3")))
    for _ in range(2):
        record = any_stack.receive(1)["Records"][0]
        any_stack.services.sqs.delete_message(QueueUrl=any_stack.queue_url, ReceiptHandle=record["receiptHandle"])

    # When the worker gets a3
    event = any_stack.receive(10)
    assert [json.loads(r["body"])["jobId"] for r in event["Records"]] == ["a3"]
    response = make_worker(any_stack).handle(event, lambda_context())

    # Then a3 did not run: it is parked behind them and ws-a is halted by a1, naming both
    assert response["batchItemFailures"] == []
    assert workspaces.commits("ws-a") == []
    assert any_stack.job("a3")["status"] == JobStatus.PARKED
    workspace: Any = any_stack.workspace("ws-a")
    assert workspace["state"] == WorkspaceState.HALTED
    assert workspace["haltingJobId"] == "a1"
    assert "jobs a1, a2 were accepted before job a3" in workspace["haltReason"]
    assert set(workspace["undecidedJobIds"]) == {"a1", "a2"}
