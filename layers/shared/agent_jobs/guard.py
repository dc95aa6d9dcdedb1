"""The guard: the only code that writes job and workspace state.

Every transition is one conditional write (a single item, or one transaction when a job and its workspace must change
together). A lost condition is an expected outcome returned as a value, never an exception: the caller decides
whether to acknowledge or retry. The happy path is two writes (claim, complete) and no read; a duplicate delivery
is one failed conditional write.
"""

from __future__ import annotations

import functools
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError

from agent_jobs.keys import job_key, workspace_key
from agent_jobs.models import JobMessage, JobStatus, WorkspaceState

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import TransactWriteItemTypeDef

Item = dict[str, Any]
Clock = Callable[[], int]

# A stored message body larger than this is truncated (DynamoDB items are capped at 400 KB).
MAX_STORED_BODY_CHARS = 300_000
_serializer = TypeSerializer()
_deserializer = TypeDeserializer()


def epoch_ms() -> int:
    return time.time_ns() // 1_000_000


class ClaimOutcome(StrEnum):
    CLAIMED = "CLAIMED"  # run the job, then complete or fail with the lease
    DUPLICATE = "DUPLICATE"  # already SUCCEEDED or SKIPPED: acknowledge without effect
    BUSY = "BUSY"  # another worker holds a live lease: report the record failed, never acknowledge
    WORKSPACE_HALTED = "WORKSPACE_HALTED"  # the workspace is HALTED or RESUMING: park the job
    SETTLED = "SETTLED"  # already DEAD, REJECTED or PARKED: its halt is on record; acknowledge
    EXHAUSTED = "EXHAUSTED"  # attempts used up by workers that never came back: now DEAD, workspace halted
    CONFLICT = "CONFLICT"  # same jobId, another payload: acknowledge without effect
    CONTENDED = "CONTENDED"  # a concurrent transaction touched the items: retry later


@dataclass(frozen=True)
class Lease:
    """Proof of a claim: later writes of this job are conditional on `owner` still being the lease owner."""

    job_id: str
    workspace_id: str
    tenant_id: str
    owner: str
    expires_at_ms: int


@dataclass(frozen=True)
class ClaimResult:
    outcome: ClaimOutcome
    lease: Lease | None = None
    previous: Item | None = None  # the job item as it was when the claim lost
    workspace: Item | None = None  # the workspace item when it blocked the claim

    @property
    def claimed(self) -> bool:
        return self.outcome is ClaimOutcome.CLAIMED


class FailOutcome(StrEnum):
    RETRY = "RETRY"  # FAILED, the queue will deliver it again
    DEAD = "DEAD"  # DEAD and the workspace HALTED, in one transaction
    LOST = "LOST"  # the lease was taken over: nothing written


class AcceptOutcome(StrEnum):
    NEW = "NEW"  # recorded QUEUED: send it
    UNSENT = "UNSENT"  # recorded earlier with the same payload but never confirmed sent: send it (idempotent)
    EXISTING = "EXISTING"  # recorded and sent earlier with the same payload: answer with the stored state
    CONFLICT = "CONFLICT"  # the jobId exists with another payload or tenant
    WORKSPACE_FORBIDDEN = "WORKSPACE_FORBIDDEN"  # the workspace is registered to (or halted for) another tenant


@dataclass(frozen=True)
class AcceptResult:
    outcome: AcceptOutcome
    item: Item = field(default_factory=dict)


# The table's GSI of job records by workspace, in acceptance order (template.yaml: workspaceId HASH, acceptedAt RANGE).
WORKSPACE_INDEX = "byWorkspace"


@dataclass(frozen=True)
class JobPage:
    """One page of a workspace's job records, and where the next page starts (None: there is no next page)."""

    items: list[Item]
    next_key: Item | None


def to_item(raw: Mapping[str, Any]) -> Item:
    """A DynamoDB wire item as plain Python (numbers as int where integral)."""
    return {key: _plain(_deserializer.deserialize(value)) for key, value in raw.items()}


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _dynamodb_value(value: Any) -> Any:
    """DynamoDB numbers are Decimals: a float anywhere in a value (a job result, say) becomes one."""
    if isinstance(value, float):
        return Decimal(str(value))
    if isinstance(value, Mapping):
        return {k: _dynamodb_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_dynamodb_value(v) for v in value]
    return value


def _wire(values: Mapping[str, Any]) -> dict[str, Any]:
    return {key: _serializer.serialize(_dynamodb_value(value)) for key, value in values.items()}


def _condition_failed(error: ClientError) -> bool:
    return error.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException"


def _cancellation(error: ClientError) -> list[dict[str, Any]] | None:
    if error.response.get("Error", {}).get("Code") != "TransactionCanceledException":
        return None
    return list(error.response.get("CancellationReasons", []))  # type: ignore[arg-type]


def _reason_failed(reason: Mapping[str, Any]) -> bool:
    return reason.get("Code") == "ConditionalCheckFailed"


class JobGuard:
    """Conditional writes of job and workspace state in one DynamoDB table keyed by `pk`."""

    def __init__(
        self,
        client: DynamoDBClient,
        table_name: str,
        *,
        max_attempts: int = 3,
        ttl_days: int = 30,
        clock: Clock = epoch_ms,
    ) -> None:
        self._client = client
        self._table = table_name
        self._max_attempts = max_attempts
        self._ttl_seconds = ttl_days * 86_400
        self._clock = clock

    def now(self) -> int:
        """The guard's clock (epoch ms), which lease expiries are measured against."""
        return self._clock()

    # ---- producer side -------------------------------------------------------------------------------------------

    def record_accepted(self, message: JobMessage) -> AcceptResult:
        """Record a job QUEUED before it is sent, unless its jobId is known: then say whether it is the same job.

        One transaction: the conditional put of the job and a check that its workspace item (`ws#<workspaceId>`)
        is absent or carries the job's tenant, so a job never enters another tenant's workspace (WORKSPACE_FORBIDDEN,
        nothing written). A known jobId is answered from its record first: CONFLICT for another job, EXISTING for
        the same job already sent (nothing is sent again); the same job recorded but unsent is sent (UNSENT) only
        while its workspace is still the tenant's own.
        """
        now = self._clock()
        item = {
            "pk": job_key(message.job_id),
            "jobId": message.job_id,
            "workspaceId": message.workspace_id,
            "tenantId": message.tenant_id,
            "type": str(message.type),
            "payloadHash": message.payload_hash,
            "status": str(JobStatus.QUEUED),
            "attempt": 0,
            "acceptedAt": now,
            "updatedAt": now,
            "ttl": self._ttl(now),
            "history": [{"status": str(JobStatus.QUEUED), "at": now}],
        }
        put_job: TransactWriteItemTypeDef = {
            "Put": {
                "TableName": self._table,
                "Item": _wire(item),
                "ConditionExpression": "attribute_not_exists(pk)",
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }
        # A workspace item without a tenant (halted by a message that named none) is not anyone's yet, as registering
        # treats it.
        workspace_is_the_tenants: TransactWriteItemTypeDef = {
            "ConditionCheck": {
                "TableName": self._table,
                "Key": _wire({"pk": workspace_key(message.workspace_id)}),
                "ConditionExpression": "attribute_not_exists(pk) OR attribute_not_exists(tenantId) OR tenantId = :tid",
                "ExpressionAttributeValues": _wire({":tid": message.tenant_id}),
            }
        }
        try:
            self._client.transact_write_items(TransactItems=[put_job, workspace_is_the_tenants])
        except ClientError as error:
            reasons = _cancellation(error)
            if reasons is None or not any(_reason_failed(reason) for reason in reasons):
                raise  # a transaction conflict or throttling: the caller answers 503 and the client retries
            job_reason = reasons[0] if reasons else {}
            workspace_forbidden = len(reasons) > 1 and _reason_failed(reasons[1])
            if not _reason_failed(job_reason):
                return AcceptResult(AcceptOutcome.WORKSPACE_FORBIDDEN)
            old = to_item(job_reason.get("Item", {}))
            same_job = old.get("payloadHash") == message.payload_hash and old.get("tenantId") == message.tenant_id
            if not same_job:
                return AcceptResult(AcceptOutcome.CONFLICT, old)
            if old.get("messageId"):
                return AcceptResult(AcceptOutcome.EXISTING, old)
            if workspace_forbidden:
                return AcceptResult(AcceptOutcome.WORKSPACE_FORBIDDEN)
            return AcceptResult(AcceptOutcome.UNSENT, old)
        return AcceptResult(AcceptOutcome.NEW, item)

    def record_sent(self, job_id: str, message_id: str, sequence_number: str | None) -> None:
        """Store the queue's message id and sequence number; never touches the status a worker may already own."""
        values: dict[str, Any] = {":mid": message_id}
        expression = "SET messageId = :mid"
        if sequence_number:
            values[":seq"] = sequence_number
            expression += ", sequenceNumber = :seq"
        self._client.update_item(
            TableName=self._table,
            Key=_wire({"pk": job_key(job_id)}),
            UpdateExpression=expression,
            ConditionExpression="attribute_exists(pk)",
            ExpressionAttributeValues=_wire(values),
        )

    # ---- worker side ---------------------------------------------------------------------------------------------

    def claim(
        self, message: JobMessage, *, message_id: str, sequence_number: str | None, remaining_ms: int
    ) -> ClaimResult:
        """Claim a job for this invocation: one transaction of a conditional update of the job and a check that its
        workspace is not halted. Succeeds iff the job is new, QUEUED, FAILED, or IN_FLIGHT with an expired lease,
        has attempts left, and carries the payload it was accepted with.
        """
        now = self._clock()
        owner = secrets.token_hex(16)
        expires = now + max(remaining_ms, 0)
        values = {
            ":inflight": str(JobStatus.IN_FLIGHT),
            ":queued": str(JobStatus.QUEUED),
            ":failed": str(JobStatus.FAILED),
            ":now": now,
            ":max": self._max_attempts,
            ":zero": 0,
            ":one": 1,
            ":owner": owner,
            ":exp": expires,
            ":jid": message.job_id,
            ":wid": message.workspace_id,
            ":tid": message.tenant_id,
            ":type": str(message.type),
            ":hash": message.payload_hash,
            ":mid": message_id,
            ":ttl": self._ttl(now),
            ":empty": [],
            ":entry": [{"status": str(JobStatus.IN_FLIGHT), "at": now, "messageId": message_id}],
        }
        set_clauses = [
            "#status = :inflight",
            "attempt = if_not_exists(attempt, :zero) + :one",
            "leaseOwner = :owner",
            "leaseExpiresAt = :exp",
            "jobId = :jid",
            "workspaceId = :wid",
            "tenantId = if_not_exists(tenantId, :tid)",  # the tenant the producer verified stays the owner
            "#type = :type",
            "payloadHash = :hash",
            "messageId = :mid",
            "acceptedAt = if_not_exists(acceptedAt, :now)",
            "updatedAt = :now",
            "#ttl = :ttl",
            "history = list_append(if_not_exists(history, :empty), :entry)",
        ]
        if sequence_number:
            values[":seq"] = sequence_number
            set_clauses.append("sequenceNumber = :seq")
        job_update: TransactWriteItemTypeDef = {
            "Update": {
                "TableName": self._table,
                "Key": _wire({"pk": job_key(message.job_id)}),
                "UpdateExpression": "SET " + ", ".join(set_clauses) + " REMOVE #error",
                "ConditionExpression": (
                    "(attribute_not_exists(pk) OR payloadHash = :hash)"
                    " AND (attribute_not_exists(pk) OR #status IN (:queued, :failed)"
                    " OR (#status = :inflight AND leaseExpiresAt < :now))"
                    " AND (attribute_not_exists(attempt) OR attempt < :max)"
                ),
                "ExpressionAttributeNames": {"#status": "status", "#type": "type", "#ttl": "ttl", "#error": "error"},
                "ExpressionAttributeValues": _wire(values),
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }
        try:
            self._client.transact_write_items(
                TransactItems=[job_update, self._workspace_active_check(message.workspace_id)]
            )
        except ClientError as error:
            reasons = _cancellation(error)
            if reasons is None:
                raise
            return self._explain_lost_claim(message, reasons, now)
        lease = Lease(message.job_id, message.workspace_id, message.tenant_id, owner, expires)
        return ClaimResult(ClaimOutcome.CLAIMED, lease=lease)

    def _explain_lost_claim(self, message: JobMessage, reasons: list[dict[str, Any]], now: int) -> ClaimResult:
        job_reason = reasons[0] if reasons else {}
        ws_reason = reasons[1] if len(reasons) > 1 else {}
        if not _reason_failed(job_reason):
            if _reason_failed(ws_reason):
                return ClaimResult(ClaimOutcome.WORKSPACE_HALTED, workspace=to_item(ws_reason.get("Item", {})))
            return ClaimResult(ClaimOutcome.CONTENDED)
        old = to_item(job_reason.get("Item", {}))
        status = old.get("status")
        if old.get("payloadHash") not in (None, message.payload_hash):
            return ClaimResult(ClaimOutcome.CONFLICT, previous=old)
        if status in (JobStatus.SUCCEEDED, JobStatus.SKIPPED):
            return ClaimResult(ClaimOutcome.DUPLICATE, previous=old)
        if status in (JobStatus.DEAD, JobStatus.REJECTED, JobStatus.PARKED):
            return ClaimResult(ClaimOutcome.SETTLED, previous=old)
        if status == JobStatus.IN_FLIGHT and int(old.get("leaseExpiresAt", 0)) >= now:
            return ClaimResult(ClaimOutcome.BUSY, previous=old)
        if int(old.get("attempt", 0)) < self._max_attempts:
            return ClaimResult(ClaimOutcome.CONTENDED, previous=old)  # the item changed between write and check
        # Attempts used up by workers that never came back (or max_attempts was lowered): dead, and halt.
        if self._dead_and_halt(
            old,
            error=f"attempts exhausted ({old.get('attempt')} of {self._max_attempts}) without a recorded outcome",
            expect_owner=old.get("leaseOwner"),
            expect_status=str(status),
        ):
            return ClaimResult(ClaimOutcome.EXHAUSTED, previous=old)
        return ClaimResult(ClaimOutcome.CONTENDED, previous=old)

    def complete(self, lease: Lease, result: Mapping[str, Any]) -> bool:
        """SUCCEEDED, conditional on still owning the lease. False means another worker took over: nothing written."""
        now = self._clock()
        try:
            self._client.update_item(
                TableName=self._table,
                Key=_wire({"pk": job_key(lease.job_id)}),
                UpdateExpression=(
                    "SET #status = :succeeded, #result = :result, updatedAt = :now, finishedAt = :now,"
                    " history = list_append(history, :entry)"
                ),
                ConditionExpression="leaseOwner = :owner AND #status = :inflight",
                ExpressionAttributeNames={"#status": "status", "#result": "result"},
                ExpressionAttributeValues=_wire(
                    {
                        ":succeeded": str(JobStatus.SUCCEEDED),
                        ":inflight": str(JobStatus.IN_FLIGHT),
                        ":result": dict(result),
                        ":now": now,
                        ":owner": lease.owner,
                        ":entry": [{"status": str(JobStatus.SUCCEEDED), "at": now}],
                    }
                ),
            )
        except ClientError as error:
            if _condition_failed(error):
                return False
            raise
        return True

    def fail(self, lease: Lease, error: str, *, permanent: bool = False) -> FailOutcome:
        """Record a failed attempt. Retryable with attempts left → FAILED; otherwise DEAD + workspace HALTED."""
        now = self._clock()
        if not permanent:
            try:
                self._client.update_item(
                    TableName=self._table,
                    Key=_wire({"pk": job_key(lease.job_id)}),
                    UpdateExpression=(
                        "SET #status = :failed, #error = :error, updatedAt = :now,"
                        " history = list_append(history, :entry)"
                    ),
                    ConditionExpression="leaseOwner = :owner AND #status = :inflight AND attempt < :max",
                    ExpressionAttributeNames={"#status": "status", "#error": "error"},
                    ExpressionAttributeValues=_wire(
                        {
                            ":failed": str(JobStatus.FAILED),
                            ":inflight": str(JobStatus.IN_FLIGHT),
                            ":error": error,
                            ":now": now,
                            ":owner": lease.owner,
                            ":max": self._max_attempts,
                            ":entry": [{"status": str(JobStatus.FAILED), "at": now, "error": error[:500]}],
                        }
                    ),
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
            except ClientError as client_error:
                if not _condition_failed(client_error):
                    raise
                old = to_item(client_error.response.get("Item", {}))  # type: ignore[arg-type]
                if old.get("leaseOwner") != lease.owner or old.get("status") != JobStatus.IN_FLIGHT:
                    return FailOutcome.LOST
                error = f"{error} (attempt {old.get('attempt')} of {self._max_attempts})"
            else:
                return FailOutcome.RETRY
        old_item = {"jobId": lease.job_id, "workspaceId": lease.workspace_id, "tenantId": lease.tenant_id}
        if self._dead_and_halt(old_item, error=error, expect_owner=lease.owner, expect_status=str(JobStatus.IN_FLIGHT)):
            return FailOutcome.DEAD
        return FailOutcome.LOST

    def park(
        self,
        message: JobMessage,
        *,
        message_id: str,
        sequence_number: str | None,
        body: str,
        reason: str,
        halt_workspace: bool = False,
    ) -> bool:
        """PARKED with its body and SequenceNumber, so a resume can run it in queue order later.

        With `halt_workspace`, the workspace is halted in the same transaction (used when a message reaches its last
        delivery: parking it instead of letting the queue dead-letter it keeps the group's order intact).
        Returns False if the job is already settled (SUCCEEDED, DEAD, ...), held by a live lease, or was accepted with
        another payload.
        """
        now = self._clock()
        values: dict[str, Any] = {
            ":parked": str(JobStatus.PARKED),
            ":queued": str(JobStatus.QUEUED),
            ":failed": str(JobStatus.FAILED),
            ":inflight": str(JobStatus.IN_FLIGHT),
            ":now": now,
            ":jid": message.job_id,
            ":wid": message.workspace_id,
            ":tid": message.tenant_id,
            ":type": str(message.type),
            ":hash": message.payload_hash,
            ":mid": message_id,
            ":body": body[:MAX_STORED_BODY_CHARS],
            ":reason": reason,
            ":empty": [],
            ":entry": [{"status": str(JobStatus.PARKED), "at": now, "reason": reason}],
        }
        set_clauses = [
            "#status = :parked",
            "jobId = :jid",
            "workspaceId = :wid",
            "tenantId = :tid",
            "#type = :type",
            "payloadHash = if_not_exists(payloadHash, :hash)",
            "messageId = :mid",
            "body = :body",
            "parkedReason = :reason",
            "acceptedAt = if_not_exists(acceptedAt, :now)",
            "updatedAt = :now",
            "history = list_append(if_not_exists(history, :empty), :entry)",
        ]
        if sequence_number:
            values[":seq"] = sequence_number
            set_clauses.append("sequenceNumber = :seq")
        job_update: TransactWriteItemTypeDef = {
            "Update": {
                "TableName": self._table,
                "Key": _wire({"pk": job_key(message.job_id)}),
                # A parked job waits for an operator: TTL must not collect it (TTL is garbage collection only).
                "UpdateExpression": "SET " + ", ".join(set_clauses) + " REMOVE #ttl",
                # Never over another job's record: a message reusing a jobId with another payload parks nothing.
                "ConditionExpression": (
                    "attribute_not_exists(pk) OR ((attribute_not_exists(payloadHash) OR payloadHash = :hash)"
                    " AND (#status IN (:queued, :failed) OR (#status = :inflight AND leaseExpiresAt < :now)))"
                ),
                "ExpressionAttributeNames": {"#status": "status", "#type": "type", "#ttl": "ttl"},
                "ExpressionAttributeValues": _wire(values),
            }
        }
        items = [job_update]
        if halt_workspace:
            items.append(self._halt_workspace(message.workspace_id, message.tenant_id, message.job_id, reason, now))
        return self._transact(items)

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
        record = functools.partial(
            self._reject,
            message_id=message_id,
            workspace_id=workspace_id,
            tenant_id=tenant_id,
            reason=reason,
            body=body,
        )
        if job_id and record(pk=job_key(job_id), job_id=job_id):
            return True
        # No usable jobId, or it names a job that exists: the bad message is recorded under its own message id.
        return record(pk=f"msg#{message_id}", job_id=None)

    def _reject(
        self,
        *,
        message_id: str,
        pk: str,
        job_id: str | None,
        workspace_id: str,
        tenant_id: str | None,
        reason: str,
        body: str,
    ) -> bool:
        now = self._clock()
        values = {
            ":rejected": str(JobStatus.REJECTED),
            ":wid": workspace_id,
            ":mid": message_id,
            ":body": body[:MAX_STORED_BODY_CHARS],
            ":reason": reason,
            ":now": now,
            ":empty": [],
            ":entry": [{"status": str(JobStatus.REJECTED), "at": now, "reason": reason[:500]}],
        }
        set_clauses = [
            "#status = :rejected",
            "workspaceId = :wid",
            "messageId = :mid",
            "body = :body",
            "#error = :reason",
            "acceptedAt = if_not_exists(acceptedAt, :now)",
            "updatedAt = :now",
            "history = list_append(if_not_exists(history, :empty), :entry)",
        ]
        if job_id:
            values[":jid"] = job_id
            set_clauses.append("jobId = :jid")
        if tenant_id:
            values[":tid"] = tenant_id
            set_clauses.append("tenantId = if_not_exists(tenantId, :tid)")
        job_update: TransactWriteItemTypeDef = {
            "Update": {
                "TableName": self._table,
                "Key": _wire({"pk": pk}),
                "UpdateExpression": "SET " + ", ".join(set_clauses) + " REMOVE #ttl",
                "ConditionExpression": "attribute_not_exists(pk) OR #status = :rejected",
                "ExpressionAttributeNames": {"#status": "status", "#error": "error", "#ttl": "ttl"},
                "ExpressionAttributeValues": _wire(values),
            }
        }
        return self._transact(
            [job_update, self._halt_workspace(workspace_id, tenant_id, job_id or pk, f"rejected: {reason}", now)]
        )

    def halt_workspace(self, workspace_id: str, *, tenant_id: str | None, job_id: str, reason: str) -> None:
        """HALTED, without touching any job: for a record the worker could neither run nor park on its last delivery,
        so that the queue dead-lettering it cannot let the next job of the workspace run."""
        update = self._halt_workspace(workspace_id, tenant_id, job_id, reason, self._clock())["Update"]
        self._client.update_item(**update)

    # ---- reads (status API) --------------------------------------------------------------------------------------

    def get_job(self, job_id: str) -> Item | None:
        response = self._client.get_item(TableName=self._table, Key=_wire({"pk": job_key(job_id)}), ConsistentRead=True)
        raw = response.get("Item")
        return to_item(raw) if raw else None

    def get_workspace(self, workspace_id: str) -> Item | None:
        response = self._client.get_item(
            TableName=self._table, Key=_wire({"pk": workspace_key(workspace_id)}), ConsistentRead=True
        )
        raw = response.get("Item")
        return to_item(raw) if raw else None

    def workspace_jobs(
        self,
        workspace_id: str,
        tenant_id: str,
        *,
        limit: int,
        start_key: Mapping[str, Any] | None = None,
        attributes: Sequence[str] | None = None,
        max_queries: int = 10,
    ) -> JobPage:
        """A page of the workspace's job records of `tenant_id`, oldest accepted first (the GSI `byWorkspace`).

        At most `limit` items; `next_key` (the index's LastEvaluatedKey, plain values: pk, workspaceId, acceptedAt)
        continues after the last item read, None at the end. Records of other tenants that name this workspace are
        read and left out, so a page can hold fewer than `limit` items while `next_key` is not None; the read stops
        after `max_queries` Query calls to keep one page's cost bounded. `attributes` limits the attributes returned.
        Reads of a GSI are eventually consistent: a job accepted a moment ago can be missing for a moment.
        """
        items: list[Item] = []
        key: Mapping[str, Any] | None = start_key
        for _ in range(max_queries):
            page = self._query_workspace(
                workspace_id,
                tenant_id,
                limit=limit - len(items),
                start_key=key,
                attributes=attributes,
                newest_first=False,
            )
            items.extend(page.items)
            key = page.next_key
            if key is None or len(items) >= limit:
                break
        return JobPage(items=items, next_key=dict(key) if key is not None else None)

    def last_succeeded_job(self, workspace_id: str, tenant_id: str, *, max_items: int = 300) -> Item | None:
        """The workspace's most recently applied job of `tenant_id`: the SUCCEEDED job with the highest SequenceNumber
        among the newest accepted records, or None if none of the newest `max_items` records SUCCEEDED.

        Derived at read time so that the worker's happy path stays two writes (claim, complete) and no read. Cost: a
        Query of the GSI `byWorkspace`, newest first, filtered on SUCCEEDED, in pages of 100 records until a page
        holds a SUCCEEDED job: usually one call reading the newest records of the workspace, at most
        ceil(max_items / 100) calls (each reads up to 100 records or 1 MB, billed by their size, eventually
        consistent). Jobs of one workspace take effect in SequenceNumber order, so within the page that holds
        SUCCEEDED jobs the highest SequenceNumber is the last applied even when acceptedAt ties or two producers'
        clocks disagree.
        """
        key: Mapping[str, Any] | None = None
        evaluated = 0
        while evaluated < max_items:
            page_size = min(100, max_items - evaluated)
            page = self._query_workspace(
                workspace_id,
                tenant_id,
                limit=page_size,
                start_key=key,
                attributes=("jobId", "sequenceNumber", "finishedAt", "status"),
                newest_first=True,
                status=str(JobStatus.SUCCEEDED),
            )
            if page.items:
                return max(page.items, key=self._applied_order)
            evaluated += page_size
            key = page.next_key
            if key is None:
                break
        return None

    @staticmethod
    def _applied_order(item: Mapping[str, Any]) -> tuple[int, int]:
        """Jobs of one workspace take effect in SequenceNumber order (a decimal string); finishedAt breaks the rest."""
        sequence = str(item.get("sequenceNumber") or "")
        return (int(sequence) if sequence.isdigit() else -1, int(item.get("finishedAt") or 0))

    def _query_workspace(
        self,
        workspace_id: str,
        tenant_id: str,
        *,
        limit: int,
        start_key: Mapping[str, Any] | None,
        attributes: Sequence[str] | None,
        newest_first: bool,
        status: str | None = None,
    ) -> JobPage:
        names = {"#tenant": "tenantId"}
        values: dict[str, Any] = {":wid": workspace_id, ":tid": tenant_id}
        condition = "#tenant = :tid"
        if status is not None:
            names["#status"] = "status"
            values[":status"] = status
            condition += " AND #status = :status"
        request: dict[str, Any] = {
            "TableName": self._table,
            "IndexName": WORKSPACE_INDEX,
            "KeyConditionExpression": "workspaceId = :wid",
            "FilterExpression": condition,
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": _wire(values),
            "ScanIndexForward": not newest_first,
            "Limit": max(1, limit),
        }
        if attributes:
            # Every name through a placeholder: status, type, result and error are DynamoDB reserved words.
            projected = {f"#a{index}": name for index, name in enumerate(attributes)}
            names.update(projected)
            request["ProjectionExpression"] = ", ".join(projected)
        if start_key is not None:
            request["ExclusiveStartKey"] = _wire(start_key)
        response = self._client.query(**request)
        last = response.get("LastEvaluatedKey")
        return JobPage(
            items=[to_item(raw) for raw in response.get("Items", [])], next_key=to_item(last) if last else None
        )

    # ---- internals -----------------------------------------------------------------------------------------------

    def _ttl(self, now_ms: int) -> int:
        return now_ms // 1000 + self._ttl_seconds

    def _workspace_active_check(self, workspace_id: str) -> TransactWriteItemTypeDef:
        return {
            "ConditionCheck": {
                "TableName": self._table,
                "Key": _wire({"pk": workspace_key(workspace_id)}),
                "ConditionExpression": "attribute_not_exists(pk) OR #state = :active",
                "ExpressionAttributeNames": {"#state": "state"},
                "ExpressionAttributeValues": _wire({":active": str(WorkspaceState.ACTIVE)}),
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }

    def _halt_workspace(
        self, workspace_id: str, tenant_id: str | None, job_id: str, reason: str, now: int
    ) -> TransactWriteItemTypeDef:
        # The first halt wins: a workspace already halted keeps the job and reason that halted it first.
        values: dict[str, Any] = {
            ":halted": str(WorkspaceState.HALTED),
            ":wid": workspace_id,
            ":jid": job_id,
            ":reason": reason[:1000],
            ":now": now,
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
        return {
            "Update": {
                "TableName": self._table,
                "Key": _wire({"pk": workspace_key(workspace_id)}),
                "UpdateExpression": "SET " + ", ".join(set_clauses),
                "ExpressionAttributeNames": {"#state": "state"},
                "ExpressionAttributeValues": _wire(values),
            }
        }

    def _dead_and_halt(self, old: Item, *, error: str, expect_owner: Any, expect_status: str) -> bool:
        now = self._clock()
        job_id = str(old["jobId"])
        values: dict[str, Any] = {
            ":dead": str(JobStatus.DEAD),
            ":status": expect_status,
            ":error": error,
            ":now": now,
            ":entry": [{"status": str(JobStatus.DEAD), "at": now, "error": error[:500]}],
            ":empty": [],
        }
        condition = "#status = :status"
        if expect_owner is None:
            condition += " AND attribute_not_exists(leaseOwner)"
        else:
            values[":owner"] = expect_owner
            condition += " AND leaseOwner = :owner"
        job_update: TransactWriteItemTypeDef = {
            "Update": {
                "TableName": self._table,
                "Key": _wire({"pk": job_key(job_id)}),
                # A DEAD job halts its workspace until an operator decides: TTL must not collect it.
                "UpdateExpression": (
                    "SET #status = :dead, #error = :error, updatedAt = :now, finishedAt = :now,"
                    " history = list_append(if_not_exists(history, :empty), :entry) REMOVE #ttl"
                ),
                "ConditionExpression": condition,
                "ExpressionAttributeNames": {"#status": "status", "#error": "error", "#ttl": "ttl"},
                "ExpressionAttributeValues": _wire(values),
            }
        }
        halt = self._halt_workspace(
            str(old["workspaceId"]), old.get("tenantId"), job_id, f"job {job_id} is DEAD: {error}", now
        )
        return self._transact([job_update, halt])

    def _transact(self, items: list[TransactWriteItemTypeDef]) -> bool:
        try:
            if len(items) == 1:
                update = dict(items[0]["Update"])
                self._client.update_item(**update)  # type: ignore[arg-type]
            else:
                self._client.transact_write_items(TransactItems=items)
        except ClientError as error:
            if _condition_failed(error):
                return False
            reasons = _cancellation(error)
            if reasons is not None and any(_reason_failed(r) for r in reasons):
                return False
            raise
        return True
