"""StartMessageMoveTask and ListMessageMoveTasks: the dead-letter queue redrive."""

from __future__ import annotations

import uuid
from typing import Any

from agent_jobs_sim.sqs import errors
from agent_jobs_sim.sqs.queue import MessageState, SimMessage, SimQueue
from agent_jobs_sim.sqs.registry import QueueRegistry, ok


class RedriveMixin(QueueRegistry):
    move_tasks: list[dict[str, Any]]

    def _sources_of(self, dlq: SimQueue) -> list[SimQueue]:
        return [queue for queue in self.queues.values() if queue.dead_letter_queue is dlq]

    def start_message_move_task(
        self,
        *,
        SourceArn: str,
        DestinationArn: str | None = None,
        MaxNumberOfMessagesPerSecond: int | None = None,
    ) -> dict[str, Any]:
        """Move the dead-letter queue's messages to `DestinationArn`, or else to the queue each came from. The
        task completes within the call (SQS moves asynchronously; the simulation's scheduler decides when calls
        happen). Messages in flight on the dead-letter queue stay. A moved message keeps its MessageId, body,
        attributes, group and deduplication ids, joins the end of its group with a new SequenceNumber and a
        receive count of zero, and is not deduplicated: a move is not a send."""
        operation = "StartMessageMoveTask"
        dlq = self.by_arn.get(SourceArn)
        if dlq is None:
            raise errors.modelled(
                "ResourceNotFoundException",
                "The resource that you specified for the SourceArn parameter doesn't exist.",
                operation,
            )
        sources = self._sources_of(dlq)
        if not sources:
            raise errors.invalid_parameter(
                "SourceArn", SourceArn, "Source queue must be configured as a Dead Letter Queue.", operation
            )
        destination = self.by_arn.get(DestinationArn) if DestinationArn else None
        if DestinationArn and destination is None:
            raise errors.modelled(
                "ResourceNotFoundException",
                "The resource that you specified for the DestinationArn parameter doesn't exist.",
                operation,
            )
        now = self.now()
        dlq.expire(now)
        moving = sorted(
            (m for m in dlq.all_messages() if m.state(now) is not MessageState.IN_FLIGHT),
            key=lambda m: m.enqueued_at,
        )
        for message in moving:
            target = destination or self.by_arn.get(message.source_arn or "") or sources[0]
            dlq.remove(message)
            self._rejoin(target, message, now)
        handle = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        task: dict[str, Any] = {
            "TaskHandle": handle,
            "Status": "COMPLETED",
            "SourceArn": SourceArn,
            "ApproximateNumberOfMessagesMoved": len(moving),
            "ApproximateNumberOfMessagesToMove": len(moving),
            "StartedTimestamp": int(now * 1000),
        }
        if DestinationArn:
            task["DestinationArn"] = DestinationArn
        if MaxNumberOfMessagesPerSecond is not None:
            task["MaxNumberOfMessagesPerSecond"] = MaxNumberOfMessagesPerSecond
        self.move_tasks.append(task)
        return ok(TaskHandle=handle)

    @staticmethod
    def _rejoin(queue: SimQueue, message: SimMessage, now: float) -> None:
        message.sequence_number = queue.next_sequence_number()
        message.receive_count = 0
        message.first_received_at = None
        message.receipt_handle = None
        message.enqueued_at = now
        message.visible_at = now + queue.setting("DelaySeconds")
        message.source_arn = None
        queue.append(message)

    def list_message_move_tasks(self, *, SourceArn: str, MaxResults: int = 1) -> dict[str, Any]:
        """The latest move tasks of `SourceArn`, newest first."""
        tasks = [dict(task) for task in reversed(self.move_tasks) if task["SourceArn"] == SourceArn]
        return ok(Results=tasks[:MaxResults])
