"""SimSQS: the simulated SQS client and what a simulation inspects of it."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from agent_jobs_sim.sqs.queue import MessageState
from agent_jobs_sim.sqs.receiving import ReceivingMixin
from agent_jobs_sim.sqs.redrive import RedriveMixin
from agent_jobs_sim.sqs.sending import SendingMixin


class SimSQS(SendingMixin, ReceivingMixin, RedriveMixin):
    """Stands in for a boto3 low-level SQS client (FIFO queues only): the same method names, keyword arguments,
    response dicts and exception classes. `now()` gives virtual seconds; `rng` is the only source of randomness
    (MessageIds, receipt handles, SequenceNumber gaps, which message groups a receive serves first), so one seed
    replays one history exactly."""

    def __init__(self, now: Callable[[], float], rng: random.Random) -> None:
        super().__init__(now, rng)
        self.move_tasks = []

    def next_timer(self) -> float | None:
        """The earliest future virtual time at which a message of any queue becomes visible: a delay ending or a
        visibility timeout expiring."""
        now = self.now()
        timers = [t for queue in self.queues.values() if (t := queue.next_timer(now)) is not None]
        return min(timers, default=None)

    def messages(self, queue_url: str) -> list[dict[str, Any]]:
        """Every message stored in the queue, group by group in order, with its state ("visible", "delayed",
        "in_flight"), receive count, group and deduplication ids, SequenceNumber, body and attributes."""
        queue = self.queue(queue_url, "Inspect")
        now = self.now()
        queue.expire(now)
        return [message.describe(now) for message in queue.all_messages()]

    def in_flight(self, queue_url: str) -> list[dict[str, Any]]:
        """The queue's messages received and neither deleted nor back to visible."""
        return [m for m in self.messages(queue_url) if m["State"] == MessageState.IN_FLIGHT.value]
