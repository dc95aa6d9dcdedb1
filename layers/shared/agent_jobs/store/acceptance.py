"""Acceptance: the API records a job QUEUED before it sends it, and its message id once sent."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from agent_jobs.core import decisions
from agent_jobs.core.outcomes import AcceptOutcome
from agent_jobs.core.records import JobRecord, registration_owner
from agent_jobs.keys import job_key, unplaced_sequence, workspace_key
from agent_jobs.models import JobMessage, JobStatus
from agent_jobs.store.base import message_tenant
from agent_jobs.store.codec import Item, cancellation, condition_failed, reason_failed, to_item, wire
from agent_jobs.store.conditions import place_clauses
from agent_jobs.store.results import AcceptResult, QueuePlace

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.type_defs import TransactWriteItemTypeDef

from agent_jobs.store.base import StoreBase

# Workspaces whose registered owner a store keeps (a few hundred bytes each); past it the oldest read is dropped.
MAX_OWNERS_KEPT = 10_000


class AcceptanceStore(StoreBase):
    """Records of accepted jobs."""

    @functools.cached_property
    def _registered_owners(self) -> dict[str, str]:
        """The owner of each registered workspace this store has read: a registration's owner never changes, so what
        was read once stays true for the life of the process."""
        return {}

    def record_accepted(self, message: JobMessage) -> AcceptResult:
        """Record a job QUEUED before it is sent, unless its jobId is known: then say whether it is the same job.

        Its workspace must be a registration of the job's tenant, so a job never enters another tenant's workspace
        (WORKSPACE_FORBIDDEN) nor one nobody registered yet (WORKSPACE_UNREGISTERED): nothing is written then. The owner
        of a registration never changes (registering needs an item without one or of the same tenant, an update the
        same tenant, and nothing removes one), so the check is a read the store keeps for the life of the process
        (`registered_owner`), and the job's record is one conditional PutItem: 1 write unit, where a transaction with
        a ConditionCheck of the workspace cost 4. A known jobId is answered from its record: CONFLICT for another job,
        EXISTING for the same job already sent (nothing is sent again); the same job recorded but unsent is sent
        (UNSENT) only while its workspace is the tenant's own.
        """
        tenant_id = message_tenant(message)
        refusal = self._ownership_refusal(message.workspace_id, tenant_id)
        if refusal is not None:
            old = self._read(job_key(tenant_id, message.job_id))
            return AcceptResult(refusal) if old is None else self._known_job(message, old, refusal)
        item = self._queued_item(message, self._clock())
        try:
            self._client.put_item(
                TableName=self._table,
                Item=wire(item),
                ConditionExpression="attribute_not_exists(pk)",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as error:
            if not condition_failed(error):
                raise  # throttling or an outage: the caller answers 503 and the client retries
            return self._known_job(message, to_item(error.response.get("Item", {})), None)  # type: ignore[arg-type]
        return AcceptResult(AcceptOutcome.NEW, item)

    def registered_owner(self, workspace_id: str) -> tuple[bool, str | None]:
        """(registered, tenant) of the workspace: its registration's owner, or for an item without a registration the
        tenant a halt recorded on it (None: no item). A registration's owner is kept once read (it never changes); a
        workspace without one is read again next time (it may be registered meanwhile)."""
        owner = self._registered_owners.get(workspace_id)
        if owner is not None:
            return True, owner
        item = self._read(workspace_key(workspace_id)) or {}
        owner = registration_owner(item)
        if owner is None:
            return False, str(item["tenantId"]) if item.get("tenantId") else None
        if len(self._registered_owners) >= MAX_OWNERS_KEPT:
            self._registered_owners.pop(next(iter(self._registered_owners)))  # the oldest read goes first
        self._registered_owners[workspace_id] = owner
        return True, owner

    def _ownership_refusal(self, workspace_id: str, tenant_id: str) -> AcceptOutcome | None:
        """Why a job of `tenant_id` may not enter the workspace, or None when it is the tenant's registration."""
        registered, owner = self.registered_owner(workspace_id)
        if registered and owner == tenant_id:
            return None
        return decisions.workspace_refusal(owner, tenant_id)

    def record_sent(self, tenant_id: str, job_id: str, message_id: str, sequence_number: str | None) -> QueuePlace:
        """Record the queue's answer to the job's send: its message id, and its SequenceNumber as the job's place
        (with `sentAt`, when the answer was recorded), unless the job is placed already (an earlier send confirmed, or
        a worker claimed a copy of it): a recorded place never moves. Never touches the status a worker may own.

        Returns the job's place as recorded, which is what the producer answers: after SQS's 5-minute deduplication
        window a resend is a second message with a later SequenceNumber, and an earlier copy the worker already placed
        the job by is where it takes effect. Raises ClientError when the job has no record."""
        now = self._clock()
        values: dict[str, Any] = {":mid": message_id, ":now": now}
        clauses, place_condition = place_clauses(values, sequence_number)
        condition = "attribute_exists(pk)" + (f" AND {place_condition}" if place_condition else "")
        try:
            self._client.update_item(
                TableName=self._table,
                Key=wire({"pk": job_key(tenant_id, job_id)}),
                UpdateExpression="SET messageId = :mid, sentAt = :now" + clauses,
                ConditionExpression=condition,
                ExpressionAttributeValues=wire(values),
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as error:
            old = to_item(error.response.get("Item", {})) if condition_failed(error) else None  # type: ignore[arg-type]
            if not old:
                raise  # no record (or throttling, an outage): the caller answers 503 and the client retries
            return QueuePlace(_str_or_none(old.get("messageId")), _str_or_none(old.get("sequenceNumber")))
        return QueuePlace(message_id, sequence_number)

    def record_accepted_batch(self, messages: Sequence[JobMessage]) -> list[AcceptResult]:
        """`record_accepted` for several jobs (distinct jobIds) in as few writes as their outcomes allow: one result
        per message, in order.

        One transaction holds the conditional put of every job and one ownership check per distinct workspace. When
        it is cancelled, the reasons say each item's fate: a job whose put failed is CONFLICT, EXISTING, UNSENT or
        WORKSPACE_FORBIDDEN as `record_accepted` decides; a job whose workspace check failed is WORKSPACE_FORBIDDEN;
        the jobs that were only cancelled along are written again in a new transaction (each round settles at least
        one job, so there are at most as many rounds as jobs). Like `record_accepted`, this relies on DynamoDB
        reporting every item's reason. A cancellation without a failed condition (a conflicting transaction,
        throttling) raises: retrying the batch is safe.

        The jobs' acceptedAt are one millisecond apart in batch order, the last one the time of the write: a
        workspace's timeline (the `byWorkspace` index, by acceptedAt) lists them in the order the batch sends them,
        which is the order the queue takes them, never in an order of their keys; and none is later than the write,
        so a job recorded after the batch is not listed before its jobs (but for a tie in one millisecond, as between
        any two jobs).
        """
        results: dict[int, AcceptResult] = {}
        remaining = list(range(len(messages)))
        last = len(messages) - 1
        for _ in range(len(messages) + 1):
            if not remaining:
                break
            now = self._clock()
            items = {index: self._queued_item(messages[index], now - (last - index)) for index in remaining}
            workspaces: dict[str, str] = {}  # workspace -> tenant, in first-seen order
            for index in remaining:
                workspaces.setdefault(messages[index].workspace_id, message_tenant(messages[index]))
            transact: list[TransactWriteItemTypeDef] = [
                {
                    "Put": {
                        "TableName": self._table,
                        "Item": wire(items[index]),
                        "ConditionExpression": "attribute_not_exists(pk)",
                        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                    }
                }
                for index in remaining
            ]
            transact.extend(self._workspace_owned_check(ws, tenant) for ws, tenant in workspaces.items())
            try:
                self._client.transact_write_items(TransactItems=transact)
            except ClientError as error:
                reasons = cancellation(error)
                if reasons is None or not any(reason_failed(reason) for reason in reasons):
                    raise  # a transaction conflict or throttling: the caller answers 503 and the client retries
                remaining = self._settle_cancelled(messages, remaining, workspaces, reasons, results)
                continue
            for index in remaining:
                results[index] = AcceptResult(AcceptOutcome.NEW, items[index])
            remaining = []
        if remaining:  # cannot happen: every cancelled round settles a job
            raise RuntimeError("jobs left unrecorded after a round per job")
        return [results[index] for index in range(len(messages))]

    def _settle_cancelled(
        self,
        messages: Sequence[JobMessage],
        remaining: list[int],
        workspaces: dict[str, str],
        reasons: list[dict[str, Any]],
        results: dict[int, AcceptResult],
    ) -> list[int]:
        """Settle the jobs of a cancelled batch round from its reasons (into `results`); the jobs that were only
        cancelled along are returned, to be written again."""
        refused = {
            ws: refusal
            for (ws, tenant), reason in zip(workspaces.items(), reasons[len(remaining) :], strict=False)
            if (refusal := _workspace_refusal(reason, tenant)) is not None
        }
        still_new = []
        for index, reason in zip(remaining, reasons, strict=False):
            message = messages[index]
            if reason_failed(reason):
                old = to_item(reason.get("Item", {}))
                results[index] = self._known_job(message, old, refused.get(message.workspace_id))
            elif message.workspace_id in refused:
                results[index] = AcceptResult(refused[message.workspace_id])
            else:
                still_new.append(index)
        return still_new

    def record_sent_batch(self, sent: Sequence[tuple[str, str, str, str | None]]) -> list[QueuePlace]:
        """`record_sent` for several jobs, (tenantId, jobId, messageId, sequenceNumber) each: one transaction of the
        updates, which never touch the status a worker may own nor a place already recorded; their places, in order.
        If the transaction is cancelled (a worker's write of one of the jobs at the same moment, or a job placed
        already), each job is recorded on its own instead."""
        if len(sent) == 1:
            return [self.record_sent(*sent[0])]
        now = self._clock()
        updates: list[TransactWriteItemTypeDef] = []
        for tenant_id, job_id, message_id, sequence_number in sent:
            values: dict[str, Any] = {":mid": message_id, ":now": now}
            clauses, place_condition = place_clauses(values, sequence_number)
            updates.append(
                {
                    "Update": {
                        "TableName": self._table,
                        "Key": wire({"pk": job_key(tenant_id, job_id)}),
                        "UpdateExpression": "SET messageId = :mid, sentAt = :now" + clauses,
                        "ConditionExpression": "attribute_exists(pk)"
                        + (f" AND {place_condition}" if place_condition else ""),
                        "ExpressionAttributeValues": wire(values),
                    }
                }
            )
        try:
            self._client.transact_write_items(TransactItems=updates)
        except ClientError as error:
            if cancellation(error) is None:
                raise
            return [self.record_sent(*one) for one in sent]
        return [QueuePlace(message_id, sequence_number) for _, _, message_id, sequence_number in sent]

    def _queued_item(self, message: JobMessage, now: int) -> Item:
        """The QUEUED record of an accepted job (`record_accepted`, `record_accepted_batch`)."""
        return {
            "pk": job_key(message_tenant(message), message.job_id),
            "jobId": message.job_id,
            "workspaceId": message.workspace_id,
            "tenantId": message_tenant(message),
            "type": str(message.type),
            "payloadHash": message.payload_hash,
            "status": str(JobStatus.QUEUED),
            # In the pending index until it is settled: SUCCEEDED, SKIPPED, or in the hands of the halt machinery
            # (PARKED, DEAD). Unplaced until its send is confirmed (`record_sent`) or a worker claims a copy of it:
            # until then every job claimed after it finds it ahead (`jobs_ahead`), since its message may be
            # ahead of theirs.
            "pendingWorkspace": message.workspace_id,
            "queueSeq": unplaced_sequence(now),
            "attempt": 0,
            "acceptedAt": now,
            "updatedAt": now,
            "ttl": self._ttl(now),
            "history": [{"status": str(JobStatus.QUEUED), "at": now}],
        }

    def _workspace_owned_check(self, workspace_id: str, tenant_id: str) -> TransactWriteItemTypeDef:
        # Only a registration (remoteUrl) of the job's own tenant takes its jobs: a job sent before anyone registered
        # the workspace would otherwise run on the branch of whoever registers it later. The old item on failure says
        # which refusal it is (`_workspace_refusal`).
        return {
            "ConditionCheck": {
                "TableName": self._table,
                "Key": wire({"pk": workspace_key(workspace_id)}),
                "ConditionExpression": "attribute_exists(remoteUrl) AND tenantId = :tid",
                "ExpressionAttributeValues": wire({":tid": tenant_id}),
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }

    @staticmethod
    def _known_job(message: JobMessage, old: Item, workspace_refusal: AcceptOutcome | None) -> AcceptResult:
        outcome = decisions.known_job(
            JobRecord.from_item(old),
            payload_hash=message.payload_hash,
            tenant_id=message.tenant_id,
            refusal=workspace_refusal,
        )
        return AcceptResult(outcome) if outcome is workspace_refusal else AcceptResult(outcome, old)


def _workspace_refusal(reason: Mapping[str, Any], tenant_id: str | None) -> AcceptOutcome | None:
    """Why a workspace ownership check failed, from its old item; None when it did not fail."""
    if not reason_failed(reason):
        return None
    return decisions.workspace_refusal(to_item(reason.get("Item", {})).get("tenantId"), tenant_id)


def _str_or_none(value: Any) -> str | None:
    return str(value) if value else None
