"""What the store answers: a lease, and the result of each kind of write or read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent_jobs.core.outcomes import AcceptOutcome, ClaimOutcome, ResumeOutcome
from agent_jobs.store.codec import Item


@dataclass(frozen=True)
class Lease:
    """Proof of a claim: later writes of this job are conditional on `owner` still being the lease owner."""

    job_id: str
    workspace_id: str
    tenant_id: str
    owner: str
    expires_at_ms: int
    # Set when the job was claimed by a resume's drain: a retryable failure parks it again instead of FAILED.
    resume_id: str | None = None
    parked_seq: str | None = None


@dataclass(frozen=True)
class QueuePlace:
    """Where a job takes effect in its workspace's queue order: the message the producer's answer names and its
    SequenceNumber, as recorded on the job (None for a job whose place is not known yet)."""

    message_id: str | None
    sequence_number: str | None


@dataclass(frozen=True)
class ClaimResult:
    outcome: ClaimOutcome
    lease: Lease | None = None
    # The job item as it was when the claim lost; for a claim that won, as it was just before it (its status, its
    # place, when its send was confirmed).
    previous: Item | None = None
    workspace: Item | None = None  # the workspace item when it blocked the claim
    # The job's place (its SequenceNumber) once claimed: the delivered copy's, or the one recorded before it.
    place: str | None = None

    @property
    def claimed(self) -> bool:
        return self.outcome is ClaimOutcome.CLAIMED


@dataclass(frozen=True)
class AcceptResult:
    outcome: AcceptOutcome
    item: Item = field(default_factory=dict)


@dataclass(frozen=True)
class JobsAhead:
    """The unsettled jobs a workspace accepted ahead of a job (`QueryStore.jobs_ahead`): `missing` left the queue
    without an outcome, or are unplaced for too long to wait for; `unplaced` may still be confirmed by their
    producers (wait for them)."""

    missing: list[Item]
    unplaced: list[Item]

    @property
    def all(self) -> list[Item]:
        """Every job ahead, earliest first: what a job that cannot wait for the unplaced ones treats as missing."""
        return sorted([*self.missing, *self.unplaced], key=lambda item: str(item.get("queueSeq", "")))


@dataclass(frozen=True)
class JobPage:
    """One page of a workspace's job records, and where the next page starts (None: there is no next page)."""

    items: list[Item]
    next_key: Item | None


@dataclass(frozen=True)
class ResumeResult:
    outcome: ResumeOutcome
    workspace: Item | None = None  # the workspace item after the resume began, or as read when refused
    resume_id: str | None = None
    reason: str = ""  # for a refusal: what the operator can do

    @property
    def begun(self) -> bool:
        return self.outcome in (
            ResumeOutcome.RESUMING,
            ResumeOutcome.ACTIVE,
            ResumeOutcome.ALREADY_RESUMING,
            ResumeOutcome.DECIDED,
        )


@dataclass(frozen=True)
class HaltedPage:
    """A page of the halted-workspaces index: workspace items (HALTED or RESUMING) and where the next page starts."""

    workspaces: list[Item]
    next_key: dict[str, Any] | None
