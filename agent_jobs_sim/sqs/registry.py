"""The simulated account's queues: creating and finding them, their attributes, purging."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from agent_jobs_sim.sqs import errors
from agent_jobs_sim.sqs.queue import MessageState, SimQueue

REGION: Final = "us-east-1"
ACCOUNT_ID: Final = "123456789012"
DEFAULT_ATTRIBUTES: Final = {
    "VisibilityTimeout": "30",
    "MaximumMessageSize": "1048576",  # SQS's limit and default since it allows 1 MiB messages
    "MessageRetentionPeriod": "345600",
    "DelaySeconds": "0",
    "ReceiveMessageWaitTimeSeconds": "0",
    "FifoQueue": "true",
    "ContentBasedDeduplication": "false",
    "DeduplicationScope": "queue",
    "FifoThroughputLimit": "perQueue",
    "SqsManagedSseEnabled": "true",
}
SETTABLE: Final = frozenset({*DEFAULT_ATTRIBUTES, "RedrivePolicy", "RedriveAllowPolicy", "Policy"})
# name -> (lowest, highest) for the numeric attributes SQS checks
LIMITS: Final = {
    "VisibilityTimeout": (0, 43_200),
    "MaximumMessageSize": (1_024, 1_048_576),
    "MessageRetentionPeriod": (60, 1_209_600),
    "DelaySeconds": (0, 900),
    "ReceiveMessageWaitTimeSeconds": (0, 20),
}


def ok(**fields: Any) -> dict[str, Any]:
    """A response as boto3 returns it: the fields plus ResponseMetadata."""
    fields["ResponseMetadata"] = {"HTTPStatusCode": 200, "HTTPHeaders": {}, "RetryAttempts": 0}
    return fields


class QueueRegistry:
    """The queues of one simulated account and region, by URL, name and ARN."""

    def __init__(self, now: Callable[[], float], rng: random.Random) -> None:
        self.now = now
        self.rng = rng
        self.queues: dict[str, SimQueue] = {}  # by URL
        self.by_name: dict[str, SimQueue] = {}
        self.by_arn: dict[str, SimQueue] = {}

    def queue(self, url: str, operation: str) -> SimQueue:
        queue = self.queues.get(url)
        if queue is None:
            raise errors.queue_does_not_exist(operation)
        return queue

    def _checked_attributes(self, attributes: Mapping[str, str], operation: str) -> dict[str, str]:
        checked = {name: str(value) for name, value in attributes.items()}
        for name, value in checked.items():
            if name not in SETTABLE:
                raise errors.modelled("InvalidAttributeName", f"Unknown Attribute {name}.", operation)
            if name in LIMITS:
                low, high = LIMITS[name]
                if not value.isdigit() or not low <= int(value) <= high:
                    raise errors.modelled(
                        "InvalidAttributeValue", f"Invalid value for the parameter {name}.", operation
                    )
        if "RedrivePolicy" in checked:
            self._check_redrive_policy(checked["RedrivePolicy"], operation)
        return checked

    def _check_redrive_policy(self, raw: str, operation: str) -> None:
        policy = json.loads(raw) if raw else {}
        if not policy:
            return
        target = self.by_arn.get(str(policy.get("deadLetterTargetArn")))
        count = policy.get("maxReceiveCount")
        if target is None or not str(count).isdigit() or not 1 <= int(str(count)) <= 1000:
            raise errors.modelled(
                "InvalidAttributeValue",
                f"Value {raw} for parameter RedrivePolicy is invalid. Reason: Dead-letter target does not exist or "
                "maxReceiveCount is not between 1 and 1000.",
                operation,
            )

    def create_queue(self, *, QueueName: str, Attributes: Mapping[str, str] | None = None, **_: Any) -> dict[str, Any]:
        attributes = self._checked_attributes(Attributes or {}, "CreateQueue")
        if not QueueName.endswith(".fifo"):
            raise NotImplementedError("SimSQS simulates FIFO queues only: name the queue <name>.fifo")
        if attributes.get("FifoQueue") != "true":
            raise errors.invalid_parameter(
                "FifoQueue", attributes.get("FifoQueue"), "A .fifo queue needs FifoQueue=true.", "CreateQueue"
            )
        existing = self.by_name.get(QueueName)
        wanted = {**DEFAULT_ATTRIBUTES, **attributes}
        if existing is not None:
            if any(existing.attributes.get(name) != value for name, value in wanted.items()):
                raise errors.modelled(
                    "QueueNameExists",
                    "A queue already exists with the same name and a different value for attribute",
                    "CreateQueue",
                )
            return ok(QueueUrl=existing.url)
        url = f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT_ID}/{QueueName}"
        arn = f"arn:aws:sqs:{REGION}:{ACCOUNT_ID}:{QueueName}"
        queue = SimQueue(QueueName, url, arn, wanted, self.now(), self.rng)
        queue.link_dead_letter_queue(self.by_arn)
        self.queues[url] = self.by_name[QueueName] = self.by_arn[arn] = queue
        return ok(QueueUrl=url)

    def get_queue_url(self, *, QueueName: str, **_: Any) -> dict[str, Any]:
        queue = self.by_name.get(QueueName)
        if queue is None:
            raise errors.queue_does_not_exist("GetQueueUrl")
        return ok(QueueUrl=queue.url)

    def list_queues(self, *, QueueNamePrefix: str = "", **_: Any) -> dict[str, Any]:
        urls = [q.url for name, q in sorted(self.by_name.items()) if name.startswith(QueueNamePrefix)]
        return ok(QueueUrls=urls) if urls else ok()

    def delete_queue(self, *, QueueUrl: str) -> dict[str, Any]:
        queue = self.queue(QueueUrl, "DeleteQueue")
        del self.queues[queue.url], self.by_name[queue.name], self.by_arn[queue.arn]
        return ok()

    def get_queue_attributes(self, *, QueueUrl: str, AttributeNames: Iterable[str] = ()) -> dict[str, Any]:
        queue = self.queue(QueueUrl, "GetQueueAttributes")
        now = self.now()
        queue.expire(now)
        counts = queue.counts(now)
        values = {
            "QueueArn": queue.arn,
            "ApproximateNumberOfMessages": str(counts[MessageState.VISIBLE]),
            "ApproximateNumberOfMessagesNotVisible": str(counts[MessageState.IN_FLIGHT]),
            "ApproximateNumberOfMessagesDelayed": str(counts[MessageState.DELAYED]),
            "CreatedTimestamp": str(int(queue.created_at)),
            "LastModifiedTimestamp": str(int(queue.created_at)),
            **queue.attributes,
        }
        names = set(AttributeNames)
        if "All" not in names:
            unknown = names - set(values) - SETTABLE
            if unknown:
                raise errors.modelled(
                    "InvalidAttributeName", f"Unknown Attribute {min(unknown)}.", "GetQueueAttributes"
                )
            values = {name: value for name, value in values.items() if name in names}
        return ok(Attributes=values) if values else ok()

    def set_queue_attributes(self, *, QueueUrl: str, Attributes: Mapping[str, str]) -> dict[str, Any]:
        queue = self.queue(QueueUrl, "SetQueueAttributes")
        queue.attributes.update(self._checked_attributes(Attributes, "SetQueueAttributes"))
        queue.link_dead_letter_queue(self.by_arn)
        return ok()

    def purge_queue(self, *, QueueUrl: str) -> dict[str, Any]:
        queue = self.queue(QueueUrl, "PurgeQueue")
        for message in queue.all_messages():
            message.deleted = True
        queue.groups.clear()
        return ok()
