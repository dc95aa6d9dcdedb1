"""What every part of the store shares: the table, the limits on attempts, the clock and the TTL."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from botocore.exceptions import ClientError

from agent_jobs.models import JobMessage
from agent_jobs.store.codec import Clock, Item, cancellation, condition_failed, epoch_ms, reason_failed, to_item, wire

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import TransactWriteItemTypeDef


class StoreBase:
    """Conditional writes and reads of job and workspace records in one DynamoDB table keyed by `pk`."""

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

    def _ttl(self, now_ms: int) -> int:
        return now_ms // 1000 + self._ttl_seconds

    def _transact(self, items: list[TransactWriteItemTypeDef]) -> bool:
        try:
            if len(items) == 1:
                update = dict(items[0]["Update"])
                self._client.update_item(**update)  # type: ignore[arg-type]
            else:
                self._client.transact_write_items(TransactItems=items)
        except ClientError as error:
            if condition_failed(error):
                return False
            reasons = cancellation(error)
            if reasons is not None and any(reason_failed(r) for r in reasons):
                return False
            raise
        return True

    def _update(
        self,
        pk: str,
        expression: str,
        values: Mapping[str, Any],
        *,
        condition: str | None = None,
        names: Mapping[str, str] | None = None,
        return_old: bool = False,
    ) -> TransactWriteItemTypeDef:
        """An UpdateItem of the item `pk` as a transaction's item (`_transact` sends one alone as an UpdateItem);
        `return_old` asks for the item as it was when `condition` fails."""
        update: dict[str, Any] = {"TableName": self._table, "Key": wire({"pk": pk}), "UpdateExpression": expression}
        if condition is not None:
            update["ConditionExpression"] = condition
        if names:
            update["ExpressionAttributeNames"] = dict(names)
        update["ExpressionAttributeValues"] = wire(values)
        if return_old:
            update["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
        return cast("TransactWriteItemTypeDef", {"Update": update})

    def _read(self, pk: str) -> Item | None:
        """The item of key `pk`, read consistently; None when there is none."""
        raw = self._client.get_item(TableName=self._table, Key=wire({"pk": pk}), ConsistentRead=True).get("Item")
        return to_item(raw) if raw else None


def message_values(message: JobMessage, message_id: str) -> dict[str, Any]:
    """The placeholders of what a delivered message records on its job: `:jid`, `:wid`, `:tid` (its tenant), `:type`,
    `:hash` (its payload's) and `:mid` (the queue's message id)."""
    return {
        ":jid": message.job_id,
        ":wid": message.workspace_id,
        ":tid": message_tenant(message),
        ":type": str(message.type),
        ":hash": message.payload_hash,
        ":mid": message_id,
    }


def message_clauses(*, first_tenant: bool = False, first_hash: bool = False) -> list[str]:
    """The SET clauses that record `message_values` on the job, with its acceptedAt (kept) and updatedAt (`:now`).
    `first_tenant` keeps the tenant first recorded (a claim: the tenant the producer verified stays the owner);
    `first_hash` keeps the payload hash first recorded (a park: the hash the job was accepted with)."""
    return [
        "jobId = :jid",
        "workspaceId = :wid",
        "tenantId = if_not_exists(tenantId, :tid)" if first_tenant else "tenantId = :tid",
        "#type = :type",
        "payloadHash = if_not_exists(payloadHash, :hash)" if first_hash else "payloadHash = :hash",
        "messageId = :mid",
        "acceptedAt = if_not_exists(acceptedAt, :now)",
        "updatedAt = :now",
    ]


def message_tenant(message: JobMessage) -> str:
    """The tenant a job is recorded for. The producer names the tenant it verified; the worker gives a message sent to
    the queue without one the workspace owner's before it claims or parks it. A job is never recorded without one."""
    if message.tenant_id is None:
        raise ValueError(f"job {message.job_id} names no tenant: bind it to the workspace owner's first")
    return message.tenant_id
