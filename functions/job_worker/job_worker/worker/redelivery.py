"""Redelivery: a record that must come back, and how soon (its visibility, shortened with jittered backoff)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from job_worker.worker.telemetry import Telemetry

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
    from mypy_boto3_sqs.type_defs import ChangeMessageVisibilityBatchRequestEntryTypeDef

    from agent_jobs.guard import Item


class RetryLaterError(Exception):
    """The record must come back: report it (and the rest of its group) in batchItemFailures."""

    def __init__(self, reason: str, delay_seconds: int) -> None:
        super().__init__(reason)
        self.delay_seconds = delay_seconds


class RunFailedError(RetryLaterError):
    """The job ran here and failed for a reason of its own (its handler raised, the failure recorded; or its own
    payload object could not be read): the only failure for which its record is parked, and its workspace halted, near
    the queue's delivery limit (`worker.last_delivery`). A record handed back for anything else (its group stopped,
    the invocation's time ran out, its tenant's share, a lease held elsewhere) never got its turn."""


class SuspectError(RetryLaterError):
    """The job's last claim died with a shared invocation: run it (and the rest of its group) alone, later in this
    invocation (`worker.batch.BatchWorker.handle`)."""

    def __init__(self, previous: Item) -> None:
        super().__init__("its last claim died with a shared invocation: run it alone", 0)
        self.shared_loss = bool(previous.get("leaseShared"))


class Redelivery(Telemetry):
    """The backoff of failed records: the rest of a failed record's group comes back with it."""

    def _back_off(
        self,
        records: list[SQSRecord],
        failures: set[str],
        delays: dict[str, int],
        spared: frozenset[str] = frozenset(),
    ) -> None:
        """Shorten the visibility of failed records and of the rest of their group (else they wait 6x Timeout). A
        group with a `spared` record (near its delivery limit without a failure of its own) comes back after
        `_spared_seconds` instead: the whole group, since a message of a group in flight holds back the rest of it."""
        spared_groups = {r.attributes.message_group_id or "" for r in records if r.message_id in spared}
        group_delay: dict[str, int] = {}
        entries: list[ChangeMessageVisibilityBatchRequestEntryTypeDef] = []
        for record in records:
            if record.message_id not in failures:
                continue
            group = record.attributes.message_group_id or ""
            delay = delays.get(record.message_id, group_delay.get(group, self._backoff_seconds(record)))
            if group in spared_groups:
                delay = max(delay, self._spared_seconds())
            group_delay.setdefault(group, delay)
            entries.append(
                {
                    "Id": str(len(entries)),
                    "ReceiptHandle": record.receipt_handle,
                    "VisibilityTimeout": group_delay[group],
                }
            )
        if not entries:
            return
        try:
            response = self.services.sqs.change_message_visibility_batch(
                QueueUrl=self.services.settings.queue_url,
                Entries=entries,
            )
        except Exception as error:  # backoff is an optimisation: the queue's visibility timeout still applies
            self.logger.warning("could not shorten visibility of failed records", extra={"error": repr(error)})
            return
        if response.get("Failed"):
            self.logger.warning("some visibility changes failed", extra={"failed": response["Failed"]})

    def _backoff_seconds(self, record: SQSRecord) -> int:
        settings = self.services.settings
        receives = max(1, int(record.attributes.approximate_receive_count))
        bound = min(settings.backoff_max_seconds, settings.backoff_base_seconds * 2 ** (receives - 1))
        return self._jittered(bound)

    def _spared_seconds(self) -> int:
        """How long a record near its delivery limit that never got its turn is handed back for: the longest backoff,
        so that what took its turns (a job killing the invocations of its batches, a backlog of long jobs ahead of it,
        the invocation's time) passes before its last receives do."""
        return int(self.services.settings.backoff_max_seconds)

    def _deferral_seconds(self, record: SQSRecord) -> int:
        """How long a record deferred over its tenant's share is handed back for: a backoff growing faster than a
        retry's (`Settings.deferral_backoff_bound`), so the few receives a deferral may spend hold it back longer."""
        receives = max(1, int(record.attributes.approximate_receive_count))
        return self._jittered(self.services.settings.deferral_backoff_bound(receives))

    def _jittered(self, bound: float) -> int:
        """Between half of `bound` and `bound`, in whole seconds (SQS visibility), never 0 for a nonzero bound: a
        record handed back for 0 s is received again at once, spending a receive for nothing."""
        if bound <= 0:
            return 0
        return max(1, round(self.jitter(bound)))
