"""The decisions after a lost condition and before a resume, on typed records: no AWS, milliseconds."""

from __future__ import annotations

import pytest

from agent_jobs.core import decisions
from agent_jobs.core.outcomes import AcceptOutcome, ClaimOutcome, ResumeOutcome
from agent_jobs.core.records import JobRecord, LastResume, WorkspaceRecord
from agent_jobs.core.transitions import WorkspaceAction
from agent_jobs.models import JobStatus, ResumeDecision, WorkspaceState

NOW = 1_000_000
HASH = "a" * 64


def job(status: JobStatus | None, **fields: object) -> JobRecord:
    values: dict[str, object] = {"tenant_id": "t1", "payload_hash": HASH, **fields}
    return JobRecord("j1", status, **values)  # type: ignore[arg-type]


def lost(record: JobRecord, *, alone: bool = True, near: bool = False, max_claims: int = 3) -> decisions.LostClaim:
    return decisions.lost_claim(
        record, payload_hash=HASH, now=NOW, alone=alone, near_delivery_limit=near, max_claims=max_claims
    )


@pytest.mark.parametrize(
    ("record", "outcome"),
    [
        (job(JobStatus.QUEUED, payload_hash="b" * 64), ClaimOutcome.CONFLICT),
        (job(JobStatus.SUCCEEDED), ClaimOutcome.DUPLICATE),
        (job(JobStatus.SKIPPED), ClaimOutcome.DUPLICATE),
        (job(JobStatus.DEAD), ClaimOutcome.SETTLED),
        (job(JobStatus.REJECTED), ClaimOutcome.SETTLED),
        (job(JobStatus.PARKED), ClaimOutcome.SETTLED),
        (job(JobStatus.IN_FLIGHT, lease_expires_at=NOW), ClaimOutcome.BUSY),
        (job(JobStatus.QUEUED, attempt=1), ClaimOutcome.CONTENDED),
        (job(JobStatus.IN_FLIGHT, lease_expires_at=NOW - 1, attempt=1), ClaimOutcome.CONTENDED),
    ],
)
def test_a_lost_claim_is_explained_by_the_job_record(record: JobRecord, outcome: ClaimOutcome) -> None:
    assert lost(record).outcome is outcome


def test_a_lost_lease_is_suspect_to_a_shared_claim_and_taken_over_alone() -> None:
    record = job(JobStatus.IN_FLIGHT, lease_expires_at=NOW - 1, attempt=1)
    assert lost(record, alone=False).outcome is ClaimOutcome.SUSPECT
    assert lost(record, alone=True).outcome is ClaimOutcome.CONTENDED


def test_claims_used_up_make_the_job_dead_with_the_count() -> None:
    result = lost(job(JobStatus.IN_FLIGHT, lease_expires_at=NOW - 1, attempt=3))
    assert result.outcome is ClaimOutcome.EXHAUSTED
    assert result.dead_error == "claims exhausted (3 of 3) without a recorded outcome"
    assert lost(job(JobStatus.QUEUED, attempt=5), max_claims=5).outcome is ClaimOutcome.EXHAUSTED


def test_a_job_that_died_alone_near_the_delivery_limit_is_dead_not_taken_over() -> None:
    alone = job(JobStatus.IN_FLIGHT, lease_expires_at=NOW - 1, attempt=1)
    result = lost(alone, near=True)
    assert result.outcome is ClaimOutcome.EXHAUSTED
    assert "ran this job alone" in result.dead_error
    # A shared lease only shared an invocation that died: taken over even near the limit.
    shared = job(JobStatus.IN_FLIGHT, lease_expires_at=NOW - 1, attempt=1, lease_shared=True)
    assert lost(shared, near=True).outcome is ClaimOutcome.CONTENDED


@pytest.mark.parametrize(
    ("record", "reclaim", "outcome"),
    [
        (job(JobStatus.IN_FLIGHT, lease_expires_at=NOW + 1), True, ClaimOutcome.BUSY),
        (job(JobStatus.IN_FLIGHT, lease_expires_at=NOW - 1), True, ClaimOutcome.EXHAUSTED),
        (job(JobStatus.IN_FLIGHT, lease_expires_at=NOW - 1), False, ClaimOutcome.SETTLED),
        (job(JobStatus.SUCCEEDED), True, ClaimOutcome.SETTLED),
        (job(JobStatus.SKIPPED), False, ClaimOutcome.SETTLED),
    ],
)
def test_a_lost_drain_claim(record: JobRecord, reclaim: bool, outcome: ClaimOutcome) -> None:
    assert decisions.lost_drain_claim(record, now=NOW, reclaim=reclaim) is outcome


def test_a_failure_is_lost_only_when_the_lease_moved_on() -> None:
    held = job(JobStatus.IN_FLIGHT, lease_owner="me")
    assert not decisions.fail_lost(held, owner="me")
    assert decisions.fail_lost(held, owner="other")
    assert decisions.fail_lost(job(JobStatus.SUCCEEDED, lease_owner="me"), owner="me")


def test_workspace_refusal_tells_another_tenants_workspace_from_an_unregistered_one() -> None:
    assert decisions.workspace_refusal("t2", "t1") is AcceptOutcome.WORKSPACE_FORBIDDEN
    assert decisions.workspace_refusal(None, "t1") is AcceptOutcome.WORKSPACE_UNREGISTERED
    assert decisions.workspace_refusal("t1", "t1") is AcceptOutcome.WORKSPACE_UNREGISTERED  # its own, unregistered


def test_a_known_job_id_is_another_job_the_same_job_sent_or_unsent() -> None:
    def known(record: JobRecord, refusal: AcceptOutcome | None = None) -> AcceptOutcome:
        return decisions.known_job(record, payload_hash=HASH, tenant_id="t1", refusal=refusal)

    assert known(job(JobStatus.QUEUED, payload_hash="b" * 64)) is AcceptOutcome.CONFLICT
    assert known(JobRecord("j1", JobStatus.QUEUED, tenant_id="t2", payload_hash=HASH)) is AcceptOutcome.CONFLICT
    assert known(job(JobStatus.QUEUED, message_id="m1")) is AcceptOutcome.EXISTING
    assert known(job(JobStatus.QUEUED)) is AcceptOutcome.UNSENT
    forbidden = AcceptOutcome.WORKSPACE_FORBIDDEN
    assert known(job(JobStatus.QUEUED), forbidden) is forbidden  # unsent, into a workspace no longer its own
    assert known(job(JobStatus.QUEUED, message_id="m1"), forbidden) is AcceptOutcome.EXISTING


def halted(**fields: object) -> WorkspaceRecord:
    values: dict[str, object] = {"state": WorkspaceState.HALTED, "tenant_id": "t1", "halting_job_id": "j1"}
    values.update(fields)
    return WorkspaceRecord(workspace_id="w1", **values)  # type: ignore[arg-type]


def refusal(workspace: WorkspaceRecord | None, halting: str = "j1", decision: ResumeDecision = ResumeDecision.SKIP):
    return decisions.resume_refusal(
        workspace, workspace_id="w1", tenant_id="t1", halting_job_id=halting, decision=decision
    )


def test_a_resume_begins_only_on_the_tenants_halted_workspace_by_the_job_seen() -> None:
    assert refusal(halted()) is None
    none = refusal(None)
    assert none is not None
    assert none.outcome is ResumeOutcome.NOT_FOUND
    unowned = refusal(halted(tenant_id=None))
    assert unowned is not None
    assert unowned.outcome is ResumeOutcome.NOT_FOUND
    other = refusal(halted(tenant_id="t2"))
    assert other is not None
    assert other.outcome is ResumeOutcome.OTHER_TENANT
    active = refusal(halted(state=WorkspaceState.ACTIVE))
    assert active is not None
    assert active.outcome is ResumeOutcome.NOT_HALTED
    assert "is ACTIVE, not HALTED" in active.reason
    changed = refusal(halted(halting_job_id="j2"))
    assert changed is not None
    assert changed.outcome is ResumeOutcome.HALTING_JOB_CHANGED
    assert "halted by 'j2', not 'j1'" in changed.reason


def test_the_same_resume_again_is_already_resuming_and_a_decided_job_points_to_the_next() -> None:
    resuming = halted(state=WorkspaceState.RESUMING, last_resume=LastResume("j1", "skip"))
    again = refusal(resuming)
    assert again is not None
    assert again.outcome is ResumeOutcome.ALREADY_RESUMING
    other_decision = refusal(resuming, decision=ResumeDecision.RETRY)
    assert other_decision is not None
    assert other_decision.outcome is ResumeOutcome.NOT_HALTED
    decided = refusal(halted(halting_job_id="j2", last_resume=LastResume("j1", "skip")))
    assert decided is not None
    assert "'j1' is decided (skip)" in decided.reason
    assert "decide that job next" in decided.reason


@pytest.mark.parametrize(
    ("record", "halting", "words"),
    [
        (job(JobStatus.QUEUED, sequence_number="7"), "j1", "is QUEUED and not settled yet"),
        (job(JobStatus.QUEUED), "j1", "its send was never confirmed"),
        (job(JobStatus.FAILED), "j1", "is FAILED and not settled yet"),
        (job(JobStatus.IN_FLIGHT), "j1", "redrive it from there"),
        (job(JobStatus.REJECTED), "j1", "rejected message"),
        (None, "msg#m1", "rejected message"),
        (job(JobStatus.DEAD), "j1", "no stored message"),
    ],
)
def test_a_retry_is_refused_when_the_job_cannot_run_again(record: JobRecord | None, halting: str, words: str) -> None:
    reason = decisions.retry_refusal(record, halting_job_id=halting, workspace_id="w1")
    assert reason is not None
    assert words in reason


def test_a_retry_runs_a_dead_job_with_its_message_or_a_parked_one() -> None:
    assert decisions.retry_refusal(job(JobStatus.DEAD, has_body=True), halting_job_id="j1", workspace_id="w1") is None
    assert decisions.retry_refusal(job(JobStatus.PARKED), halting_job_id="j1", workspace_id="w1") is None
    assert decisions.retry_refusal(None, halting_job_id="j1", workspace_id="w1") is None  # halted without a record


def test_a_live_lease_holds_off_a_decision() -> None:
    assert decisions.lease_refusal(job(JobStatus.IN_FLIGHT, lease_expires_at=NOW), halting_job_id="j1", now=NOW)
    assert (
        decisions.lease_refusal(job(JobStatus.IN_FLIGHT, lease_expires_at=NOW - 1), halting_job_id="j1", now=NOW)
        is None
    )
    assert decisions.lease_refusal(None, halting_job_id="j1", now=NOW) is None


@pytest.mark.parametrize(
    ("status", "decision", "change"),
    [
        (JobStatus.PARKED, ResumeDecision.SKIP, -1),
        (JobStatus.DEAD, ResumeDecision.SKIP, 0),
        (JobStatus.DEAD, ResumeDecision.RETRY, 1),
        (JobStatus.PARKED, ResumeDecision.RETRY, 0),
        (None, ResumeDecision.SKIP, 0),
    ],
)
def test_a_decision_changes_the_parked_count(status: JobStatus | None, decision: ResumeDecision, change: int) -> None:
    assert decisions.parked_change(status, decision) == change


def test_the_next_undecided_job_is_the_earliest_in_queue_order_and_unrecorded_ones_last() -> None:
    candidates = {
        "late": job(JobStatus.DEAD, sequence_number="30", error="boom"),
        "early": job(JobStatus.PARKED, sequence_number="4", parked_reason="behind"),
        "ghost": None,
    }
    assert decisions.next_undecided(candidates) == ("early", "job early is PARKED: behind")
    del candidates["early"]
    assert decisions.next_undecided(candidates) == ("late", "job late is DEAD: boom")
    assert decisions.next_undecided({"ghost": None}) == ("ghost", "halted by ghost (no job record)")


def test_the_queue_order_is_numeric_not_by_string() -> None:
    candidates = {"nine": job(JobStatus.DEAD, sequence_number="9"), "ten": job(JobStatus.DEAD, sequence_number="10")}
    assert decisions.next_undecided(candidates)[0] == "nine"


def test_where_a_decided_resume_takes_the_workspace() -> None:
    assert decisions.resume_action(halted(), next_halt="j2", parked_delta=0) is WorkspaceAction.DECIDE_NEXT
    assert decisions.resume_action(halted(), next_halt=None, parked_delta=0) is WorkspaceAction.RESUME_EMPTY
    assert decisions.resume_action(halted(), next_halt=None, parked_delta=1) is WorkspaceAction.RESUME
    assert (
        decisions.resume_action(halted(parked_count=1), next_halt=None, parked_delta=-1) is WorkspaceAction.RESUME_EMPTY
    )
    assert (
        decisions.resume_action(halted(draining_job_id="j3"), next_halt=None, parked_delta=0) is WorkspaceAction.RESUME
    )


def test_records_read_from_stored_items() -> None:
    record = JobRecord.from_item(
        {"jobId": "j1", "status": "IN_FLIGHT", "leaseExpiresAt": 5, "attempt": 2, "body": "x", "leaseShared": True}
    )
    assert (record.status, record.lease_expires_at, record.attempt, record.has_body, record.lease_shared) == (
        JobStatus.IN_FLIGHT,
        5,
        2,
        True,
        True,
    )
    workspace = WorkspaceRecord.from_item(
        {"pk": "ws#w9", "state": "RESUMING", "undecidedJobIds": {"a"}, "lastResume": {"decision": "retry"}}
    )
    assert workspace.workspace_id == "w9"
    assert workspace.state is WorkspaceState.RESUMING
    assert workspace.undecided_job_ids == {"a"}
    assert workspace.last_resume.decision == "retry"
    assert WorkspaceRecord.from_item({"pk": "ws#w9"}).state is WorkspaceState.ACTIVE
