"""Batch and message groups: one SQS batch, its message groups at once on a bounded pool (each group's records in
order under Powertools' FIFO partial processing), suspects run alone after them, and the failures reported in the
event's order after parking near the delivery limit (the records whose own run failed) and backoff."""

from __future__ import annotations

import contextvars
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import SqsFifoPartialProcessor, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from job_worker.worker.last_delivery import LastDeliveryParking
from job_worker.worker.records import is_drain_marker
from job_worker.worker.redelivery import RetryLaterError, RunFailedError, SuspectError
from job_worker.worker.running import running_alone
from job_worker.worker.shares import ShareDeferral, ShareGate

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

    from agent_jobs.models import JobMessage


class BatchWorker(LastDeliveryParking):
    """One per process; `handle` runs one SQS batch."""

    # This invocation's tenant shares (set by `handle`; None: no shares, or no batch yet).
    _share_gate: ShareGate | None = None

    def handle(self, event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
        self._invocation_ms = context.get_remaining_time_in_millis()
        raw_records: list[dict[str, Any]] = event.get("Records") or []
        if not raw_records:
            return {"batchItemFailures": []}
        self._share_gate = self._new_share_gate(context)
        settings = self.services.settings
        # Groups a deferral would cost a retry (or a dead-letter): they run even over their tenant's share.
        self._groups_never_deferred = {
            str(raw.get("attributes", {}).get("MessageGroupId") or "")
            for raw in raw_records
            if not settings.deferrable(int(raw.get("attributes", {}).get("ApproximateReceiveCount") or 1))
        }
        deferred: dict[str, str] = {}  # group -> tenant, of the groups deferred (each written from its own thread)
        self._deferred_groups = deferred
        delays: dict[str, int] = {}  # each record's own key: written from one group's thread only
        # The records whose job ran here and failed for a reason of its own (each added from its group's thread).
        self._failed_runs: set[str] = set()
        groups: dict[str, list[dict[str, Any]]] = {}
        for raw in raw_records:
            groups.setdefault(str(raw.get("attributes", {}).get("MessageGroupId") or ""), []).append(raw)
        concurrency = min(self.services.settings.group_concurrency, len(groups))
        suspects: dict[str, SuspectError] = {}  # each record's own key: written from one group's thread only
        if concurrency <= 1:
            failures = self._process_group(raw_records, delays, context, suspects)  # alone: no suspect comes back
        else:
            failures = self._process_groups_concurrently(list(groups.values()), concurrency, delays, context, suspects)
            failures = self._run_suspects_alone(list(groups.values()), failures, suspects, delays, context)
        self._emit_shares_in_use()
        if not failures:
            return {"batchItemFailures": []}
        records = [SQSRecord(raw) for raw in raw_records]
        parked, spared = self._park_last_deliveries(records, failures, frozenset(self._failed_runs & failures))
        failures -= parked
        self._back_off(records, failures, delays, spared)
        retried = self._count_deferred(records, failures, deferred)
        if retried:
            self.metrics.add_metric(name="RecordsRetried", unit=MetricUnit.Count, value=retried)
        # In the event's order, whichever group finished first.
        return {"batchItemFailures": [{"itemIdentifier": r.message_id} for r in records if r.message_id in failures]}

    def _process_groups_concurrently(
        self,
        groups: list[list[dict[str, Any]]],
        concurrency: int,
        delays: dict[str, int],
        context: LambdaContext,
        suspects: dict[str, SuspectError],
    ) -> set[str]:
        """Each message group's records on a thread of a bounded pool, in order within the group; the groups share
        nothing but the worker (its clients, guard, logger and metrics are safe to share; see `_emit`, `_log_keys`).

        Every group runs in its own copy of this thread's context variables (the logger's per-job keys live there,
        so a pool thread never carries one job's keys into the next) and under this invocation's trace entity.
        """
        parent = self._trace_entity()

        def run(records: list[dict[str, Any]]) -> set[str]:
            running_alone.set(False)  # in this group's own copy of the context
            if parent is None:
                return self._process_group(records, delays, context, suspects)
            provider = self.tracer.provider
            provider.set_trace_entity(parent)  # type: ignore[attr-defined]  # the X-Ray recorder
            try:
                return self._process_group(records, delays, context, suspects)
            finally:
                provider.clear_trace_entities()  # type: ignore[attr-defined]

        failures: set[str] = set()
        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="job-group") as pool:
            futures = [pool.submit(contextvars.copy_context().run, run, records) for records in groups]
            for future in futures:
                failures |= future.result()
        return failures

    def _run_suspects_alone(
        self,
        groups: list[list[dict[str, Any]]],
        failures: set[str],
        suspects: dict[str, SuspectError],
        delays: dict[str, int],
        context: LambdaContext,
    ) -> set[str]:
        """After the groups ran at once: each group stopped at a SUSPECT record runs again from that record, alone
        (nothing else of this invocation in flight), one group at a time. Those whose last claim only shared a dead
        invocation go first, then the ones nearer their delivery limit: the culprit, whose claims died alone, goes
        last, so when it kills this invocation too it takes no other job's claim with it."""
        waiting: list[tuple[tuple[int, int, int], list[dict[str, Any]]]] = []
        for position, records in enumerate(groups):
            for index, raw in enumerate(records):
                suspect = suspects.get(str(raw.get("messageId")))
                if suspect is None:
                    continue
                receives = int(raw.get("attributes", {}).get("ApproximateReceiveCount") or 1)
                waiting.append(((0 if suspect.shared_loss else 1, -receives, position), records[index:]))
                break
        for _, records in sorted(waiting, key=lambda entry: entry[0]):
            ids = {str(raw.get("messageId")) for raw in records}
            for message_id in ids:
                delays.pop(message_id, None)
            self.logger.info("running a suspect job alone", extra={"messageId": records[0].get("messageId")})
            failures = (failures - ids) | self._process_group(records, delays, context, suspects)
        return failures

    def _process_group(
        self,
        records: list[dict[str, Any]],
        delays: dict[str, int],
        context: LambdaContext,
        suspects: dict[str, SuspectError],
    ) -> set[str]:
        """The failed message ids of `records` (one group's, or a whole batch run sequentially): Powertools' FIFO
        partial processing, where a failure skips the rest of its own group and other groups go on."""
        processor = SqsFifoPartialProcessor(skip_group_on_error=True)
        # A batch whose every record must come back is still a normal answer (the records are listed, their
        # visibility shortened); raising would skip the backoff and make Lambda retry the batch blindly.
        processor.raise_on_entire_batch_failure = False

        def record_handler(record: SQSRecord, lambda_context: LambdaContext) -> None:
            try:
                self.process_record(record, lambda_context)
            except SuspectError as suspect:
                suspects[record.message_id] = suspect
                raise
            except RetryLaterError as retry:
                delays[record.message_id] = retry.delay_seconds
                if isinstance(retry, RunFailedError):
                    self._failed_runs.add(record.message_id)
                raise
            except Exception as error:
                self._report_failed_record(record, error)
                raise

        response = process_partial_response(
            event={"Records": records}, record_handler=record_handler, processor=processor, context=context
        )
        return {str(failure["itemIdentifier"]) for failure in response["batchItemFailures"]}

    # ---- one record ----------------------------------------------------------------------------------------------

    def process_record(self, record: SQSRecord, context: LambdaContext) -> None:
        settings = self.services.settings
        if context.get_remaining_time_in_millis() < settings.time_safety_margin_ms:
            raise RetryLaterError("not enough time left in this invocation to start a job", 0)
        if is_drain_marker(record):
            marker = self._drain_marker(record)
            if marker is not None:
                with self._log_keys(workspaceId=marker.workspace_id, resumeId=marker.resume_id):
                    self._drain(record, marker, context)
            return
        message = self._parse_or_reject(record)
        if message is None:
            return
        with (
            self._log_keys(
                jobId=message.job_id,
                workspaceId=message.workspace_id,
                tenantId=message.tenant_id,
                type=str(message.type),
            ),
            self._traced(message),
        ):
            self._defer_over_share(record, message)  # its log lines name the job, as the claim's do
            self._claim_and_run(record, message, context)

    # ---- tenant shares -------------------------------------------------------------------------------------------

    def _new_share_gate(self, context: LambdaContext) -> ShareGate | None:
        shares = self.services.tenant_shares
        if shares is None:
            return None
        invocation_id = getattr(context, "aws_request_id", None) or uuid.uuid4().hex
        return ShareGate(shares, self._running_invocations, invocation_id=str(invocation_id))

    def _running_invocations(self, tenant_id: str, limit: int) -> set[str]:
        return self.services.guard.running_invocations(tenant_id, limit=limit)

    def _defer_over_share(self, record: SQSRecord, message: JobMessage) -> None:
        """Raise ShareDeferral when the job's tenant runs in as many other invocations as its share (once decided
        for a tenant, the decision stands for the whole batch); a group with a record that has no delivery to spare
        (`Settings.deferrable`) always runs. A share that cannot be checked (DynamoDB throttled or unreachable) lets
        the records run: the share is fairness, not safety."""
        gate = self._share_gate
        if gate is None or message.tenant_id is None:
            return
        try:
            decision = gate.decide(str(message.tenant_id))
        except Exception as error:  # the share check's reads failed: fail open, say so
            self.logger.warning("tenant share not checked: the records run", extra={"error": repr(error)})
            self._emit("TenantShareUnchecked", MetricUnit.Count, 1, dimensions={})
            gate.admit(str(message.tenant_id))
            return
        if decision.admitted:
            return
        group = record.attributes.message_group_id or ""
        if group in self._groups_never_deferred:
            # Deferred again, its job would lose a retry to the queue's redrive: it runs over the share, and says so.
            self.logger.warning(
                "tenant at its share, but its record has no delivery to spare for a deferral: it runs",
                extra={"inUse": decision.in_use, "share": decision.share},
            )
            self._emit("RecordsOverShare", MetricUnit.Count, 1, dimensions={"TenantId": str(message.tenant_id)})
            return
        self._deferred_groups[group] = str(message.tenant_id)
        delay = self._deferral_seconds(record)
        self.logger.info(
            "tenant at its share of the worker: deferred",
            extra={"inUse": decision.in_use, "share": decision.share, "deferredSeconds": delay},
        )
        raise ShareDeferral(str(message.tenant_id), decision.in_use, decision.share, delay)

    def _running_invocation_id(self, message: JobMessage) -> str | None:
        """This invocation's id for a claim of the job, when its tenant has a share (it then counts against it)."""
        gate = self._share_gate
        if gate is None or message.tenant_id is None:
            return None
        decision = gate.decided(str(message.tenant_id))
        return gate.invocation_id if decision is not None and decision.share > 0 else None

    def _count_deferred(self, records: list[SQSRecord], failures: set[str], deferred: dict[str, str]) -> int:
        """Emit RecordsDeferred per tenant (the records of deferred groups: they wait, nothing failed); return how many
        other records are retried."""
        per_tenant: dict[str, int] = {}
        retried = 0
        for record in records:
            if record.message_id not in failures:
                continue
            tenant = deferred.get(record.attributes.message_group_id or "")
            if tenant is None:
                retried += 1
            else:
                per_tenant[tenant] = per_tenant.get(tenant, 0) + 1
        for tenant, count in sorted(per_tenant.items()):
            self._emit("RecordsDeferred", MetricUnit.Count, count, dimensions={"TenantId": tenant})
        return retried

    def _emit_shares_in_use(self) -> None:
        """TenantShareInUse for each tenant with a share that this invocation decided on: the invocations running its
        jobs, this one included when it ran them."""
        gate = self._share_gate
        for tenant, decision in sorted((gate.decisions() if gate else {}).items()):
            if decision.share > 0:
                in_use = decision.in_use + (1 if decision.admitted else 0)
                self._emit("TenantShareInUse", MetricUnit.Count, in_use, dimensions={"TenantId": tenant})
