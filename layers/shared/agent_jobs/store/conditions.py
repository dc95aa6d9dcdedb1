"""Named fragments of the store's condition and update expressions, and the indexes they use.

Status lists come from the transition table (`agent_jobs.core.transitions`): a write may leave a record only from a
state the table allows for its action.
"""

from __future__ import annotations

from typing import Any

from agent_jobs.core.transitions import JobAction, job_sources, recorded
from agent_jobs.keys import parked_sequence
from agent_jobs.models import JobStatus

# Sparse indexes (template.yaml): PARKED jobs by workspace in SequenceNumber order; halted workspaces by tenant.
PARKED_INDEX = "parkedByWorkspace"
HALTED_INDEX = "haltedByTenant"
# Sparse index of the jobs a workspace accepted and has not settled (neither SUCCEEDED nor SKIPPED), in queue order:
# `pendingWorkspace` HASH, `queueSeq` RANGE: the job's place (its SequenceNumber, zero-padded), or for a job whose place
# is not known yet (recorded, its send unconfirmed) `keys.unplaced_sequence`, which sorts before every place.
PENDING_INDEX = "pendingByWorkspace"
# Sparse: a job claimed from the queue is in it, under its tenant, until its lease ends (see `LeaseStore.claim`).
RUNNING_INDEX = "runningByTenant"
# What ends a queue claim's entry in RUNNING_INDEX: every write that settles or releases the job removes them.
RUNNING_ATTRIBUTES = "runningTenant, runningInvocation"
# Sparse: the records of messages the worker refused without halting a workspace (another sender's or tenant's, a group
# of no workspace), under `msg#<messageId>`: `refusedDay` (UTC, YYYY-MM-DD) HASH, `acceptedAt` RANGE.
REFUSED_INDEX = "refusedByDay"
# The table's GSI of job records by workspace, in acceptance order (template.yaml: workspaceId HASH, acceptedAt RANGE).
WORKSPACE_INDEX = "byWorkspace"
# Pending jobs ahead of a job that a claim reads at most, and names at most in a halt reason.
MAX_MISSING_LISTED = 25

# The claims a job had before an operator's retry started its attempts again (`attempt` is the claims since, which
# `Settings.max_claims` bounds): what a tenant sees as the job's `attempt` counts both.
ATTEMPTS_BEFORE_RETRY = "attemptsBeforeRetry"

# A failed attempt may be retried while fewer than max_attempts - 1 failures are recorded (`:lastfailure`); a retried
# one counts one more (`StoreBase._failure_values` gives the three values).
FAILURES_LEFT = "(attribute_not_exists(failures) OR failures < :lastfailure)"
COUNT_FAILURE = "failures = if_not_exists(failures, :zero) + :one"
# The writer still holds the job's lease (`:owner`, `:inflight`).
LEASE_HELD = "leaseOwner = :owner AND #status = :inflight"
# A lease whose worker never came back.
LEASE_EXPIRED = "#status = :inflight AND leaseExpiresAt < :now"
# Only a new record or one that carries the same payload.
SAME_PAYLOAD = "(attribute_not_exists(pk) OR payloadHash = :hash)"


def status_in(values: dict[str, Any], action: JobAction) -> str:
    """`#status IN (...)` over the recorded states the table allows `action` from (placeholders added to
    `values`); a transition from no record or from IN_FLIGHT has its own fragment (its side condition differs)."""
    states = [s for s in recorded(job_sources(action)) if s is not JobStatus.IN_FLIGHT]
    names = []
    for status in states:
        name = f":from{status.name.lower().replace('_', '')}"
        values[name] = str(status)
        names.append(name)
    return f"#status IN ({', '.join(names)})"


def lease_held(values: dict[str, Any], owner: str) -> str:
    """LEASE_HELD for the lease of `owner` (its placeholders added to `values`)."""
    values.update({":owner": owner, ":inflight": str(JobStatus.IN_FLIGHT)})
    return LEASE_HELD


def place_clauses(values: dict[str, Any], sequence_number: str | None) -> tuple[str, str]:
    """(SET clauses with a leading comma, a condition) that make `sequence_number` the job's place in its
    workspace's queue order (`sequenceNumber`, and `queueSeq`, the key of the pending index), on a record whose place
    is not known yet or is that one already. A recorded place never moves: the condition fails on a record placed
    elsewhere, and the writer decides from the old item (`decisions.place_mismatch`). Both are empty for a message
    without a numeric SequenceNumber (nothing to order by). Values go into `values`."""
    if not sequence_number or not sequence_number.isdigit():
        return "", ""
    values[":seq"] = sequence_number
    values[":qseq"] = parked_sequence(sequence_number, 0)
    return ", sequenceNumber = :seq, queueSeq = :qseq", PLACE_UNSET_OR_SAME


# A record not placed in its queue yet, or placed where this write places it (`place_clauses`).
PLACE_UNSET_OR_SAME = "(attribute_not_exists(sequenceNumber) OR sequenceNumber = :seq)"
