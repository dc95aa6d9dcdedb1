"""The drain of a resume: the parked jobs in queue order, each claimed, released, and the workspace made ACTIVE."""

from __future__ import annotations

import secrets
from typing import Any

from botocore.exceptions import ClientError

from agent_jobs.core import decisions
from agent_jobs.core.outcomes import ClaimOutcome, FailOutcome
from agent_jobs.core.records import JobRecord
from agent_jobs.core.transitions import JobAction
from agent_jobs.keys import job_key, parked_sequence, workspace_key
from agent_jobs.models import JobStatus, WorkspaceState
from agent_jobs.store.codec import Item, cancellation, reason_item, stored_error, to_item, wire
from agent_jobs.store.conditions import COUNT_FAILURE, FAILURES_LEFT, LEASE_EXPIRED, PARKED_INDEX, lease_held, status_in
from agent_jobs.store.halts import HaltStore
from agent_jobs.store.results import ClaimResult, Lease


class DrainStore(HaltStore):
    """Writes and reads of a resume's drain."""

    def list_parked(self, workspace_id: str, *, after_seq: str | None, expected: int) -> list[Item] | None:
        """The PARKED jobs of a workspace in SequenceNumber order, read from the parked index (entries carry the keys,
        jobId, workspaceId and tenantId; read the job for its body).

        The index is eventually consistent: it may still show jobs that left PARKED, or not yet show jobs that just
        became PARKED. Entries after `after_seq` (the workspace's `lastDrainedSeq`: everything at or before it was
        drained or skipped) are taken as parked; entries at or before it are checked with a consistent read (normally
        there are none, or a few stale ones). None when fewer than `expected` (the workspace's `parkedCount`, which is
        strongly consistent) are found: the index is lagging and the order it shows cannot be trusted; come back
        later.
        """
        entries: list[Item] = []
        start: dict[str, Any] | None = None
        while True:
            kwargs: dict[str, Any] = {
                "TableName": self._table,
                "IndexName": PARKED_INDEX,
                "KeyConditionExpression": "parkedWorkspace = :ws",
                "ExpressionAttributeValues": wire({":ws": workspace_id}),
            }
            if start:
                kwargs["ExclusiveStartKey"] = start
            response = self._client.query(**kwargs)
            entries.extend(to_item(raw) for raw in response.get("Items", []))
            start = response.get("LastEvaluatedKey")
            if not start:
                break
        if len(entries) < expected:
            return None
        ahead = [entry for entry in entries if not after_seq or str(entry.get("parkedSeq", "")) > after_seq]
        if len(ahead) < expected:
            for entry in entries:
                if entry in ahead:
                    continue
                job = self.get_job(str(entry.get("tenantId", "")), str(entry["jobId"]))
                if job and job.get("status") == JobStatus.PARKED and job.get("parkedWorkspace") == workspace_id:
                    ahead.append(job)
            if len(ahead) < expected:
                return None
        return sorted(ahead, key=lambda item: str(item.get("parkedSeq", "")))

    def claim_parked(self, job: Item, *, resume_id: str, remaining_ms: int, reclaim: bool = False) -> ClaimResult:
        """Claim a PARKED job for the drain of resume `resume_id`: one transaction of the job (PARKED → IN_FLIGHT,
        out of the parked index) and its workspace (RESUMING with this resumeId, no other drained job unfinished, no
        halting job undecided; `parkedCount` - 1, `drainingJobId` = the job).

        With `reclaim`, the job is the workspace's `drainingJobId`, left IN_FLIGHT by a drain that never came back: it
        is claimed again once its lease expired, if it has attempts left (else DEAD and the workspace HALTED:
        EXHAUSTED). Lost claims: WORKSPACE_HALTED (the resume is over or another one began), BUSY (a live lease),
        SETTLED (not PARKED any more: the index showed a stale entry), CONTENDED.
        """
        now = self._clock()
        owner = secrets.token_hex(16)
        expires = now + max(remaining_ms, 0)
        job_id = str(job["jobId"])
        tenant_id = str(job["tenantId"])
        workspace_id = str(job["workspaceId"])
        parked_seq = str(job.get("parkedSeq") or parked_sequence(job.get("sequenceNumber"), now))
        values: dict[str, Any] = {
            ":inflight": str(JobStatus.IN_FLIGHT),
            ":now": now,
            ":zero": 0,
            ":one": 1,
            ":owner": owner,
            ":exp": expires,
            ":empty": [],
            ":entry": [{"status": str(JobStatus.IN_FLIGHT), "at": now, "resumeId": resume_id}],
        }
        if reclaim:
            values[":maxclaims"] = self._max_claims
            job_condition = f"{LEASE_EXPIRED} AND attempt < :maxclaims"
        else:
            job_condition = status_in(values, JobAction.DRAIN)
        job_update = self._update(
            job_key(tenant_id, job_id),
            "SET #status = :inflight, attempt = if_not_exists(attempt, :zero) + :one, leaseOwner = :owner,"
            " leaseExpiresAt = :exp, updatedAt = :now, history = list_append(if_not_exists(history, :empty), :entry)"
            # a job running again has no current error: its history keeps the failed attempts' errors
            " REMOVE parkedWorkspace, parkedSeq, #error",
            values,
            condition=job_condition,
            names={"#status": "status", "#error": "error"},
            return_old=True,
        )
        ws_values: dict[str, Any] = {
            ":resuming": str(WorkspaceState.RESUMING),
            ":rid": resume_id,
            ":jid": job_id,
            ":now": now,
        }
        # No drained job may pass a halting job that is still undecided (halt on failure), whatever the state says.
        if reclaim:
            ws_condition = (
                "#state = :resuming AND resumeId = :rid AND drainingJobId = :jid"
                " AND attribute_not_exists(undecidedJobIds)"
            )
            ws_expression = "SET updatedAt = :now"
        else:
            ws_values[":minus"] = -1
            ws_condition = (
                "#state = :resuming AND resumeId = :rid AND attribute_not_exists(drainingJobId)"
                " AND attribute_not_exists(undecidedJobIds)"
            )
            ws_expression = "SET drainingJobId = :jid, updatedAt = :now ADD parkedCount :minus"
        workspace_update = self._update(
            workspace_key(workspace_id),
            ws_expression,
            ws_values,
            condition=ws_condition,
            names={"#state": "state"},
            return_old=True,
        )
        try:
            self._client.transact_write_items(TransactItems=[job_update, workspace_update])
        except ClientError as error:
            reasons = cancellation(error)
            if reasons is None:
                raise
            workspace = reason_item(reasons, 1)
            if workspace is not None:
                return ClaimResult(ClaimOutcome.WORKSPACE_HALTED, workspace=workspace)
            old = reason_item(reasons, 0)
            if old is None:
                return ClaimResult(ClaimOutcome.CONTENDED)
            outcome = decisions.lost_drain_claim(JobRecord.from_item(old), now=now, reclaim=reclaim)
            if outcome is ClaimOutcome.EXHAUSTED and not self._dead_and_halt(
                old,
                error=f"claims exhausted ({old.get('attempt')} of {self._max_claims}) while resuming",
                expect_owner=old.get("leaseOwner"),
                expect_status=str(JobStatus.IN_FLIGHT),
            ):
                return ClaimResult(ClaimOutcome.CONTENDED, previous=old)
            return ClaimResult(outcome, previous=old)
        lease = Lease(
            job_id,
            workspace_id,
            str(job.get("tenantId", "")),
            owner,
            expires,
            resume_id=resume_id,
            parked_seq=parked_seq,
        )
        return ClaimResult(ClaimOutcome.CLAIMED, lease=lease)

    def release_drain(self, workspace_id: str, job_id: str, *, drained_seq: str | None) -> bool:
        """The drain is done with `job_id` (it finished, or it is PARKED again): clear `drainingJobId`, and record
        `drained_seq` as the last drained position when the job finished. False if the workspace no longer names it."""
        values: dict[str, Any] = {":jid": job_id, ":now": self._clock()}
        expression = "SET updatedAt = :now"
        if drained_seq is not None:
            values[":dseq"] = drained_seq
            expression += ", lastDrainedSeq = :dseq"
        update = self._update(
            workspace_key(workspace_id), expression + " REMOVE drainingJobId", values, condition="drainingJobId = :jid"
        )
        return self._transact([update])

    def activate(self, workspace_id: str, resume_id: str) -> bool:
        """RESUMING → ACTIVE, only if this resume is still the current one, nothing is parked (`parkedCount` = 0), no
        drained job is unfinished and no halting job is undecided (`undecidedJobIds` absent: DynamoDB drops an empty
        set). Out of the halted index. False otherwise (come back later, or the marker is stale)."""
        values = {
            ":active": str(WorkspaceState.ACTIVE),
            ":resuming": str(WorkspaceState.RESUMING),
            ":rid": resume_id,
            ":zero": 0,
            ":now": self._clock(),
        }
        update = self._update(
            workspace_key(workspace_id),
            "SET #state = :active, updatedAt = :now REMOVE resumeId, haltedTenant, drainingJobId",
            values,
            condition="#state = :resuming AND resumeId = :rid"
            " AND (attribute_not_exists(parkedCount) OR parkedCount = :zero)"
            " AND attribute_not_exists(drainingJobId) AND attribute_not_exists(undecidedJobIds)",
            names={"#state": "state"},
        )
        return self._transact([update])

    def _park_drained_again(self, lease: Lease, error: str, now: int) -> FailOutcome | None:
        """A drained job failed and has attempts left: PARKED again at its place (counted), the drain released.
        None when it has no attempts left (the caller makes it DEAD)."""
        values = {
            ":parked": str(JobStatus.PARKED),
            ":error": stored_error(error),
            ":now": now,
            **self._failure_values(),
            ":pws": lease.workspace_id,
            ":pseq": lease.parked_seq or parked_sequence(None, now),
            ":entry": [{"status": str(JobStatus.PARKED), "at": now, "error": error[:500], "resumeId": lease.resume_id}],
        }
        condition = f"{lease_held(values, lease.owner)} AND {FAILURES_LEFT}"
        job_update = self._update(
            job_key(lease.tenant_id, lease.job_id),
            "SET #status = :parked, #error = :error, updatedAt = :now, parkedWorkspace = :pws, parkedSeq = :pseq,"
            f" {COUNT_FAILURE}, history = list_append(history, :entry)",
            values,
            condition=condition,
            names={"#status": "status", "#error": "error"},
            return_old=True,
        )
        workspace_update = self._update(
            workspace_key(lease.workspace_id),
            "SET updatedAt = :now ADD parkedCount :one REMOVE drainingJobId",
            {":now": now, ":one": 1},
        )
        try:
            self._client.transact_write_items(TransactItems=[job_update, workspace_update])
        except ClientError as client_error:
            reasons = cancellation(client_error)
            old = reason_item(reasons or [], 0)
            if old is None:
                raise
            if decisions.fail_lost(JobRecord.from_item(old), owner=lease.owner):
                return FailOutcome.LOST
            return None
        return FailOutcome.PARKED
