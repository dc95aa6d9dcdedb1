"""The worker's batch logic (see `worker`): the SQS batch handler `BatchWorker`, the names its users import."""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import SqsFifoPartialProcessor, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from agent_jobs.guard import ClaimOutcome, FailOutcome, Item, Lease
from agent_jobs.keys import parked_sequence, workspace_group_id
from agent_jobs.models import DrainMarker, JobMessage, JobStatus, PayloadUnavailableError, WorkspaceState
from agent_jobs.resume import send_drain_marker
from jobs import run_job
from jobs.context import JobContext
from jobs.errors import PermanentJobError
from jobs.registered import RegisteredWorkspaceStore
from worker.records import RecordParsing, describe_invalid, is_drain_marker, parse_job_message
from worker.redelivery import RetryLaterError, SuspectError
from worker.telemetry import JOB_TYPE_DIMENSION, UNKNOWN_JOB_TYPE, WORKSPACES_HALTED, failure_cause

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

    from jobs.sandbox import TestSandbox

__all__ = [
    "JOB_TYPE_DIMENSION",
    "UNKNOWN_JOB_TYPE",
    "WORKSPACES_HALTED",
    "BatchWorker",
    "RetryLaterError",
    "SuspectError",
    "failure_cause",
    "parse_job_message",
]

# False while the groups of a batch run at once: a claim then never takes over a lease whose worker never came back.
_running_alone: contextvars.ContextVar[bool] = contextvars.ContextVar("running_alone", default=True)


class BatchWorker(RecordParsing):
    """One per process; `handle` runs one SQS batch."""

    def handle(self, event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
        self._invocation_ms = context.get_remaining_time_in_millis()
        raw_records: list[dict[str, Any]] = event.get("Records") or []
        if not raw_records:
            return {"batchItemFailures": []}
        delays: dict[str, int] = {}  # each record's own key: written from one group's thread only
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
        if not failures:
            return {"batchItemFailures": []}
        records = [SQSRecord(raw) for raw in raw_records]
        failures -= self._park_last_deliveries(records, failures)
        self._back_off(records, failures, delays)
        if failures:
            self.metrics.add_metric(name="RecordsRetried", unit=MetricUnit.Count, value=len(failures))
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
            _running_alone.set(False)  # in this group's own copy of the context
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
            self._claim_and_run(record, message, context)

    def _claim_and_run(self, record: SQSRecord, message: JobMessage, context: LambdaContext) -> None:
        guard = self.services.guard
        body = self._storable_body(record, message)
        claim = guard.claim(
            message,
            message_id=record.message_id,
            sequence_number=record.attributes.sequence_number,
            remaining_ms=context.get_remaining_time_in_millis(),
            body=body,
            near_delivery_limit=self.services.settings.near_delivery_limit(
                int(record.attributes.approximate_receive_count)
            ),
            alone=_running_alone.get(),
        )
        outcome = claim.outcome
        if outcome is ClaimOutcome.SUSPECT:
            self.logger.info("the job's last claim died with a shared invocation: it runs alone after the others")
            raise SuspectError(claim.previous or {})
        job_type = str(message.type)
        if outcome is ClaimOutcome.DUPLICATE:
            self.logger.info("duplicate delivery of a job that already took effect: acknowledged")
            self._count("JobsDuplicate", job_type)
            return
        if outcome is ClaimOutcome.BUSY:
            lease_left_ms = int((claim.previous or {}).get("leaseExpiresAt", 0)) - guard.now()
            self.logger.info("job is leased by another worker: retry after its lease")
            raise RetryLaterError("leased by another worker", max(1, lease_left_ms // 1000 + 1))
        if outcome is ClaimOutcome.WORKSPACE_HALTED:
            if not self._park(record, message, reason="workspace halted"):
                # The workspace became ACTIVE between the claim and the park (or the job changed): claim it again.
                raise RetryLaterError("could not park: claim again", 0)
            return
        if outcome in (ClaimOutcome.SETTLED, ClaimOutcome.CONFLICT, ClaimOutcome.EXHAUSTED):
            previous_status = (claim.previous or {}).get("status")
            self.logger.warning(f"job not run: {outcome}", extra={"previousStatus": previous_status})
            self._count({"EXHAUSTED": "JobsDead", "CONFLICT": "JobsConflict"}.get(outcome, "JobsSettled"), job_type)
            if outcome is ClaimOutcome.EXHAUSTED:
                self._count_halt()
            return
        if outcome is ClaimOutcome.CONTENDED or claim.lease is None:
            raise RetryLaterError("claim contended", 1)
        if self._parked_behind_missing_jobs(record, message, claim.lease):
            return

        self._run_leased(
            claim.lease,
            message,
            context,
            body=body,
            backoff_seconds=lambda: self._backoff_seconds(record),
            message_id=record.message_id,
            sequence_number=record.attributes.sequence_number,
        )

    def _parked_behind_missing_jobs(self, record: SQSRecord, message: JobMessage, lease: Lease) -> bool:
        """True if jobs the workspace accepted ahead of this one left the queue unsettled: this job, just claimed, is
        parked behind them and the workspace halted naming them (a resume runs it after they were redriven and
        retried, or skipped). Checked after the claim, so a duplicate delivery still costs one write and no read."""
        missing = self.services.guard.missing_predecessors(
            message.workspace_id,
            tenant_id=str(message.tenant_id),
            job_id=message.job_id,
            sequence_number=record.attributes.sequence_number,
        )
        if not missing:
            return False
        missing_ids = [str(item.get("jobId")) for item in missing]
        self.logger.error(
            "jobs accepted ahead of this one never took effect: workspace halted", extra={"missingJobIds": missing_ids}
        )
        reason = f"jobs ahead of it never took effect: {', '.join(missing_ids)}"
        if not self._park(record, message, reason=reason, lease=lease, missing=missing):
            raise RetryLaterError("lease lost before the job could be parked", 1)
        return True

    def _run_leased(
        self,
        lease: Lease,
        message: JobMessage,
        context: LambdaContext,
        *,
        body: str,
        backoff_seconds: Callable[[], int],
        message_id: str | None,
        sequence_number: str | None,
    ) -> bool:
        """Run a claimed job and record its outcome: True if it SUCCEEDED, False if it ended DEAD (workspace halted).
        A retryable failure raises RetryLaterError (the job is FAILED, or PARKED again when a drain claimed it)."""
        guard = self.services.guard
        job_type = str(message.type)
        started = time.monotonic()
        try:
            result = run_job(message.request(), self._job_context(message.workspace_id, context))
        except (PermanentJobError, PayloadUnavailableError) as error:
            if guard.fail(lease, str(error), permanent=True, body=body) is not FailOutcome.DEAD:
                self.logger.info("lease lost before the permanent failure was recorded; leaving the job to its owner")
                raise RetryLaterError("lease lost", 1) from error
            self.logger.error("job failed permanently: DEAD, workspace halted", extra={"error": str(error)})
            self._count("JobsDead", job_type)
            self._count_halt()
            return False
        except Exception as error:
            self.logger.warning("job failed, will retry", extra={"error": repr(error)})
            self._count("JobsFailed", job_type)
            failed = guard.fail(lease, f"{type(error).__name__}: {error}", body=body)
            if failed is FailOutcome.DEAD:
                self.logger.error("attempts exhausted: DEAD, workspace halted")
                self._count("JobsDead", job_type)
                self._count_halt()
                return False
            raise RetryLaterError(str(error), backoff_seconds()) from error
        if not guard.complete(lease, result):
            # Another worker took the job over after our lease expired; its outcome stands, not ours.
            self.logger.info("lease lost before completion; leaving the job to its new owner")
            raise RetryLaterError("lease lost", 1)
        self.logger.info("job succeeded", extra={"messageId": message_id, "sequenceNumber": sequence_number})
        self._count("JobsSucceeded", job_type)
        self._emit("JobDuration", MetricUnit.Milliseconds, (time.monotonic() - started) * 1000, job_type=job_type)
        return True

    def _job_context(self, workspace_id: str, context: LambdaContext) -> JobContext:
        """The handler's view of its workspace; for a registered git workspace also its registration and token.
        (An unregistered workspace raises PermanentJobError here: the job ends DEAD with what to do.)"""
        workspaces = self.workspaces
        job_context = JobContext(
            workspace=workspaces.open(workspace_id),
            remaining_ms=context.get_remaining_time_in_millis,
            safety_margin_ms=self.services.settings.time_safety_margin_ms,
            invocation_ms=self._invocation_ms,
            test_sandbox=self._test_sandbox,
        )
        if isinstance(workspaces, RegisteredWorkspaceStore):
            return replace(
                job_context,
                registration=workspaces.registration(workspace_id),
                token=lambda: workspaces.token(workspace_id),
                check_host=workspaces.check_host,
            )
        return job_context

    def _test_sandbox(self) -> TestSandbox | None:
        from jobs.sandbox import TestSandbox  # the first run_tests job loads it, not the cold start

        return TestSandbox.from_services(self.services)

    def _park(
        self,
        record: SQSRecord,
        message: JobMessage,
        *,
        reason: str,
        halt: bool = False,
        lease: Lease | None = None,
        missing: list[Item] | None = None,
    ) -> bool:
        parked = self.services.guard.park(
            message,
            message_id=record.message_id,
            sequence_number=record.attributes.sequence_number,
            body=self._storable_body(record, message),
            reason=reason,
            halt_workspace=halt,
            lease=lease,
            missing=missing or (),
        )
        if parked:
            self.logger.warning(f"job parked: {reason}")
            self._count("JobsParked", str(message.type))
            if halt or missing:
                self._count_halt()
        return parked

    # ---- resume: drain markers ------------------------------------------------------------------------------------

    def _drain(self, record: SQSRecord, marker: DrainMarker, context: LambdaContext) -> None:
        """Run the PARKED jobs of the marker's workspace in SequenceNumber order, at most `drain_jobs_per_marker`
        and within the invocation's time budget; then send the next marker, or make the workspace ACTIVE when none
        is left. A stale marker (another resume, or the workspace not RESUMING) is acknowledged without effect."""
        guard, settings = self.services.guard, self.services.settings
        workspace_id, budget = marker.workspace_id, settings.drain_jobs_per_marker
        drained = 0
        for _ in range(budget * 3 + 3):  # each pass drains a job, releases a finished one or re-reads; never spins
            workspace = guard.get_workspace(workspace_id)
            if (
                workspace is None
                or workspace.get("state") != WorkspaceState.RESUMING
                or workspace.get("resumeId") != marker.resume_id
            ):
                self.logger.info("stale drain marker: acknowledged", extra={"state": (workspace or {}).get("state")})
                self._count("DrainMarkersStale")
                return
            cursor = workspace.get("drainingJobId")
            if cursor:
                # A drained job not released yet: a drain that never came back, or one that finished but crashed
                # before releasing it. Finish that one first: nothing after it may run before it.
                job = guard.get_job(str(workspace.get("tenantId", "")), str(cursor))
                if job is not None and job.get("status") == JobStatus.IN_FLIGHT:
                    if not self._drain_job(record, marker, job, context, reclaim=True):
                        return
                    drained += 1
                    continue
                if job is not None and job.get("status") in (JobStatus.DEAD, JobStatus.REJECTED):
                    # It ended DEAD while another halt was on record (first halt wins), and this resume decided that
                    # other job: it is undecided, and nothing behind it may run (I3). Halt by it for the operator.
                    guard.halt_workspace(
                        workspace_id,
                        tenant_id=job.get("tenantId"),
                        job_id=str(cursor),
                        reason=f"job {cursor} is {job.get('status')}: {job.get('error') or 'no recorded reason'}",
                    )
                    self.logger.error("drained job is DEAD and undecided: workspace halted by it")
                    self._count_halt()
                    return
                finished = job is not None and job.get("status") in (JobStatus.SUCCEEDED, JobStatus.SKIPPED)
                seq = parked_sequence(job.get("sequenceNumber"), 0) if finished and job else None
                guard.release_drain(workspace_id, str(cursor), drained_seq=seq)
                continue
            expected = int(workspace.get("parkedCount", 0))
            if expected <= 0:
                # Nothing parked (the strongly consistent count, not the index, says so): ACTIVE, conditionally.
                if guard.activate(workspace_id, marker.resume_id):
                    self.logger.info("workspace resumed: ACTIVE")
                    self._count("WorkspacesResumed")
                    return
                raise RetryLaterError("workspace could not be made ACTIVE yet", settings.drain_lag_retry_seconds)
            if drained >= budget or self._time_is_short(context):
                self._send_next_marker(marker)
                return
            parked = guard.list_parked(workspace_id, after_seq=workspace.get("lastDrainedSeq"), expected=expected)
            if not parked:
                self.logger.info("parked index lags behind parkedCount: drain later", extra={"parkedCount": expected})
                raise RetryLaterError("parked index lagging", settings.drain_lag_retry_seconds)
            for job in parked[: budget - drained]:
                if self._time_is_short(context):
                    break
                if not self._drain_job(record, marker, job, context, reclaim=False):
                    return
                drained += 1
        self._send_next_marker(marker)

    def _drain_job(
        self, record: SQSRecord, marker: DrainMarker, job: Item, context: LambdaContext, *, reclaim: bool
    ) -> bool:
        """Claim and run one parked job of a drain. True: it SUCCEEDED, go on. False: stop draining and acknowledge
        the marker (the job ended DEAD and halted the workspace again). RetryLaterError: the marker comes back (the
        job is PARKED again, or the index or a lease says later)."""
        guard, settings = self.services.guard, self.services.settings
        job_id = str(job.get("jobId"))
        if "body" not in job:
            # An entry of the parked index (keys only): the job itself, read consistently, carries the body.
            job = guard.get_job(str(job.get("tenantId", "")), job_id) or job
        with self._log_keys(jobId=job_id, type=job.get("type")):
            claim = guard.claim_parked(
                job,
                resume_id=marker.resume_id,
                remaining_ms=context.get_remaining_time_in_millis(),
                reclaim=reclaim,
            )
            if claim.outcome is ClaimOutcome.EXHAUSTED:
                self.logger.error("drained job used up its attempts: DEAD, workspace halted")
                self._count("JobsDead")
                return False
            if claim.outcome is ClaimOutcome.BUSY:
                lease_left_ms = int((claim.previous or {}).get("leaseExpiresAt", 0)) - guard.now()
                raise RetryLaterError("drained job leased by another worker", max(1, lease_left_ms // 1000 + 1))
            if claim.outcome is ClaimOutcome.SETTLED:
                # The index showed a job that is no longer PARKED: it lags; read it again a little later.
                raise RetryLaterError("parked index lagging", settings.drain_lag_retry_seconds)
            if claim.outcome is not ClaimOutcome.CLAIMED or claim.lease is None:
                # The workspace changed (halted, another resume) or a transaction collided: read it again.
                raise RetryLaterError("drain claim lost", 1)
            lease = claim.lease
            body = str(job.get("body") or "")
            try:
                message = parse_job_message(body, workspace_group_id(marker.workspace_id))
                if message.job_id != job_id:
                    raise ValueError(f"the stored message is job {message.job_id!r}, not {job_id!r}")
            except Exception as error:  # a stored body that no longer parses cannot run: DEAD, for the operator
                reason = f"stored message of a parked job cannot be run: {describe_invalid(error)}"
                guard.fail(lease, reason, permanent=True, body=body)
                self.logger.error("parked job's message is invalid: DEAD, workspace halted", extra={"error": reason})
                self._count("JobsDead")
                return False
            try:
                message = self._resolve_payload(message, lambda: settings.drain_lag_retry_seconds)
            except RetryLaterError:
                guard.fail(lease, "payload object not readable yet", body=body)  # back to PARKED, in its place
                raise
            succeeded = self._run_leased(
                lease,
                message,
                context,
                body=body,
                backoff_seconds=lambda: self._backoff_seconds(record),
                message_id=job.get("messageId"),
                sequence_number=job.get("sequenceNumber"),
            )
            if not succeeded:
                return False
            guard.release_drain(marker.workspace_id, job_id, drained_seq=lease.parked_seq)
            self._count("JobsDrained")
            return True

    def _send_next_marker(self, marker: DrainMarker) -> None:
        next_marker = marker.model_copy(update={"round": marker.round + 1})
        send_drain_marker(self.services.sqs, self.services.settings.queue_url, next_marker)
        self.logger.info("drain continues with the next marker", extra={"round": next_marker.round})

    def _time_is_short(self, context: LambdaContext) -> bool:
        return context.get_remaining_time_in_millis() < self.services.settings.time_safety_margin_ms

    # ---- after the batch -----------------------------------------------------------------------------------------

    def _park_last_deliveries(self, records: list[SQSRecord], failures: set[str]) -> set[str]:
        """A failed record near its last delivery would be dead-lettered by the queue, and the queue would then hand out
        the next job of its workspace as if nothing was missing. Park it and halt its workspace instead.

        "Near" leaves LAST_DELIVERIES receives, so an invocation that crashes or times out on one of them (and so never
        gets here) still leaves another chance before the queue's redrive. A record that cannot be parked (its job is
        leased elsewhere, or was accepted with another payload) still halts its workspace, and is left to the queue.
        """
        parked: set[str] = set()
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
                    parked.add(record.message_id)  # rejected and halted: acknowledged
                    continue
                with self._log_keys(jobId=message.job_id, workspaceId=message.workspace_id):
                    reason = f"delivery limit near ({receives} receives) before the job could finish"
                    # A workspace already HALTED or RESUMING parks the record like any other of its records: a halt
                    # would end a resume under way for a record that only waited behind its drain marker. Only an
                    # ACTIVE workspace is halted by it.
                    if self._park(record, message, reason=reason) or self._park(
                        record, message, reason=reason, halt=True
                    ):
                        parked.add(record.message_id)
                    else:
                        self.services.guard.halt_workspace(
                            message.workspace_id, tenant_id=message.tenant_id, job_id=message.job_id, reason=reason
                        )
                        self.logger.warning("could not park a record near its delivery limit: workspace halted")
                        self._count_halt()
            except Exception:  # never fail the whole batch for one record: it stays reported, the queue retries it
                self.logger.exception("parking near the delivery limit failed", extra={"messageId": record.message_id})
        return parked
