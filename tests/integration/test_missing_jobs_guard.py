"""Jobs a workspace accepted that left the queue unsettled: the guard's pending index, the check a claim makes before
a job runs, the halt naming the missing jobs and the resume decisions on them. On moto in-process and on moto's
server over HTTP (the table and its sparse pending index created from template.yaml)."""

from __future__ import annotations

from typing import Any

import pytest

from agent_jobs.guard import AcceptOutcome, ClaimOutcome, FailOutcome, JobGuard, ResumeOutcome
from agent_jobs.keys import job_key
from agent_jobs.models import JobStatus, ResumeDecision, WorkspaceState
from tests.conftest import ManualClock, Stack, make_message, register_workspace

RETRY, SKIP = ResumeDecision.RETRY, ResumeDecision.SKIP


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def guard(any_stack: Stack, clock: ManualClock) -> JobGuard:
    register_workspace(any_stack, "ws-a", "tenant-1")
    return JobGuard(any_stack.services.dynamodb, any_stack.table_name, max_attempts=3, clock=clock)


def accepted(guard: JobGuard, job_id: str, seq: str) -> Any:
    """A job recorded QUEUED and sent at `seq`, as the producer leaves it."""
    message = make_message(job_id)
    assert guard.record_accepted(message).outcome is AcceptOutcome.NEW
    guard.record_sent("tenant-1", job_id, f"m-{job_id}", seq)
    return message


def missing(guard: JobGuard, job_id: str, seq: str) -> list[str]:
    found = guard.jobs_ahead("ws-a", tenant_id="tenant-1", job_id=job_id, sequence_number=seq, sent_at=None).all
    return [str(item["jobId"]) for item in found]


def run(guard: JobGuard, message: Any, seq: str) -> None:
    claim = guard.claim(message, message_id=f"m-{message.job_id}", sequence_number=seq, remaining_ms=60_000)
    assert claim.lease is not None
    assert guard.complete(claim.lease, {"ok": True})


def test_jobs_accepted_ahead_and_unsettled_are_missing_until_they_succeed(guard: JobGuard):
    first, second = accepted(guard, "a1", "100"), accepted(guard, "a2", "200")
    accepted(guard, "a3", "300")
    assert missing(guard, "a3", "300") == ["a1", "a2"]
    assert missing(guard, "a1", "100") == []  # the jobs behind a job never stop it
    run(guard, first, "100")
    assert missing(guard, "a3", "300") == ["a2"]
    run(guard, second, "200")
    assert missing(guard, "a3", "300") == []


def test_sequence_numbers_are_compared_as_numbers(guard: JobGuard):
    accepted(guard, "a1", "99")
    accepted(guard, "a2", "100")
    assert missing(guard, "a2", "100") == ["a1"]  # as strings, "99" would sort after "100"


def test_jobs_the_halt_machinery_holds_are_not_missing(guard: JobGuard, any_stack: Stack):
    # A parked job is run in order by a resume, a DEAD one halts the workspace until an operator decides it
    dead = accepted(guard, "a1", "100")
    claim = guard.claim(dead, message_id="m-a1", sequence_number="100", remaining_ms=60_000)
    assert claim.lease is not None
    assert guard.fail(claim.lease, "bad patch", permanent=True) is FailOutcome.DEAD
    parked = accepted(guard, "a2", "200")
    assert guard.park(parked, message_id="m-a2", sequence_number="200", body="{}", reason="workspace halted")
    accepted(guard, "a3", "300")
    assert missing(guard, "a3", "300") == []


def test_a_job_a_redrive_parks_stays_ahead_of_the_jobs_behind_it_until_it_runs(guard: JobGuard, any_stack: Stack):
    # The redrive parks a dead-lettered job and halts the workspace in one write; a job behind it may have been claimed
    # just before that write, while the workspace was ACTIVE: its check must still find the parked job ahead
    redriven = accepted(guard, "a1", "100")
    accepted(guard, "a2", "200")
    assert guard.park(
        redriven, message_id="m-a1", sequence_number="100", body="{}", reason="redriven", halt_workspace=True
    )
    assert missing(guard, "a2", "200") == ["a1"]
    assert any_stack.job("a1")["status"] == JobStatus.PARKED
    # Skipped by an operator (or run by a resume), it no longer stands ahead
    resumed = guard.begin_resume("ws-a", tenant_id="tenant-1", halting_job_id="a1", decision=SKIP, operator="op")
    assert resumed.outcome is ResumeOutcome.ACTIVE  # nothing else was parked
    assert missing(guard, "a2", "200") == []


def test_an_index_entry_of_a_job_that_settled_meanwhile_is_not_missing(guard: JobGuard, any_stack: Stack):
    # The index lags behind the table: an entry whose job SUCCEEDED a moment ago is read again, consistently
    accepted(guard, "a1", "100")
    any_stack.services.dynamodb.update_item(
        TableName=any_stack.table_name,
        Key={"pk": {"S": job_key("tenant-1", "a1")}},
        UpdateExpression="SET #status = :succeeded",  # the job settled; the entry is still indexed
        ExpressionAttributeNames={"#status": "status"},
        ExpressionAttributeValues={":succeeded": {"S": str(JobStatus.SUCCEEDED)}},
    )
    accepted(guard, "a2", "200")
    assert missing(guard, "a2", "200") == []


def test_another_tenants_record_naming_the_workspace_is_ignored(guard: JobGuard, any_stack: Stack):
    any_stack.services.dynamodb.put_item(
        TableName=any_stack.table_name,
        Item={
            "pk": {"S": job_key("tenant-2", "evil")},
            "jobId": {"S": "evil"},
            "tenantId": {"S": "tenant-2"},
            "status": {"S": str(JobStatus.QUEUED)},
            "pendingWorkspace": {"S": "ws-a"},
            "queueSeq": {"S": "0" * 40},
        },
    )
    accepted(guard, "a1", "100")
    assert missing(guard, "a1", "100") == []


def test_a_job_keeps_the_place_in_the_queue_it_was_first_recorded_at(guard: JobGuard, any_stack: Stack):
    message = accepted(guard, "a1", "100")
    claim = guard.claim(message, message_id="m-again", sequence_number="500", remaining_ms=60_000)  # sent again
    assert claim.lease is not None
    assert any_stack.job("a1")["queueSeq"] == "100".rjust(40, "0")
    accepted(guard, "a2", "200")
    assert missing(guard, "a2", "200") == ["a1"]


def test_missing_jobs_halt_their_workspace_and_each_is_decided_before_anything_runs(guard: JobGuard, any_stack: Stack):
    accepted(guard, "a1", "100")
    accepted(guard, "a2", "200")
    behind = accepted(guard, "a3", "300")
    claim = guard.claim(behind, message_id="m-a3", sequence_number="300", remaining_ms=60_000)
    assert claim.lease is not None
    found = guard.jobs_ahead("ws-a", tenant_id="tenant-1", job_id="a3", sequence_number="300", sent_at=None).all
    assert guard.park(
        behind,
        message_id="m-a3",
        sequence_number="300",
        body="{}",
        reason="behind missing jobs",
        lease=claim.lease,
        missing=found,
    )
    assert any_stack.job("a3")["status"] == JobStatus.PARKED
    workspace = any_stack.workspace("ws-a")
    assert workspace["state"] == WorkspaceState.HALTED
    assert workspace["haltingJobId"] == "a1"
    assert set(workspace["undecidedJobIds"]) == {"a1", "a2"}
    assert "a1, a2" in workspace["haltReason"]
    assert "dlq redrive --workspace ws-a" in workspace["haltReason"]

    # A missing job cannot be retried from the table (its message is in the DLQ): the refusal says to redrive it
    refused = guard.begin_resume("ws-a", tenant_id="tenant-1", halting_job_id="a1", decision=RETRY, operator="op")
    assert refused.outcome is ResumeOutcome.RETRY_REFUSED
    assert "redrive" in (refused.reason or "")
    # Skipping them one at a time, earliest first, resumes the workspace
    decided = guard.begin_resume("ws-a", tenant_id="tenant-1", halting_job_id="a1", decision=SKIP, operator="op")
    assert decided.outcome is ResumeOutcome.DECIDED
    assert any_stack.workspace("ws-a")["haltingJobId"] == "a2"
    resumed = guard.begin_resume("ws-a", tenant_id="tenant-1", halting_job_id="a2", decision=SKIP, operator="op")
    assert resumed.outcome is ResumeOutcome.RESUMING  # a3 drains next
    assert [any_stack.job(j)["status"] for j in ("a1", "a2")] == [JobStatus.SKIPPED, JobStatus.SKIPPED]
    accepted(guard, "a4", "400")
    assert missing(guard, "a4", "400") == []


# ---- a job's queue place: decided once, by what the queue holds -----------------------------------------------------


def test_a_recorded_place_never_moves_later_and_a_resend_is_answered_with_it(guard: JobGuard, any_stack: Stack):
    accepted(guard, "a1", "100")
    # A resend after the deduplication window is a second message with a later SequenceNumber
    place = guard.record_sent("tenant-1", "a1", "m-again", "500")
    assert (place.message_id, place.sequence_number) == ("m-a1", "100")
    assert (any_stack.job("a1")["sequenceNumber"], any_stack.job("a1")["messageId"]) == ("100", "m-a1")
    assert any_stack.job("a1")["queueSeq"] == "100".rjust(40, "0")


def test_a_claimed_copy_places_a_job_whose_send_was_never_confirmed(guard: JobGuard, any_stack: Stack):
    message = make_message("a1")
    guard.record_accepted(message)
    claim = guard.claim(message, message_id="m-a1", sequence_number="100", remaining_ms=60_000)
    assert claim.lease is not None
    assert claim.place == "100"
    # The producer's late answer of another send finds the job placed by the copy the worker claimed
    assert guard.record_sent("tenant-1", "a1", "m-other", "300").sequence_number == "100"


def test_an_earlier_copy_than_the_recorded_place_is_not_claimed(guard: JobGuard, any_stack: Stack):
    message = make_message("a1")
    guard.record_accepted(message)
    guard.record_sent("tenant-1", "a1", "m-second", "300")  # the send answered after the window: a second message
    stale = guard.claim(message, message_id="m-first", sequence_number="100", remaining_ms=60_000)
    assert stale.outcome is ClaimOutcome.STALE_COPY
    assert stale.lease is None
    assert any_stack.job("a1")["status"] == JobStatus.QUEUED
    later = guard.claim(message, message_id="m-second", sequence_number="300", remaining_ms=60_000)
    assert later.lease is not None


def test_a_later_copy_than_the_recorded_place_runs_at_the_recorded_place(guard: JobGuard, any_stack: Stack):
    message = accepted(guard, "a1", "100")
    claim = guard.claim(message, message_id="m-again", sequence_number="500", remaining_ms=60_000)
    assert claim.lease is not None
    assert claim.place == "100"
    assert any_stack.job("a1")["sequenceNumber"] == "100"


def test_a_job_accepted_but_not_confirmed_is_ahead_of_every_job_sent_after_it(
    guard: JobGuard, any_stack: Stack, clock: ManualClock
):
    guard.record_accepted(make_message("a1"))  # its send's answer never recorded: unplaced
    assert any_stack.job("a1")["queueSeq"].startswith("!")
    accepted(guard, "a2", "200")
    sent_at = int(any_stack.job("a2")["sentAt"])
    ahead = guard.jobs_ahead(
        "ws-a", tenant_id="tenant-1", job_id="a2", sequence_number="200", sent_at=sent_at, unplaced_grace_ms=30_000
    )
    assert ([str(i["jobId"]) for i in ahead.unplaced], ahead.missing) == (["a1"], [])
    # Past its grace, it is a job the queue lost: missing, as the halt names it
    clock.advance(31)
    ahead = guard.jobs_ahead(
        "ws-a", tenant_id="tenant-1", job_id="a2", sequence_number="200", sent_at=sent_at, unplaced_grace_ms=30_000
    )
    assert ([str(i["jobId"]) for i in ahead.missing], ahead.unplaced) == (["a1"], [])
    # Confirmed, it is placed where the queue put it, and ahead as any job is
    assert guard.record_sent("tenant-1", "a1", "m-a1", "150").sequence_number == "150"
    assert missing(guard, "a2", "200") == ["a1"]


def test_a_job_accepted_after_this_one_was_sent_is_not_ahead_of_it(
    guard: JobGuard, any_stack: Stack, clock: ManualClock
):
    accepted(guard, "a1", "100")
    sent_at = int(any_stack.job("a1")["sentAt"])
    clock.advance(2)  # past the margin allowed for the producers' clocks
    guard.record_accepted(make_message("a2"))  # unplaced, and recorded after a1's send: behind it in the queue
    ahead = guard.jobs_ahead(
        "ws-a", tenant_id="tenant-1", job_id="a1", sequence_number="100", sent_at=sent_at, unplaced_grace_ms=30_000
    )
    assert (ahead.missing, ahead.unplaced) == ([], [])
