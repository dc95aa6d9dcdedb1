"""The guard's halt, park and resume transitions, on moto in-process and on moto's server over HTTP (the table, with
its sparse parked and halted indexes, created from template.yaml)."""

from __future__ import annotations

from typing import Any

import pytest

from agent_jobs.guard import ClaimOutcome, FailOutcome, JobGuard, ResumeOutcome
from agent_jobs.keys import parked_sequence
from agent_jobs.models import JobStatus, ResumeDecision, WorkspaceState
from tests.conftest import ManualClock, Stack, make_message

RETRY, SKIP = ResumeDecision.RETRY, ResumeDecision.SKIP


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def guard(any_stack: Stack, clock: ManualClock) -> JobGuard:
    return JobGuard(any_stack.services.dynamodb, any_stack.table_name, max_attempts=3, clock=clock)


def body_of(message: Any) -> str:
    return str(message.model_dump_json(by_alias=True))


def dead(guard: JobGuard, job_id: str, seq: str = "100", workspace_id: str = "ws-a", body: bool = True) -> Any:
    """A job claimed at `seq` that failed permanently: DEAD, its workspace halted."""
    message = make_message(job_id, workspace_id)
    claim = guard.claim(message, message_id=f"m-{job_id}", sequence_number=seq, remaining_ms=60_000)
    assert claim.lease is not None
    outcome = guard.fail(claim.lease, "patch does not apply", permanent=True, body=body_of(message) if body else None)
    assert outcome is FailOutcome.DEAD
    return message


def park(guard: JobGuard, job_id: str, seq: str, workspace_id: str = "ws-a", *, halt: bool = False) -> Any:
    message = make_message(job_id, workspace_id)
    assert guard.park(
        message,
        message_id=f"m-{job_id}",
        sequence_number=seq,
        body=body_of(message),
        reason="workspace halted",
        halt_workspace=halt,
    )
    return message


def resume(guard: JobGuard, halting: str, decision: ResumeDecision, **kw: Any) -> Any:
    arguments: dict[str, Any] = {"tenant_id": "tenant-1", "operator": "alice", **kw}
    return guard.begin_resume("ws-a", halting_job_id=halting, decision=decision, **arguments)


# ---- what a halt keeps ---------------------------------------------------------------------------------------------


def test_dead_job_keeps_its_body_for_a_retry(guard: JobGuard, any_stack: Stack):
    message = dead(guard, "d1")
    job = any_stack.job("d1")
    assert job["status"] == JobStatus.DEAD
    assert job["body"] == body_of(message)
    workspace = any_stack.workspace("ws-a")
    assert workspace["haltedTenant"] == "tenant-1"  # listed as halted for its tenant


def test_claim_exhausted_path_keeps_the_body(guard: JobGuard, any_stack: Stack, clock: ManualClock):
    # Given a job whose every attempt was taken by workers that never came back
    message = make_message("x1")
    for _ in range(3):
        assert guard.claim(message, message_id="m", sequence_number="100", remaining_ms=1_000).claimed
        clock.advance(2)
    # When it is delivered again
    result = guard.claim(message, message_id="m", sequence_number="100", remaining_ms=1_000, body=body_of(message))
    # Then it is DEAD with its body
    assert result.outcome is ClaimOutcome.EXHAUSTED
    assert any_stack.job("x1")["body"] == body_of(message)


def test_succeeded_job_stores_no_body(guard: JobGuard, any_stack: Stack):
    message = make_message("ok1")
    claim = guard.claim(message, message_id="m", sequence_number="100", remaining_ms=60_000, body=body_of(message))
    assert claim.lease is not None
    assert guard.complete(claim.lease, {"ok": True})
    assert "body" not in any_stack.job("ok1")


def test_park_counts_and_indexes_the_job(guard: JobGuard, any_stack: Stack):
    dead(guard, "d1")
    park(guard, "p2", "200")
    park(guard, "p3", "1000")
    assert any_stack.workspace("ws-a")["parkedCount"] == 2
    job = any_stack.job("p2")
    assert job["parkedWorkspace"] == "ws-a"
    assert job["parkedSeq"] == parked_sequence("200", 0)
    # a second park of the same job changes nothing
    message = make_message("p2")
    assert not guard.park(message, message_id="m", sequence_number="200", body="{}", reason="again")
    assert any_stack.workspace("ws-a")["parkedCount"] == 2


def test_park_without_halt_refuses_an_active_workspace(guard: JobGuard, any_stack: Stack):
    # Given a workspace that is ACTIVE (the claim that saw it halted is stale)
    assert guard.claim(make_message("a1"), message_id="m", sequence_number="1", remaining_ms=60_000).claimed
    any_stack.services.dynamodb.put_item(
        TableName=any_stack.table_name, Item={"pk": {"S": "ws#ws-a"}, "state": {"S": "ACTIVE"}}
    )
    message = make_message("a2")
    # Then the job is not parked where no resume would ever run it
    assert not guard.park(message, message_id="m2", sequence_number="2", body="{}", reason="workspace halted")
    assert any_stack.job("a2") is None


def test_park_with_halt_halts_and_counts(guard: JobGuard, any_stack: Stack):
    park(guard, "l1", "100", halt=True)
    workspace = any_stack.workspace("ws-a")
    assert workspace["state"] == WorkspaceState.HALTED
    assert workspace["haltingJobId"] == "l1"
    assert workspace["parkedCount"] == 1


# ---- begin_resume: decisions ---------------------------------------------------------------------------------------


def test_resume_retry_of_a_dead_job_parks_it_again_first(guard: JobGuard, any_stack: Stack, clock: ManualClock):
    # Given d1 DEAD (seq 100) and p2 parked behind it
    dead(guard, "d1", seq="100")
    park(guard, "p2", "200")
    clock.advance(10)

    # When the operator retries d1
    result = resume(guard, "d1", RETRY)

    # Then d1 is PARKED with its attempts reset and its place first; the workspace RESUMING, halt fields gone
    assert result.outcome is ResumeOutcome.RESUMING
    job = any_stack.job("d1")
    assert job["status"] == JobStatus.PARKED
    assert job["attempt"] == 0
    assert job["parkedSeq"] < any_stack.job("p2")["parkedSeq"]
    assert job["history"][-1] == {
        "status": "PARKED",
        "at": clock.now,
        "by": "alice",
        "decision": "retry",
        "resumeId": result.resume_id,
    }
    workspace = any_stack.workspace("ws-a")
    assert workspace["state"] == WorkspaceState.RESUMING
    assert workspace["resumeId"] == result.resume_id
    assert workspace["parkedCount"] == 2
    assert not {"haltingJobId", "haltReason", "haltedAt"} & set(workspace)
    assert workspace["lastResume"]["haltingJobId"] == "d1"
    assert workspace["lastResume"]["decision"] == "retry"
    assert workspace["lastResume"]["by"] == "alice"
    assert "DEAD" in workspace["lastResume"]["haltReason"]


def test_resume_skip_of_a_dead_job_with_nothing_parked_is_active_at_once(guard: JobGuard, any_stack: Stack):
    dead(guard, "d1")
    result = resume(guard, "d1", SKIP)
    assert result.outcome is ResumeOutcome.ACTIVE
    job = any_stack.job("d1")
    assert job["status"] == JobStatus.SKIPPED
    assert job["skippedBy"] == "alice"
    assert job["history"][-1]["status"] == "SKIPPED"
    assert "ttl" in job  # settled: garbage collection may take it again
    workspace = any_stack.workspace("ws-a")
    assert workspace["state"] == WorkspaceState.ACTIVE
    assert "haltedTenant" not in workspace
    assert "resumeId" not in workspace


def test_resume_skip_with_parked_jobs_is_resuming(guard: JobGuard, any_stack: Stack):
    dead(guard, "d1", seq="100")
    park(guard, "p2", "200")
    result = resume(guard, "d1", SKIP)
    assert result.outcome is ResumeOutcome.RESUMING
    workspace = any_stack.workspace("ws-a")
    assert workspace["parkedCount"] == 1
    assert workspace["lastDrainedSeq"] == parked_sequence("100", 0)


def test_resume_of_a_rejected_message_skip_only(guard: JobGuard, any_stack: Stack):
    # Given a message rejected under its jobId
    assert guard.reject(
        message_id="m-r1", job_id="r1", workspace_id="ws-a", tenant_id="tenant-1", reason="bad", body="{"
    )
    # Then a retry is refused and changes nothing; a skip is taken
    refused = resume(guard, "r1", RETRY)
    assert refused.outcome is ResumeOutcome.RETRY_REFUSED
    assert "skip" in refused.reason
    assert any_stack.job("r1")["status"] == JobStatus.REJECTED
    assert any_stack.workspace("ws-a")["state"] == WorkspaceState.HALTED
    assert resume(guard, "r1", SKIP).outcome is ResumeOutcome.ACTIVE
    assert any_stack.job("r1")["status"] == JobStatus.SKIPPED


def test_resume_of_a_message_without_job_id_skip_only(guard: JobGuard, any_stack: Stack):
    assert guard.reject(message_id="m-9", job_id=None, workspace_id="ws-a", tenant_id="tenant-1", reason="x", body="")
    halting = any_stack.workspace("ws-a")["haltingJobId"]
    assert halting == "msg#m-9"
    assert resume(guard, halting, RETRY).outcome is ResumeOutcome.RETRY_REFUSED
    assert resume(guard, halting, SKIP).outcome is ResumeOutcome.ACTIVE
    assert any_stack.item("msg#m-9")["status"] == JobStatus.SKIPPED


def test_resume_retry_of_a_job_parked_at_its_last_delivery_keeps_it_parked(
    guard: JobGuard, any_stack: Stack, clock: ManualClock
):
    # Given a job parked near its last delivery (an attempt used, its lease run out), halting its workspace
    message = make_message("l1")
    assert guard.claim(message, message_id="m", sequence_number="100", remaining_ms=0).claimed
    clock.advance(1)
    park(guard, "l1", "100", halt=True)
    result = resume(guard, "l1", RETRY)
    assert result.outcome is ResumeOutcome.RESUMING
    job = any_stack.job("l1")
    assert job["status"] == JobStatus.PARKED
    assert job["attempt"] == 0
    assert any_stack.workspace("ws-a")["parkedCount"] == 1


def test_resume_skip_of_a_parked_halting_job_uncounts_it(guard: JobGuard, any_stack: Stack):
    park(guard, "l1", "100", halt=True)
    park(guard, "p2", "200")
    assert resume(guard, "l1", SKIP).outcome is ResumeOutcome.RESUMING
    assert any_stack.job("l1")["status"] == JobStatus.SKIPPED
    assert "parkedWorkspace" not in any_stack.job("l1")
    assert any_stack.workspace("ws-a")["parkedCount"] == 1


def test_resume_of_a_halt_without_a_job_record_changes_no_job(guard: JobGuard, any_stack: Stack):
    guard.halt_workspace("ws-a", tenant_id="tenant-1", job_id="ghost", reason="could not park")
    assert resume(guard, "ghost", RETRY).outcome is ResumeOutcome.ACTIVE
    assert any_stack.job("ghost") is None


def test_resume_retry_of_a_dead_job_without_a_body_is_refused(guard: JobGuard, any_stack: Stack):
    dead(guard, "d1", body=False)
    result = resume(guard, "d1", RETRY)
    assert result.outcome is ResumeOutcome.RETRY_REFUSED
    assert any_stack.job("d1")["status"] == JobStatus.DEAD


# ---- begin_resume: refusals ----------------------------------------------------------------------------------------


def test_resume_refusals_change_nothing(guard: JobGuard, any_stack: Stack):
    assert resume(guard, "d1", RETRY).outcome is ResumeOutcome.NOT_FOUND
    dead(guard, "d1")
    before = any_stack.workspace("ws-a")
    assert resume(guard, "other", RETRY).outcome is ResumeOutcome.HALTING_JOB_CHANGED
    assert resume(guard, "d1", RETRY, tenant_id="tenant-2").outcome is ResumeOutcome.OTHER_TENANT
    assert any_stack.workspace("ws-a") == before
    assert any_stack.job("d1")["status"] == JobStatus.DEAD


def test_resume_of_an_active_workspace_is_not_halted(guard: JobGuard, any_stack: Stack):
    dead(guard, "d1")
    assert resume(guard, "d1", SKIP).outcome is ResumeOutcome.ACTIVE
    assert resume(guard, "d1", RETRY).outcome is ResumeOutcome.NOT_HALTED


def test_resume_repeated_while_resuming_is_the_same_resume(guard: JobGuard, any_stack: Stack):
    dead(guard, "d1")
    first = resume(guard, "d1", RETRY)
    again = resume(guard, "d1", RETRY)
    assert again.outcome is ResumeOutcome.ALREADY_RESUMING
    assert again.resume_id == first.resume_id
    assert any_stack.workspace("ws-a")["parkedCount"] == 1  # not parked twice
    assert resume(guard, "d1", SKIP).outcome is ResumeOutcome.NOT_HALTED  # another decision: not this resume


# ---- the drain's transitions ---------------------------------------------------------------------------------------


def resuming(guard: JobGuard, *seqs: str) -> str:
    """ws-a RESUMING after d1 (seq 100) was retried, with jobs p<seq> parked behind it."""
    dead(guard, "d1", seq="100")
    for seq in seqs:
        park(guard, f"p{seq}", seq)
    result = resume(guard, "d1", RETRY)
    assert result.resume_id is not None
    return str(result.resume_id)


def test_list_parked_is_in_numeric_sequence_order(guard: JobGuard, any_stack: Stack):
    resuming(guard, "1000", "200", "99999999999999999999")
    parked = guard.list_parked("ws-a", after_seq=None, expected=4)
    assert parked is not None
    assert [job["jobId"] for job in parked] == ["d1", "p200", "p1000", "p99999999999999999999"]
    assert all("body" not in job for job in parked)  # index entries stay small; the drain reads the body it runs


def test_list_parked_says_lagging_when_the_index_shows_fewer_than_the_count(guard: JobGuard, any_stack: Stack):
    resuming(guard, "200")
    assert guard.list_parked("ws-a", after_seq=None, expected=3) is None


def test_list_parked_checks_entries_at_or_before_the_last_drained_position(guard: JobGuard, any_stack: Stack):
    resuming(guard, "200")
    # an entry behind lastDrainedSeq is taken only if a consistent read confirms it is PARKED
    parked = guard.list_parked("ws-a", after_seq=parked_sequence("150", 0), expected=2)
    assert parked is not None
    assert [job["jobId"] for job in parked] == ["d1", "p200"]


def test_claim_parked_takes_one_job_at_a_time_and_counts_it(guard: JobGuard, any_stack: Stack):
    resume_id = resuming(guard, "200")
    first, second = guard.list_parked("ws-a", after_seq=None, expected=2) or []
    claim = guard.claim_parked(first, resume_id=resume_id, remaining_ms=60_000)
    assert claim.outcome is ClaimOutcome.CLAIMED
    workspace = any_stack.workspace("ws-a")
    assert workspace["parkedCount"] == 1
    assert workspace["drainingJobId"] == "d1"
    job = any_stack.job("d1")
    assert job["status"] == JobStatus.IN_FLIGHT
    assert "parkedWorkspace" not in job
    # the next job waits for the drained one to be released
    assert guard.claim_parked(second, resume_id=resume_id, remaining_ms=60_000).outcome is (
        ClaimOutcome.WORKSPACE_HALTED
    )
    assert guard.claim_parked(first, resume_id=resume_id, remaining_ms=60_000).outcome is ClaimOutcome.WORKSPACE_HALTED
    assert claim.lease is not None
    assert guard.complete(claim.lease, {})
    assert guard.release_drain("ws-a", "d1", drained_seq=claim.lease.parked_seq)
    assert guard.claim_parked(second, resume_id=resume_id, remaining_ms=60_000).claimed


def test_claim_parked_of_another_resume_or_a_stale_entry_is_refused(guard: JobGuard, any_stack: Stack):
    resume_id = resuming(guard)
    (job,) = guard.list_parked("ws-a", after_seq=None, expected=1) or []
    assert guard.claim_parked(job, resume_id="other", remaining_ms=1).outcome is ClaimOutcome.WORKSPACE_HALTED
    claim = guard.claim_parked(job, resume_id=resume_id, remaining_ms=60_000)
    assert claim.lease is not None
    assert guard.complete(claim.lease, {})
    assert guard.release_drain("ws-a", "d1", drained_seq=claim.lease.parked_seq)
    assert guard.claim_parked(job, resume_id=resume_id, remaining_ms=1).outcome is ClaimOutcome.SETTLED


def test_reclaim_of_a_drained_job_left_in_flight(guard: JobGuard, any_stack: Stack, clock: ManualClock):
    resume_id = resuming(guard)
    (job,) = guard.list_parked("ws-a", after_seq=None, expected=1) or []
    first = guard.claim_parked(job, resume_id=resume_id, remaining_ms=10_000)
    assert first.claimed
    current = any_stack.job("d1")
    assert guard.claim_parked(current, resume_id=resume_id, remaining_ms=1, reclaim=True).outcome is ClaimOutcome.BUSY
    clock.advance(11)
    again = guard.claim_parked(current, resume_id=resume_id, remaining_ms=10_000, reclaim=True)
    assert again.claimed
    assert any_stack.workspace("ws-a")["parkedCount"] == 0  # counted once
    assert any_stack.job("d1")["attempt"] == 2
    # attempts used up by drains that never came back: DEAD, halted again
    clock.advance(11)
    assert guard.claim_parked(any_stack.job("d1"), resume_id=resume_id, remaining_ms=1, reclaim=True).claimed
    clock.advance(11)
    exhausted = guard.claim_parked(any_stack.job("d1"), resume_id=resume_id, remaining_ms=1, reclaim=True)
    assert exhausted.outcome is ClaimOutcome.EXHAUSTED
    assert any_stack.workspace("ws-a")["state"] == WorkspaceState.HALTED


def test_drained_job_failing_is_parked_again_then_dead_and_halts(guard: JobGuard, any_stack: Stack):
    resume_id = resuming(guard, "200")
    for attempt in (1, 2):
        parked = guard.list_parked("ws-a", after_seq=None, expected=2) or []
        assert parked[0]["jobId"] == "d1"  # still first
        claim = guard.claim_parked(parked[0], resume_id=resume_id, remaining_ms=60_000)
        assert claim.lease is not None
        assert guard.fail(claim.lease, "flaky") is FailOutcome.PARKED
        job = any_stack.job("d1")
        assert (job["status"], job["attempt"]) == (JobStatus.PARKED, attempt)
        workspace = any_stack.workspace("ws-a")
        assert workspace["parkedCount"] == 2
        assert "drainingJobId" not in workspace
    parked = guard.list_parked("ws-a", after_seq=None, expected=2) or []
    claim = guard.claim_parked(parked[0], resume_id=resume_id, remaining_ms=60_000)
    assert claim.lease is not None
    assert guard.fail(claim.lease, "flaky", body="kept") is FailOutcome.DEAD
    workspace = any_stack.workspace("ws-a")
    assert workspace["state"] == WorkspaceState.HALTED
    assert workspace["haltingJobId"] == "d1"
    assert workspace["parkedCount"] == 1
    assert "resumeId" not in workspace
    assert any_stack.job("d1")["body"] == "kept"


def test_a_retry_gives_a_drained_job_its_failed_attempts_again(guard: JobGuard, any_stack: Stack):
    # Given d1 DEAD after failing every attempt of a drain
    resume_id = resuming(guard)
    for _ in range(3):
        (job,) = guard.list_parked("ws-a", after_seq=None, expected=1) or []
        lease = guard.claim_parked(job, resume_id=resume_id, remaining_ms=60_000).lease
        assert lease is not None
        outcome = guard.fail(lease, "flaky", body="kept")
    assert outcome is FailOutcome.DEAD
    # When the operator retries it again
    again = resume(guard, "d1", RETRY)
    assert again.resume_id is not None
    assert not {"failures"} & set(any_stack.job("d1"))
    # Then (the drain first releases d1, which the last one left PARKED) its next failure parks it again instead of
    # making it DEAD at once
    assert guard.release_drain("ws-a", "d1", drained_seq=None)
    (job,) = guard.list_parked("ws-a", after_seq=None, expected=1) or []
    lease = guard.claim_parked(job, resume_id=str(again.resume_id), remaining_ms=60_000).lease
    assert lease is not None
    assert guard.fail(lease, "flaky") is FailOutcome.PARKED


def test_activate_only_when_nothing_is_parked_and_this_resume_is_current(guard: JobGuard, any_stack: Stack):
    resume_id = resuming(guard)
    assert not guard.activate("ws-a", resume_id)  # d1 still parked
    (job,) = guard.list_parked("ws-a", after_seq=None, expected=1) or []
    claim = guard.claim_parked(job, resume_id=resume_id, remaining_ms=60_000)
    assert claim.lease is not None
    assert not guard.activate("ws-a", resume_id)  # d1 drained but not released
    assert guard.complete(claim.lease, {})
    assert guard.release_drain("ws-a", "d1", drained_seq=claim.lease.parked_seq)
    assert not guard.activate("ws-a", "another")
    assert guard.activate("ws-a", resume_id)
    workspace = any_stack.workspace("ws-a")
    assert workspace["state"] == WorkspaceState.ACTIVE
    assert not {"resumeId", "haltedTenant", "drainingJobId"} & set(workspace)


def test_claim_while_resuming_is_refused_so_new_jobs_park_behind(guard: JobGuard, any_stack: Stack):
    resuming(guard)
    message = make_message("n9")
    result = guard.claim(message, message_id="m", sequence_number="900", remaining_ms=60_000)
    assert result.outcome is ClaimOutcome.WORKSPACE_HALTED
    # Claimed first, then found RESUMING: a park without its lease is refused (the job is leased), one under it parks
    assert not guard.park(message, message_id="m", sequence_number="900", body=body_of(message), reason="halted")
    assert guard.park(
        message,
        message_id="m",
        sequence_number="900",
        body=body_of(message),
        reason="workspace halted",
        lease=result.lease,
        unclaim=True,
    )
    job = any_stack.job("n9")
    assert (job["status"], job["attempt"]) == (JobStatus.PARKED, 0)
    assert any_stack.workspace("ws-a")["parkedCount"] == 2


# ---- the halted index ----------------------------------------------------------------------------------------------


def test_list_halted_shows_halted_and_resuming_workspaces_of_the_tenant(guard: JobGuard, any_stack: Stack):
    dead(guard, "d1", workspace_id="ws-a")
    dead(guard, "d2", workspace_id="ws-b")
    dead(guard, "d3", workspace_id="ws-c")
    assert guard.begin_resume(
        "ws-b", tenant_id="tenant-1", halting_job_id="d2", decision=RETRY, operator="alice"
    ).outcome is (ResumeOutcome.RESUMING)
    assert guard.begin_resume(
        "ws-c", tenant_id="tenant-1", halting_job_id="d3", decision=SKIP, operator="alice"
    ).outcome is (ResumeOutcome.ACTIVE)
    message = make_message("o1", "ws-o", tenant_id="tenant-2")
    claim = guard.claim(message, message_id="m", sequence_number="1", remaining_ms=60_000)
    assert claim.lease is not None
    guard.fail(claim.lease, "x", permanent=True)

    page = guard.list_halted("tenant-1")
    assert {(w["workspaceId"], w["state"]) for w in page.workspaces} == {("ws-a", "HALTED"), ("ws-b", "RESUMING")}
    assert page.next_key is None
    first = guard.list_halted("tenant-1", limit=1)
    assert len(first.workspaces) == 1
    assert first.next_key is not None
    rest = guard.list_halted("tenant-1", limit=1, start_key=first.next_key)
    assert {w["workspaceId"] for w in first.workspaces + rest.workspaces} == {"ws-a", "ws-b"}


# ---- a second halt while halted ------------------------------------------------------------------------------------


def test_job_dead_while_halted_by_another_job_is_not_passed_by_the_resume(guard: JobGuard, any_stack: Stack):
    # Given b1 running (claimed while ws-a is ACTIVE) when a DLQ redrive parks an earlier job r0 and halts ws-a, then b1
    # fails permanently (DEAD, but ws-a stays halted by r0), and p4 is parked behind b1
    b1 = make_message("b1")
    claim = guard.claim(b1, message_id="m-b1", sequence_number="300", remaining_ms=60_000)
    assert claim.lease is not None
    park(guard, "r0", "100", halt=True)
    assert guard.fail(claim.lease, "patch does not apply", permanent=True, body=body_of(b1)) is FailOutcome.DEAD
    park(guard, "p4", "400")
    assert any_stack.workspace("ws-a")["haltingJobId"] == "r0"

    # When the operator retries r0 (the halting job the workspace names) and the drain takes the parked jobs in order
    result = resume(guard, "r0", RETRY)
    claimed: list[str] = []
    for job in guard.list_parked("ws-a", after_seq=None, expected=2) or []:
        drained = guard.claim_parked(job, resume_id=str(result.resume_id), remaining_ms=60_000)
        if drained.lease is None:
            break
        claimed.append(str(job["jobId"]))
        assert guard.complete(drained.lease, {})
        assert guard.release_drain("ws-a", drained.lease.job_id, drained_seq=drained.lease.parked_seq)

    # Then p4 never runs while b1, before it, is DEAD and undecided
    assert any_stack.job("b1")["status"] == JobStatus.DEAD
    assert "p4" not in claimed


def drain_all(guard: JobGuard, resume_id: str, expected: int) -> list[str]:
    """Claim, complete and release the parked jobs in order, as the drain does; the jobIds it ran."""
    ran: list[str] = []
    for job in guard.list_parked("ws-a", after_seq=None, expected=expected) or []:
        drained = guard.claim_parked(job, resume_id=resume_id, remaining_ms=60_000)
        if drained.lease is None:
            break
        ran.append(str(job["jobId"]))
        assert guard.complete(drained.lease, {})
        assert guard.release_drain("ws-a", drained.lease.job_id, drained_seq=drained.lease.parked_seq)
    return ran


def test_resume_decides_each_undecided_halting_job_in_turn_then_drains_in_order(guard: JobGuard, any_stack: Stack):
    # Given ws-a halted by r0 (redriven, parked), then b1 DEAD and a message rejected while it was halted, p4 parked
    b1 = make_message("b1")
    claim = guard.claim(b1, message_id="m-b1", sequence_number="300", remaining_ms=60_000)
    assert claim.lease is not None
    park(guard, "r0", "100", halt=True)
    assert guard.fail(claim.lease, "patch does not apply", permanent=True, body=body_of(b1)) is FailOutcome.DEAD
    assert guard.reject(message_id="m-x", job_id=None, workspace_id="ws-a", tenant_id="tenant-1", reason="x", body="")
    park(guard, "p4", "400")
    assert any_stack.workspace("ws-a")["undecidedJobIds"] == {"r0", "b1", "msg#m-x"}

    # When the operator retries r0: decided, and the workspace stays HALTED by the earliest undecided job, b1
    first = resume(guard, "r0", RETRY)
    assert first.outcome is ResumeOutcome.DECIDED
    assert first.resume_id is None
    assert "'b1'" in first.reason
    workspace = any_stack.workspace("ws-a")
    assert (workspace["state"], workspace["haltingJobId"]) == (WorkspaceState.HALTED, "b1")
    assert "DEAD" in workspace["haltReason"]
    assert workspace["haltedTenant"] == "tenant-1"  # still listed as halted
    assert workspace["undecidedJobIds"] == {"b1", "msg#m-x"}
    # and repeating r0's decision is refused with what to decide next
    again = resume(guard, "r0", RETRY)
    assert again.outcome is ResumeOutcome.HALTING_JOB_CHANGED
    assert "decide that job next" in again.reason

    # When b1 is retried, then the rejected message skipped
    assert resume(guard, "b1", RETRY).outcome is ResumeOutcome.DECIDED
    assert any_stack.workspace("ws-a")["haltingJobId"] == "msg#m-x"
    last = resume(guard, "msg#m-x", SKIP)

    # Then the workspace is RESUMING with nothing undecided and the drain runs r0, b1, p4 in queue order
    assert last.outcome is ResumeOutcome.RESUMING
    workspace = any_stack.workspace("ws-a")
    assert "undecidedJobIds" not in workspace
    assert workspace["parkedCount"] == 3
    assert drain_all(guard, str(last.resume_id), expected=3) == ["r0", "b1", "p4"]
    assert guard.activate("ws-a", str(last.resume_id))


def test_halt_landing_between_the_resume_read_and_write_keeps_the_workspace_halted(
    guard: JobGuard, any_stack: Stack, monkeypatch: pytest.MonkeyPatch
):
    # Given ws-a halted by d1 with p2 parked, and b3 (claimed while ACTIVE) failing permanently just after the resume
    # read the workspace
    b3 = make_message("b3")
    claim = guard.claim(b3, message_id="m-b3", sequence_number="300", remaining_ms=60_000)
    assert claim.lease is not None
    dead(guard, "d1", "100")
    park(guard, "p2", "200")
    read = guard.get_workspace

    def read_then_halt(workspace_id: str) -> Any:
        workspace = read(workspace_id)
        if claim.lease is not None and any_stack.job("b3")["status"] == JobStatus.IN_FLIGHT:
            assert guard.fail(claim.lease, "no", permanent=True, body=body_of(b3)) is FailOutcome.DEAD
        return workspace

    monkeypatch.setattr(guard, "get_workspace", read_then_halt)

    # When the operator skips d1
    result = resume(guard, "d1", SKIP)

    # Then the decision is made but the workspace stays HALTED by b3: p2 does not drain past it
    assert result.outcome is ResumeOutcome.DECIDED
    workspace = any_stack.workspace("ws-a")
    assert (workspace["state"], workspace["haltingJobId"]) == (WorkspaceState.HALTED, "b3")
    assert any_stack.job("d1")["status"] == JobStatus.SKIPPED


def test_claim_parked_and_activate_refuse_while_a_halting_job_is_undecided(guard: JobGuard, any_stack: Stack):
    # Given a RESUMING workspace whose item also names an undecided halting job (a write no resume makes)
    resume_id = resuming(guard)
    any_stack.services.dynamodb.update_item(
        TableName=any_stack.table_name,
        Key={"pk": {"S": "ws#ws-a"}},
        UpdateExpression="ADD undecidedJobIds :u",
        ExpressionAttributeValues={":u": {"SS": ["b9"]}},
    )
    (job,) = guard.list_parked("ws-a", after_seq=None, expected=1) or []
    assert guard.claim_parked(job, resume_id=resume_id, remaining_ms=60_000).outcome is ClaimOutcome.WORKSPACE_HALTED
    assert any_stack.job("d1")["status"] == JobStatus.PARKED
    assert any_stack.workspace("ws-a")["parkedCount"] == 1
    # and with nothing parked, the workspace is not made ACTIVE until the set is gone
    any_stack.services.dynamodb.update_item(
        TableName=any_stack.table_name,
        Key={"pk": {"S": "ws#ws-a"}},
        UpdateExpression="SET parkedCount = :zero",
        ExpressionAttributeValues={":zero": {"N": "0"}},
    )
    assert not guard.activate("ws-a", resume_id)
    any_stack.services.dynamodb.update_item(
        TableName=any_stack.table_name, Key={"pk": {"S": "ws#ws-a"}}, UpdateExpression="REMOVE undecidedJobIds"
    )
    assert guard.activate("ws-a", resume_id)
