"""What a write of job or workspace state came to: the answers the store gives its callers."""

from __future__ import annotations

from enum import StrEnum


class ClaimOutcome(StrEnum):
    CLAIMED = "CLAIMED"  # run the job, then complete or fail with the lease
    DUPLICATE = "DUPLICATE"  # already SUCCEEDED or SKIPPED: acknowledge without effect
    BUSY = "BUSY"  # another worker holds a live lease: report the record failed, never acknowledge
    WORKSPACE_HALTED = "WORKSPACE_HALTED"  # the workspace is HALTED or RESUMING: park the job (under the claim's lease)
    SETTLED = "SETTLED"  # already DEAD, REJECTED or PARKED: its halt is on record; acknowledge
    EXHAUSTED = "EXHAUSTED"  # attempts used up by workers that never came back: now DEAD, workspace halted
    CONFLICT = "CONFLICT"  # same jobId, another payload: acknowledge without effect
    CONTENDED = "CONTENDED"  # a concurrent transaction touched the items: retry later
    # Its last claim never came back from an invocation that ran other jobs too, so it may be what killed that
    # invocation, or an innocent victim of another job: claim it again only alone (`claim(..., alone=True)`).
    SUSPECT = "SUSPECT"
    # A copy of the job ahead of its place in the queue: the job's place was recorded later (a send confirmed after
    # the deduplication window, while this earlier copy was still queued). The copy at its place runs it:
    # acknowledge this one without effect.
    STALE_COPY = "STALE_COPY"
    # A copy behind the job's recorded place, the job not yet settled (its copy there left the queue unsettled): the
    # store claims it again at the recorded place (`claim`); callers never see this outcome.
    LATER_COPY = "LATER_COPY"


class FailOutcome(StrEnum):
    RETRY = "RETRY"  # FAILED, the queue will deliver it again
    DEAD = "DEAD"  # DEAD and the workspace HALTED, in one transaction
    LOST = "LOST"  # the lease was taken over: nothing written
    PARKED = "PARKED"  # a drained job with attempts left: PARKED again (counted), the drain retries it first


class AcceptOutcome(StrEnum):
    NEW = "NEW"  # recorded QUEUED: send it
    UNSENT = "UNSENT"  # recorded earlier with the same payload but never confirmed sent: send it (idempotent)
    EXISTING = "EXISTING"  # recorded and sent earlier with the same payload: answer with the stored state
    CONFLICT = "CONFLICT"  # the jobId exists with another payload or tenant
    WORKSPACE_FORBIDDEN = "WORKSPACE_FORBIDDEN"  # the workspace is registered to (or halted for) another tenant
    WORKSPACE_UNREGISTERED = "WORKSPACE_UNREGISTERED"  # no tenant registered the workspace: register it first


class ResumeOutcome(StrEnum):
    RESUMING = "RESUMING"  # decided; send the drain marker (resume_id) into the workspace's group
    ACTIVE = "ACTIVE"  # decided, and nothing was parked: the workspace runs its jobs again at once
    ALREADY_RESUMING = "ALREADY_RESUMING"  # the same resume was begun before: send its drain marker again (idempotent)
    # Decided; another job halted the workspace while it was halted and is undecided: the workspace stays HALTED with
    # that job as its haltingJobId (decide it next). Nothing drains until every halting job is decided.
    DECIDED = "DECIDED"
    NOT_FOUND = "NOT_FOUND"  # no workspace item, or one no tenant owns
    OTHER_TENANT = "OTHER_TENANT"  # the workspace belongs to another tenant
    NOT_HALTED = "NOT_HALTED"  # ACTIVE, or RESUMING from another decision
    HALTING_JOB_CHANGED = "HALTING_JOB_CHANGED"  # the workspace is halted by another job than the operator saw
    RETRY_REFUSED = "RETRY_REFUSED"  # the halting job cannot run again (a REJECTED message, no stored body): skip it
