"""Halts and parks: a workspace halted by a job, a job made DEAD, a job parked behind a halt."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agent_jobs.core import decisions
from agent_jobs.core.transitions import JobAction
from agent_jobs.keys import job_key, parked_sequence, workspace_key
from agent_jobs.models import JobMessage, JobStatus, WorkspaceState
from agent_jobs.store.base import message_clauses, message_tenant, message_values
from agent_jobs.store.codec import BODY_SET, Item, body_values, stored_error
from agent_jobs.store.conditions import LEASE_EXPIRED, RUNNING_ATTRIBUTES, lease_held, place_clauses, status_in
from agent_jobs.store.results import Lease

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.type_defs import TransactWriteItemTypeDef

from agent_jobs.store.queries import QueryStore


class HaltStore(QueryStore):
    """Writes that halt a workspace or park a job behind its halt."""

    def halt_workspace(self, workspace_id: str, *, tenant_id: str | None, job_id: str, reason: str) -> None:
        """HALTED, without touching any job: for a record the worker could neither run nor park on its last delivery,
        so that the queue dead-lettering it cannot let the next job of the workspace run."""
        update = self._halt_workspace(workspace_id, tenant_id, job_id, reason, self._clock())["Update"]
        self._client.update_item(**update)

    def park(
        self,
        message: JobMessage,
        *,
        message_id: str,
        sequence_number: str | None,
        body: str,
        reason: str,
        halt_workspace: bool = False,
        lease: Lease | None = None,
        missing: Sequence[Item] = (),
        unclaim: bool = False,
    ) -> bool:
        """PARKED with its body and SequenceNumber, so a resume can run it in queue order later.

        With `lease`, the job is one this worker just claimed (conditional on still owning it); with `unclaim` as well,
        the claim is taken back (its attempt is not counted: the job never ran, it found its workspace halted); with
        `missing` (what `jobs_ahead` found ahead of it), the workspace is halted by the earliest of them in the
        same transaction, every one of them joining the jobs the operator decides (`undecidedJobIds`), so that a
        resume lets nothing run before each was redriven and retried, or skipped; the reason names them.

        With `halt_workspace`, the workspace is halted in the same transaction (used when a message reaches its last
        delivery: parking it instead of letting the queue dead-letter it keeps the group's order intact); without it,
        the workspace must be HALTED or RESUMING. The same transaction adds one to the workspace's `parkedCount` and
        puts the job in the parked index (`parkedWorkspace`, `parkedSeq`), which a resume drains in order.
        Returns False if the job is already settled (SUCCEEDED, DEAD, PARKED, ...), held by a live lease, was accepted
        with another payload, or (without `halt_workspace`) the workspace is ACTIVE again: claim it again then.
        """
        now = self._clock()
        if lease is None:
            # Parked at the job's place: the one recorded if it has one (an earlier copy placed it, or its send was
            # confirmed), else this copy's. A claimed job (`lease`) is placed at `sequence_number` already.
            sequence_number = self._recorded_place(message) or sequence_number
        values: dict[str, Any] = {
            ":parked": str(JobStatus.PARKED),
            ":inflight": str(JobStatus.IN_FLIGHT),
            ":now": now,
            **message_values(message, message_id),
            **body_values(body),
            ":reason": stored_error(reason),
            ":pws": message.workspace_id,
            ":pseq": parked_sequence(sequence_number, now),
            ":empty": [],
            ":entry": [{"status": str(JobStatus.PARKED), "at": now, "reason": reason}],
        }
        set_clauses = [
            "#status = :parked",
            "parkedWorkspace = :pws",
            "parkedSeq = :pseq",
            *message_clauses(first_hash=True),
            BODY_SET,
            "parkedReason = :reason",
            "history = list_append(if_not_exists(history, :empty), :entry)",
        ]
        # Never over another job's record: a message reusing a jobId with another payload parks nothing.
        if lease is not None:
            condition = lease_held(values, lease.owner)
            if unclaim:
                values[":one"] = 1
                set_clauses.append("attempt = attempt - :one")
        else:
            condition = (
                "attribute_not_exists(pk) OR ((attribute_not_exists(payloadHash) OR payloadHash = :hash)"
                f" AND ({status_in(values, JobAction.PARK)} OR ({LEASE_EXPIRED})))"
            )
        # A parked job waits for an operator: TTL must not collect it (TTL is garbage collection only). A resume runs
        # it in order, from the parked index. A park that halts the workspace keeps the job in the pending index: its
        # message may have left the queue already (a redrive from the DLQ), so a job behind it can be claimed while
        # the workspace is still ACTIVE, just before this write; that job's check for unsettled jobs ahead of it must
        # still find this one, PARKED, where it was.
        place_set, place_condition = place_clauses(values, sequence_number)
        if place_condition:
            condition = f"({condition}) AND {place_condition}"
        expression = "SET " + ", ".join(set_clauses) + place_set
        removed = ("#ttl" if halt_workspace else "#ttl, pendingWorkspace") + f", {RUNNING_ATTRIBUTES}"
        job_update = self._update(
            job_key(message_tenant(message), message.job_id),
            expression + " REMOVE " + removed,
            values,
            condition=condition,
            names={"#status": "status", "#type": "type", "#ttl": "ttl"},
        )
        if missing:
            missing_ids = [str(item["jobId"]) for item in missing]
            workspace_update = self._halt_workspace(
                message.workspace_id,
                message_tenant(message),
                missing_ids[0],
                decisions.missing_reason(message.workspace_id, message.job_id, missing_ids),
                now,
                parked_delta=1,
                undecided=set(missing_ids),
            )
        elif halt_workspace:
            workspace_update = self._halt_workspace(
                message.workspace_id, message_tenant(message), message.job_id, reason, now, parked_delta=1
            )
        else:
            workspace_update = self._count_parked(message.workspace_id, 1, now, only_if_halted=True)
        return self._transact([job_update, workspace_update])

    def _recorded_place(self, message: JobMessage) -> str | None:
        """The SequenceNumber the job's record names as its place, read consistently; None when it has none yet."""
        job = self._read(job_key(message_tenant(message), message.job_id)) or {}
        place = str(job.get("sequenceNumber") or "")
        return place if place.isdigit() else None

    def _halt_workspace(
        self,
        workspace_id: str,
        tenant_id: str | None,
        job_id: str,
        reason: str,
        now: int,
        *,
        parked_delta: int = 0,
        undecided: set[str] | None = None,
    ) -> TransactWriteItemTypeDef:
        # The first halt wins: a workspace already halted keeps the job and reason that halted it first. Every halting
        # job joins `undecidedJobIds` in the same write, so a job that halts an already halted workspace is not lost:
        # a resume decides one of them at a time and drains nothing while any is left (halt on failure).
        values: dict[str, Any] = {
            ":halted": str(WorkspaceState.HALTED),
            ":wid": workspace_id,
            ":jid": job_id,
            ":reason": reason[:1000],
            ":now": now,
            ":undecided": {job_id, *(undecided or ())},
        }
        set_clauses = [
            "#state = :halted",
            "workspaceId = :wid",
            "haltingJobId = if_not_exists(haltingJobId, :jid)",
            "haltReason = if_not_exists(haltReason, :reason)",
            "haltedAt = if_not_exists(haltedAt, :now)",
            "updatedAt = :now",
        ]
        if tenant_id:
            values[":tid"] = tenant_id
            set_clauses.append("tenantId = if_not_exists(tenantId, :tid)")
            # The sparse "halted workspaces by tenant" index; the owner is the registered tenant if there is one.
            set_clauses.append("haltedTenant = if_not_exists(tenantId, :tid)")
        # A halt during a resume ends that resume: its drain markers become stale.
        expression = "SET " + ", ".join(set_clauses) + " ADD undecidedJobIds :undecided"
        if parked_delta:
            values[":pdelta"] = parked_delta
            expression += ", parkedCount :pdelta"
        return self._update(
            workspace_key(workspace_id), expression + " REMOVE resumeId", values, names={"#state": "state"}
        )

    def _dead_and_halt(
        self, old: Item, *, error: str, expect_owner: Any, expect_status: str, body: str | None = None
    ) -> bool:
        now = self._clock()
        job_id = str(old["jobId"])
        tenant_id = str(old["tenantId"])
        values: dict[str, Any] = {
            ":dead": str(JobStatus.DEAD),
            ":status": expect_status,
            ":error": stored_error(error),
            ":now": now,
            ":entry": [{"status": str(JobStatus.DEAD), "at": now, "error": error[:500]}],
            ":empty": [],
        }
        # The body is kept so that an operator can retry the job on resume (only DEAD jobs pay for storing it).
        store_body = ""
        if body is not None:
            values.update(body_values(body))
            store_body = f", {BODY_SET}"
        condition = "#status = :status"
        if expect_owner is None:
            condition += " AND attribute_not_exists(leaseOwner)"
        else:
            values[":owner"] = expect_owner
            condition += " AND leaseOwner = :owner"
        # A DEAD job halts its workspace until an operator decides: TTL must not collect it.
        job_update = self._update(
            job_key(tenant_id, job_id),
            "SET #status = :dead, #error = :error, updatedAt = :now, finishedAt = :now,"
            f" history = list_append(if_not_exists(history, :empty), :entry){store_body}"
            f" REMOVE #ttl, pendingWorkspace, {RUNNING_ATTRIBUTES}",
            values,
            condition=condition,
            names={"#status": "status", "#error": "error", "#ttl": "ttl"},
        )
        halt = self._halt_workspace(
            str(old["workspaceId"]), old.get("tenantId"), job_id, f"job {job_id} is DEAD: {error}", now
        )
        return self._transact([job_update, halt])

    def _count_parked(
        self, workspace_id: str, delta: int, now: int, *, only_if_halted: bool = False
    ) -> TransactWriteItemTypeDef:
        expression = "SET updatedAt = :now ADD parkedCount :delta"
        values: dict[str, Any] = {":now": now, ":delta": delta}
        if not only_if_halted:
            return self._update(workspace_key(workspace_id), expression, values)
        # A job parks only behind a halt: if the workspace is ACTIVE again, the job must be claimed instead.
        values.update({":halted": str(WorkspaceState.HALTED), ":resuming": str(WorkspaceState.RESUMING)})
        return self._update(
            workspace_key(workspace_id),
            expression,
            values,
            condition="#state IN (:halted, :resuming)",
            names={"#state": "state"},
        )
