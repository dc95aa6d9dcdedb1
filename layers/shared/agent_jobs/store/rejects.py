"""Rejections: a message that is no valid job is recorded, and its workspace halts; a message that is not its
workspace owner's (or of no workspace) is recorded for the operator and refused, nothing halted."""

from __future__ import annotations

import time
from typing import Any, Final

from agent_jobs.keys import job_key
from agent_jobs.models import JobStatus
from agent_jobs.store.codec import BODY_SET, Item, body_values, stored_body, stored_error, to_item, wire
from agent_jobs.store.conditions import REFUSED_INDEX
from agent_jobs.store.halts import HaltStore

# The most of a refused message's body its record keeps (the whole body's size and sha256 are kept too).
REFUSED_BODY_CHARS: Final = 4096


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
        keeps the group and the body for the operator (`agent-jobs refused` lists it) and expires with the table's
        TTL like a finished job. A delivery of the same message again writes the same record."""
        self._write_refusal(
            message_id=message_id,
            group_id=group_id,
            reason=reason,
            stored=body_values(body),
            # Only a new record or this message's own: never another message's record of the same key.
            condition="attribute_not_exists(pk) OR messageId = :mid",
        )

    def refuse(
        self,
        *,
        message_id: str,
        group_id: str,
        reason: str,
        body: str,
        sender_id: str | None,
        named_tenant: str | None,
    ) -> bool:
        """REJECTED under `msg#<messageId>` for a message that is not its workspace owner's (a sender the owner did not
        bind, or another tenant named): the owner's workspace is not halted and no jobId is taken, since the record
        is never under a jobId. It is no record of the owner's either (no tenantId or workspaceId: neither the
        owner's timeline nor the sender sees it); it keeps the group, the SenderId, the tenant the message named and
        the head of its body for the operator (`agent-jobs refused` lists it), and expires with the table's TTL.

        Returns False when this message was recorded before (a delivery again) or its record was decided since."""
        values = body_values(body)
        # Whatever a refused sender sends costs the stack one small write: the record keeps the head of the body, with
        # the size and sha256 of the whole.
        values[":body"] = stored_body(str(values[":body"])[:REFUSED_BODY_CHARS])
        extra: dict[str, Any] = {}
        if sender_id:
            extra["senderId"] = sender_id[:256]
        if named_tenant:
            extra["namedTenantId"] = named_tenant[:128]
        return self._write_refusal(
            message_id=message_id,
            group_id=group_id,
            reason=reason,
            stored=values,
            extra=extra,
            condition="attribute_not_exists(pk) OR (messageId = :mid AND #status = :rejected)",
        )

    def _write_refusal(
        self,
        *,
        message_id: str,
        group_id: str | None,
        reason: str,
        stored: dict[str, Any],
        condition: str,
        extra: dict[str, Any] | None = None,
    ) -> bool:
        now = self._clock()
        values: dict[str, Any] = {
            ":rejected": str(JobStatus.REJECTED),
            ":mid": message_id,
            ":gid": (group_id or "")[:128],
            ":reason": stored_error(reason),
            ":now": now,
            ":day": refused_day(now),
            ":ttl": self._ttl(now),
            ":empty": [],
            ":entry": [{"status": str(JobStatus.REJECTED), "at": now, "reason": reason[:500]}],
            **stored,
        }
        clauses = [
            "#status = :rejected",
            "messageId = :mid",
            "groupId = :gid",
            "#error = :reason",
            "acceptedAt = if_not_exists(acceptedAt, :now)",
            "refusedDay = if_not_exists(refusedDay, :day)",
            "updatedAt = :now",
            "#ttl = :ttl",
            "history = list_append(if_not_exists(history, :empty), :entry)",
            BODY_SET,
        ]
        for index, (name, value) in enumerate(sorted((extra or {}).items())):
            values[f":extra{index}"] = value
            clauses.append(f"{name} = :extra{index}")
        return self._transact(
            [
                self._update(
                    f"msg#{message_id}",
                    "SET " + ", ".join(clauses),
                    values,
                    condition=condition,
                    names={"#status": "status", "#error": "error", "#ttl": "ttl"},
                )
            ]
        )

    def refused_messages(self, *, since_ms: int, limit: int = 100) -> list[Item]:
        """The records of refused messages (`refuse`, `reject_unrouted`) accepted since `since_ms`, newest first, at
        most `limit`: a Query of the sparse index REFUSED_INDEX per day, from today back. Entries of the index, not
        the records: no bodies."""
        found: list[Item] = []
        day_ms = 86_400_000
        day = self._clock()
        while len(found) < limit and day >= since_ms - day_ms:
            pages = self._client.get_paginator("query").paginate(
                TableName=self._table,
                IndexName=REFUSED_INDEX,
                KeyConditionExpression="refusedDay = :day AND acceptedAt >= :since",
                ExpressionAttributeValues=wire({":day": refused_day(day), ":since": since_ms}),
                ScanIndexForward=False,
                PaginationConfig={"MaxItems": limit - len(found), "PageSize": min(100, limit)},
            )
            found.extend(to_item(raw) for page in pages for raw in page.get("Items", []))
            day -= day_ms
        return found[:limit]


def refused_day(epoch_ms: int) -> str:
    """The REFUSED_INDEX partition of a record written at `epoch_ms`: its UTC day."""
    return time.strftime("%Y-%m-%d", time.gmtime(epoch_ms // 1000))
