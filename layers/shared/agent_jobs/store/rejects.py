"""Rejections: a message that is no valid job is recorded, and its workspace halts."""

from __future__ import annotations

from typing import Any

from agent_jobs.keys import job_key
from agent_jobs.models import JobStatus
from agent_jobs.store.codec import BODY_SET, Item, body_values, stored_error, wire
from agent_jobs.store.halts import HaltStore


class RejectStore(HaltStore):
    """Records of messages the worker cannot run."""

    def reject(
        self,
        *,
        message_id: str,
        job_id: str | None,
        workspace_id: str,
        tenant_id: str | None,
        reason: str,
        body: str,
    ) -> bool:
        """REJECTED (an unparseable or invalid message) and its workspace HALTED, in one transaction.

        The rejection is recorded under the message's jobId when that names no job yet, else (no usable jobId, or an
        accepted job that a bad message must not overwrite) under `msg#<messageId>`. Returns False only if neither
        could be written (the same message was rejected before).
        """
        # Under the jobId when there is a usable one; else, or when it names a job that exists, under its own id.
        keys: list[tuple[str, str | None]] = [(f"msg#{message_id}", None)]
        if job_id and tenant_id:
            keys.insert(0, (job_key(tenant_id, job_id), job_id))
        for pk, recorded_job_id in keys:
            now = self._clock()
            values = {
                ":rejected": str(JobStatus.REJECTED),
                ":wid": workspace_id,
                ":mid": message_id,
                **body_values(body),
                ":reason": stored_error(reason),
                ":now": now,
                ":empty": [],
                ":entry": [{"status": str(JobStatus.REJECTED), "at": now, "reason": reason[:500]}],
            }
            set_clauses = [
                "#status = :rejected",
                "workspaceId = :wid",
                "messageId = :mid",
                BODY_SET,
                "#error = :reason",
                "acceptedAt = if_not_exists(acceptedAt, :now)",
                "updatedAt = :now",
                "history = list_append(if_not_exists(history, :empty), :entry)",
            ]
            if recorded_job_id:
                values[":jid"] = recorded_job_id
                set_clauses.append("jobId = :jid")
            if tenant_id:
                values[":tid"] = tenant_id
                set_clauses.append("tenantId = if_not_exists(tenantId, :tid)")
            job_update = self._update(
                pk,
                "SET " + ", ".join(set_clauses) + " REMOVE #ttl",
                values,
                # Only a new record, or this same message's own rejection delivered again: never another message's
                # rejection (possibly another tenant's job of the same jobId), which would take its body and reason.
                condition="attribute_not_exists(pk) OR (#status = :rejected AND messageId = :mid)",
                names={"#status": "status", "#error": "error", "#ttl": "ttl"},
            )
            halt = self._halt_workspace(workspace_id, tenant_id, recorded_job_id or pk, f"rejected: {reason}", now)
            if self._transact([job_update, halt]):
                return True
        return False

    def rejection_of(self, *, message_id: str, job_id: str | None, tenant_id: str | None) -> Item | None:
        """The record of this message's rejection, under `msg#<messageId>` or under its jobId, whatever became of it
        since (REJECTED, or SKIPPED by an operator): None if the message was never rejected. A record under the jobId
        counts only if it names this message (the queue's message ids are its own: no sender chooses one)."""
        keys = [f"msg#{message_id}"]
        if job_id and tenant_id:
            keys.insert(0, job_key(tenant_id, job_id))
        for pk in keys:
            item = self._read(pk)
            if item is not None and item.get("messageId") == message_id and "payloadHash" not in item:
                return item
        return None

    def reject_unrouted(self, *, message_id: str, group_id: str | None, reason: str, body: str) -> None:
        """REJECTED under `msg#<messageId>` for a message whose group names no workspace (empty, `ws#` alone, another
        scheme): there is no workspace to halt and no owner to show it to, so nothing else is written. The record
        keeps the group and the body for the operator and expires with the table's TTL like a finished job. A
        delivery of the same message again writes the same record."""
        now = self._clock()
        values: dict[str, Any] = {
            ":rejected": str(JobStatus.REJECTED),
            ":mid": message_id,
            ":gid": (group_id or "")[:128],
            ":reason": stored_error(reason),
            ":now": now,
            ":ttl": self._ttl(now),
            ":empty": [],
            ":entry": [{"status": str(JobStatus.REJECTED), "at": now, "reason": reason[:500]}],
            **body_values(body),
        }
        self._client.update_item(
            TableName=self._table,
            Key=wire({"pk": f"msg#{message_id}"}),
            UpdateExpression=(
                "SET #status = :rejected, messageId = :mid, groupId = :gid, #error = :reason, "
                "acceptedAt = if_not_exists(acceptedAt, :now), updatedAt = :now, #ttl = :ttl, "
                f"history = list_append(if_not_exists(history, :empty), :entry), {BODY_SET}"
            ),
            # Only a new record or this message's own: never another message's record of the same key.
            ConditionExpression="attribute_not_exists(pk) OR messageId = :mid",
            ExpressionAttributeNames={"#status": "status", "#error": "error", "#ttl": "ttl"},
            ExpressionAttributeValues=wire(values),
        )
