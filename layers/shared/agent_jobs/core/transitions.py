"""Every state change of a job and of a workspace, as a table.

A row says: the action `action`, taken on a record in `source` (None: no record yet), leaves it in `target`, only
`when` its side condition holds. The store builds its conditional writes from these rows (`sources`), and
`docs/architecture.md`'s state diagram is generated from them (`python -m agent_jobs.core.diagram`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from agent_jobs.models import JobStatus, WorkspaceState


class JobAction(StrEnum):
    ACCEPT = "accept"  # the API records a job before it sends it
    CLAIM = "claim"  # a worker takes a lease to run the job
    TAKE_OVER = "take over"  # a worker claims a job whose last worker never came back
    COMPLETE = "complete"  # the job ran and took effect
    RETRY_LATER = "fail, attempts left"  # the job failed and the queue delivers it again
    DIE = "fail for good"  # a permanent error, or the last attempt failed: DEAD, and the workspace halts
    EXHAUST = "claims used up"  # claimed too often by workers that never came back: DEAD, and the workspace halts
    PARK = "park"  # the workspace is halted: the job waits, in queue order, for a resume
    REJECT = "reject"  # a message that is not a valid job: recorded, and the workspace halts
    SKIP = "skip on resume"  # an operator drops the job that halted the workspace
    RETRY = "retry on resume"  # an operator runs the job that halted the workspace again
    DRAIN = "drain"  # a resume runs a parked job, in queue order
    PARK_AGAIN = "fail in the drain, attempts left"  # a drained job failed: parked again at its place
    # a job accepted ahead of it may still be confirmed by its producer: the claim is given back, uncounted
    WAIT = "wait for an unplaced job ahead"


class WorkspaceAction(StrEnum):
    HALT = "halt"  # a job of the workspace is DEAD, REJECTED or missing: nothing behind it runs
    DECIDE_NEXT = "decide, another undecided"  # decided; another job halted it meanwhile: decide that one next
    RESUME = "resume"  # decided; parked jobs drain in queue order
    RESUME_EMPTY = "resume, nothing parked"  # decided; nothing is parked: the workspace runs again at once
    ACTIVATE = "drain done"  # the drain ran every parked job


@dataclass(frozen=True)
class Transition:
    action: str
    source: str | None
    target: str
    when: str = ""


_J = JobStatus
_W = WorkspaceState

JOB_TRANSITIONS: tuple[Transition, ...] = (
    Transition(JobAction.ACCEPT, None, _J.QUEUED, "the workspace is the tenant's registration"),
    Transition(JobAction.CLAIM, None, _J.IN_FLIGHT, "a message the API never recorded; the workspace is ACTIVE"),
    Transition(JobAction.CLAIM, _J.QUEUED, _J.IN_FLIGHT, "the workspace is ACTIVE and claims are left"),
    Transition(JobAction.CLAIM, _J.FAILED, _J.IN_FLIGHT, "the workspace is ACTIVE and claims are left"),
    Transition(JobAction.TAKE_OVER, _J.IN_FLIGHT, _J.IN_FLIGHT, "the lease expired and the claim runs alone"),
    Transition(JobAction.COMPLETE, _J.IN_FLIGHT, _J.SUCCEEDED, "the worker still holds the lease"),
    Transition(JobAction.RETRY_LATER, _J.IN_FLIGHT, _J.FAILED, "the worker holds the lease; failures are left"),
    Transition(JobAction.DIE, _J.IN_FLIGHT, _J.DEAD, "the worker holds the lease"),
    Transition(JobAction.EXHAUST, _J.QUEUED, _J.DEAD, "claims used up"),
    Transition(JobAction.EXHAUST, _J.FAILED, _J.DEAD, "claims used up"),
    Transition(JobAction.EXHAUST, _J.IN_FLIGHT, _J.DEAD, "the lease expired; claims used up or its last delivery"),
    Transition(JobAction.PARK, None, _J.PARKED, "the workspace is halted"),
    Transition(JobAction.PARK, _J.QUEUED, _J.PARKED, "the workspace is halted"),
    Transition(JobAction.PARK, _J.FAILED, _J.PARKED, "the workspace is halted"),
    Transition(JobAction.PARK, _J.IN_FLIGHT, _J.PARKED, "its own lease, or an expired one"),
    Transition(JobAction.REJECT, None, _J.REJECTED, "a message that is no valid job"),
    Transition(JobAction.REJECT, _J.REJECTED, _J.REJECTED, "the same message delivered again"),
    Transition(JobAction.SKIP, _J.DEAD, _J.SKIPPED, "it halts the workspace"),
    Transition(JobAction.SKIP, _J.REJECTED, _J.SKIPPED, "it halts the workspace"),
    Transition(JobAction.SKIP, _J.PARKED, _J.SKIPPED, "it halts the workspace"),
    Transition(JobAction.SKIP, _J.QUEUED, _J.SKIPPED, "it halts the workspace: accepted, never ran"),
    Transition(JobAction.SKIP, _J.FAILED, _J.SKIPPED, "it halts the workspace: accepted, never settled"),
    Transition(JobAction.SKIP, _J.IN_FLIGHT, _J.SKIPPED, "it halts the workspace; its lease expired"),
    Transition(JobAction.RETRY, _J.DEAD, _J.PARKED, "it halts the workspace and its message is stored"),
    Transition(JobAction.RETRY, _J.PARKED, _J.PARKED, "it halts the workspace"),
    Transition(JobAction.DRAIN, _J.PARKED, _J.IN_FLIGHT, "the workspace is RESUMING by this resume"),
    Transition(JobAction.DRAIN, _J.IN_FLIGHT, _J.IN_FLIGHT, "the drain's own job; its lease expired"),
    Transition(JobAction.PARK_AGAIN, _J.IN_FLIGHT, _J.PARKED, "a drained job; failures are left"),
    Transition(JobAction.WAIT, _J.IN_FLIGHT, _J.QUEUED, "its own lease; the claim is not counted"),
)

WORKSPACE_TRANSITIONS: tuple[Transition, ...] = (
    Transition(WorkspaceAction.HALT, None, _W.HALTED, "the first halt names the halting job"),
    Transition(WorkspaceAction.HALT, _W.ACTIVE, _W.HALTED, "the first halt names the halting job"),
    Transition(WorkspaceAction.HALT, _W.HALTED, _W.HALTED, "the job joins the undecided ones"),
    Transition(WorkspaceAction.HALT, _W.RESUMING, _W.HALTED, "the resume under way ends"),
    Transition(WorkspaceAction.DECIDE_NEXT, _W.HALTED, _W.HALTED, "other halting jobs are undecided"),
    Transition(WorkspaceAction.RESUME, _W.HALTED, _W.RESUMING, "every halting job decided; jobs are parked"),
    Transition(WorkspaceAction.RESUME_EMPTY, _W.HALTED, _W.ACTIVE, "every halting job decided; nothing parked"),
    Transition(WorkspaceAction.ACTIVATE, _W.RESUMING, _W.ACTIVE, "nothing parked, draining or undecided"),
)


class IllegalTransition(ValueError):
    """An action taken on a record in a state the table does not allow it from."""


def _rows(table: Iterable[Transition], action: str) -> list[Transition]:
    rows = [row for row in table if row.action == action]
    if not rows:
        raise KeyError(f"no transition is named {action!r}")
    return rows


def job_sources(action: JobAction) -> frozenset[JobStatus | None]:
    """The states a job record may be in for `action` (None: no record yet)."""
    return frozenset(JobStatus(row.source) if row.source else None for row in _rows(JOB_TRANSITIONS, action))


def workspace_sources(action: WorkspaceAction) -> frozenset[WorkspaceState | None]:
    return frozenset(WorkspaceState(row.source) if row.source else None for row in _rows(WORKSPACE_TRANSITIONS, action))


def _target(table: Iterable[Transition], action: str, source: str | None, *, record: str) -> str:
    for row in _rows(table, action):
        if row.source == source:
            return row.target
    raise IllegalTransition(f"a {record} cannot {action} from {source or 'no record'}")


def job_target(action: JobAction, source: JobStatus | None) -> JobStatus:
    """The state `action` leaves a job in that was in `source`; IllegalTransition if the table has no such row."""
    return JobStatus(_target(JOB_TRANSITIONS, action, source, record="job"))


def workspace_target(action: WorkspaceAction, source: WorkspaceState | None) -> WorkspaceState:
    return WorkspaceState(_target(WORKSPACE_TRANSITIONS, action, source, record="workspace"))


def recorded(states: Iterable[JobStatus | None]) -> tuple[JobStatus, ...]:
    """The recorded states of `states` in table order (for a condition's `#status IN (...)`)."""
    wanted = set(states)
    return tuple(status for status in JobStatus if status in wanted)


# Jobs that can halt a workspace without having run to an outcome: accepted jobs the queue let go before the worker
# settled them. A resume may skip them; retrying one needs its message redriven first.
UNSETTLED = frozenset({JobStatus.QUEUED, JobStatus.FAILED, JobStatus.IN_FLIGHT})
# The halting jobs a resume decision changes.
DECIDABLE = frozenset(s for s in job_sources(JobAction.SKIP) if s is not None)
# The jobs whose effect is over: a delivery of them again is acknowledged without running.
DONE = frozenset({JobStatus.SUCCEEDED, JobStatus.SKIPPED})
# The jobs in the hands of the halt machinery: their halt is on record.
HELD = frozenset({JobStatus.DEAD, JobStatus.REJECTED, JobStatus.PARKED})
