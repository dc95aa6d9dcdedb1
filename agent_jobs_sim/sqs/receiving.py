"""ReceiveMessage, DeleteMessage and ChangeMessageVisibility (single and batch) on a simulated FIFO queue.

Receipt handles on a FIFO queue, as SQS treats them: only the handle of a message's latest receive, while that
receive's visibility timeout lasts, deletes it or changes its visibility. A handle from an earlier receive, or one
whose visibility timeout is over, is refused with InvalidParameterValue ("The receipt handle has expired."); a
handle SimSQS never issued for the queue with ReceiptHandleIsInvalid. Deleting a message again with the handle
that deleted it succeeds (SQS answers a repeated delete idempotently); changing its visibility is refused
("Message does not exist or is not available for visibility timeout change.").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from botocore.exceptions import ClientError

from agent_jobs_sim.sqs import errors, wire
from agent_jobs_sim.sqs.queue import SimMessage, SimQueue
from agent_jobs_sim.sqs.registry import LIMITS, QueueRegistry, ok
from agent_jobs_sim.sqs.sending import check_batch, failure


def _received(message: SimMessage, system_names: Iterable[str], attribute_names: Iterable[str]) -> dict[str, Any]:
    received: dict[str, Any] = {
        "MessageId": message.message_id,
        "ReceiptHandle": message.receipt_handle,
        "MD5OfBody": message.md5_of_body,
        "Body": message.body,
    }
    if system_names:
        first = message.first_received_at if message.first_received_at is not None else message.sent_at
        values = {
            "SenderId": wire.SENDER_ID,
            "ApproximateFirstReceiveTimestamp": str(int(first * 1000)),
            "ApproximateReceiveCount": str(message.receive_count),
            "SentTimestamp": str(int(message.sent_at * 1000)),
            "SequenceNumber": message.sequence_number,
            "MessageDeduplicationId": message.deduplication_id,
            "MessageGroupId": message.group_id,
        }
        selected = wire.selected_system_attributes(system_names, values)
        if selected:
            received["Attributes"] = selected
    attributes = wire.selected_message_attributes(attribute_names, message.attributes)
    if attributes:
        every = len(attributes) == len(message.attributes)
        received["MD5OfMessageAttributes"] = (
            message.md5_of_attributes if every and message.md5_of_attributes else wire.md5_of_attributes(attributes)
        )
        received["MessageAttributes"] = attributes
    return received


class ReceivingMixin(QueueRegistry):
    def receive_message(
        self,
        *,
        QueueUrl: str,
        MaxNumberOfMessages: int = 1,
        VisibilityTimeout: int | None = None,
        WaitTimeSeconds: int | None = None,
        AttributeNames: Sequence[str] = (),
        MessageSystemAttributeNames: Sequence[str] = (),
        MessageAttributeNames: Sequence[str] = (),
        ReceiveRequestAttemptId: str | None = None,
    ) -> dict[str, Any]:
        """Receive what is deliverable now. WaitTimeSeconds never blocks (the scheduler advances time, not the
        queue); ReceiveRequestAttemptId is accepted and ignored: a simulated receive never fails after taking
        messages, so there is no lost response to retry."""
        operation = "ReceiveMessage"
        queue = self.queue(QueueUrl, operation)
        if not 1 <= MaxNumberOfMessages <= 10:
            raise errors.invalid_parameter(
                "MaxNumberOfMessages", MaxNumberOfMessages, "Must be between 1 and 10, if provided.", operation
            )
        if WaitTimeSeconds is not None and not 0 <= WaitTimeSeconds <= 20:
            raise errors.invalid_parameter(
                "WaitTimeSeconds", WaitTimeSeconds, "Must be >= 0 and <= 20, if provided.", operation
            )
        visibility = queue.setting("VisibilityTimeout") if VisibilityTimeout is None else VisibilityTimeout
        self._check_visibility(visibility, operation)
        delivered = queue.receive(MaxNumberOfMessages, visibility, self.now())
        if not delivered:
            return ok()
        system_names = [*AttributeNames, *MessageSystemAttributeNames]
        return ok(Messages=[_received(m, system_names, MessageAttributeNames) for m in delivered])

    @staticmethod
    def _check_visibility(timeout: int, operation: str) -> None:
        low, high = LIMITS["VisibilityTimeout"]
        if not low <= timeout <= high:
            raise errors.invalid_parameter(
                "VisibilityTimeout", timeout, f"Must be between {low} and {high}, if provided.", operation
            )

    def _current(self, queue: SimQueue, handle: str, operation: str) -> SimMessage | None:
        """The message `handle` may act on now, None for a repeated delete; raises when SQS refuses the handle."""
        message = queue.handles.get(handle)
        if message is None:
            raise errors.invalid_receipt_handle(handle, operation)
        latest = message.receipt_handle == handle
        if message.deleted:
            if latest and operation.startswith("DeleteMessage"):
                return None
            raise errors.invalid_parameter(
                "ReceiptHandle",
                handle,
                "Message does not exist or is not available for visibility timeout change."
                if operation.startswith("ChangeMessageVisibility")
                else errors.EXPIRED_HANDLE,
                operation,
            )
        if not latest or message.visible_at <= self.now():
            raise errors.invalid_parameter("ReceiptHandle", handle, errors.EXPIRED_HANDLE, operation)
        return message

    def _delete(self, queue: SimQueue, handle: str, operation: str) -> None:
        message = self._current(queue, handle, operation)
        if message is not None:
            queue.remove(message)
            message.deleted = True

    def _change_visibility(self, queue: SimQueue, handle: str, timeout: int, operation: str) -> None:
        self._check_visibility(timeout, operation)
        message = self._current(queue, handle, operation)
        assert message is not None
        message.visible_at = self.now() + timeout

    def delete_message(self, *, QueueUrl: str, ReceiptHandle: str) -> dict[str, Any]:
        self._delete(self.queue(QueueUrl, "DeleteMessage"), ReceiptHandle, "DeleteMessage")
        return ok()

    def change_message_visibility(
        self,
        *,
        QueueUrl: str,
        ReceiptHandle: str,
        VisibilityTimeout: int,
    ) -> dict[str, Any]:
        operation = "ChangeMessageVisibility"
        self._change_visibility(self.queue(QueueUrl, operation), ReceiptHandle, VisibilityTimeout, operation)
        return ok()

    def delete_message_batch(self, *, QueueUrl: str, Entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        def delete(queue: SimQueue, entry: Mapping[str, Any], operation: str) -> None:
            self._delete(queue, str(entry["ReceiptHandle"]), operation)

        return self._each_entry(QueueUrl, Entries, "DeleteMessage", delete)

    def change_message_visibility_batch(
        self,
        *,
        QueueUrl: str,
        Entries: Sequence[Mapping[str, Any]],
    ) -> dict[str, Any]:
        def change(queue: SimQueue, entry: Mapping[str, Any], operation: str) -> None:
            timeout = int(entry.get("VisibilityTimeout", 0))
            self._change_visibility(queue, str(entry["ReceiptHandle"]), timeout, operation)

        return self._each_entry(QueueUrl, Entries, "ChangeMessageVisibility", change)

    def _each_entry(
        self,
        url: str,
        entries: Sequence[Mapping[str, Any]],
        kind: str,
        act: Callable[[SimQueue, Mapping[str, Any], str], None],
    ) -> dict[str, Any]:
        """A batch call: the batch's own checks fail the call, an entry's failure is reported in `Failed`."""
        operation = f"{kind}Batch"
        queue = self.queue(url, operation)
        check_batch(entries, kind, operation)
        successful, failed = [], []
        for entry in entries:
            try:
                act(queue, entry, operation)
                successful.append({"Id": entry["Id"]})
            except ClientError as error:
                failed.append(failure(str(entry["Id"]), error))
        return ok(Successful=successful, Failed=failed)
