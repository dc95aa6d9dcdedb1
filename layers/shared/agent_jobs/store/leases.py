"""Leases: a worker's claim of a job, and its completion or failure under the lease."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

from botocore.exceptions import ClientError

from agent_jobs.core import decisions
from agent_jobs.core.outcomes import ClaimOutcome, FailOutcome
from agent_jobs.core.records import JobRecord, WorkspaceRecord
from agent_jobs.core.transitions import JobAction
from agent_jobs.keys import job_key
from agent_jobs.models import JobMessage, JobStatus
from agent_jobs.store.base import message_clauses, message_tenant, message_values
from agent_jobs.store.codec import Item, condition_failed, stored_error, to_item
from agent_jobs.store.conditions import (
    COUNT_FAILURE,
    FAILURES_LEFT,
    LEASE_EXPIRED,
    RUNNING_ATTRIBUTES,
    SAME_PAYLOAD,
    lease_held,
    place_clauses,
    status_in,
)
from agent_jobs.store.drain import DrainStore
from agent_jobs.store.results import ClaimResult, Lease


class LeaseStore(DrainStore):
    """Claims of jobs and what their workers record."""

    def claim(
        self,
        message: JobMessage,
        *,
        message_id: str,
        sequence_number: str | None,
        remaining_ms: int,
        body: str | None = None,
        near_delivery_limit: bool = False,
        alone: bool = True,
        invocation_id: str | None = None,
    ) -> ClaimResult:
        """Claim a job for this invocation: one conditional update of the job, then a consistent read of its workspace
        (WORKSPACE_HALTED with the lease when it is HALTED or RESUMING: park the job under it, `park(unclaim=True)`).
        Succeeds iff the job is new, QUEUED, FAILED, or IN_FLIGHT with an expired lease (its
        worker never came back), has been claimed fewer than `max_claims` times, and carries the payload it was
        accepted with. A FAILED job always has attempts left: `fail` makes the last allowed failure DEAD.

        `alone`: no other job of this invocation runs while this one does. An invocation that dies (killed, out of
        memory, timed out) takes every job it had in flight with it, and only a job that ran alone is known to be
        the one that killed it. So a claim that is not alone never takes over an expired lease (SUSPECT: claim it
        again alone), and the lease records whether it was shared (`leaseShared`).

        `near_delivery_limit`: the message has few deliveries left before the queue's redrive. An expired lease of a
        claim that ran alone is then not taken over: the job is what killed its worker, and one more crash would let
        the queue dead-letter it. It becomes DEAD (EXHAUSTED) and halts its workspace instead. An expired shared lease
        is taken over: that job only shared an invocation that died, and most likely another job killed it.

        `body` (the message body) is written only if the claim finds the attempts used up and the job becomes DEAD,
        so that an operator can retry it; the happy path never writes it.

        `invocation_id` (the invocation's request id) puts the job, in the same write, in the sparse running index
        under its tenant (`runningTenant`, `runningInvocation`), which counts the invocations a tenant occupies
        (`running_invocations`); every write that settles or releases the job takes it out again, and a lease that
        ends without one (its worker crashed) drops out of the count when it expires.
        """
        now = self._clock()
        owner = secrets.token_hex(16)
        expires = now + max(remaining_ms, 0)
        values: dict[str, Any] = {
            ":inflight": str(JobStatus.IN_FLIGHT),
            ":now": now,
            ":maxclaims": self._max_claims,
            ":zero": 0,
            ":one": 1,
            ":owner": owner,
            ":exp": expires,
            **message_values(message, message_id),
            ":ttl": self._ttl(now),
            ":empty": [],
            ":entry": [{"status": str(JobStatus.IN_FLIGHT), "at": now, "messageId": message_id}],
        }
        set_clauses = [
            "#status = :inflight",
            "attempt = if_not_exists(attempt, :zero) + :one",
            "leaseOwner = :owner",
            "leaseExpiresAt = :exp",
            *message_clauses(first_tenant=True),  # the tenant the producer verified stays the owner
            "#ttl = :ttl",
            "history = list_append(if_not_exists(history, :empty), :entry)",
            "pendingWorkspace = :wid",  # pending until it settles (also a job the producer never recorded)
        ]
        removed = ["#error"]
        if invocation_id is not None:
            values[":inv"] = invocation_id
            set_clauses += ["runningTenant = if_not_exists(tenantId, :tid)", "runningInvocation = :inv"]
        else:
            removed.append(RUNNING_ATTRIBUTES)  # a takeover of a lease that counted: no longer counts
        takeover = ""  # a shared claim never takes over a lost lease
        if alone:
            removed.append("leaseShared")
            # near the limit, only the lease of a shared claim: the job did not die alone
            shared_only = " AND leaseShared = :true" if near_delivery_limit else ""
            takeover = f" OR ({LEASE_EXPIRED}{shared_only})"
        else:
            set_clauses.append("leaseShared = :true")
        if not alone or near_delivery_limit:
            values[":true"] = True
        # The claim places the job at this copy's SequenceNumber, unless its record is placed already: at this copy
        # (the same place), or elsewhere (the condition fails, and `_explain_lost_claim` decides from the record).
        place_set, place_condition = place_clauses(values, sequence_number)
        expression = "SET " + ", ".join(set_clauses) + place_set
        condition = (
            f"{SAME_PAYLOAD}"
            f" AND (attribute_not_exists(pk) OR {status_in(values, JobAction.CLAIM)}{takeover})"
            " AND (attribute_not_exists(attempt) OR attempt < :maxclaims)"
            + (f" AND {place_condition}" if place_condition else "")
        )
        job_update = self._update(
            job_key(message_tenant(message), message.job_id),
            expression + " REMOVE " + ", ".join(removed),
            values,
            condition=condition,
            names={"#status": "status", "#type": "type", "#ttl": "ttl", "#error": "error"},
            return_old=True,
        )
        try:
            # ALL_OLD costs nothing more: the record as it was tells the worker when its send was confirmed and what
            # to give the claim back to (`release`).
            answer = self._client.update_item(**job_update["Update"], ReturnValues="ALL_OLD")
        except ClientError as error:
            if not condition_failed(error):
                raise
            old = to_item(error.response.get("Item", {}))  # type: ignore[arg-type]
            lost = self._explain_lost_claim(
                message,
                old or None,
                now,
                body=body,
                near_delivery_limit=near_delivery_limit,
                alone=alone,
                sequence_number=sequence_number,
            )
            if lost.outcome is ClaimOutcome.LATER_COPY and old.get("sequenceNumber"):
                # The job's copy at its recorded place left the queue unsettled; this later copy claims it there, so
                # the jobs between still find it ahead of them, and it runs only once nothing before its place is left.
                return self.claim(
                    message,
                    message_id=message_id,
                    sequence_number=str(old["sequenceNumber"]),
                    remaining_ms=remaining_ms,
                    body=body,
                    near_delivery_limit=near_delivery_limit,
                    alone=alone,
                    invocation_id=invocation_id,
                )
            return lost
        previous = to_item(answer.get("Attributes", {}))
        lease = Lease(message.job_id, message.workspace_id, message_tenant(message), owner, expires)
        workspace = self._halted_workspace(message.workspace_id)
        outcome = ClaimOutcome.CLAIMED if workspace is None else ClaimOutcome.WORKSPACE_HALTED
        return ClaimResult(outcome, lease=lease, previous=previous, workspace=workspace, place=sequence_number)

    def _halted_workspace(self, workspace_id: str) -> Item | None:
        """The workspace item if the workspace is HALTED or RESUMING, read consistently after the claim's write.

        Read after the claim, it sees every halt that took effect before the claim: the halt of a job ahead in the
        same FIFO group is written before that job's message is deleted, so before this job could be delivered; a halt
        that lands after the read is one a transaction of the claim and a check of the workspace would have let pass
        as well (it landed after the claim), and the check for unsettled jobs ahead of the claimed job stands behind
        it. The read costs 1 read unit; in a transaction the check cost 2 write units and doubled the claim's."""
        workspace = self.get_workspace(workspace_id)
        if workspace is None or not WorkspaceRecord.from_item(workspace, workspace_id).halted:
            return None
        return workspace

    def holds(self, lease: Lease) -> bool:
        """Whether `lease` still holds its job (read consistently): the job IN_FLIGHT under this lease's owner."""
        job = self.get_job(lease.tenant_id, lease.job_id)
        return job is not None and not decisions.fail_lost(JobRecord.from_item(job), owner=lease.owner)

    def _explain_lost_claim(
        self,
        message: JobMessage,
        old: Item | None,
        now: int,
        *,
        body: str | None = None,
        near_delivery_limit: bool = False,
        alone: bool = True,
        sequence_number: str | None = None,
    ) -> ClaimResult:
        if old is None:
            return ClaimResult(ClaimOutcome.CONTENDED)
        lost = decisions.lost_claim(
            JobRecord.from_item(old),
            payload_hash=message.payload_hash,
            now=now,
            alone=alone,
            near_delivery_limit=near_delivery_limit,
            max_claims=self._max_claims,
            sequence_number=sequence_number,
        )
        if lost.outcome is not ClaimOutcome.EXHAUSTED:
            return ClaimResult(lost.outcome, previous=old)
        if self._dead_and_halt(
            old,
            error=lost.dead_error,
            expect_owner=old.get("leaseOwner"),
            expect_status=str(old.get("status")),
            body=body,
        ):
            return ClaimResult(ClaimOutcome.EXHAUSTED, previous=old)
        return ClaimResult(ClaimOutcome.CONTENDED, previous=old)

    def release(self, lease: Lease, *, reason: str) -> bool:
        """Give a claim back uncounted (`attempt - 1`): the job is QUEUED again (its recorded failures kept), its lease
        and running-index entry removed, conditional on still holding the lease. For a job that must wait before it
        runs (a job accepted ahead of it is unplaced and may still be confirmed: `jobs_ahead`). False: the lease was
        lost meanwhile, nothing written."""
        now = self._clock()
        status = JobStatus.QUEUED
        values: dict[str, Any] = {
            ":back": str(status),
            ":now": now,
            ":one": 1,
            ":entry": [{"status": str(status), "at": now, "reason": reason[:500]}],
        }
        condition = lease_held(values, lease.owner)
        return self._transact(
            [
                self._update(
                    job_key(lease.tenant_id, lease.job_id),
                    "SET #status = :back, updatedAt = :now, attempt = attempt - :one,"
                    " history = list_append(history, :entry)"
                    f" REMOVE leaseOwner, leaseExpiresAt, leaseShared, {RUNNING_ATTRIBUTES}",
                    values,
                    condition=condition,
                    names={"#status": "status"},
                )
            ]
        )

    def complete(self, lease: Lease, result: Mapping[str, Any]) -> bool:
        """SUCCEEDED, conditional on still owning the lease. False means another worker took over: nothing written.
        A job that failed before and succeeded now has no `error` (its history keeps each failed attempt's)."""
        now = self._clock()
        values = {
            ":succeeded": str(JobStatus.SUCCEEDED),
            ":result": dict(result),
            ":now": now,
            ":entry": [{"status": str(JobStatus.SUCCEEDED), "at": now}],
        }
        condition = lease_held(values, lease.owner)
        return self._transact(
            [
                self._update(
                    job_key(lease.tenant_id, lease.job_id),
                    "SET #status = :succeeded, #result = :result, updatedAt = :now, finishedAt = :now,"
                    f" history = list_append(history, :entry) REMOVE pendingWorkspace, #error, {RUNNING_ATTRIBUTES}",
                    values,
                    condition=condition,
                    names={"#status": "status", "#result": "result", "#error": "error"},
                )
            ]
        )

    def fail(self, lease: Lease, error: str, *, permanent: bool = False, body: str | None = None) -> FailOutcome:
        """Record a failed attempt. Retryable with attempts left → FAILED (PARKED again for a job a resume's drain
        claimed); otherwise DEAD + workspace HALTED, with `body` (the message body) stored so that the job can be
        retried by a resume."""
        now = self._clock()
        if lease.resume_id is not None and not permanent:
            parked = self._park_drained_again(lease, error, now)
            if parked is not None:
                return parked
            error = f"{error} (attempts exhausted: {self._max_attempts})"
        elif not permanent:
            values = {
                ":failed": str(JobStatus.FAILED),
                ":error": stored_error(error),
                ":now": now,
                **self._failure_values(),
                ":entry": [{"status": str(JobStatus.FAILED), "at": now, "error": error[:500]}],
            }
            condition = f"{lease_held(values, lease.owner)} AND {FAILURES_LEFT}"
            update = self._update(
                job_key(lease.tenant_id, lease.job_id),
                f"SET #status = :failed, #error = :error, updatedAt = :now, {COUNT_FAILURE},"
                f" history = list_append(history, :entry) REMOVE {RUNNING_ATTRIBUTES}",
                values,
                condition=condition,
                names={"#status": "status", "#error": "error"},
                return_old=True,
            )
            try:
                self._client.update_item(**update["Update"])
            except ClientError as client_error:
                if not condition_failed(client_error):
                    raise
                old = JobRecord.from_item(to_item(client_error.response.get("Item", {})))  # type: ignore[arg-type]
                if decisions.fail_lost(old, owner=lease.owner):
                    return FailOutcome.LOST
                error = f"{error} (failed attempt {old.failures + 1} of {self._max_attempts})"
            else:
                return FailOutcome.RETRY
        old_item = {"jobId": lease.job_id, "workspaceId": lease.workspace_id, "tenantId": lease.tenant_id}
        if self._dead_and_halt(
            old_item, error=error, expect_owner=lease.owner, expect_status=str(JobStatus.IN_FLIGHT), body=body
        ):
            return FailOutcome.DEAD
        return FailOutcome.LOST
