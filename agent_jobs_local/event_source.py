"""Lambda's SQS event source, reduced to one poll: receive a batch, shape it as Lambda does, invoke, settle.

The shape follows what Lambda passes a function for an SQS FIFO queue; settling follows the event source mapping:
records not listed in `batchItemFailures` are deleted; listed ones are left to the queue (their visibility
timeout, or whatever the function set); an invocation that raised deletes nothing.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mypy_boto3_sqs.client import SQSClient
    from mypy_boto3_sqs.type_defs import MessageTypeDef


def _message_attribute(value: dict[str, Any]) -> dict[str, Any]:
    shaped: dict[str, Any] = {"stringListValues": [], "binaryListValues": [], "dataType": value["DataType"]}
    if "StringValue" in value:
        shaped["stringValue"] = value["StringValue"]
    if "BinaryValue" in value:
        shaped["binaryValue"] = value["BinaryValue"]
    return shaped


def lambda_sqs_record(message: MessageTypeDef, *, queue_arn: str, region: str) -> dict[str, Any]:
    """One ReceiveMessage message as a Lambda SQS event record."""
    attributes = {key: str(value) for key, value in message.get("Attributes", {}).items()}
    record: dict[str, Any] = {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message["Body"],
        "attributes": attributes,
        "messageAttributes": {
            name: _message_attribute(dict(value)) for name, value in message.get("MessageAttributes", {}).items()
        },
        "md5OfBody": message.get("MD5OfBody", ""),
        "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn,
        "awsRegion": region,
    }
    if "MD5OfMessageAttributes" in message:
        record["md5OfMessageAttributes"] = message["MD5OfMessageAttributes"]
    return record


def receive_event(
    sqs: SQSClient, queue_url: str, *, queue_arn: str, region: str, batch_size: int, wait_seconds: int = 0
) -> dict[str, Any]:
    """Receive up to `batch_size` messages (the queue's own visibility timeout applies) as a Lambda event."""
    response = sqs.receive_message(
        QueueUrl=queue_url,
        MaxNumberOfMessages=batch_size,
        WaitTimeSeconds=wait_seconds,
        MessageSystemAttributeNames=["All"],
        MessageAttributeNames=["All"],
        ReceiveRequestAttemptId=uuid.uuid4().hex,
    )
    messages = response.get("Messages", [])
    return {"Records": [lambda_sqs_record(m, queue_arn=queue_arn, region=region) for m in messages]}


def settle(sqs: SQSClient, queue_url: str, event: dict[str, Any], response: Any) -> list[str]:
    """Delete the records the function did not report as failed; returns the deleted message ids."""
    failed = {item["itemIdentifier"] for item in (response or {}).get("batchItemFailures", [])}
    done = [record for record in event["Records"] if record["messageId"] not in failed]
    for start in range(0, len(done), 10):
        chunk = done[start : start + 10]
        sqs.delete_message_batch(
            QueueUrl=queue_url,
            Entries=[{"Id": str(i), "ReceiptHandle": r["receiptHandle"]} for i, r in enumerate(chunk)],
        )
    return [record["messageId"] for record in done]


@dataclass
class LambdaContextStub:
    """An invocation context whose remaining time counts down from the function's Timeout, as Lambda's does."""

    timeout_seconds: float
    function_name: str = "JobWorkerFunction"
    memory_limit_in_mb: int = 512
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    clock: Callable[[], float] = time.monotonic
    _started: float = field(init=False)

    def __post_init__(self) -> None:
        self._started = self.clock()
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:123456789012:function:{self.function_name}"
        self.function_version = "$LATEST"
        self.log_group_name = f"/aws/lambda/{self.function_name}"
        self.log_stream_name = self.aws_request_id

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.timeout_seconds - (self.clock() - self._started)) * 1000))
