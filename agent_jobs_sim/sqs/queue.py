"""One simulated FIFO queue: its messages by message group, deduplication, visibility and the redrive to its
dead-letter queue. Times are the simulation's virtual seconds; nothing here reads a clock or draws randomness
except through what the caller passes."""

from __future__ import annotations

import enum
import json
import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

DEDUPLICATION_WINDOW_SECONDS: Final = 300.0
SEQUENCE_NUMBER_DIGITS: Final = 20


class MessageState(enum.StrEnum):
    VISIBLE = "visible"  # may be delivered (unless an earlier message of its group is in flight)
    DELAYED = "delayed"  # sent with a delay that has not ended
    IN_FLIGHT = "in_flight"  # received, not deleted, its visibility timeout not over


@dataclass(eq=False)
class SimMessage:
    """A message stored in a queue, with what SQS keeps about it."""

    message_id: str
    body: str
    group_id: str
    deduplication_id: str
    sequence_number: str
    sent_at: float
    attributes: dict[str, dict[str, Any]]
    md5_of_body: str
    md5_of_attributes: str | None
    enqueued_at: float  # when it joined this queue (a move to a dead-letter queue resets it, as for FIFO queues)
    visible_at: float  # before this it is delayed (never received) or in flight (received)
    receive_count: int = 0
    first_received_at: float | None = None
    receipt_handle: str | None = None  # of the latest receive; earlier ones are stale
    deleted: bool = False
    source_arn: str | None = None  # the queue it was moved from to a dead-letter queue

    def state(self, now: float) -> MessageState:
        if self.visible_at <= now:
            return MessageState.VISIBLE
        return MessageState.IN_FLIGHT if self.receive_count else MessageState.DELAYED

    def describe(self, now: float) -> dict[str, Any]:
        """The message as a simulation inspects it."""
        return {
            "MessageId": self.message_id,
            "State": self.state(now).value,
            "ReceiveCount": self.receive_count,
            "MessageGroupId": self.group_id,
            "MessageDeduplicationId": self.deduplication_id,
            "SequenceNumber": self.sequence_number,
            "Body": self.body,
            "MessageAttributes": self.attributes,
            "VisibleAt": self.visible_at,
            "ReceiptHandle": self.receipt_handle,
        }


@dataclass(frozen=True)
class RedrivePolicy:
    dead_letter_target_arn: str
    max_receive_count: int


@dataclass(eq=False)
class SimQueue:
    """A FIFO queue. `groups` holds each message group's messages in order; received messages always form a prefix
    of their group (a message is delivered only once every earlier one of its group was), so a group is blocked
    exactly when one message of that prefix is in flight."""

    name: str
    url: str
    arn: str
    attributes: dict[str, str]
    created_at: float
    rng: random.Random
    groups: dict[str, deque[SimMessage]] = field(default_factory=dict)
    handles: dict[str, SimMessage] = field(default_factory=dict)  # every receipt handle issued, latest or stale
    dedup: dict[tuple[str, str], tuple[float, str, str]] = field(default_factory=dict)
    dedup_expiries: deque[tuple[float, tuple[str, str]]] = field(default_factory=deque)  # in the order they expire
    dead_letter_queue: SimQueue | None = None
    redrive_policy: RedrivePolicy | None = None
    last_sequence_number: int = 0

    def __post_init__(self) -> None:
        self.last_sequence_number = 18_000_000_000_000_000_000 + self.rng.randrange(10**15)

    # ---- settings -------------------------------------------------------------------------------------------

    def setting(self, name: str) -> int:
        return int(self.attributes[name])

    def link_dead_letter_queue(self, queues_by_arn: dict[str, SimQueue]) -> None:
        """Read the RedrivePolicy attribute (checked when set) and find its dead-letter queue."""
        raw = self.attributes.get("RedrivePolicy")
        policy = json.loads(raw) if raw else None
        if not policy:
            self.redrive_policy, self.dead_letter_queue = None, None
            return
        self.redrive_policy = RedrivePolicy(str(policy["deadLetterTargetArn"]), int(policy["maxReceiveCount"]))
        self.dead_letter_queue = queues_by_arn[self.redrive_policy.dead_letter_target_arn]

    # ---- sending --------------------------------------------------------------------------------------------

    def _dedup_key(self, group_id: str, deduplication_id: str) -> tuple[str, str]:
        by_group = self.attributes.get("DeduplicationScope") == "messageGroup"
        return (group_id if by_group else "", deduplication_id)

    def duplicate_of(self, group_id: str, deduplication_id: str, now: float) -> tuple[str, str] | None:
        """The MessageId and SequenceNumber of the message accepted with this deduplication id within the last
        five minutes (whether or not it was since deleted), or None."""
        seen = self.dedup.get(self._dedup_key(group_id, deduplication_id))
        if seen is None or seen[0] <= now:
            return None
        return seen[1], seen[2]

    def next_sequence_number(self) -> str:
        self.last_sequence_number += 1 + self.rng.getrandbits(4)
        return f"{self.last_sequence_number:0{SEQUENCE_NUMBER_DIGITS}d}"

    def accept(self, message: SimMessage, now: float) -> None:
        """Store a sent message and remember its deduplication id for the window."""
        key = self._dedup_key(message.group_id, message.deduplication_id)
        expires = now + DEDUPLICATION_WINDOW_SECONDS
        self.dedup[key] = (expires, message.message_id, message.sequence_number)
        self.dedup_expiries.append((expires, key))
        self.append(message)

    def append(self, message: SimMessage) -> None:
        group = self.groups.get(message.group_id)
        if group is None:
            group = self.groups[message.group_id] = deque()
        group.append(message)

    def remove(self, message: SimMessage) -> None:
        group = self.groups[message.group_id]
        group.remove(message)
        if not group:
            del self.groups[message.group_id]

    # ---- receiving ------------------------------------------------------------------------------------------

    def expire(self, now: float) -> None:
        """Drop messages older than the retention period (the oldest of a group come first) and forget
        deduplication ids whose window is over."""
        retention = self.setting("MessageRetentionPeriod")
        for group_id in [g for g, messages in self.groups.items() if messages[0].enqueued_at + retention <= now]:
            messages = self.groups[group_id]
            while messages and messages[0].enqueued_at + retention <= now:
                messages.popleft().deleted = True
            if not messages:
                del self.groups[group_id]
        expiries = self.dedup_expiries
        while expiries and expiries[0][0] <= now:
            _, key = expiries.popleft()
            seen = self.dedup.get(key)
            if seen is not None and seen[0] <= now:
                del self.dedup[key]

    def deliverable_groups(self, now: float) -> list[str]:
        """Groups whose first message is visible and none of whose received messages is in flight."""
        free = []
        for group_id, messages in self.groups.items():
            if messages[0].visible_at > now:
                continue  # in flight, or delayed (holding back the rest)
            if all(m.visible_at <= now for m in self._received_prefix(messages)):
                free.append(group_id)
        return free

    @staticmethod
    def _received_prefix(messages: deque[SimMessage]) -> Iterator[SimMessage]:
        for message in messages:
            if not message.receive_count:
                return
            yield message

    def receive(self, count: int, visibility_timeout: int, now: float) -> list[SimMessage]:
        """Deliver up to `count` messages: groups in an order drawn from the rng, from each group its first
        visible messages in order. A message already received maxReceiveCount times is moved to the dead-letter
        queue instead, which frees the next message of its group."""
        self.expire(now)
        groups = self.deliverable_groups(now)
        if len(groups) > 1:
            self.rng.shuffle(groups)
        policy = self.redrive_policy
        delivered: list[SimMessage] = []
        for group_id in groups:
            for message in list(self.groups.get(group_id, ())):
                if len(delivered) >= count or message.visible_at > now:
                    break
                if policy is not None and message.receive_count >= policy.max_receive_count:
                    self.move_to_dead_letter_queue(message, now)
                    continue
                self.mark_received(message, visibility_timeout, now)
                delivered.append(message)
            if len(delivered) >= count:
                break
        return delivered

    def mark_received(self, message: SimMessage, visibility_timeout: int, now: float) -> None:
        message.receive_count += 1
        if message.first_received_at is None:
            message.first_received_at = now
        message.visible_at = now + visibility_timeout
        handle = f"AQEB{self.rng.getrandbits(256):064x}"
        message.receipt_handle = handle
        self.handles[handle] = message

    def move_to_dead_letter_queue(self, message: SimMessage, now: float) -> None:
        """Move `message` (body, attributes, group and deduplication ids, MessageId and SequenceNumber kept) to
        the dead-letter queue, bypassing its deduplication: a move is not a send."""
        dlq = self.dead_letter_queue
        assert dlq is not None
        self.remove(message)
        message.source_arn = self.arn
        message.receipt_handle = None
        message.enqueued_at = now
        message.visible_at = now
        dlq.append(message)

    # ---- inspection -----------------------------------------------------------------------------------------

    def all_messages(self) -> Iterator[SimMessage]:
        for messages in self.groups.values():
            yield from messages

    def counts(self, now: float) -> dict[MessageState, int]:
        counts = dict.fromkeys(MessageState, 0)
        for message in self.all_messages():
            counts[message.state(now)] += 1
        return counts

    def next_timer(self, now: float) -> float | None:
        """The earliest future moment a message of this queue becomes visible (delay over or visibility timeout
        expired)."""
        future = [m.visible_at for m in self.all_messages() if m.visible_at > now]
        return min(future, default=None)
