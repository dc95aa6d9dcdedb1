"""SendMessage and SendMessageBatch on a simulated FIFO queue: validation as SQS does it, deduplication within
the five-minute window (by queue or by message group), SequenceNumbers increasing per queue."""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Final

from botocore.exceptions import ClientError

from agent_jobs_sim.sqs import errors, wire
from agent_jobs_sim.sqs.queue import SimMessage, SimQueue
from agent_jobs_sim.sqs.registry import QueueRegistry, ok

MAX_BATCH_ENTRIES: Final = 10
BATCH_ENTRY_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,80}")
MAX_BATCH_BYTES: Final = 1_048_576


def check_batch(entries: Sequence[Mapping[str, Any]], kind: str, operation: str) -> None:
    """A batch request's own checks, which fail the whole call: empty, too many, ids malformed or repeated."""
    if not entries:
        raise errors.modelled(
            "EmptyBatchRequest", f"There should be at least one {kind}BatchRequestEntry in the request.", operation
        )
    if len(entries) > MAX_BATCH_ENTRIES:
        raise errors.modelled(
            "TooManyEntriesInBatchRequest",
            f"Maximum number of entries per request are {MAX_BATCH_ENTRIES}. You have sent {len(entries)}.",
            operation,
        )
    seen: set[str] = set()
    for entry in entries:
        entry_id = str(entry.get("Id", ""))
        if not BATCH_ENTRY_ID.fullmatch(entry_id):
            raise errors.modelled(
                "InvalidBatchEntryId",
                "A batch entry id can only contain alphanumeric characters, hyphens and underscores. "
                "It can be at most 80 letters long.",
                operation,
            )
        if entry_id in seen:
            raise errors.modelled("BatchEntryIdsNotDistinct", f"Id {entry_id} repeated.", operation)
        seen.add(entry_id)


def failure(entry_id: str, error: ClientError) -> dict[str, Any]:
    return {
        "Id": entry_id,
        "SenderFault": True,
        "Code": error.response["Error"]["Code"],
        "Message": error.response["Error"]["Message"],
    }


class SendingMixin(QueueRegistry):
    def send_message(self, *, QueueUrl: str, **entry: Any) -> dict[str, Any]:
        queue = self.queue(QueueUrl, "SendMessage")
        self._check_message(queue, entry, "SendMessage")
        return ok(**self._send(queue, entry))

    def send_message_batch(self, *, QueueUrl: str, Entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        operation = "SendMessageBatch"
        queue = self.queue(QueueUrl, operation)
        check_batch(Entries, "SendMessage", operation)
        total = sum(
            len(str(e.get("MessageBody", "")).encode()) + wire.attributes_size(e.get("MessageAttributes") or {})
            for e in Entries
        )
        limit = MAX_BATCH_BYTES
        if total > limit:
            raise errors.modelled(
                "BatchRequestTooLong",
                f"Batch requests cannot be longer than {limit} bytes. You have sent {total} bytes.",
                operation,
            )
        # An entry SQS refuses (no MessageGroupId, no deduplication id, too large) fails the whole call, before
        # any entry is sent.
        batch = [{key: value for key, value in entry.items() if key != "Id"} for entry in Entries]
        for fields in batch:
            self._check_message(queue, fields, operation)
        successful = [
            {"Id": entry["Id"], **self._send(queue, fields)} for entry, fields in zip(Entries, batch, strict=True)
        ]
        return ok(Successful=successful, Failed=[])

    def _send(self, queue: SimQueue, entry: Mapping[str, Any]) -> dict[str, Any]:
        body = str(entry["MessageBody"])
        attributes = {name: dict(value) for name, value in (entry.get("MessageAttributes") or {}).items()}
        group_id = str(entry["MessageGroupId"])
        dedup_id = entry.get("MessageDeduplicationId") or hashlib.sha256(body.encode()).hexdigest()
        now = self.now()
        response: dict[str, Any] = {"MD5OfMessageBody": wire.md5_of_body(body)}
        md5_of_attributes = wire.md5_of_attributes(attributes) if attributes else None
        if md5_of_attributes is not None:
            response["MD5OfMessageAttributes"] = md5_of_attributes
        duplicate = queue.duplicate_of(group_id, dedup_id, now)
        if duplicate is not None:  # accepted, not enqueued: the original's ids
            return {**response, "MessageId": duplicate[0], "SequenceNumber": duplicate[1]}
        message = SimMessage(
            message_id=str(uuid.UUID(int=self.rng.getrandbits(128), version=4)),
            body=body,
            group_id=group_id,
            deduplication_id=dedup_id,
            sequence_number=queue.next_sequence_number(),
            sent_at=now,
            attributes=attributes,
            md5_of_body=response["MD5OfMessageBody"],
            md5_of_attributes=md5_of_attributes,
            enqueued_at=now,
            visible_at=now + queue.setting("DelaySeconds"),
        )
        queue.accept(message, now)
        return {**response, "MessageId": message.message_id, "SequenceNumber": message.sequence_number}

    @staticmethod
    def _check_message(queue: SimQueue, entry: Mapping[str, Any], operation: str) -> None:
        body = entry.get("MessageBody")
        if not body:
            raise errors.missing_parameter("MessageBody", operation)
        attributes: Mapping[str, Mapping[str, Any]] = entry.get("MessageAttributes") or {}
        if not entry.get("MessageGroupId"):
            raise errors.missing_parameter("MessageGroupId", operation)
        if not entry.get("MessageDeduplicationId") and queue.attributes["ContentBasedDeduplication"] != "true":
            raise errors.client_error(
                "InvalidParameterValue",
                "The queue should either have ContentBasedDeduplication enabled or MessageDeduplicationId provided "
                "explicitly",
                operation,
            )
        delay = int(entry.get("DelaySeconds") or 0)
        if delay:  # FIFO queues delay by the queue's DelaySeconds only
            raise errors.invalid_parameter(
                "DelaySeconds", delay, "The request include parameter that is not valid for this queue type.", operation
            )
        limit = queue.setting("MaximumMessageSize")
        if len(body.encode()) + wire.attributes_size(attributes) > limit:
            raise errors.client_error(
                "InvalidParameterValue",
                f"One or more parameters are invalid. Reason: Message must be shorter than {limit} bytes.",
                operation,
            )
        for name, value in attributes.items():
            data_type = str(value.get("DataType", ""))
            if not data_type.startswith(("String", "Number", "Binary")) or not (
                value.get("StringValue") is not None or value.get("BinaryValue") is not None
            ):
                raise errors.client_error(
                    "InvalidParameterValue",
                    f"The message attribute '{name}' must contain a non-empty value.",
                    operation,
                )
