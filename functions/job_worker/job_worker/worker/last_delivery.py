"""Redelivery near the queue's limit: a failed record that the queue would dead-letter next is parked and its
workspace halted when its own run failed, so the queue never hands out the next job of the workspace as if nothing
was missing; a record that never got its turn is handed back for long instead, never parked into a halt."""

from __future__ import annotations

from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from job_worker.worker.drain import Draining
from job_worker.worker.records import is_drain_marker


class LastDeliveryParking(Draining):
    """After a batch: its failed records near their delivery limit, parked (or their workspaces halted) when their own
    run failed, spared otherwise."""

    def _park_last_deliveries(
        self, records: list[SQSRecord], failures: set[str], failed_runs: frozenset[str]
    ) -> tuple[set[str], frozenset[str]]:
        """A failed record near its last delivery would be dead-lettered by the queue, and the queue would then hand out
        the next job of its workspace as if nothing was missing. When its job ran here and failed (`failed_runs`), park
        it and halt its workspace instead.

        A record that never got its turn (behind a failed record of its group, handed back for the invocation's time or
        a lease held elsewhere, or left by an invocation that died, on earlier receives) did nothing to halt its
        workspace for. It is parked only behind a halt its workspace already has; otherwise it is spared: handed back
        for long (`Redelivery._spared_seconds`), so its last receives come after what took its turns has passed. If the
        queue dead-letters it all the same, the next job of its workspace finds it unsettled ahead of it and is parked
        behind it (`JobRunning._parked_behind_missing_jobs`): the order holds.

        "Near" leaves LAST_DELIVERIES receives, so an invocation that crashes or times out on one of them (and so never
        gets here) still leaves another chance before the queue's redrive. A record whose own run failed but cannot be
        parked (its job is leased elsewhere, or was accepted with another payload) still halts its workspace, and is
        left to the queue. Returns the records settled here (parked, or rejected) and the ones spared.
        """
        parked: set[str] = set()
        spared: set[str] = set()
        for record in records:
            receives = int(record.attributes.approximate_receive_count)
            if record.message_id not in failures or not self.services.settings.near_delivery_limit(receives):
                continue
            try:
                if is_drain_marker(record):
                    # A marker is never rejected or parked: a fresh one takes its place (with its receive count
                    # reset) and this one is acknowledged, so the queue never dead-letters a resume's drain.
                    marker = self._drain_marker(record)
                    if marker is not None:
                        self._send_next_marker(marker)
                    parked.add(record.message_id)
                    continue
                # Not resolved: a pointer whose object S3 keeps refusing must still be parked, not dead-lettered.
                message = self._parse_or_reject(record, resolve_payload_ref=False)
                if message is None:
                    parked.add(record.message_id)  # rejected and halted, or refused: acknowledged
                    continue
                with self._log_keys(jobId=message.job_id, workspaceId=message.workspace_id):
                    reason = f"delivery limit near ({receives} receives) before the job could finish"
                    # A workspace already HALTED or RESUMING parks the record like any other of its records: a halt
                    # would end a resume under way for a record that only waited behind its drain marker. Only an
                    # ACTIVE workspace is halted, and only by a record whose own run failed.
                    if self._park(record, message, reason=reason):
                        parked.add(record.message_id)
                    elif record.message_id not in failed_runs:
                        spared.add(record.message_id)
                        self.logger.info(
                            "near its delivery limit without a failure of its own: handed back for long, not parked",
                            extra={"receives": receives},
                        )
                    elif self._park(record, message, reason=reason, halt=True):
                        parked.add(record.message_id)
                    else:
                        self.services.guard.halt_workspace(
                            message.workspace_id, tenant_id=message.tenant_id, job_id=message.job_id, reason=reason
                        )
                        self.logger.warning("could not park a record near its delivery limit: workspace halted")
                        self._count_halt()
            except Exception:  # never fail the whole batch for one record: it stays reported, the queue retries it
                self.logger.exception("parking near the delivery limit failed", extra={"messageId": record.message_id})
        return parked, frozenset(spared)
