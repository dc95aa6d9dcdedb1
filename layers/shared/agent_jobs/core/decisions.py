"""The decisions taken when a conditional write lost, or before a resume writes: pure functions over typed records.

The store asks the table for a transition with a conditional write; DynamoDB decides it atomically. When the
condition fails, the store hands the record as it was to these functions, which say what happened and what to do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from agent_jobs.core.outcomes import AcceptOutcome, ClaimOutcome, ResumeOutcome
from agent_jobs.core.records import JobRecord, WorkspaceRecord
from agent_jobs.core.transitions import DONE, HELD, UNSETTLED, WorkspaceAction
from agent_jobs.models import JobStatus, ResumeDecision, WorkspaceState


@dataclass(frozen=True)
class LostClaim:
    """Why a claim lost. EXHAUSTED carries the error to make the job DEAD with (the store writes it, and answers
    CONTENDED instead if that write loses too)."""

    outcome: ClaimOutcome
    dead_error: str = ""


def lost_claim(
    job: JobRecord,
    *,
    payload_hash: str,
    now: int,
    alone: bool,
    near_delivery_limit: bool,
    max_claims: int,
    sequence_number: str | None = None,
) -> LostClaim:
    """A claim's condition on the job failed: what the job's record says about it. `sequence_number`: the delivered
    copy's SequenceNumber (the claim places the job there unless its record is placed elsewhere)."""
    taken = _taken(job, payload_hash=payload_hash, now=now)
    if taken is not None:
        return LostClaim(taken)
    mismatch = place_mismatch(job, sequence_number)
    if mismatch is not None:
        return LostClaim(mismatch)
    lost = job.status is JobStatus.IN_FLIGHT  # its worker never came back
    if lost and not alone:
        return LostClaim(ClaimOutcome.SUSPECT)
    lost_near_limit = lost and near_delivery_limit and not job.lease_shared
    if job.attempt < max_claims and not lost_near_limit:
        return LostClaim(ClaimOutcome.CONTENDED)  # the item changed between write and check
    # Claims used up, mostly by workers that never came back (or max_claims was lowered), or a worker that never came
    # back from running this job alone, on a message with few deliveries left: dead, and halt.
    if lost_near_limit:
        error = (
            f"claim {job.attempt} never came back from an invocation that ran this job alone, and the message is near"
            " its delivery limit"
        )
    else:
        error = f"claims exhausted ({job.attempt} of {max_claims}) without a recorded outcome"
    return LostClaim(ClaimOutcome.EXHAUSTED, error)


def place_mismatch(job: JobRecord, sequence_number: str | None) -> ClaimOutcome | None:
    """A delivered copy whose SequenceNumber is not the job's recorded place: STALE_COPY when the place is later (the
    copy at the place runs the job), LATER_COPY when it is earlier (claim the job at its place); None when the record
    has no place yet, or this one, or either is not a number."""
    place, delivered = job.sequence_number, sequence_number
    if not place or not delivered or not place.isdigit() or not delivered.isdigit() or int(place) == int(delivered):
        return None
    return ClaimOutcome.STALE_COPY if int(place) > int(delivered) else ClaimOutcome.LATER_COPY


def _taken(job: JobRecord, *, payload_hash: str, now: int) -> ClaimOutcome | None:
    """The claim lost to the job's own state: another payload, done, held by the halt machinery, or a live lease."""
    if job.payload_hash not in (None, payload_hash):
        return ClaimOutcome.CONFLICT
    if job.status in DONE:
        return ClaimOutcome.DUPLICATE
    if job.status in HELD:
        return ClaimOutcome.SETTLED
    if job.lease_live(now):
        return ClaimOutcome.BUSY
    return None


def lost_drain_claim(job: JobRecord, *, now: int, reclaim: bool) -> ClaimOutcome:
    """A drain's claim of a parked job lost on the job: BUSY (a live lease), EXHAUSTED (its drain never came back and
    claims are used up: make it DEAD), or SETTLED (it is no longer PARKED: the index showed a stale entry)."""
    if reclaim and job.status is JobStatus.IN_FLIGHT:
        return ClaimOutcome.BUSY if job.lease_live(now) else ClaimOutcome.EXHAUSTED
    return ClaimOutcome.SETTLED


def fail_lost(job: JobRecord, *, owner: str) -> bool:
    """A failure's write lost: True if the lease is no longer `owner`'s (another worker took the job over)."""
    return job.lease_owner != owner or job.status is not JobStatus.IN_FLIGHT


def workspace_refusal(owner: str | None, tenant_id: str | None) -> AcceptOutcome:
    """Why a workspace ownership check failed, from the workspace's owner (None: nobody registered it)."""
    if owner and owner != tenant_id:
        return AcceptOutcome.WORKSPACE_FORBIDDEN
    return AcceptOutcome.WORKSPACE_UNREGISTERED


def known_job(
    old: JobRecord, *, payload_hash: str, tenant_id: str | None, refusal: AcceptOutcome | None
) -> AcceptOutcome:
    """An accepted jobId is known: another job's record (CONFLICT), the same job sent (EXISTING), or the same job
    unsent (UNSENT: sent only while its workspace is still the tenant's own registration)."""
    if old.payload_hash != payload_hash or old.tenant_id != tenant_id:
        return AcceptOutcome.CONFLICT
    if old.message_id:
        return AcceptOutcome.EXISTING
    return refusal or AcceptOutcome.UNSENT


@dataclass(frozen=True)
class Refusal:
    outcome: ResumeOutcome
    reason: str = ""


def resume_refusal(
    workspace: WorkspaceRecord | None,
    *,
    workspace_id: str,
    tenant_id: str,
    halting_job_id: str,
    decision: ResumeDecision,
) -> Refusal | None:
    """Why a resume cannot begin on the workspace as read, or None when it can. ALREADY_RESUMING is the same resume
    begun before (its drain marker is sent again)."""
    if workspace is None or not workspace.tenant_id:
        return Refusal(ResumeOutcome.NOT_FOUND, f"no workspace '{workspace_id}'")
    if workspace.tenant_id != tenant_id:
        return Refusal(ResumeOutcome.OTHER_TENANT)
    last = workspace.last_resume
    if (
        workspace.state is WorkspaceState.RESUMING
        and last.halting_job_id == halting_job_id
        and last.decision == str(decision)
    ):
        return Refusal(ResumeOutcome.ALREADY_RESUMING)
    if workspace.state is not WorkspaceState.HALTED:
        return Refusal(
            ResumeOutcome.NOT_HALTED, f"workspace '{workspace_id}' is {workspace.state}, not HALTED; nothing to resume"
        )
    if workspace.halting_job_id != halting_job_id:
        current = workspace.halting_job_id
        decided = last.halting_job_id == halting_job_id and halting_job_id not in workspace.undecided_job_ids
        return Refusal(
            ResumeOutcome.HALTING_JOB_CHANGED,
            f"'{halting_job_id}' is decided ({last.decision}); workspace '{workspace_id}' is still halted by"
            f" '{current}': decide that job next"
            if decided
            else f"workspace '{workspace_id}' is halted by '{current}', not '{halting_job_id}'; read the workspace"
            " again and decide for its halting job",
        )
    return None


def retry_refusal(job: JobRecord | None, *, halting_job_id: str, workspace_id: str) -> str | None:
    """Why the halting job cannot run again (the operator's way out), or None when a retry can run it."""
    status = job.status if job else None
    if job is not None and status is JobStatus.QUEUED and not job.sequence_number:
        return (
            f"job '{halting_job_id}' was accepted but its send was never confirmed, so where its message is (if"
            " anywhere) is unknown: if its client sends it again (same jobId and payload), it is queued and parked"
            f" here; if its message is in the dead-letter queue, redrive it (agent-jobs dlq redrive --workspace"
            f" {workspace_id}), which parks it; then retry it. Or resume with decision 'skip' to drop it"
        )
    if status in UNSETTLED:
        return (
            f"job '{halting_job_id}' is {status} and not settled yet: its message is either still on the queue, where"
            " a worker settles it (it runs, or becomes DEAD), or in the dead-letter queue: redrive it from there"
            f" (agent-jobs dlq redrive --workspace {workspace_id}), which parks it; then retry it, or resume with"
            " decision 'skip'"
        )
    if halting_job_id.startswith("msg#") or status is JobStatus.REJECTED:
        return f"'{halting_job_id}' is a rejected message and cannot run; resume with decision 'skip'"
    if status is JobStatus.DEAD and not (job and job.has_body):
        return (
            f"job '{halting_job_id}' has no stored message to run again; resume with decision 'skip' and"
            " submit the job again under a new jobId"
        )
    return None


def lease_refusal(job: JobRecord | None, *, halting_job_id: str, now: int) -> str | None:
    """A halting job held by a live lease is not decided while its worker may still run it."""
    if job is not None and job.lease_live(now):
        return f"job '{halting_job_id}' is held by a worker's lease right now; resume again after it ends"
    return None


def parked_change(status: JobStatus | None, decision: ResumeDecision) -> int:
    """How a decision changes the workspace's count of parked jobs: a skipped PARKED job leaves it, a retried DEAD
    job joins it."""
    if decision is ResumeDecision.SKIP:
        return -1 if status is JobStatus.PARKED else 0
    return 1 if status is JobStatus.DEAD else 0


def next_undecided(candidates: Mapping[str, JobRecord | None]) -> tuple[str, str]:
    """The undecided halting job the operator decides next, and its halt reason: the earliest in queue order (its
    record's SequenceNumber; a job without a record last, by jobId)."""
    ranked: list[tuple[tuple[int, str, str], str, str]] = []
    for job_id, job in candidates.items():
        if job is not None:
            detail = job.error or job.parked_reason or "no recorded reason"
            ranked.append(((0, job.queue_position(), job_id), job_id, f"job {job_id} is {job.status}: {detail}"))
        else:
            ranked.append(((1, "", job_id), job_id, f"halted by {job_id} (no job record)"))
    _, job_id, reason = min(ranked)
    return job_id, reason


def resume_action(workspace: WorkspaceRecord, *, next_halt: str | None, parked_delta: int) -> WorkspaceAction:
    """Where a decided resume takes the workspace: HALTED by the next undecided job, ACTIVE at once when nothing is
    parked or draining, else RESUMING (the drain runs the parked jobs)."""
    if next_halt is not None:
        return WorkspaceAction.DECIDE_NEXT
    if workspace.parked_count + parked_delta <= 0 and not workspace.draining_job_id:
        return WorkspaceAction.RESUME_EMPTY
    return WorkspaceAction.RESUME


def missing_reason(workspace_id: str, job_id: str, missing_ids: list[str]) -> str:
    """The halt reason for jobs accepted before `job_id` that left the queue without an outcome."""
    return (
        f"jobs {', '.join(missing_ids)} were accepted before job {job_id} but never took effect: the queue let their"
        " messages go before the worker recorded an outcome (dead-lettered). Redrive them from the dead-letter queue"
        f" (agent-jobs dlq redrive --workspace {workspace_id}) and resume with --retry for each, or resume with --skip"
        " for each to drop them"
    )
