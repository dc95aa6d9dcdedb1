"""Resume: an operator decides the job that halted a workspace, and the workspace resumes."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

from agent_jobs.core import decisions
from agent_jobs.core.outcomes import ResumeOutcome
from agent_jobs.core.records import JobRecord, WorkspaceRecord
from agent_jobs.core.transitions import DECIDABLE, JobAction, WorkspaceAction, job_target
from agent_jobs.keys import job_key, parked_sequence, workspace_key
from agent_jobs.models import JobStatus, ResumeDecision, WorkspaceState
from agent_jobs.store.codec import Item
from agent_jobs.store.conditions import ATTEMPTS_BEFORE_RETRY
from agent_jobs.store.results import ResumeResult

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.type_defs import TransactWriteItemTypeDef

from agent_jobs.store.halts import HaltStore


class ResumeStore(HaltStore):
    """An operator's decisions on halted workspaces."""

    def begin_resume(
        self,
        workspace_id: str,
        *,
        tenant_id: str,
        halting_job_id: str,
        decision: ResumeDecision,
        operator: str,
    ) -> ResumeResult:
        """Begin an operator's resume of a HALTED workspace of `tenant_id`, deciding its halting job.

        `skip`: the halting job (DEAD, REJECTED or PARKED) becomes SKIPPED, with who and when in its history.
        `retry`: a DEAD halting job becomes PARKED again with its attempts reset (it drains first: it has the lowest
        SequenceNumber); a PARKED one stays PARKED (attempts reset); a REJECTED message, or a DEAD job without a stored
        body, cannot run again (RETRY_REFUSED). A halting job without a record (the workspace was halted without one)
        needs no change. One transaction writes the job and the workspace, conditional on the workspace still being
        HALTED by `halting_job_id` (what the operator saw), and removes the job from `undecidedJobIds`: when other
        halting jobs are left there (they halted the workspace while it was halted), the workspace stays HALTED by the
        earliest of them (DECIDED: decide that one next); otherwise RESUMING with a fresh resumeId (send a drain
        marker), or ACTIVE at once when nothing is parked.
        """
        for _ in range(3):  # a park landing between the read and the write changes parkedCount: read again
            workspace = self.get_workspace(workspace_id)
            record = WorkspaceRecord.from_item(workspace, workspace_id) if workspace is not None else None
            refusal = decisions.resume_refusal(
                record,
                workspace_id=workspace_id,
                tenant_id=tenant_id,
                halting_job_id=halting_job_id,
                decision=decision,
            )
            if refusal is not None:
                resume_id = workspace.get("resumeId") if workspace is not None else None
                if refusal.outcome is ResumeOutcome.ALREADY_RESUMING:
                    return ResumeResult(refusal.outcome, workspace, resume_id=resume_id)
                return ResumeResult(refusal.outcome, workspace, reason=refusal.reason)
            # A workspace that is not there is refused.
            assert workspace is not None
            assert record is not None
            result = self._try_resume(workspace, record, halting_job_id, decision, operator)
            if result is not None:
                return result
        return ResumeResult(
            ResumeOutcome.HALTING_JOB_CHANGED,
            self.get_workspace(workspace_id),
            reason=f"workspace '{workspace_id}' kept changing while resuming; read it again and retry",
        )

    def _try_resume(
        self,
        workspace: Item,
        record_ws: WorkspaceRecord,
        halting_job_id: str,
        decision: ResumeDecision,
        operator: str,
    ) -> ResumeResult | None:
        now = self._clock()
        workspace_id = record_ws.workspace_id
        resume_id = secrets.token_hex(8)
        # A workspace's halting jobs are its owner's (a message naming another tenant is recorded for the owner).
        tenant_id = str(workspace.get("tenantId", ""))
        pk = halting_job_id if halting_job_id.startswith("msg#") else job_key(tenant_id, halting_job_id)
        job = self._read(pk)
        record = JobRecord.from_item(job) if job is not None else None
        status = record.status if record is not None else None
        refusal = decisions.lease_refusal(record, halting_job_id=halting_job_id, now=now)
        if decision is ResumeDecision.RETRY:
            refusal = (
                decisions.retry_refusal(record, halting_job_id=halting_job_id, workspace_id=workspace_id) or refusal
            )
        if refusal is not None:
            return ResumeResult(ResumeOutcome.RETRY_REFUSED, workspace, reason=refusal)
        items: list[TransactWriteItemTypeDef] = []
        parked_delta, drained_seq = 0, None
        if job is not None and status in DECIDABLE:
            update, parked_delta, drained_seq = self._decide_halting_job(
                pk, job, workspace_id=workspace_id, decision=decision, operator=operator, resume_id=resume_id, now=now
            )
            items.append(update)
        count = record_ws.parked_count
        # Other jobs that halted the workspace while it was halted (first halt wins) are still undecided: the workspace
        # stays HALTED by the next of them, and nothing drains until the operator decided each one.
        undecided = set(record_ws.undecided_job_ids) - {halting_job_id}
        next_halt = self._next_undecided(tenant_id, undecided) if undecided else None
        target = decisions.resume_action(record_ws, next_halt=next_halt and next_halt[0], parked_delta=parked_delta)
        activate = target is WorkspaceAction.RESUME_EMPTY
        ws_values: dict[str, Any] = {
            ":halted": str(WorkspaceState.HALTED),
            ":seen": halting_job_id,
            ":decided": {halting_job_id},
            ":now": now,
            ":last": {
                "resumeId": resume_id,
                "decision": str(decision),
                "haltingJobId": halting_job_id,
                "haltReason": workspace.get("haltReason"),
                "haltedAt": workspace.get("haltedAt"),
                "by": operator,
                "at": now,
            },
        }
        expression, condition, removed = _resume_target(
            ws_values,
            next_halt=next_halt,
            activate=activate,
            count=count,
            parked_delta=parked_delta,
            resume_id=resume_id,
        )
        if drained_seq is not None and drained_seq > str(workspace.get("lastDrainedSeq", "")):
            ws_values[":dseq"] = drained_seq
            expression = expression.replace(", updatedAt = :now", ", updatedAt = :now, lastDrainedSeq = :dseq", 1)
        expression += " DELETE undecidedJobIds :decided" + (" REMOVE " + ", ".join(removed) if removed else "")
        items.append(
            self._update(
                workspace_key(workspace_id), expression, ws_values, condition=condition, names={"#state": "state"}
            )
        )
        if not self._transact(items):
            return None
        after = self.get_workspace(workspace_id)
        if next_halt is not None:
            return ResumeResult(
                ResumeOutcome.DECIDED,
                after,
                reason=(
                    f"'{halting_job_id}' decided ({decision}); workspace '{workspace_id}' stays HALTED by"
                    f" '{next_halt[0]}', which halted it meanwhile: decide that job next"
                ),
            )
        if activate:
            return ResumeResult(ResumeOutcome.ACTIVE, after, resume_id=resume_id)
        return ResumeResult(ResumeOutcome.RESUMING, after, resume_id=resume_id)

    def _next_undecided(self, tenant_id: str, job_ids: set[str]) -> tuple[str, str]:
        """The undecided halting job the operator decides next, and its halt reason (`decisions.next_undecided`), from
        the job records read consistently."""
        candidates: dict[str, JobRecord | None] = {}
        for job_id in job_ids:
            job = self._read(job_id if job_id.startswith("msg#") else job_key(tenant_id, job_id))
            candidates[job_id] = JobRecord.from_item(job) if job is not None else None
        return decisions.next_undecided(candidates)

    def _decide_halting_job(
        self,
        pk: str,
        job: Item,
        *,
        workspace_id: str,
        decision: ResumeDecision,
        operator: str,
        resume_id: str,
        now: int,
    ) -> tuple[TransactWriteItemTypeDef, int, str | None]:
        """The halting job's update for a decision, the change of parkedCount it makes, and the parked position a
        skip leaves behind (the drain's `lastDrainedSeq`)."""
        status = JobStatus(job["status"])
        entry = {"at": now, "by": operator, "decision": str(decision), "resumeId": resume_id}
        seq = parked_sequence(job.get("sequenceNumber"), int(job.get("acceptedAt", now)))
        values: dict[str, Any] = {":seen": status, ":now": now, ":empty": []}
        names = {"#status": "status"}
        if decision is ResumeDecision.SKIP:
            values.update(
                {
                    ":skipped": str(job_target(JobAction.SKIP, status)),
                    ":by": operator,
                    ":ttl": self._ttl(now),
                    ":entry": [{"status": str(JobStatus.SKIPPED), **entry}],
                }
            )
            names["#ttl"] = "ttl"
            condition = "#status = :seen"
            if status == JobStatus.IN_FLIGHT:
                condition += " AND leaseExpiresAt < :now"  # only a lease whose worker never came back
            expression = (
                "SET #status = :skipped, skippedBy = :by, updatedAt = :now, finishedAt = :now, #ttl = :ttl,"
                " history = list_append(if_not_exists(history, :empty), :entry)"
                " REMOVE parkedWorkspace, parkedSeq, pendingWorkspace"
            )
            drained_seq: str | None = seq
        else:
            values.update(
                {
                    ":parked": str(job_target(JobAction.RETRY, status)),
                    ":zero": 0,
                    ":pws": workspace_id,
                    ":pseq": seq,
                    ":reason": f"retry decided by {operator}",
                    ":entry": [{"status": str(JobStatus.PARKED), **entry}],
                }
            )
            # Attempts start again, the claims made so far kept aside (a job's view counts every claim of its life);
            # the job keeps its SequenceNumber, so the drain runs it before the jobs behind it.
            expression = (
                f"SET {ATTEMPTS_BEFORE_RETRY} = if_not_exists({ATTEMPTS_BEFORE_RETRY}, :zero)"
                " + if_not_exists(attempt, :zero),"
                " #status = :parked, attempt = :zero, parkedWorkspace = :pws, parkedSeq = :pseq,"
                " parkedReason = :reason, updatedAt = :now,"
                " history = list_append(if_not_exists(history, :empty), :entry)"
                " REMOVE failures"
            )
            drained_seq = None
            condition = "#status = :seen"
        update = self._update(pk, expression, values, condition=condition, names=names)
        return update, decisions.parked_change(status, decision), drained_seq


def _resume_target(
    ws_values: dict[str, Any],
    *,
    next_halt: tuple[str, str] | None,
    activate: bool,
    count: int,
    parked_delta: int,
    resume_id: str,
) -> tuple[str, str, list[str]]:
    """The workspace's SET/ADD clauses, condition and removed attributes for a resume decision (values are added
    to `ws_values`): HALTED by the next undecided job, ACTIVE at once, or RESUMING."""
    condition = "#state = :halted AND haltingJobId = :seen"
    removed = ["haltingJobId", "haltReason", "haltedAt"]
    if next_halt is not None:
        # Still HALTED (and listed as halted), now by the next undecided job; a halt landing meanwhile stays in the
        # set. The parked count changes with the decided job.
        ws_values.update({":next": next_halt[0], ":nreason": next_halt[1][:1000]})
        condition += " AND contains(undecidedJobIds, :next)"
        expression = "SET haltingJobId = :next, haltReason = :nreason, updatedAt = :now, lastResume = :last"
        removed = []
        if parked_delta:
            ws_values[":pdelta"] = parked_delta
            expression += " ADD parkedCount :pdelta"
        return expression, condition, removed
    # The decided job was the last undecided one: a halt that joined the set since the read fails this.
    ws_values[":one"] = 1
    condition += (
        " AND (attribute_not_exists(undecidedJobIds)"
        " OR (size(undecidedJobIds) = :one AND contains(undecidedJobIds, :seen)))"
    )
    if activate:
        ws_values.update({":active": str(WorkspaceState.ACTIVE), ":count": count, ":zero": 0})
        condition += " AND (attribute_not_exists(parkedCount) OR parkedCount = :count)"
        condition += " AND attribute_not_exists(drainingJobId)"
        expression = "SET #state = :active, parkedCount = :zero, updatedAt = :now, lastResume = :last"
        removed += ["haltedTenant", "resumeId"]
    else:
        ws_values.update({":resuming": str(WorkspaceState.RESUMING), ":rid": resume_id})
        expression = "SET #state = :resuming, resumeId = :rid, updatedAt = :now, lastResume = :last"
        if parked_delta:
            ws_values[":pdelta"] = parked_delta
            expression += " ADD parkedCount :pdelta"
    return expression, condition, removed
