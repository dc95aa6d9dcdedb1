"""The guard: the only code that writes job and workspace state.

Every transition is one conditional write (a single item, or one transaction when a job and its workspace must change
together). A lost condition is an expected outcome returned as a value, never an exception: the caller decides
whether to acknowledge or retry. The happy path is two writes (claim, complete) and one Query of the sparse pending
index (`missing_predecessors`, an empty range unless jobs went missing); a duplicate delivery is one failed
conditional write.
"""

from __future__ import annotations

import functools
import hashlib
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError

from agent_jobs.keys import job_key, parked_sequence, workspace_key
from agent_jobs.models import JobMessage, JobStatus, ResumeDecision, WorkspaceState

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import TransactWriteItemTypeDef

Item = dict[str, Any]
Clock = Callable[[], int]

# A stored message body larger than this (in characters, and in UTF-8 bytes) is truncated (DynamoDB items are capped
# at 400 KB).
MAX_STORED_BODY_CHARS = 300_000
# A stored error (or rejection reason) longer than this is cut short: it may quote what a tenant sent (a path).
MAX_STORED_ERROR_CHARS = 10_000
# Sparse indexes (template.yaml): PARKED jobs by workspace in SequenceNumber order; halted workspaces by tenant.
PARKED_INDEX = "parkedByWorkspace"
HALTED_INDEX = "haltedByTenant"
# Sparse index of the jobs a workspace accepted and has not settled (neither SUCCEEDED nor SKIPPED), in queue order:
# `pendingWorkspace` HASH, `queueSeq` (the job's first recorded SequenceNumber, zero-padded) RANGE.
PENDING_INDEX = "pendingByWorkspace"
# Pending jobs ahead of a job that a claim reads at most, and names at most in a halt reason.
MAX_MISSING_LISTED = 25
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
    # Its last claim never came back from an invocation that ran other jobs too, so it may be what killed that
    # invocation, or an innocent victim of another job: claim it again only alone (`claim(..., alone=True)`).
    SUSPECT = "SUSPECT"


@dataclass(frozen=True)
class Lease:
    """Proof of a claim: later writes of this job are conditional on `owner` still being the lease owner."""

    job_id: str
    workspace_id: str
    tenant_id: str
    owner: str
    expires_at_ms: int
    # Set when the job was claimed by a resume's drain: a retryable failure parks it again instead of FAILED.
    resume_id: str | None = None
    parked_seq: str | None = None


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
    PARKED = "PARKED"  # a drained job with attempts left: PARKED again (counted), the drain retries it first


class AcceptOutcome(StrEnum):
    NEW = "NEW"  # recorded QUEUED: send it
    UNSENT = "UNSENT"  # recorded earlier with the same payload but never confirmed sent: send it (idempotent)
    EXISTING = "EXISTING"  # recorded and sent earlier with the same payload: answer with the stored state
    CONFLICT = "CONFLICT"  # the jobId exists with another payload or tenant
    WORKSPACE_FORBIDDEN = "WORKSPACE_FORBIDDEN"  # the workspace is registered to (or halted for) another tenant
    WORKSPACE_UNREGISTERED = "WORKSPACE_UNREGISTERED"  # no tenant registered the workspace: register it first


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


class ResumeOutcome(StrEnum):
    RESUMING = "RESUMING"  # decided; send the drain marker (resume_id) into the workspace's group
    ACTIVE = "ACTIVE"  # decided, and nothing was parked: the workspace runs its jobs again at once
    ALREADY_RESUMING = "ALREADY_RESUMING"  # the same resume was begun before: send its drain marker again (idempotent)
    # Decided; another job halted the workspace while it was halted and is undecided: the workspace stays HALTED with
    # that job as its haltingJobId (decide it next). Nothing drains until every halting job is decided.
    DECIDED = "DECIDED"
    NOT_FOUND = "NOT_FOUND"  # no workspace item, or one no tenant owns
    OTHER_TENANT = "OTHER_TENANT"  # the workspace belongs to another tenant
    NOT_HALTED = "NOT_HALTED"  # ACTIVE, or RESUMING from another decision
    HALTING_JOB_CHANGED = "HALTING_JOB_CHANGED"  # the workspace is halted by another job than the operator saw
    RETRY_REFUSED = "RETRY_REFUSED"  # the halting job cannot run again (a REJECTED message, no stored body): skip it


@dataclass(frozen=True)
class ResumeResult:
    outcome: ResumeOutcome
    workspace: Item | None = None  # the workspace item after the resume began, or as read when refused
    resume_id: str | None = None
    reason: str = ""  # for a refusal: what the operator can do

    @property
    def begun(self) -> bool:
        return self.outcome in (
            ResumeOutcome.RESUMING,
            ResumeOutcome.ACTIVE,
            ResumeOutcome.ALREADY_RESUMING,
            ResumeOutcome.DECIDED,
        )


@dataclass(frozen=True)
class HaltedPage:
    """A page of the halted-workspaces index: workspace items (HALTED or RESUMING) and where the next page starts."""

    workspaces: list[Item]
    next_key: dict[str, Any] | None


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


def _sequence_clauses(values: dict[str, Any], sequence_number: str | None) -> str:
    """The SET clauses (with a leading comma) recording a message's SequenceNumber; the first one recorded stays the
    job's place in its workspace's queue order (`queueSeq`, the key of the pending index). Values go into `values`."""
    if not sequence_number:
        return ""
    values[":seq"] = sequence_number
    clauses = ", sequenceNumber = :seq"
    if sequence_number.isdigit():
        values[":qseq"] = parked_sequence(sequence_number, 0)
        clauses += ", queueSeq = if_not_exists(queueSeq, :qseq)"
    return clauses


# Jobs that can halt a workspace without having run to an outcome: accepted jobs the queue let go before the worker
# settled them (`missing_predecessors`). A resume may skip them; retrying one needs its message redriven first.
_UNSETTLED = frozenset({JobStatus.QUEUED, JobStatus.FAILED, JobStatus.IN_FLIGHT})
# The halting jobs a resume decision changes.
_DECIDABLE = frozenset({JobStatus.DEAD, JobStatus.REJECTED, JobStatus.PARKED}) | _UNSETTLED


def _missing_reason(workspace_id: str, job_id: str, missing_ids: Sequence[str]) -> str:
    return (
        f"jobs {', '.join(missing_ids)} were accepted before job {job_id} but never took effect: the queue let their"
        " messages go before the worker recorded an outcome (dead-lettered). Redrive them from the dead-letter queue"
        f" (agent-jobs dlq redrive --workspace {workspace_id}) and resume with --retry for each, or resume with --skip"
        " for each to drop them"
    )


def _condition_failed(error: ClientError) -> bool:
    return error.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException"


def _cancellation(error: ClientError) -> list[dict[str, Any]] | None:
    if error.response.get("Error", {}).get("Code") != "TransactionCanceledException":
        return None
    return list(error.response.get("CancellationReasons", []))  # type: ignore[arg-type]


def _message_tenant(message: JobMessage) -> str:
    # The producer names the tenant it verified; the worker gives a message sent to the queue without one the
    # workspace owner's before it claims or parks it. A job is never recorded without a tenant.
    if message.tenant_id is None:
        raise ValueError(f"job {message.job_id} names no tenant: bind it to the workspace owner's first")
    return message.tenant_id


def _workspace_refusal(reason: Mapping[str, Any], tenant_id: str | None) -> AcceptOutcome | None:
    """Why a workspace ownership check failed, from its old item: another tenant's (registered, or halted for it)
    is WORKSPACE_FORBIDDEN; no item, or one without a registration of anyone else, is WORKSPACE_UNREGISTERED."""
    if not _reason_failed(reason):
        return None
    old = to_item(reason.get("Item", {}))
    owner = old.get("tenantId")
    if owner and owner != tenant_id:
        return AcceptOutcome.WORKSPACE_FORBIDDEN
    return AcceptOutcome.WORKSPACE_UNREGISTERED


def _reason_failed(reason: Mapping[str, Any]) -> bool:
    return reason.get("Code") == "ConditionalCheckFailed"


# A failed attempt may be retried while fewer than max_attempts - 1 failures are recorded (`:lastfailure`); a retried
# one counts one more (`_failure_values` gives the three values).
_FAILURES_LEFT = "(attribute_not_exists(failures) OR failures < :lastfailure)"
_COUNT_FAILURE = "failures = if_not_exists(failures, :zero) + :one"


class JobGuard:
    """Conditional writes of job and workspace state in one DynamoDB table keyed by `pk`."""

    def __init__(
        self,
        client: DynamoDBClient,
        table_name: str,
        *,
        max_attempts: int = 3,
        max_claims: int | None = None,
        ttl_days: int = 30,
        clock: Clock = epoch_ms,
    ) -> None:
        self._client = client
        self._table = table_name
        self._max_attempts = max_attempts
        # Claims of one job in all, counting those whose worker never came back (a crash or timeout of the invocation,
        # which takes every job it had in flight with it, not only the one at fault). Recorded failures are bounded
        # by max_attempts alone, so an innocent job sharing crashed invocations is not made DEAD by them.
        self._max_claims = max_attempts if max_claims is None else max_claims
        if self._max_claims < max_attempts:
            raise ValueError(f"max_claims ({max_claims}) must be at least max_attempts ({max_attempts})")
        self._ttl_seconds = ttl_days * 86_400
        self._clock = clock

    def _failure_values(self) -> dict[str, int]:
        return {":zero": 0, ":one": 1, ":lastfailure": self._max_attempts - 1}

    def now(self) -> int:
        """The guard's clock (epoch ms), which lease expiries are measured against."""
        return self._clock()

    # ---- producer side -------------------------------------------------------------------------------------------

    def record_accepted(self, message: JobMessage) -> AcceptResult:
        """Record a job QUEUED before it is sent, unless its jobId is known: then say whether it is the same job.

        One transaction: the conditional put of the job and a check that its workspace item (`ws#<workspaceId>`)
        is a registration of the job's tenant, so a job never enters another tenant's workspace (WORKSPACE_FORBIDDEN)
        nor one nobody registered yet (WORKSPACE_UNREGISTERED), nothing written; the check's old item tells the two
        apart, without a read. A known jobId is answered from its record first: CONFLICT for another job, EXISTING
        for the same job already sent (nothing is sent again); the same job recorded but unsent is sent (UNSENT) only
        while its workspace is still the tenant's own.
        """
        item = self._queued_item(message, self._clock())
        put_job: TransactWriteItemTypeDef = {
            "Put": {
                "TableName": self._table,
                "Item": _wire(item),
                "ConditionExpression": "attribute_not_exists(pk)",
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }
        workspace_is_the_tenants = self._workspace_owned_check(message.workspace_id, _message_tenant(message))
        try:
            self._client.transact_write_items(TransactItems=[put_job, workspace_is_the_tenants])
        except ClientError as error:
            reasons = _cancellation(error)
            if reasons is None or not any(_reason_failed(reason) for reason in reasons):
                raise  # a transaction conflict or throttling: the caller answers 503 and the client retries
            job_reason = reasons[0] if reasons else {}
            refusal = _workspace_refusal(reasons[1], message.tenant_id) if len(reasons) > 1 else None
            if not _reason_failed(job_reason):
                return AcceptResult(refusal or AcceptOutcome.WORKSPACE_FORBIDDEN)
            return self._known_job(message, to_item(job_reason.get("Item", {})), refusal)
        return AcceptResult(AcceptOutcome.NEW, item)

    def record_sent(self, tenant_id: str, job_id: str, message_id: str, sequence_number: str | None) -> None:
        """Store the queue's message id and sequence number; never touches the status a worker may already own."""
        values: dict[str, Any] = {":mid": message_id}
        expression = "SET messageId = :mid" + _sequence_clauses(values, sequence_number)
        self._client.update_item(
            TableName=self._table,
            Key=_wire({"pk": job_key(tenant_id, job_id)}),
            UpdateExpression=expression,
            ConditionExpression="attribute_exists(pk)",
            ExpressionAttributeValues=_wire(values),
        )

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
        """
        results: dict[int, AcceptResult] = {}
        remaining = list(range(len(messages)))
        for _ in range(len(messages) + 1):
            if not remaining:
                break
            now = self._clock()
            items = {index: self._queued_item(messages[index], now) for index in remaining}
            workspaces: dict[str, str] = {}  # workspace -> tenant, in first-seen order
            for index in remaining:
                workspaces.setdefault(messages[index].workspace_id, _message_tenant(messages[index]))
            transact: list[TransactWriteItemTypeDef] = [
                {
                    "Put": {
                        "TableName": self._table,
                        "Item": _wire(items[index]),
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
                reasons = _cancellation(error)
                if reasons is None or not any(_reason_failed(reason) for reason in reasons):
                    raise  # a transaction conflict or throttling: the caller answers 503 and the client retries
                refused = {
                    ws: refusal
                    for (ws, tenant), reason in zip(workspaces.items(), reasons[len(remaining) :], strict=False)
                    if (refusal := _workspace_refusal(reason, tenant)) is not None
                }
                still_new = []
                for index, reason in zip(remaining, reasons, strict=False):
                    message = messages[index]
                    if _reason_failed(reason):
                        old = to_item(reason.get("Item", {}))
                        results[index] = self._known_job(message, old, refused.get(message.workspace_id))
                    elif message.workspace_id in refused:
                        results[index] = AcceptResult(refused[message.workspace_id])
                    else:
                        still_new.append(index)
                remaining = still_new
                continue
            for index in remaining:
                results[index] = AcceptResult(AcceptOutcome.NEW, items[index])
            remaining = []
        if remaining:  # cannot happen: every cancelled round settles a job
            raise RuntimeError("jobs left unrecorded after a round per job")
        return [results[index] for index in range(len(messages))]

    def record_sent_batch(self, sent: Sequence[tuple[str, str, str, str | None]]) -> None:
        """`record_sent` for several jobs, (tenantId, jobId, messageId, sequenceNumber) each: one transaction of the
        updates, which never touch the status a worker may own. If the transaction is cancelled (a worker's write of
        one of the jobs at the same moment), each job is updated on its own instead."""
        if len(sent) == 1:
            self.record_sent(*sent[0])
            return
        updates: list[TransactWriteItemTypeDef] = []
        for tenant_id, job_id, message_id, sequence_number in sent:
            values: dict[str, Any] = {":mid": message_id}
            expression = "SET messageId = :mid" + _sequence_clauses(values, sequence_number)
            updates.append(
                {
                    "Update": {
                        "TableName": self._table,
                        "Key": _wire({"pk": job_key(tenant_id, job_id)}),
                        "UpdateExpression": expression,
                        "ConditionExpression": "attribute_exists(pk)",
                        "ExpressionAttributeValues": _wire(values),
                    }
                }
            )
        try:
            self._client.transact_write_items(TransactItems=updates)
        except ClientError as error:
            if _cancellation(error) is None:
                raise
            for tenant_id, job_id, message_id, sequence_number in sent:
                self.record_sent(tenant_id, job_id, message_id, sequence_number)

    def _queued_item(self, message: JobMessage, now: int) -> Item:
        """The QUEUED record of an accepted job (`record_accepted`, `record_accepted_batch`)."""
        return {
            "pk": job_key(_message_tenant(message), message.job_id),
            "jobId": message.job_id,
            "workspaceId": message.workspace_id,
            "tenantId": _message_tenant(message),
            "type": str(message.type),
            "payloadHash": message.payload_hash,
            "status": str(JobStatus.QUEUED),
            # In the pending index once its SequenceNumber is recorded (`record_sent`) until it is settled: SUCCEEDED,
            # SKIPPED, or in the hands of the halt machinery (PARKED, DEAD).
            "pendingWorkspace": message.workspace_id,
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
                "Key": _wire({"pk": workspace_key(workspace_id)}),
                "ConditionExpression": "attribute_exists(remoteUrl) AND tenantId = :tid",
                "ExpressionAttributeValues": _wire({":tid": tenant_id}),
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }

    @staticmethod
    def _known_job(message: JobMessage, old: Item, workspace_refusal: AcceptOutcome | None) -> AcceptResult:
        # A known jobId: another job's record, the same job sent, or the same job unsent (sent only while its workspace
        # is still the tenant's own registration).
        same_job = old.get("payloadHash") == message.payload_hash and old.get("tenantId") == message.tenant_id
        if not same_job:
            return AcceptResult(AcceptOutcome.CONFLICT, old)
        if old.get("messageId"):
            return AcceptResult(AcceptOutcome.EXISTING, old)
        if workspace_refusal is not None:
            return AcceptResult(workspace_refusal)
        return AcceptResult(AcceptOutcome.UNSENT, old)

    # ---- worker side ---------------------------------------------------------------------------------------------

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
    ) -> ClaimResult:
        """Claim a job for this invocation: one transaction of a conditional update of the job and a check that its
        workspace is not halted. Succeeds iff the job is new, QUEUED, FAILED, or IN_FLIGHT with an expired lease (its
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
        """
        now = self._clock()
        owner = secrets.token_hex(16)
        expires = now + max(remaining_ms, 0)
        values = {
            ":inflight": str(JobStatus.IN_FLIGHT),
            ":queued": str(JobStatus.QUEUED),
            ":failed": str(JobStatus.FAILED),
            ":now": now,
            ":maxclaims": self._max_claims,
            ":zero": 0,
            ":one": 1,
            ":owner": owner,
            ":exp": expires,
            ":jid": message.job_id,
            ":wid": message.workspace_id,
            ":tid": _message_tenant(message),
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
            "pendingWorkspace = :wid",  # pending until it settles (also a job the producer never recorded)
        ]
        removed = ["#error"]
        takeover = ""  # a shared claim never takes over a lost lease
        if alone:
            removed.append("leaseShared")
            # near the limit, only the lease of a shared claim: the job did not die alone
            shared_only = " AND leaseShared = :true" if near_delivery_limit else ""
            takeover = f" OR (#status = :inflight AND leaseExpiresAt < :now{shared_only})"
        else:
            set_clauses.append("leaseShared = :true")
        if not alone or near_delivery_limit:
            values[":true"] = True
        job_update: TransactWriteItemTypeDef = {
            "Update": {
                "TableName": self._table,
                "Key": _wire({"pk": job_key(_message_tenant(message), message.job_id)}),
                "UpdateExpression": (
                    "SET "
                    + ", ".join(set_clauses)
                    + _sequence_clauses(values, sequence_number)
                    + " REMOVE "
                    + ", ".join(removed)
                ),
                "ConditionExpression": (
                    "(attribute_not_exists(pk) OR payloadHash = :hash)"
                    f" AND (attribute_not_exists(pk) OR #status IN (:queued, :failed){takeover})"
                    " AND (attribute_not_exists(attempt) OR attempt < :maxclaims)"
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
            return self._explain_lost_claim(
                message, reasons, now, body=body, near_delivery_limit=near_delivery_limit, alone=alone
            )
        lease = Lease(message.job_id, message.workspace_id, _message_tenant(message), owner, expires)
        return ClaimResult(ClaimOutcome.CLAIMED, lease=lease)

    def _explain_lost_claim(
        self,
        message: JobMessage,
        reasons: list[dict[str, Any]],
        now: int,
        *,
        body: str | None = None,
        near_delivery_limit: bool = False,
        alone: bool = True,
    ) -> ClaimResult:
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
        claims = int(old.get("attempt", 0))
        lost = status == JobStatus.IN_FLIGHT  # its worker never came back
        if lost and not alone:
            return ClaimResult(ClaimOutcome.SUSPECT, previous=old)
        lost_near_limit = lost and near_delivery_limit and not old.get("leaseShared")
        if claims < self._max_claims and not lost_near_limit:
            return ClaimResult(ClaimOutcome.CONTENDED, previous=old)  # the item changed between write and check
        # Claims used up, mostly by workers that never came back (or max_claims was lowered), or a worker that never
        # came back from running this job alone, on a message with few deliveries left: dead, and halt.
        if lost_near_limit:
            error = (
                f"claim {claims} never came back from an invocation that ran this job alone, and the message is near"
                " its delivery limit"
            )
        else:
            error = f"claims exhausted ({claims} of {self._max_claims}) without a recorded outcome"
        if self._dead_and_halt(
            old,
            error=error,
            expect_owner=old.get("leaseOwner"),
            expect_status=str(status),
            body=body,
        ):
            return ClaimResult(ClaimOutcome.EXHAUSTED, previous=old)
        return ClaimResult(ClaimOutcome.CONTENDED, previous=old)

    def complete(self, lease: Lease, result: Mapping[str, Any]) -> bool:
        """SUCCEEDED, conditional on still owning the lease. False means another worker took over: nothing written."""
        now = self._clock()
        try:
            self._client.update_item(
                TableName=self._table,
                Key=_wire({"pk": job_key(lease.tenant_id, lease.job_id)}),
                UpdateExpression=(
                    "SET #status = :succeeded, #result = :result, updatedAt = :now, finishedAt = :now,"
                    " history = list_append(history, :entry) REMOVE pendingWorkspace"
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
            try:
                self._client.update_item(
                    TableName=self._table,
                    Key=_wire({"pk": job_key(lease.tenant_id, lease.job_id)}),
                    UpdateExpression=(
                        "SET #status = :failed, #error = :error, updatedAt = :now,"
                        f" {_COUNT_FAILURE}, history = list_append(history, :entry)"
                    ),
                    ConditionExpression=f"leaseOwner = :owner AND #status = :inflight AND {_FAILURES_LEFT}",
                    ExpressionAttributeNames={"#status": "status", "#error": "error"},
                    ExpressionAttributeValues=_wire(
                        {
                            ":failed": str(JobStatus.FAILED),
                            ":inflight": str(JobStatus.IN_FLIGHT),
                            ":error": _stored_error(error),
                            ":now": now,
                            ":owner": lease.owner,
                            **self._failure_values(),
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
                error = f"{error} (failed attempt {int(old.get('failures', 0)) + 1} of {self._max_attempts})"
            else:
                return FailOutcome.RETRY
        old_item = {"jobId": lease.job_id, "workspaceId": lease.workspace_id, "tenantId": lease.tenant_id}
        if self._dead_and_halt(
            old_item, error=error, expect_owner=lease.owner, expect_status=str(JobStatus.IN_FLIGHT), body=body
        ):
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
        lease: Lease | None = None,
        missing: Sequence[Item] = (),
    ) -> bool:
        """PARKED with its body and SequenceNumber, so a resume can run it in queue order later.

        With `lease`, the job is one this worker just claimed (conditional on still owning it); with `missing` (what
        `missing_predecessors` found for it), the workspace is halted by the earliest of them in the same
        transaction, every one of them joining the jobs the operator decides (`undecidedJobIds`), so that a resume
        lets nothing run before each was redriven and retried, or skipped; the reason names them.

        With `halt_workspace`, the workspace is halted in the same transaction (used when a message reaches its last
        delivery: parking it instead of letting the queue dead-letter it keeps the group's order intact); without it,
        the workspace must be HALTED or RESUMING. The same transaction adds one to the workspace's `parkedCount` and
        puts the job in the parked index (`parkedWorkspace`, `parkedSeq`), which a resume drains in order.
        Returns False if the job is already settled (SUCCEEDED, DEAD, PARKED, ...), held by a live lease, was accepted
        with another payload, or (without `halt_workspace`) the workspace is ACTIVE again: claim it again then.
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
            ":tid": _message_tenant(message),
            ":type": str(message.type),
            ":hash": message.payload_hash,
            ":mid": message_id,
            **_body_values(body),
            ":reason": _stored_error(reason),
            ":pws": message.workspace_id,
            ":pseq": parked_sequence(sequence_number, now),
            ":empty": [],
            ":entry": [{"status": str(JobStatus.PARKED), "at": now, "reason": reason}],
        }
        set_clauses = [
            "#status = :parked",
            "parkedWorkspace = :pws",
            "parkedSeq = :pseq",
            "jobId = :jid",
            "workspaceId = :wid",
            "tenantId = :tid",
            "#type = :type",
            "payloadHash = if_not_exists(payloadHash, :hash)",
            "messageId = :mid",
            _BODY_SET,
            "parkedReason = :reason",
            "acceptedAt = if_not_exists(acceptedAt, :now)",
            "updatedAt = :now",
            "history = list_append(if_not_exists(history, :empty), :entry)",
        ]
        if lease is not None:
            values[":owner"] = lease.owner
        job_update: TransactWriteItemTypeDef = {
            "Update": {
                "TableName": self._table,
                "Key": _wire({"pk": job_key(_message_tenant(message), message.job_id)}),
                # A parked job waits for an operator: TTL must not collect it (TTL is garbage collection only).
                "UpdateExpression": (
                    "SET "
                    + ", ".join(set_clauses)
                    + _sequence_clauses(values, sequence_number)
                    + " REMOVE #ttl, pendingWorkspace"  # a resume runs it in order, from the parked index
                ),
                # Never over another job's record: a message reusing a jobId with another payload parks nothing.
                "ConditionExpression": (
                    "leaseOwner = :owner AND #status = :inflight"
                    if lease is not None
                    else "attribute_not_exists(pk) OR ((attribute_not_exists(payloadHash) OR payloadHash = :hash)"
                    " AND (#status IN (:queued, :failed) OR (#status = :inflight AND leaseExpiresAt < :now)))"
                ),
                "ExpressionAttributeNames": {"#status": "status", "#type": "type", "#ttl": "ttl"},
                "ExpressionAttributeValues": _wire(values),
            }
        }
        if missing:
            missing_ids = [str(item["jobId"]) for item in missing]
            workspace_update = self._halt_workspace(
                message.workspace_id,
                _message_tenant(message),
                missing_ids[0],
                _missing_reason(message.workspace_id, message.job_id, missing_ids),
                now,
                parked_delta=1,
                undecided=set(missing_ids),
            )
        elif halt_workspace:
            workspace_update = self._halt_workspace(
                message.workspace_id, _message_tenant(message), message.job_id, reason, now, parked_delta=1
            )
        else:
            workspace_update = self._count_parked(message.workspace_id, 1, now, only_if_halted=True)
        return self._transact([job_update, workspace_update])

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
        if job_id and tenant_id and record(pk=job_key(tenant_id, job_id), job_id=job_id):
            return True
        # No usable jobId or tenant, or it names a job that exists: the bad message is recorded under its own id.
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
            **_body_values(body),
            ":reason": _stored_error(reason),
            ":now": now,
            ":empty": [],
            ":entry": [{"status": str(JobStatus.REJECTED), "at": now, "reason": reason[:500]}],
        }
        set_clauses = [
            "#status = :rejected",
            "workspaceId = :wid",
            "messageId = :mid",
            _BODY_SET,
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
                # Only a new record, or this same message's own rejection delivered again: never another message's
                # rejection (possibly another tenant's job of the same jobId), which would take its body and reason.
                "ConditionExpression": "attribute_not_exists(pk) OR (#status = :rejected AND messageId = :mid)",
                "ExpressionAttributeNames": {"#status": "status", "#error": "error", "#ttl": "ttl"},
                "ExpressionAttributeValues": _wire(values),
            }
        }
        return self._transact(
            [job_update, self._halt_workspace(workspace_id, tenant_id, job_id or pk, f"rejected: {reason}", now)]
        )

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
            ":reason": _stored_error(reason),
            ":now": now,
            ":ttl": self._ttl(now),
            ":empty": [],
            ":entry": [{"status": str(JobStatus.REJECTED), "at": now, "reason": reason[:500]}],
            **_body_values(body),
        }
        self._client.update_item(
            TableName=self._table,
            Key=_wire({"pk": f"msg#{message_id}"}),
            UpdateExpression=(
                "SET #status = :rejected, messageId = :mid, groupId = :gid, #error = :reason, "
                "acceptedAt = if_not_exists(acceptedAt, :now), updatedAt = :now, #ttl = :ttl, "
                f"history = list_append(if_not_exists(history, :empty), :entry), {_BODY_SET}"
            ),
            # Only a new record or this message's own: never another message's record of the same key.
            ConditionExpression="attribute_not_exists(pk) OR messageId = :mid",
            ExpressionAttributeNames={"#status": "status", "#error": "error", "#ttl": "ttl"},
            ExpressionAttributeValues=_wire(values),
        )

    def halt_workspace(self, workspace_id: str, *, tenant_id: str | None, job_id: str, reason: str) -> None:
        """HALTED, without touching any job: for a record the worker could neither run nor park on its last delivery,
        so that the queue dead-lettering it cannot let the next job of the workspace run."""
        update = self._halt_workspace(workspace_id, tenant_id, job_id, reason, self._clock())["Update"]
        self._client.update_item(**update)

    def missing_predecessors(
        self, workspace_id: str, *, tenant_id: str, job_id: str, sequence_number: str | None
    ) -> list[Item]:
        """The jobs of `tenant_id` that the workspace accepted ahead of this one in queue order (a lower
        SequenceNumber) and that are still QUEUED, FAILED or IN_FLIGHT: earliest first, at most MAX_MISSING_LISTED.

        The queue hands out a job only once every earlier message of its group is gone, and the worker deletes a
        message only once its job is settled; so such a job left the queue without the worker settling it (the queue
        dead-lettered it, for example after every delivery died before the handler ran). The job must not run: it
        would take effect before them. Empty for a job without a numeric SequenceNumber (nothing to order by).

        Cost: one Query of the sparse pending index (usually empty: half a read unit); entries it shows are checked
        with a strongly consistent read, because the index lags behind jobs that settled a moment ago.
        """
        if not sequence_number or not sequence_number.isdigit():
            return []
        response = self._client.query(
            TableName=self._table,
            IndexName=PENDING_INDEX,
            KeyConditionExpression="pendingWorkspace = :wid AND queueSeq < :qseq",
            ExpressionAttributeValues=_wire({":wid": workspace_id, ":qseq": parked_sequence(sequence_number, 0)}),
            Limit=MAX_MISSING_LISTED,
        )
        keys = [
            {"pk": job_key(tenant_id, str(entry["jobId"]))}
            for entry in map(to_item, response.get("Items", []))
            if entry.get("jobId") and entry.get("jobId") != job_id and entry.get("tenantId") in (None, tenant_id)
        ]
        missing = [
            item
            for item in self._get_consistently(keys)
            if item.get("pendingWorkspace") == workspace_id
            and item.get("tenantId") == tenant_id
            and item.get("status") in _UNSETTLED
        ]
        return sorted(missing, key=lambda item: str(item.get("queueSeq", "")))

    def _get_consistently(self, keys: list[Item]) -> list[Item]:
        """The items of `keys` that exist, read with strongly consistent reads (BatchGetItem, 100 keys a call, its
        unprocessed keys read again)."""
        items: list[Item] = []
        for start in range(0, len(keys), 100):
            request: dict[str, Any] = {
                self._table: {"Keys": [_wire(key) for key in keys[start : start + 100]], "ConsistentRead": True}
            }
            for _ in range(10):
                response = self._client.batch_get_item(RequestItems=request)
                items.extend(to_item(raw) for raw in response.get("Responses", {}).get(self._table, []))
                request = dict(response.get("UnprocessedKeys") or {})
                if not request:
                    break
                time.sleep(0.05)
            else:
                raise RuntimeError("keys left unprocessed after 10 BatchGetItem calls")
        return items

    # ---- halt, park, resume ----------------------------------------------------------------------------------------
    #
    # A workspace item carries, besides its halt fields: `parkedCount` (a strongly consistent count of its PARKED jobs,
    # changed in the same transaction as each park and each job leaving PARKED), `resumeId` (while RESUMING),
    # `drainingJobId` (the job a drain claimed and has not finished yet), `lastDrainedSeq` (the parked sequence of the
    # last job a drain finished or a resume skipped), `lastResume` (the operator's last decision) and `undecidedJobIds`
    # (a string set of every halting job no resume decided yet; DynamoDB drops it when empty). A PARKED job
    # carries `parkedWorkspace` and `parkedSeq`, the keys of the sparse parked index; a halted workspace carries
    # `haltedTenant`, the key of the sparse halted index. Index reads are eventually consistent: the drain trusts them
    # only when they agree with `parkedCount`.

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
            if workspace is None or not workspace.get("tenantId"):
                return ResumeResult(ResumeOutcome.NOT_FOUND, workspace, reason=f"no workspace '{workspace_id}'")
            if workspace.get("tenantId") != tenant_id:
                return ResumeResult(ResumeOutcome.OTHER_TENANT, workspace)
            state = workspace.get("state") or str(WorkspaceState.ACTIVE)
            last = workspace.get("lastResume") or {}
            if (
                state == WorkspaceState.RESUMING
                and last.get("haltingJobId") == halting_job_id
                and last.get("decision") == str(decision)
            ):
                return ResumeResult(ResumeOutcome.ALREADY_RESUMING, workspace, resume_id=workspace.get("resumeId"))
            if state != WorkspaceState.HALTED:
                return ResumeResult(
                    ResumeOutcome.NOT_HALTED,
                    workspace,
                    reason=f"workspace '{workspace_id}' is {state}, not HALTED; nothing to resume",
                )
            if workspace.get("haltingJobId") != halting_job_id:
                current = workspace.get("haltingJobId")
                decided = last.get("haltingJobId") == halting_job_id and halting_job_id not in (
                    workspace.get("undecidedJobIds") or ()
                )
                return ResumeResult(
                    ResumeOutcome.HALTING_JOB_CHANGED,
                    workspace,
                    reason=(
                        f"'{halting_job_id}' is decided ({last.get('decision')}); workspace '{workspace_id}' is still"
                        f" halted by '{current}': decide that job next"
                        if decided
                        else f"workspace '{workspace_id}' is halted by '{current}', not '{halting_job_id}'; read the"
                        " workspace again and decide for its halting job"
                    ),
                )
            result = self._try_resume(workspace, halting_job_id, decision, operator)
            if result is not None:
                return result
        return ResumeResult(
            ResumeOutcome.HALTING_JOB_CHANGED,
            self.get_workspace(workspace_id),
            reason=f"workspace '{workspace_id}' kept changing while resuming; read it again and retry",
        )

    def _try_resume(
        self, workspace: Item, halting_job_id: str, decision: ResumeDecision, operator: str
    ) -> ResumeResult | None:
        now = self._clock()
        workspace_id = str(workspace["workspaceId"]) if "workspaceId" in workspace else str(workspace["pk"])[3:]
        resume_id = secrets.token_hex(8)
        # A workspace's halting jobs are its owner's (a message naming another tenant is recorded for the owner).
        tenant_id = str(workspace.get("tenantId", ""))
        pk = halting_job_id if halting_job_id.startswith("msg#") else job_key(tenant_id, halting_job_id)
        raw = self._client.get_item(TableName=self._table, Key=_wire({"pk": pk}), ConsistentRead=True).get("Item")
        job = to_item(raw) if raw else None
        status = (job or {}).get("status")
        if decision is ResumeDecision.RETRY:
            refusal = self._retry_refusal(workspace, halting_job_id, pk, job)
            if refusal is not None:
                return refusal
        if status == JobStatus.IN_FLIGHT and int((job or {}).get("leaseExpiresAt", 0)) >= now:
            return ResumeResult(
                ResumeOutcome.RETRY_REFUSED,
                workspace,
                reason=f"job '{halting_job_id}' is held by a worker's lease right now; resume again after it ends",
            )
        items: list[TransactWriteItemTypeDef] = []
        parked_delta, drained_seq = 0, None
        if job is not None and status in _DECIDABLE:
            update, parked_delta, drained_seq = self._decide_halting_job(
                pk, job, workspace_id=workspace_id, decision=decision, operator=operator, resume_id=resume_id, now=now
            )
            items.append(update)
        count = int(workspace.get("parkedCount", 0))
        # Other jobs that halted the workspace while it was halted (first halt wins) are still undecided: the workspace
        # stays HALTED by the next of them, and nothing drains until the operator decided each one.
        undecided = {str(job_id) for job_id in workspace.get("undecidedJobIds") or ()} - {halting_job_id}
        next_halt = self._next_undecided(tenant_id, undecided) if undecided else None
        activate = next_halt is None and count + parked_delta <= 0 and not workspace.get("drainingJobId")
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
        expression, condition, removed = self._resume_target(
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
        items.append(
            {
                "Update": {
                    "TableName": self._table,
                    "Key": _wire({"pk": workspace_key(workspace_id)}),
                    "UpdateExpression": (
                        expression
                        + " DELETE undecidedJobIds :decided"
                        + (" REMOVE " + ", ".join(removed) if removed else "")
                    ),
                    "ConditionExpression": condition,
                    "ExpressionAttributeNames": {"#state": "state"},
                    "ExpressionAttributeValues": _wire(ws_values),
                }
            }
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

    @staticmethod
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

    @staticmethod
    def _retry_refusal(workspace: Item, halting_job_id: str, pk: str, job: Item | None) -> ResumeResult | None:
        """RETRY_REFUSED when the halting job cannot run again (a rejected message, a DEAD job without its body)."""
        status = (job or {}).get("status")
        if status in _UNSETTLED:
            workspace_id = workspace.get("workspaceId") or halting_job_id
            return ResumeResult(
                ResumeOutcome.RETRY_REFUSED,
                workspace,
                reason=(
                    f"job '{halting_job_id}' never reached the worker and its message is not in the table: redrive it"
                    f" from the dead-letter queue (agent-jobs dlq redrive --workspace {workspace_id}), which parks it,"
                    " then retry it; or resume with decision 'skip'"
                ),
            )
        if pk.startswith("msg#") or status == JobStatus.REJECTED:
            return ResumeResult(
                ResumeOutcome.RETRY_REFUSED,
                workspace,
                reason=f"'{halting_job_id}' is a rejected message and cannot run; resume with decision 'skip'",
            )
        if status == JobStatus.DEAD and not (job or {}).get("body"):
            return ResumeResult(
                ResumeOutcome.RETRY_REFUSED,
                workspace,
                reason=(
                    f"job '{halting_job_id}' has no stored message to run again; resume with decision 'skip' and"
                    " submit the job again under a new jobId"
                ),
            )
        return None

    def _next_undecided(self, tenant_id: str, job_ids: set[str]) -> tuple[str, str]:
        """The undecided halting job the operator decides next, and its halt reason: the earliest in queue order (its
        record's SequenceNumber; a job without a record last), read consistently from the job records."""
        candidates: list[tuple[tuple[int, str, str], str, str]] = []
        for job_id in job_ids:
            pk = job_id if job_id.startswith("msg#") else job_key(tenant_id, job_id)
            raw = self._client.get_item(TableName=self._table, Key=_wire({"pk": pk}), ConsistentRead=True).get("Item")
            job = to_item(raw) if raw else {}
            if job:
                status = job.get("status")
                detail = job.get("error") or job.get("parkedReason") or "no recorded reason"
                reason = f"job {job_id} is {status}: {detail}"
                order = (0, parked_sequence(job.get("sequenceNumber"), int(job.get("acceptedAt", 0))), job_id)
            else:
                reason = f"halted by {job_id} (no job record)"
                order = (1, "", job_id)
            candidates.append((order, job_id, reason))
        _, job_id, reason = min(candidates)
        return job_id, reason

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
        status = job.get("status")
        entry = {"at": now, "by": operator, "decision": str(decision), "resumeId": resume_id}
        seq = parked_sequence(job.get("sequenceNumber"), int(job.get("acceptedAt", now)))
        values: dict[str, Any] = {":seen": status, ":now": now, ":empty": []}
        names = {"#status": "status"}
        if decision is ResumeDecision.SKIP:
            values.update(
                {
                    ":skipped": str(JobStatus.SKIPPED),
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
            parked_delta: int = -1 if status == JobStatus.PARKED else 0
            drained_seq: str | None = seq
        else:
            values.update(
                {
                    ":parked": str(JobStatus.PARKED),
                    ":zero": 0,
                    ":pws": workspace_id,
                    ":pseq": seq,
                    ":reason": f"retry decided by {operator}",
                    ":entry": [{"status": str(JobStatus.PARKED), **entry}],
                }
            )
            # Attempts start again; the job keeps its SequenceNumber, so the drain runs it before the jobs behind it.
            expression = (
                "SET #status = :parked, attempt = :zero, parkedWorkspace = :pws, parkedSeq = :pseq,"
                " parkedReason = :reason, updatedAt = :now,"
                " history = list_append(if_not_exists(history, :empty), :entry)"
                " REMOVE failures"
            )
            parked_delta = 1 if status == JobStatus.DEAD else 0
            drained_seq = None
            condition = "#status = :seen"
        update: TransactWriteItemTypeDef = {
            "Update": {
                "TableName": self._table,
                "Key": _wire({"pk": pk}),
                "UpdateExpression": expression,
                "ConditionExpression": condition,
                "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": _wire(values),
            }
        }
        return update, parked_delta, drained_seq

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
                "ExpressionAttributeValues": _wire({":ws": workspace_id}),
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
            ":parked": str(JobStatus.PARKED),
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
            job_condition = "#status = :inflight AND leaseExpiresAt < :now AND attempt < :maxclaims"
        else:
            job_condition = "#status = :parked"
        job_update: TransactWriteItemTypeDef = {
            "Update": {
                "TableName": self._table,
                "Key": _wire({"pk": job_key(tenant_id, job_id)}),
                "UpdateExpression": (
                    "SET #status = :inflight, attempt = if_not_exists(attempt, :zero) + :one, leaseOwner = :owner,"
                    " leaseExpiresAt = :exp, updatedAt = :now,"
                    " history = list_append(if_not_exists(history, :empty), :entry)"
                    " REMOVE parkedWorkspace, parkedSeq"
                ),
                "ConditionExpression": job_condition,
                "ExpressionAttributeNames": {"#status": "status"},
                "ExpressionAttributeValues": _wire(values),
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }
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
        workspace_update: TransactWriteItemTypeDef = {
            "Update": {
                "TableName": self._table,
                "Key": _wire({"pk": workspace_key(workspace_id)}),
                "UpdateExpression": ws_expression,
                "ConditionExpression": ws_condition,
                "ExpressionAttributeNames": {"#state": "state"},
                "ExpressionAttributeValues": _wire(ws_values),
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }
        try:
            self._client.transact_write_items(TransactItems=[job_update, workspace_update])
        except ClientError as error:
            reasons = _cancellation(error)
            if reasons is None:
                raise
            job_reason = reasons[0] if reasons else {}
            ws_reason = reasons[1] if len(reasons) > 1 else {}
            if _reason_failed(ws_reason):
                return ClaimResult(ClaimOutcome.WORKSPACE_HALTED, workspace=to_item(ws_reason.get("Item", {})))
            if not _reason_failed(job_reason):
                return ClaimResult(ClaimOutcome.CONTENDED)
            old = to_item(job_reason.get("Item", {}))
            if reclaim and old.get("status") == JobStatus.IN_FLIGHT:
                if int(old.get("leaseExpiresAt", 0)) >= now:
                    return ClaimResult(ClaimOutcome.BUSY, previous=old)
                if self._dead_and_halt(
                    old,
                    error=f"claims exhausted ({old.get('attempt')} of {self._max_claims}) while resuming",
                    expect_owner=old.get("leaseOwner"),
                    expect_status=str(JobStatus.IN_FLIGHT),
                ):
                    return ClaimResult(ClaimOutcome.EXHAUSTED, previous=old)
                return ClaimResult(ClaimOutcome.CONTENDED, previous=old)
            return ClaimResult(ClaimOutcome.SETTLED, previous=old)
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
        return self._transact(
            [
                {
                    "Update": {
                        "TableName": self._table,
                        "Key": _wire({"pk": workspace_key(workspace_id)}),
                        "UpdateExpression": expression + " REMOVE drainingJobId",
                        "ConditionExpression": "drainingJobId = :jid",
                        "ExpressionAttributeValues": _wire(values),
                    }
                }
            ]
        )

    def activate(self, workspace_id: str, resume_id: str) -> bool:
        """RESUMING → ACTIVE, only if this resume is still the current one, nothing is parked (`parkedCount` = 0), no
        drained job is unfinished and no halting job is undecided (`undecidedJobIds` absent: DynamoDB drops an empty
        set). Out of the halted index. False otherwise (come back later, or the marker is stale)."""
        return self._transact(
            [
                {
                    "Update": {
                        "TableName": self._table,
                        "Key": _wire({"pk": workspace_key(workspace_id)}),
                        "UpdateExpression": (
                            "SET #state = :active, updatedAt = :now REMOVE resumeId, haltedTenant, drainingJobId"
                        ),
                        "ConditionExpression": (
                            "#state = :resuming AND resumeId = :rid"
                            " AND (attribute_not_exists(parkedCount) OR parkedCount = :zero)"
                            " AND attribute_not_exists(drainingJobId) AND attribute_not_exists(undecidedJobIds)"
                        ),
                        "ExpressionAttributeNames": {"#state": "state"},
                        "ExpressionAttributeValues": _wire(
                            {
                                ":active": str(WorkspaceState.ACTIVE),
                                ":resuming": str(WorkspaceState.RESUMING),
                                ":rid": resume_id,
                                ":zero": 0,
                                ":now": self._clock(),
                            }
                        ),
                    }
                }
            ]
        )

    def list_halted(self, tenant_id: str, *, limit: int = 50, start_key: Mapping[str, Any] | None = None) -> HaltedPage:
        """A page of the tenant's HALTED and RESUMING workspaces (the halted index, ordered by workspaceId)."""
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "IndexName": HALTED_INDEX,
            "KeyConditionExpression": "haltedTenant = :tid",
            "ExpressionAttributeValues": _wire({":tid": tenant_id}),
            "Limit": limit,
        }
        if start_key:
            kwargs["ExclusiveStartKey"] = _wire(start_key)
        response = self._client.query(**kwargs)
        items = [to_item(raw) for raw in response.get("Items", [])]
        # The index may lag a resume that just finished: show only what it says is still halted or resuming.
        shown = [item for item in items if item.get("state") in (WorkspaceState.HALTED, WorkspaceState.RESUMING)]
        last = response.get("LastEvaluatedKey")
        return HaltedPage(shown, to_item(last) if last else None)

    def _count_parked(
        self, workspace_id: str, delta: int, now: int, *, only_if_halted: bool = False
    ) -> TransactWriteItemTypeDef:
        update: TransactWriteItemTypeDef = {
            "Update": {
                "TableName": self._table,
                "Key": _wire({"pk": workspace_key(workspace_id)}),
                "UpdateExpression": "SET updatedAt = :now ADD parkedCount :delta",
                "ExpressionAttributeValues": _wire({":now": now, ":delta": delta}),
            }
        }
        if only_if_halted:
            # A job parks only behind a halt: if the workspace is ACTIVE again, the job must be claimed instead.
            update["Update"]["ConditionExpression"] = "#state IN (:halted, :resuming)"
            update["Update"]["ExpressionAttributeNames"] = {"#state": "state"}
            update["Update"]["ExpressionAttributeValues"] = _wire(
                {
                    ":now": now,
                    ":delta": delta,
                    ":halted": str(WorkspaceState.HALTED),
                    ":resuming": str(WorkspaceState.RESUMING),
                }
            )
        return update

    def _park_drained_again(self, lease: Lease, error: str, now: int) -> FailOutcome | None:
        """A drained job failed and has attempts left: PARKED again at its place (counted), the drain released.
        None when it has no attempts left (the caller makes it DEAD)."""
        values = {
            ":parked": str(JobStatus.PARKED),
            ":inflight": str(JobStatus.IN_FLIGHT),
            ":error": _stored_error(error),
            ":now": now,
            ":owner": lease.owner,
            **self._failure_values(),
            ":pws": lease.workspace_id,
            ":pseq": lease.parked_seq or parked_sequence(None, now),
            ":entry": [{"status": str(JobStatus.PARKED), "at": now, "error": error[:500], "resumeId": lease.resume_id}],
        }
        job_update: TransactWriteItemTypeDef = {
            "Update": {
                "TableName": self._table,
                "Key": _wire({"pk": job_key(lease.tenant_id, lease.job_id)}),
                "UpdateExpression": (
                    "SET #status = :parked, #error = :error, updatedAt = :now, parkedWorkspace = :pws,"
                    f" parkedSeq = :pseq, {_COUNT_FAILURE},"
                    " history = list_append(history, :entry)"
                ),
                "ConditionExpression": f"leaseOwner = :owner AND #status = :inflight AND {_FAILURES_LEFT}",
                "ExpressionAttributeNames": {"#status": "status", "#error": "error"},
                "ExpressionAttributeValues": _wire(values),
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }
        workspace_update: TransactWriteItemTypeDef = {
            "Update": {
                "TableName": self._table,
                "Key": _wire({"pk": workspace_key(lease.workspace_id)}),
                "UpdateExpression": "SET updatedAt = :now ADD parkedCount :one REMOVE drainingJobId",
                "ExpressionAttributeValues": _wire({":now": now, ":one": 1}),
            }
        }
        try:
            self._client.transact_write_items(TransactItems=[job_update, workspace_update])
        except ClientError as client_error:
            reasons = _cancellation(client_error)
            if reasons is None or not reasons or not _reason_failed(reasons[0]):
                raise
            old = to_item(reasons[0].get("Item", {}))
            if old.get("leaseOwner") != lease.owner or old.get("status") != JobStatus.IN_FLIGHT:
                return FailOutcome.LOST
            return None
        return FailOutcome.PARKED

    # ---- reads (status API) --------------------------------------------------------------------------------------

    def get_job(self, tenant_id: str, job_id: str) -> Item | None:
        """The record of `tenant_id`'s job `job_id`, read consistently; None if that tenant has no such job."""
        key = _wire({"pk": job_key(tenant_id, job_id)})
        response = self._client.get_item(TableName=self._table, Key=key, ConsistentRead=True)
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

        Derived at read time so that the worker's happy path writes nothing more than the job's own item. Cost: a
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
        return {
            "Update": {
                "TableName": self._table,
                "Key": _wire({"pk": workspace_key(workspace_id)}),
                "UpdateExpression": expression + " REMOVE resumeId",
                "ExpressionAttributeNames": {"#state": "state"},
                "ExpressionAttributeValues": _wire(values),
            }
        }

    def _dead_and_halt(
        self, old: Item, *, error: str, expect_owner: Any, expect_status: str, body: str | None = None
    ) -> bool:
        now = self._clock()
        job_id = str(old["jobId"])
        tenant_id = str(old["tenantId"])
        values: dict[str, Any] = {
            ":dead": str(JobStatus.DEAD),
            ":status": expect_status,
            ":error": _stored_error(error),
            ":now": now,
            ":entry": [{"status": str(JobStatus.DEAD), "at": now, "error": error[:500]}],
            ":empty": [],
        }
        # The body is kept so that an operator can retry the job on resume (only DEAD jobs pay for storing it).
        store_body = ""
        if body is not None:
            values.update(_body_values(body))
            store_body = f", {_BODY_SET}"
        condition = "#status = :status"
        if expect_owner is None:
            condition += " AND attribute_not_exists(leaseOwner)"
        else:
            values[":owner"] = expect_owner
            condition += " AND leaseOwner = :owner"
        job_update: TransactWriteItemTypeDef = {
            "Update": {
                "TableName": self._table,
                "Key": _wire({"pk": job_key(tenant_id, job_id)}),
                # A DEAD job halts its workspace until an operator decides: TTL must not collect it.
                "UpdateExpression": (
                    "SET #status = :dead, #error = :error, updatedAt = :now, finishedAt = :now,"
                    f" history = list_append(if_not_exists(history, :empty), :entry){store_body}"
                    " REMOVE #ttl, pendingWorkspace"
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


_BODY_SET = "body = :body, bodyBytes = :bodyBytes, bodySha256 = :bodySha256"
"""The update clause of a stored message body, with `_body_values`."""


def _body_values(body: str) -> dict[str, Any]:
    """A message body as a record stores it: `body` (cut by `_stored_body` when too large), and the whole body's
    UTF-8 size and sha256, so that a cut body still says what was sent (SQS takes bodies up to 1 MiB, more than a
    DynamoDB item holds). A valid job's body never needs the cut: the worker stores its payload in the payload
    bucket first (`agent_jobs.payloads.storable_body`)."""
    encoded = body.encode("utf-8", errors="replace")
    return {
        ":body": _stored_body(body),
        ":bodyBytes": len(encoded),
        ":bodySha256": hashlib.sha256(encoded).hexdigest(),
    }


def _stored_body(body: str) -> str:
    """`body` cut to MAX_STORED_BODY_CHARS characters and as many UTF-8 bytes: a character takes up to four bytes, and
    a body cut by characters alone could make its item too large to write, on every delivery of its message."""
    head = body[:MAX_STORED_BODY_CHARS].encode("utf-8", errors="replace")[:MAX_STORED_BODY_CHARS]
    return head.decode("utf-8", errors="ignore")  # a character the cut split in two is left out


def _stored_error(error: str) -> str:
    """`error` cut to MAX_STORED_ERROR_CHARS characters (marked with an ellipsis), so that its record stays writable."""
    return error if len(error) <= MAX_STORED_ERROR_CHARS else error[: MAX_STORED_ERROR_CHARS - 1] + "…"
