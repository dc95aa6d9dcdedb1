"""The guard's transitions, one by one, on moto in-process (the table created from template.yaml)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from agent_jobs.guard import (
    MAX_STORED_BODY_CHARS,
    MAX_STORED_ERROR_CHARS,
    AcceptOutcome,
    ClaimOutcome,
    FailOutcome,
    JobGuard,
)
from agent_jobs.models import JobStatus, WorkspaceState
from agent_jobs.registration import WorkspaceRegistration
from agent_jobs.workspaces import WorkspaceRegistry
from tests.conftest import ManualClock, Stack, count_dynamodb_calls, make_message, register_workspace


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def guard(stack: Stack, clock: ManualClock) -> JobGuard:
    register_workspace(stack, "ws-a", "tenant-1")  # the workspace of make_message's jobs: the producer takes none else
    return JobGuard(stack.services.dynamodb, stack.table_name, max_attempts=3, clock=clock)


def claim(guard: JobGuard, message: Any, remaining_ms: int = 60_000) -> Any:
    return guard.claim(message, message_id="m-1", sequence_number="100", remaining_ms=remaining_ms)


def test_claim_new_job_sets_in_flight_with_lease_and_attempt(guard: JobGuard, stack: Stack, clock: ManualClock):
    result = claim(guard, make_message("j1"))
    assert result.outcome is ClaimOutcome.CLAIMED
    assert result.lease is not None
    assert result.lease.expires_at_ms == clock.now + 60_000
    job = stack.job("j1")
    assert job["status"] == JobStatus.IN_FLIGHT
    assert job["attempt"] == 1
    assert job["leaseOwner"] == result.lease.owner
    assert job["sequenceNumber"] == "100"
    assert [h["status"] for h in job["history"]] == ["IN_FLIGHT"]


def test_claim_accepted_job_keeps_acceptance_time(guard: JobGuard, stack: Stack, clock: ManualClock):
    message = make_message("j1")
    assert guard.record_accepted(message).outcome is AcceptOutcome.NEW
    accepted_at = stack.job("j1")["acceptedAt"]
    clock.advance(5)
    assert claim(guard, message).claimed
    job = stack.job("j1")
    assert job["acceptedAt"] == accepted_at
    assert [h["status"] for h in job["history"]] == ["QUEUED", "IN_FLIGHT"]


def test_claim_while_leased_is_busy_and_changes_nothing(guard: JobGuard, stack: Stack, clock: ManualClock):
    message = make_message("j1")
    first = claim(guard, message)
    clock.advance(59)
    second = claim(guard, message)
    assert second.outcome is ClaimOutcome.BUSY
    assert second.previous is not None
    assert second.previous["leaseOwner"] == first.lease.owner
    assert stack.job("j1")["attempt"] == 1


def test_claim_after_lease_expiry_takes_over_with_a_new_owner(guard: JobGuard, stack: Stack, clock: ManualClock):
    message = make_message("j1")
    first = claim(guard, message)
    clock.advance(61)
    second = claim(guard, message)
    assert second.claimed
    assert second.lease.owner != first.lease.owner
    assert stack.job("j1")["attempt"] == 2
    # the first owner's writes are fenced off
    assert guard.complete(first.lease, {"by": "stale"}) is False
    assert guard.fail(first.lease, "stale error") is FailOutcome.LOST
    assert guard.complete(second.lease, {"by": "owner"}) is True
    job = stack.job("j1")
    assert job["status"] == JobStatus.SUCCEEDED
    assert job["result"] == {"by": "owner"}


def test_claim_after_success_is_a_duplicate(guard: JobGuard):
    message = make_message("j1")
    guard.complete(claim(guard, message).lease, {})
    assert claim(guard, message).outcome is ClaimOutcome.DUPLICATE


def test_claim_with_another_payload_is_a_conflict(guard: JobGuard, stack: Stack):
    guard.record_accepted(make_message("j1"))
    other = make_message("j1", job_type="open_pr", payload={"title": "something else"})
    result = claim(guard, other)
    assert result.outcome is ClaimOutcome.CONFLICT
    assert stack.job("j1")["status"] == JobStatus.QUEUED


def test_fail_retries_until_max_attempts_then_dead_and_halted(guard: JobGuard, stack: Stack):
    message = make_message("j1", workspace_id="ws-x")
    outcomes = []
    for _ in range(3):
        lease = claim(guard, message).lease
        outcomes.append(guard.fail(lease, "boom"))
    assert outcomes == [FailOutcome.RETRY, FailOutcome.RETRY, FailOutcome.DEAD]
    job = stack.job("j1")
    assert job["status"] == JobStatus.DEAD
    assert "attempt 3 of 3" in job["error"]
    workspace = stack.workspace("ws-x")
    assert workspace["state"] == WorkspaceState.HALTED
    assert workspace["haltingJobId"] == "j1"
    assert workspace["tenantId"] == "tenant-1"
    assert claim(guard, message).outcome is ClaimOutcome.SETTLED


def test_permanent_failure_is_dead_at_once(guard: JobGuard, stack: Stack):
    lease = claim(guard, make_message("j1")).lease
    assert guard.fail(lease, "patch does not apply", permanent=True) is FailOutcome.DEAD
    assert stack.job("j1")["attempt"] == 1
    assert stack.workspace("ws-a")["state"] == WorkspaceState.HALTED


def test_claim_when_every_attempt_crashed_makes_the_job_dead(guard: JobGuard, stack: Stack, clock: ManualClock):
    # Given three deliveries whose workers all died without recording an outcome
    message = make_message("j1")
    for _ in range(3):
        assert claim(guard, message).claimed
        clock.advance(61)
    # When it is delivered again, Then it is not run a fourth time: DEAD and the workspace halted
    assert claim(guard, message).outcome is ClaimOutcome.EXHAUSTED
    assert stack.job("j1")["status"] == JobStatus.DEAD
    assert stack.workspace("ws-a")["state"] == WorkspaceState.HALTED


def test_claims_whose_worker_never_came_back_do_not_use_up_failed_attempts(stack: Stack, clock: ManualClock):
    # Given a guard allowing 3 failed attempts within 7 claims, and a job claimed by four invocations that crashed or
    # timed out (with groups running at once, an innocent job goes down with every invocation that dies)
    guard = JobGuard(stack.services.dynamodb, stack.table_name, max_attempts=3, max_claims=7, clock=clock)
    message = make_message("j1")
    for _ in range(4):
        assert claim(guard, message, remaining_ms=1_000).claimed
        clock.advance(2)
    # When it runs and fails, Then it still has every one of its failed attempts: two retries, DEAD at the third
    outcomes = [guard.fail(claim(guard, message).lease, "flaky") for _ in range(3)]
    assert outcomes == [FailOutcome.RETRY, FailOutcome.RETRY, FailOutcome.DEAD]
    job = stack.job("j1")
    assert (job["attempt"], job["failures"]) == (7, 2)
    assert "failed attempt 3 of 3" in job["error"]


def test_claims_are_exhausted_at_max_claims_without_a_recorded_outcome(stack: Stack, clock: ManualClock):
    guard = JobGuard(stack.services.dynamodb, stack.table_name, max_attempts=3, max_claims=7, clock=clock)
    message = make_message("j1")
    for _ in range(7):
        assert claim(guard, message, remaining_ms=1_000).claimed
        clock.advance(2)
    assert claim(guard, message).outcome is ClaimOutcome.EXHAUSTED
    job = stack.job("j1")
    assert job["status"] == JobStatus.DEAD
    assert "claims exhausted (7 of 7)" in job["error"]
    assert stack.workspace("ws-a")["state"] == WorkspaceState.HALTED


def test_near_its_delivery_limit_a_claim_never_takes_over_a_lost_lease(stack: Stack, clock: ManualClock):
    # Given a job whose one claim never came back, with claims to spare
    guard = JobGuard(stack.services.dynamodb, stack.table_name, max_attempts=3, max_claims=7, clock=clock)
    message = make_message("j1")
    assert claim(guard, message, remaining_ms=1_000).claimed
    clock.advance(2)
    # When its message comes back on one of its last deliveries, Then the job is not run again (one more crash and
    # the queue would dead-letter it and hand out the next job of its workspace): DEAD, its workspace halted
    result = guard.claim(
        message, message_id="m-1", sequence_number="100", remaining_ms=60_000, near_delivery_limit=True
    )
    assert result.outcome is ClaimOutcome.EXHAUSTED
    job = stack.job("j1")
    assert job["status"] == JobStatus.DEAD
    assert "near its delivery limit" in job["error"]
    assert stack.workspace("ws-a")["state"] == WorkspaceState.HALTED


def test_a_claim_shared_with_other_jobs_never_takes_over_a_lost_lease(stack: Stack, clock: ManualClock):
    # Given a job whose claim died with an invocation that ran other jobs too
    guard = JobGuard(stack.services.dynamodb, stack.table_name, max_attempts=3, max_claims=7, clock=clock)
    message = make_message("j1")
    assert guard.claim(message, message_id="m-1", sequence_number="100", remaining_ms=1_000, alone=False).claimed
    assert stack.job("j1")["leaseShared"] is True
    clock.advance(2)
    # When it is claimed again beside other jobs, Then it is a suspect: nothing written, claim it alone
    shared = guard.claim(message, message_id="m-1", sequence_number="100", remaining_ms=60_000, alone=False)
    assert shared.outcome is ClaimOutcome.SUSPECT
    assert shared.previous is not None
    assert shared.previous["leaseShared"] is True
    assert stack.job("j1")["attempt"] == 1
    # and alone, even on one of its last deliveries, it is taken over (its death was not its own doing, as far as
    # anyone knows), the lease no longer shared
    alone = guard.claim(message, message_id="m-1", sequence_number="100", remaining_ms=60_000, near_delivery_limit=True)
    assert alone.claimed
    job = stack.job("j1")
    assert job["attempt"] == 2
    assert "leaseShared" not in job


def test_near_its_delivery_limit_a_job_that_died_alone_is_dead_even_when_claimed_beside_others(
    stack: Stack, clock: ManualClock
):
    guard = JobGuard(stack.services.dynamodb, stack.table_name, max_attempts=3, max_claims=7, clock=clock)
    message = make_message("j1")
    assert claim(guard, message, remaining_ms=1_000).claimed  # alone
    clock.advance(2)
    kwargs: dict[str, Any] = {"message_id": "m-1", "sequence_number": "100", "remaining_ms": 60_000}
    # Beside others it waits to be claimed alone; alone on a last delivery it is the culprit: DEAD
    assert guard.claim(message, **kwargs, near_delivery_limit=True, alone=False).outcome is ClaimOutcome.SUSPECT
    assert guard.claim(message, **kwargs, near_delivery_limit=True).outcome is ClaimOutcome.EXHAUSTED
    job = stack.job("j1")
    assert job["status"] == JobStatus.DEAD
    assert "ran this job alone" in job["error"]


def test_near_its_delivery_limit_a_job_with_a_recorded_failure_is_claimed(stack: Stack, clock: ManualClock):
    guard = JobGuard(stack.services.dynamodb, stack.table_name, max_attempts=3, max_claims=7, clock=clock)
    message = make_message("j1")
    assert guard.fail(claim(guard, message).lease, "flaky") is FailOutcome.RETRY
    result = guard.claim(
        message, message_id="m-1", sequence_number="100", remaining_ms=60_000, near_delivery_limit=True
    )
    assert result.claimed


def test_max_claims_below_max_attempts_is_refused(stack: Stack):
    with pytest.raises(ValueError, match="max_claims"):
        JobGuard(stack.services.dynamodb, stack.table_name, max_attempts=3, max_claims=2)


def test_claim_in_halted_workspace_is_refused_and_job_can_be_parked(guard: JobGuard, stack: Stack):
    guard.fail(claim(guard, make_message("j1")).lease, "bad", permanent=True)
    later = make_message("j2")
    result = claim(guard, later)
    assert result.outcome is ClaimOutcome.WORKSPACE_HALTED
    assert result.workspace["haltingJobId"] == "j1"
    # The claim's write came first (the halt check is a read after it): the job holds the lease it parks under
    assert result.lease is not None
    assert stack.job("j2")["leaseOwner"] == result.lease.owner
    assert guard.park(
        later,
        message_id="m-2",
        sequence_number=result.place,
        body="{}",
        reason="workspace halted",
        lease=result.lease,
        unclaim=True,
    )
    parked = stack.job("j2")
    assert parked["status"] == JobStatus.PARKED
    assert parked["sequenceNumber"] == "100"  # the place its claim recorded
    assert parked["attempt"] == 0  # the claim was taken back: parking behind a halt uses none of the job's claims
    assert "ttl" not in parked


def take_over(stack: Stack, job_id: str) -> None:
    """Another worker takes the job's lease over (its expiry passed by that worker's clock)."""
    stack.services.dynamodb.update_item(
        TableName=stack.table_name,
        Key={"pk": {"S": stack.job(job_id)["pk"]}},
        UpdateExpression="SET leaseOwner = :o",
        ExpressionAttributeValues={":o": {"S": "another-worker"}},
    )


def test_a_park_under_a_lease_another_worker_took_over_is_refused(guard: JobGuard, stack: Stack):
    guard.fail(claim(guard, make_message("j1")).lease, "bad", permanent=True)
    later = make_message("j2")
    result = claim(guard, later)
    take_over(stack, "j2")
    assert not guard.park(
        later, message_id="m-2", sequence_number="200", body="{}", reason="halted", lease=result.lease, unclaim=True
    )
    assert stack.job("j2")["status"] == JobStatus.IN_FLIGHT


def test_holds_says_whether_a_lease_still_holds_its_job(guard: JobGuard, stack: Stack):
    lease = claim(guard, make_message("j1")).lease
    assert guard.holds(lease)
    take_over(stack, "j1")
    assert not guard.holds(lease)
    done = claim(guard, make_message("j2")).lease
    assert guard.complete(done, {})
    assert not guard.holds(done)  # SUCCEEDED: no longer IN_FLIGHT under any lease


def test_no_write_for_another_tenants_job_changes_a_registered_workspaces_owner(guard: JobGuard, stack: Stack):
    # The enqueue keeps a registration's owner for the life of its process (`registered_owner`): sound only while
    # nothing changes the owner. Given ws-a registered to tenant-1 (the fixture), and every guard write that touches a
    # workspace item made for jobs of tenant-2 naming ws-a: a halt, a rejection, a redriven job parked with a halt
    guard.halt_workspace("ws-a", tenant_id="tenant-2", job_id="x1", reason="last delivery")
    guard.reject(message_id="m-x2", job_id="x2", workspace_id="ws-a", tenant_id="tenant-2", reason="bad", body="{}")
    intruder = make_message("x3", tenant_id="tenant-2")
    assert guard.park(
        intruder, message_id="m-x3", sequence_number="300", body="{}", reason="redriven", halt_workspace=True
    )

    # Then the workspace is still tenant-1's, a process reading it now keeps tenant-1, and tenant-2 is refused
    assert stack.workspace("ws-a")["tenantId"] == "tenant-1"
    fresh = JobGuard(stack.services.dynamodb, stack.table_name)
    assert fresh.registered_owner("ws-a") == (True, "tenant-1")
    assert fresh.record_accepted(make_message("x4", tenant_id="tenant-2")).outcome is AcceptOutcome.WORKSPACE_FORBIDDEN


def test_first_halt_keeps_its_halting_job(guard: JobGuard, stack: Stack):
    guard.fail(claim(guard, make_message("j1")).lease, "first", permanent=True)
    guard.reject(message_id="m-9", job_id=None, workspace_id="ws-a", tenant_id=None, reason="bad body", body="x")
    workspace = stack.workspace("ws-a")
    assert workspace["haltingJobId"] == "j1"
    assert "first" in workspace["haltReason"]


@pytest.mark.parametrize("settle", ["succeeded", "queued"])
def test_reject_never_overwrites_an_existing_job(guard: JobGuard, stack: Stack, settle: str):
    # Given a job that took effect, or one that is accepted and waiting for its real message
    if settle == "succeeded":
        guard.complete(claim(guard, make_message("j1")).lease, {})
    else:
        guard.record_accepted(make_message("j1"))
    before = stack.job("j1")["status"]
    # When a bad message carrying its jobId arrives in the workspace's group
    assert guard.reject(message_id="m-9", job_id="j1", workspace_id="ws-a", tenant_id=None, reason="x", body="{}")
    # Then the job keeps its record; the bad message is recorded on its own and halts the workspace
    assert stack.job("j1")["status"] == before
    assert stack.item("msg#m-9")["status"] == JobStatus.REJECTED
    assert stack.workspace("ws-a")["state"] == WorkspaceState.HALTED


def test_park_never_takes_over_a_job_accepted_with_another_payload(guard: JobGuard, stack: Stack):
    guard.record_accepted(make_message("j1"))
    other = make_message("j1", job_type="open_pr", payload={"title": "not the accepted job"})
    assert not guard.park(other, message_id="m-2", sequence_number="5", body="{}", reason="r", halt_workspace=True)
    job = stack.job("j1")
    assert (job["status"], job["type"]) == (JobStatus.QUEUED, "apply_patch")


def test_claim_keeps_the_tenant_the_producer_recorded(guard: JobGuard, stack: Stack):
    guard.record_accepted(make_message("j1", tenant_id="tenant-1"))
    before = stack.job("j1", "tenant-1")
    # the same job (same payload) arriving with another tenant in its body is that tenant's j1, not this job: it
    # can neither move this job to that tenant nor claim it
    message = make_message("j1", tenant_id="tenant-1").model_copy(update={"tenant_id": "tenant-2"})
    theirs = claim(guard, message)
    assert stack.job("j1", "tenant-1") == before
    assert before["tenantId"] == "tenant-1"
    # what it claimed is a record of tenant-2's own
    assert theirs.claimed
    assert stack.job("j1", "tenant-2")["tenantId"] == "tenant-2"
    assert stack.job("j1", "tenant-1")["status"] == JobStatus.QUEUED


def test_complete_stores_a_result_with_floats(guard: JobGuard, stack: Stack):
    lease = claim(guard, make_message("j1")).lease
    assert guard.complete(lease, {"durationSeconds": 1.25, "nested": [{"ratio": 0.5}]})
    assert stack.job("j1")["result"] == {"durationSeconds": 1.25, "nested": [{"ratio": 0.5}]}


def test_halt_workspace_without_a_job(guard: JobGuard, stack: Stack):
    guard.halt_workspace("ws-h", tenant_id="tenant-1", job_id="j9", reason="could not park")
    workspace = stack.workspace("ws-h")
    assert (workspace["state"], workspace["haltingJobId"]) == (WorkspaceState.HALTED, "j9")


def test_record_accepted_is_idempotent_for_the_same_job_and_conflicts_otherwise(guard: JobGuard, stack: Stack):
    message = make_message("j1")
    assert guard.record_accepted(message).outcome is AcceptOutcome.NEW
    assert guard.record_accepted(message).outcome is AcceptOutcome.UNSENT
    guard.record_sent("tenant-1", "j1", "msg-1", "123")
    again = guard.record_accepted(message)
    assert again.outcome is AcceptOutcome.EXISTING
    assert again.item["messageId"] == "msg-1"
    # Another tenant's j1 is a job of its own (jobIds are each tenant's names): accepted, tenant-1's untouched
    register_workspace(stack, "ws-b", "tenant-2")
    theirs = guard.record_accepted(make_message("j1", workspace_id="ws-b", tenant_id="tenant-2"))
    assert (theirs.outcome, theirs.item["workspaceId"]) == (AcceptOutcome.NEW, "ws-b")
    assert (guard.get_job("tenant-1", "j1") or {}).get("messageId") == "msg-1"
    other_payload = make_message("j1", job_type="open_pr", payload={"title": "t"})
    assert guard.record_accepted(other_payload).outcome is AcceptOutcome.CONFLICT


def test_record_accepted_refuses_a_workspace_of_another_tenant_and_writes_nothing(guard: JobGuard, stack: Stack):
    # Given ws-a registered to tenant-1, and ws-h halted by a job of tenant-1
    WorkspaceRegistry(stack.services.dynamodb, stack.table_name).register(
        "ws-a", WorkspaceRegistration(remote_url="/srv/git/a.git", branch="agent/a"), "tenant-1"
    )
    guard.halt_workspace("ws-h", tenant_id="tenant-1", job_id="j0", reason="dead")

    for workspace_id in ("ws-a", "ws-h"):
        message = make_message(f"j-{workspace_id}", workspace_id=workspace_id, tenant_id="tenant-2")
        assert guard.record_accepted(message).outcome is AcceptOutcome.WORKSPACE_FORBIDDEN
        assert stack.job(f"j-{workspace_id}") is None
    assert guard.record_accepted(make_message("j-own", workspace_id="ws-a", tenant_id="tenant-1")).outcome is (
        AcceptOutcome.NEW
    )


def test_record_accepted_refuses_a_workspace_nobody_registered_and_writes_nothing(guard: JobGuard, stack: Stack):
    # Given no item for ws-new, and ws-x halted by a message that named no tenant (an item without a registration)
    guard.halt_workspace("ws-x", tenant_id=None, job_id="j0", reason="rejected")

    for workspace_id in ("ws-new", "ws-x"):
        message = make_message(f"j-{workspace_id}", workspace_id=workspace_id, tenant_id="tenant-2")
        assert guard.record_accepted(message).outcome is AcceptOutcome.WORKSPACE_UNREGISTERED
        assert stack.job(f"j-{workspace_id}") is None


def test_record_accepted_reads_a_registration_once_and_then_only_writes_the_job(guard: JobGuard, stack: Stack):
    # Given ws-a registered to tenant-1 (the fixture) and ws-b to tenant-2, and calls counted from here on
    register_workspace(stack, "ws-b", "tenant-2")
    calls = count_dynamodb_calls(stack)

    # When tenant-1 enqueues three jobs to ws-a and tenant-2 tries twice to enqueue into ws-a
    for n in range(3):
        assert guard.record_accepted(make_message(f"j{n}")).outcome is AcceptOutcome.NEW
    first = Counter(calls)
    for n in range(2):
        stolen = guard.record_accepted(make_message(f"x{n}", tenant_id="tenant-2"))
        assert stolen.outcome is AcceptOutcome.WORKSPACE_FORBIDDEN

    # Then the registration was read once: each job after the first is one conditional PutItem, no transaction
    assert first == Counter({"GetItem": 1, "PutItem": 3})
    # And the kept owner still refuses the other tenant (its refusals read only whether it has such a job)
    assert Counter(calls) - first == Counter({"GetItem": 2})
    assert stack.job("x0") is None
    assert stack.job("x1") is None


def test_record_accepted_reads_an_unregistered_workspace_again_until_it_is_registered(guard: JobGuard, stack: Stack):
    message = make_message("j1", workspace_id="ws-late", tenant_id="tenant-1")
    assert guard.record_accepted(message).outcome is AcceptOutcome.WORKSPACE_UNREGISTERED
    register_workspace(stack, "ws-late", "tenant-1")
    assert guard.record_accepted(message).outcome is AcceptOutcome.NEW


def test_record_accepted_answers_a_sent_job_from_its_record_but_never_sends_into_a_taken_workspace(
    guard: JobGuard, stack: Stack
):
    # Given two jobs of tenant-1 accepted for ws-a (only j-sent was sent) before ws-a became tenant-2's (an item
    # written by hand: a registration never changes its owner)
    guard.record_accepted(make_message("j-sent", workspace_id="ws-a", tenant_id="tenant-1"))
    guard.record_sent("tenant-1", "j-sent", "msg-1", "1")
    guard.record_accepted(make_message("j-unsent", workspace_id="ws-a", tenant_id="tenant-1"))
    stack.services.dynamodb.update_item(
        TableName=stack.table_name,
        Key={"pk": {"S": "ws#ws-a"}},
        UpdateExpression="SET tenantId = :other",
        ExpressionAttributeValues={":other": {"S": "tenant-2"}},
    )
    assert stack.workspace("ws-a")["tenantId"] == "tenant-2"

    # When tenant-1 repeats both requests to a new process (a store keeps a registration's owner once read)
    fresh = JobGuard(stack.services.dynamodb, stack.table_name)
    sent = fresh.record_accepted(make_message("j-sent", workspace_id="ws-a", tenant_id="tenant-1"))
    unsent = fresh.record_accepted(make_message("j-unsent", workspace_id="ws-a", tenant_id="tenant-1"))

    # Then the sent one is answered from its record (nothing is sent again), the unsent one is not sent
    assert (sent.outcome, sent.item["messageId"]) == (AcceptOutcome.EXISTING, "msg-1")
    assert unsent.outcome is AcceptOutcome.WORKSPACE_FORBIDDEN


def test_a_stored_body_of_wide_characters_stays_within_an_item(guard: JobGuard, stack: Stack):
    # Given a message body of 300,000 three-byte characters (900 KB in UTF-8), sent to the queue directly
    body = "€" * 300_000

    # When it is rejected (and its body kept for the operator), or parked
    assert guard.reject(
        message_id="m-9", job_id="j9", workspace_id="ws-a", tenant_id="tenant-1", reason="bad", body=body
    )
    assert guard.park(make_message("j2"), message_id="m-2", sequence_number="200", body=body, reason="halted")

    # Then what is kept fits a DynamoDB item (400 KB): a write over it would fail on every delivery
    for job_id in ("j9", "j2"):
        stored = stack.job(job_id)["body"]
        assert len(stored.encode()) <= MAX_STORED_BODY_CHARS
        assert body.startswith(stored)


@pytest.mark.parametrize("permanent", [True, False])
def test_a_huge_error_message_is_recorded_cut_short(guard: JobGuard, stack: Stack, permanent: bool):
    # Given a job whose error names a 500,000-character path taken from its own payload
    error = "p" * 500_000 + ": no such file in the workspace"

    # When it fails (and, when it is DEAD, its body is kept too), or a bad message is rejected with such a reason
    lease = claim(guard, make_message("j1")).lease
    assert guard.fail(lease, error, permanent=permanent, body="€" * 300_000) in (FailOutcome.DEAD, FailOutcome.RETRY)
    assert guard.reject(
        message_id="m-9", job_id="j9", workspace_id="ws-b", tenant_id="tenant-1", reason=error, body="{}"
    )

    # Then the records are written, with the error cut short: a write over 400 KB would fail on every delivery
    for job_id in ("j1", "j9"):
        stored = stack.job(job_id)["error"]
        assert error.startswith(stored.removesuffix("…"))
        assert len(stored.encode()) <= MAX_STORED_ERROR_CHARS * 4
