"""Call sequences shared by the SimSQS tests and its comparison with moto: queues with unique names and short
helpers that speak the boto3 SQS client's language, so one sequence runs against either."""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from agent_jobs_sim.sqs import SimSQS

START = 1_800_000_000.0


@dataclass
class Side:
    """One SQS to run a call sequence against: the client and how to let time pass."""

    name: str
    sqs: Any
    advance: Callable[[float], None]


def sim_side(seed: int = 7) -> Side:
    clock = [START]

    def advance(seconds: float) -> None:
        clock[0] += seconds

    return Side("sim", SimSQS(lambda: clock[0], random.Random(seed)), advance)


def fifo_queue(side: Side, **attributes: str) -> str:
    return str(
        side.sqs.create_queue(
            QueueName=f"sim-{uuid.uuid4().hex[:12]}.fifo", Attributes={"FifoQueue": "true", **attributes}
        )["QueueUrl"]
    )


def queue_arn(side: Side, url: str) -> str:
    return str(side.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"])


def with_dead_letter_queue(side: Side, max_receive_count: int, **attributes: str) -> tuple[str, str]:
    """A source queue redriving to a new dead-letter queue after `max_receive_count` receives: (source, dlq)."""
    dlq = fifo_queue(side)
    policy = {"deadLetterTargetArn": queue_arn(side, dlq), "maxReceiveCount": max_receive_count}
    return fifo_queue(side, RedrivePolicy=json.dumps(policy), **attributes), dlq


def send(side: Side, url: str, body: str, group: str, dedup: str | None = None, **fields: Any) -> dict[str, Any]:
    if dedup is not None:
        fields["MessageDeduplicationId"] = dedup
    response: dict[str, Any] = side.sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=group, **fields)
    return response


def receive(side: Side, url: str, count: int = 10, **fields: Any) -> list[dict[str, Any]]:
    response = side.sqs.receive_message(
        QueueUrl=url,
        MaxNumberOfMessages=count,
        MessageSystemAttributeNames=["All"],
        MessageAttributeNames=["All"],
        **fields,
    )
    return list(response.get("Messages", []))


def bodies(messages: list[dict[str, Any]]) -> list[str]:
    return [m["Body"] for m in messages]


def by_group(messages: list[dict[str, Any]]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for message in messages:
        groups.setdefault(message["Attributes"]["MessageGroupId"], []).append(message["Body"])
    return groups


def counts(messages: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(m["Body"], int(m["Attributes"]["ApproximateReceiveCount"])) for m in messages]


def depth(side: Side, url: str) -> tuple[int, int, int]:
    """(visible, in flight, delayed) as the queue's attributes tell them."""
    attributes = side.sqs.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=[
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ],
    )["Attributes"]
    return (
        int(attributes["ApproximateNumberOfMessages"]),
        int(attributes["ApproximateNumberOfMessagesNotVisible"]),
        int(attributes["ApproximateNumberOfMessagesDelayed"]),
    )


def outcome(call: Callable[[], Any]) -> tuple[str, str]:
    """("ok", "") when the call succeeds, else the exception's class name and the error code botocore parsed."""
    try:
        call()
    except ClientError as error:
        return type(error).__name__, str(error.response["Error"]["Code"])
    return "ok", ""
