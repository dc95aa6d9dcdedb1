"""The transition table: every row is a legal transition, nothing outside it is, and the store's conditions allow
exactly what the table allows."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from agent_jobs.core.transitions import (
    DECIDABLE,
    JOB_TRANSITIONS,
    WORKSPACE_TRANSITIONS,
    IllegalTransition,
    JobAction,
    Transition,
    WorkspaceAction,
    job_sources,
    job_target,
    workspace_sources,
    workspace_target,
)
from agent_jobs.models import JobMessage, JobStatus, JobType, WorkspaceState
from agent_jobs.store import JobGuard

JOB_STATES: list[JobStatus | None] = [None, *JobStatus]
WORKSPACE_STATES: list[WorkspaceState | None] = [None, *WorkspaceState]


@pytest.mark.parametrize("row", JOB_TRANSITIONS, ids=lambda row: f"{row.action}:{row.source}->{row.target}")
def test_every_job_row_is_a_legal_transition(row: Transition) -> None:
    assert job_target(JobAction(row.action), JobStatus(row.source) if row.source else None) == row.target
    assert row.when, "every row says when it applies"


@pytest.mark.parametrize("row", WORKSPACE_TRANSITIONS, ids=lambda row: f"{row.action}:{row.source}->{row.target}")
def test_every_workspace_row_is_a_legal_transition(row: Transition) -> None:
    source = WorkspaceState(row.source) if row.source else None
    assert workspace_target(WorkspaceAction(row.action), source) == row.target


@pytest.mark.parametrize("action", list(JobAction))
def test_a_job_action_from_any_other_state_is_illegal(action: JobAction) -> None:
    allowed = job_sources(action)
    assert allowed, f"{action} has no row"
    for state in JOB_STATES:
        if state not in allowed:
            with pytest.raises(IllegalTransition, match=str(action)):
                job_target(action, state)


@pytest.mark.parametrize("action", list(WorkspaceAction))
def test_a_workspace_action_from_any_other_state_is_illegal(action: WorkspaceAction) -> None:
    allowed = workspace_sources(action)
    assert allowed
    for state in WORKSPACE_STATES:
        if state not in allowed:
            with pytest.raises(IllegalTransition):
                workspace_target(action, state)


def test_done_jobs_never_change_and_every_other_state_can_end() -> None:
    sources = {row.source for row in JOB_TRANSITIONS}
    assert JobStatus.SUCCEEDED not in sources
    assert JobStatus.SKIPPED not in sources
    reached = {row.target for row in JOB_TRANSITIONS}
    assert reached == set(JobStatus), "every state is reachable"
    for status in set(JobStatus) - {JobStatus.SUCCEEDED, JobStatus.SKIPPED}:
        assert status in sources, f"{status} has no way out"


def test_a_resume_decides_every_state_a_halting_job_can_be_in() -> None:
    assert {
        JobStatus.DEAD,
        JobStatus.REJECTED,
        JobStatus.PARKED,
        JobStatus.QUEUED,
        JobStatus.FAILED,
        JobStatus.IN_FLIGHT,
    } == DECIDABLE
    # Only a job whose message is stored can run again.
    assert job_sources(JobAction.RETRY) == {JobStatus.DEAD, JobStatus.PARKED}


class _Refusing:
    """A DynamoDB client that records the request and refuses it as a failed condition would."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    def update_item(self, **request: Any) -> None:
        self.requests.append(request)
        response: dict[str, Any] = {"Error": {"Code": "ConditionalCheckFailedException"}}
        raise ClientError(response, "UpdateItem")  # type: ignore[arg-type]

    def transact_write_items(self, **request: Any) -> None:
        self.requests.append(request)
        response: dict[str, Any] = {
            "Error": {"Code": "TransactionCanceledException"},
            "CancellationReasons": [{"Code": "None"} for _ in request["TransactItems"]],
        }
        raise ClientError(response, "TransactWriteItems")  # type: ignore[arg-type]


def _statuses(update: dict[str, Any], condition: str) -> set[str]:
    values = update["ExpressionAttributeValues"]
    names = [token.strip("(),") for token in condition.split("IN (", 1)[1].split(")", 1)[0].split(",")]
    return {values[name.strip()]["S"] for name in names}


def test_the_claim_condition_allows_exactly_the_tables_sources() -> None:
    client = _Refusing()
    guard = JobGuard(client, "jobs")  # type: ignore[arg-type]
    message = JobMessage(
        job_id="j1", workspace_id="w1", tenant_id="t1", type=JobType.RUN_TESTS, payload={}, payload_hash="0" * 64
    )
    guard.claim(message, message_id="m1", sequence_number="1", remaining_ms=1000)
    update = client.requests[0]
    condition = update["ConditionExpression"]
    recorded = {str(state) for state in job_sources(JobAction.CLAIM) if state is not None}
    assert _statuses(update, condition) == recorded
    assert "attribute_not_exists(pk)" in condition  # the row from no record
    assert "leaseExpiresAt < :now" in condition  # the take-over row from IN_FLIGHT


def test_the_drain_condition_allows_exactly_the_tables_sources() -> None:
    client = _Refusing()
    guard = JobGuard(client, "jobs")  # type: ignore[arg-type]
    job = {"jobId": "j1", "tenantId": "t1", "workspaceId": "w1", "parkedSeq": "1"}
    guard.claim_parked(job, resume_id="r1", remaining_ms=1000)
    update = client.requests[0]["TransactItems"][0]["Update"]
    assert _statuses(update, update["ConditionExpression"]) == {str(JobStatus.PARKED)}
