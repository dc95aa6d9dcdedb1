"""The worker's batch logic: FIFO partial-batch semantics per workspace group, on top of the guard.

Per record, in order, per message group: parse and validate (bad → REJECTED + workspace halted, acknowledged);
claim (one conditional write that also checks the workspace is not halted; halted → PARKED, acknowledged); run the
job; complete. A retryable failure stops the rest of its group (Powertools' SqsFifoPartialProcessor with
skip_group_on_error) while other groups go on; the failed record and the rest of its group get a shortened
visibility (backoff) and are reported in batchItemFailures. Nothing is raised out of the handler for one record.

The message groups of one batch run at once, each on a thread of a bounded pool (GROUP_CONCURRENCY; 1 runs the batch
as one sequential loop), each group's records in order under its own SqsFifoPartialProcessor; the failures are merged
and reported in the event's order, and parking near the delivery limit and backoff run after all groups, as before.

An invocation that dies (killed, out of memory, timed out) takes every job it had in flight with it, so a job whose
last claim never came back from a shared invocation is only a suspect: it may have killed it, or another job may
have. Such a job (SUSPECT) and the rest of its group wait until the groups running at once are done, and then run
alone, one group at a time, those that only shared a dead invocation before those that died alone. Only a job that
dies alone is blamed (see `JobGuard.claim`), so a job that kills every invocation never makes the jobs of other
workspaces it shared batches with DEAD.

Once a job is claimed, and before it runs, the worker checks that the jobs its workspace accepted ahead of it are
settled (`JobGuard.missing_predecessors`): if the queue let one of them go unsettled (dead-lettered), this job would
take effect before it, so the workspace is halted naming them and this job is parked behind them.

A drain marker (message attribute type=drain, sent by a resume into the workspace's own group) is recognised before
any job parsing and is never rejected: it runs the workspace's PARKED jobs in SequenceNumber order through the same
claim/run/complete path, a bounded number per marker, then sends the next marker or makes the workspace ACTIVE.
"""

from __future__ import annotations

import contextvars
import json
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.metrics.base import SingleMetric
from aws_lambda_powertools.utilities.batch import SqsFifoPartialProcessor, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError

from agent_jobs.guard import ClaimOutcome, FailOutcome, Item, Lease
from agent_jobs.keys import parked_sequence, workspace_group_id, workspace_id_from_group
from agent_jobs.models import (
    DRAIN_MESSAGE_TYPE,
    ID_PATTERN,
    DrainMarker,
    JobMessage,
    JobStatus,
    JobType,
    PayloadUnavailableError,
    WorkspaceState,
    parse_queue_message,
)
from agent_jobs.payloads import resolve_payload, storable_body
from agent_jobs.resume import send_drain_marker
from agent_jobs.services import Services
from jobs import run_job
from jobs.context import JobContext
from jobs.errors import PermanentJobError
from jobs.registered import RegisteredWorkspaceStore
from jobs.workspace import WorkspaceStore

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext
    from mypy_boto3_sqs.type_defs import ChangeMessageVisibilityBatchRequestEntryTypeDef

    from jobs.sandbox import TestSandbox

# Job-level metrics carry the job's type in this dimension; a rejected message whose type cannot be read counts as
# UNKNOWN_JOB_TYPE (never a value taken from a bad message, which would make a new metric per message).
JOB_TYPE_DIMENSION = "JobType"
UNKNOWN_JOB_TYPE = "unknown"
# One per halt the worker causes (DEAD, REJECTED, parked or halted on a last delivery). Its only dimension is
# Powertools' `service`: template.yaml's WorkspacesHaltedAlarm names exactly that, so keep both sides in step.
WORKSPACES_HALTED = "WorkspacesHalted"


def parse_job_message(body: str, group: str) -> JobMessage:
    """The one parse of a job message body, for a queue record and for a body a resume drains from the table alike.

    Raises (pydantic's ValidationError, ValueError) when the body is not a valid job of the workspace of `group`.
    A large job's payload stays a pointer here; `BatchWorker._resolve_payload` fetches it before the job runs.
    """
    # payloadHash is derived when a direct producer left it out (`parse_queue_message`); a pointer message
    # (payloadRef) is checked against its object when resolved (BatchWorker._resolve_payload).
    message = parse_queue_message(body)
    if group != workspace_group_id(message.workspace_id):
        # Two groups feeding one workspace would let two of its jobs run at once.
        raise ValueError(f"message group {group!r} is not workspace {message.workspace_id!r}'s group")
    return message


class RetryLaterError(Exception):
    """The record must come back: report it (and the rest of its group) in batchItemFailures."""

    def __init__(self, reason: str, delay_seconds: int) -> None:
        super().__init__(reason)
        self.delay_seconds = delay_seconds


class SuspectError(RetryLaterError):
    """The job's last claim died with a shared invocation: run it (and the rest of its group) alone, later in this
    invocation (`BatchWorker.handle`)."""

    def __init__(self, previous: Item) -> None:
        super().__init__("its last claim died with a shared invocation: run it alone", 0)
        self.shared_loss = bool(previous.get("leaseShared"))


# False while the groups of a batch run at once: a claim then never takes over a lease whose worker never came back.
_running_alone: contextvars.ContextVar[bool] = contextvars.ContextVar("running_alone", default=True)


@dataclass
class BatchWorker:
    """One per process; `handle` runs one SQS batch."""

    services: Services
    workspaces: WorkspaceStore
    logger: Logger
    metrics: Metrics
    jitter: Callable[[float], float] = field(default=lambda bound: random.uniform(bound / 2, bound))
    tracer: Tracer = field(default_factory=Tracer)
    _emit_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    # The time the current invocation had when it started (one invocation at a time per environment).
    _invocation_ms: int = field(default=0, init=False, repr=False)

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

    def _trace_entity(self) -> Any:
        """The X-Ray entity open in this thread (the handler's subsegment), for the group threads to attach their
        job subsegments to (X-Ray keeps the current entity per thread); None when tracing is off or there is none."""
        get_entity = getattr(self.tracer.provider, "get_trace_entity", None)
        if self.tracer.disabled or get_entity is None:
            return None
        try:
            return get_entity()
        except Exception:  # no segment to attach to (not in Lambda): the jobs' subsegments are dropped as before
            return None

    def _report_failed_record(self, record: SQSRecord, error: Exception) -> None:
        """An unplanned failure of a record (DynamoDB or SQS unreachable, throttled, a bug): the processor reports
        it failed and the queue brings it back, so it is logged here, with its job and cause, and counted by cause
        (`RecordsFailed<Cause>`); its group stops behind it."""
        cause = failure_cause(error)
        self.logger.error(
            "record failed: it comes back after its visibility timeout",
            extra={
                "jobId": _job_id_if_any(record.body),
                "workspaceId": workspace_id_from_group(record.attributes.message_group_id or ""),
                "messageId": record.message_id,
                "cause": cause,
                "error": f"{type(error).__name__}: {error}"[:1000],
            },
            exc_info=error,
        )
        self._count(f"RecordsFailed{cause}")

    # ---- one record ----------------------------------------------------------------------------------------------

    def process_record(self, record: SQSRecord, context: LambdaContext) -> None:
        settings = self.services.settings
        if context.get_remaining_time_in_millis() < settings.time_safety_margin_ms:
            raise RetryLaterError("not enough time left in this invocation to start a job", 0)
        if _is_drain_marker(record):
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

    @contextmanager
    def _log_keys(self, **keys: Any) -> Iterator[None]:
        """`keys` on this thread's log lines while the block runs, then the keys it had before. Powertools' thread-safe
        keys live in a context variable, so jobs of groups running at once each log their own jobId (the formatter's
        shared keys, `append_context_keys`, would hand one job's keys to every thread)."""
        before = self.logger.thread_safe_get_current_keys()
        self.logger.thread_safe_append_keys(**keys)
        try:
            yield
        finally:
            self.logger.thread_safe_clear_keys()
            self.logger.thread_safe_append_keys(**before)

    @contextmanager
    def _traced(self, message: JobMessage) -> Iterator[None]:
        """One X-Ray subsegment per job, annotated so traces can be searched by job and workspace (a batch holds
        several jobs, so annotations on the handler's segment would keep only one)."""
        with self.tracer.provider.in_subsegment(f"## {message.type}"):
            self.tracer.put_annotation("jobId", message.job_id)
            self.tracer.put_annotation("workspaceId", message.workspace_id)
            yield

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

    def _parse_or_reject(self, record: SQSRecord, *, resolve_payload_ref: bool = True) -> JobMessage | None:
        group = record.attributes.message_group_id or ""
        group_workspace = workspace_id_from_group(group)
        if group_workspace is None:
            self._reject_without_workspace(record, group)
            return None
        try:
            message = parse_job_message(record.body, group)
        except Exception as error:  # anything that cannot be parsed is rejected, never retried until dead-lettered
            reason = _describe(error)
            job_id = _job_id_if_any(record.body)
            attributes = record.message_attributes
            # SQSMessageAttributes.get returns the raw dict; indexing gives the typed attribute
            named = attributes["tenantId"] if "tenantId" in attributes else None  # noqa: SIM401
            tenant = named.string_value if named else None
            if isinstance(self.workspaces, RegisteredWorkspaceStore):
                # The attribute is the sender's word: the record is the owner's, and it takes the message's jobId
                # only when the sender named the owner, so that no sender can take a jobId of the owner's.
                owner = self._owner(group_workspace)
                job_id, tenant = (job_id if tenant == owner else None), owner
            rejected = self.services.guard.reject(
                message_id=record.message_id,
                job_id=job_id,
                workspace_id=group_workspace,
                tenant_id=tenant,
                reason=reason,
                body=record.body,
            )
            self.logger.error(
                "message rejected: workspace halted",
                extra={
                    "reason": reason,
                    "jobId": job_id,
                    "workspaceId": group_workspace,
                    "messageId": record.message_id,
                },
            )
            self._count("JobsRejected", _job_type_if_any(record))
            if rejected:  # False: this message was rejected (and its workspace halted) before
                self._count_halt()
            return None
        bound = self._bind_tenant(record, message)
        if bound is None:
            return None
        if resolve_payload_ref:  # parking needs only the pointer; running needs the payload
            bound = self._resolve_payload(bound, lambda: self._backoff_seconds(record))
        return bound

    def _reject_without_workspace(self, record: SQSRecord, group: str) -> None:
        """A record whose group names no workspace (empty, `ws#` alone, another scheme): nothing can run it and there
        is no workspace to halt. It is recorded REJECTED under `msg#<messageId>` (`JobGuard.reject_unrouted`), logged,
        counted (`MessagesWithoutWorkspace`) and acknowledged; whatever its body says, it is never run."""
        reason = (
            f"message group {group!r} names no workspace: send each job with MessageGroupId ws#<workspaceId> of a "
            "registered workspace; nothing was applied"
        )
        self.services.guard.reject_unrouted(
            message_id=record.message_id, group_id=group, reason=reason, body=record.body
        )
        self.logger.error(
            "message rejected: its group names no workspace",
            extra={
                "reason": reason,
                "jobId": _job_id_if_any(record.body),
                "groupId": group[:128],
                "messageId": record.message_id,
            },
        )
        self._count("JobsRejected", _job_type_if_any(record))
        self._count("MessagesWithoutWorkspace")

    def _owner(self, workspace_id: str) -> str | None:
        """The tenant that registered `workspace_id` (cached per execution environment); None when nobody did, or
        for the folder store of the worker's own tests, which has no registrations."""
        if not isinstance(self.workspaces, RegisteredWorkspaceStore) or not re.match(ID_PATTERN, workspace_id):
            return None
        try:
            return self.workspaces.registration(workspace_id).tenant_id
        except PermanentJobError:
            return None  # not registered

    def _bind_tenant(self, record: SQSRecord, message: JobMessage) -> JobMessage | None:
        """The message with its job's tenant: the workspace owner's. A message naming another tenant is REJECTED (its
        workspace halted for the owner to see; nothing applied) and None returned; one naming none takes the owner's.

        The registration is cached per execution environment and its owner never changes, so this costs no read on
        the happy path. A workspace nobody registered keeps the message's tenant: its job ends DEAD saying to register
        the workspace (`_job_context`); without a tenant either, the message is REJECTED with that advice. The folder
        store of the worker's own tests has no registrations: there the message's tenant stands.
        """
        owner = self._owner(message.workspace_id)
        if owner is not None and message.tenant_id not in (None, owner):
            reason = (
                f"message names tenant {message.tenant_id} but workspace {message.workspace_id} belongs to another "
                "tenant; nothing was applied"
            )
        elif owner is None and message.tenant_id is None:
            reason = (
                f"message names no tenant and workspace {message.workspace_id} is not registered: register it with "
                f"PUT /workspaces/{message.workspace_id}, then resume the workspace"
            )
        else:
            tenant = owner or message.tenant_id
            return message if tenant == message.tenant_id else message.model_copy(update={"tenant_id": tenant})
        # The owner sees this record on its halted workspace: it names the message's claim, never more of the sender.
        # A message naming another tenant is recorded under its message id, never under the jobId it names: a
        # sender must not take a jobId of the owner's (the owner's own job of that jobId would be refused forever).
        rejected = self.services.guard.reject(
            message_id=record.message_id,
            job_id=message.job_id if message.tenant_id == owner else None,
            workspace_id=message.workspace_id,
            tenant_id=owner,
            reason=reason,
            body=record.body,
        )
        self.logger.error("message rejected: workspace halted", extra={"reason": reason, "jobId": message.job_id})
        self._count("JobsRejected", str(message.type))
        if rejected:
            self._count_halt()
        return None

    def _resolve_payload(self, message: JobMessage, backoff_seconds: Callable[[], int]) -> JobMessage:
        """The message with a large job's payload fetched from the payload bucket (the one place pointers are resolved,
        for a queue record and for a body a drain runs). A missing or changed object is not a bad message: the job is
        claimed as usual (a duplicate stays a duplicate, a halted workspace parks it) and then ends DEAD without
        running, its reason saying what to do. S3 unreachable or throttled: nothing decided, RetryLaterError."""
        try:
            return resolve_payload(message, self.services.payloads)
        except PayloadUnavailableError as unavailable:
            self.logger.error("payload object unavailable", extra={"reason": str(unavailable)})
            return message
        except (BotoCoreError, ClientError) as error:
            raise RetryLaterError(f"payload object not readable: {error}", backoff_seconds()) from error

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

    def _storable_body(self, record: SQSRecord, message: JobMessage) -> str:
        """The record's body as a PARKED or DEAD job keeps it (`agent_jobs.payloads.storable_body`): a body too large
        for a record is replaced by the job's pointer message. The bucket unreachable: nothing decided, retried."""
        try:
            return storable_body(record.body, message, self.services.payloads)
        except (BotoCoreError, ClientError) as error:
            raise RetryLaterError(f"payload bucket not writable: {error}", self._backoff_seconds(record)) from error

    # ---- resume: drain markers ------------------------------------------------------------------------------------

    def _drain_marker(self, record: SQSRecord) -> DrainMarker | None:
        """The marker of a record whose type attribute says drain; None (logged, to be acknowledged) if it is not a
        valid marker of its own group's workspace: a marker is never rejected, so it never halts a workspace."""
        try:
            marker = DrainMarker.model_validate_json(record.body)
        except Exception as error:  # a malformed marker can do nothing: acknowledge it
            self.logger.error("invalid drain marker: acknowledged", extra={"error": _describe(error)})
            return None
        if record.attributes.message_group_id != workspace_group_id(marker.workspace_id):
            self.logger.error("drain marker in another workspace's group: acknowledged")
            return None
        return marker

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
                    # other job: it is undecided, and nothing behind it may run (halt on failure). Halt by it.
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
                reason = f"stored message of a parked job cannot be run: {_describe(error)}"
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
                if _is_drain_marker(record):
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

    def _back_off(self, records: list[SQSRecord], failures: set[str], delays: dict[str, int]) -> None:
        """Shorten the visibility of failed records and of the rest of their group (else they wait 6x Timeout)."""
        group_delay: dict[str, int] = {}
        entries: list[ChangeMessageVisibilityBatchRequestEntryTypeDef] = []
        for record in records:
            if record.message_id not in failures:
                continue
            group = record.attributes.message_group_id or ""
            delay = delays.get(record.message_id, group_delay.get(group, self._backoff_seconds(record)))
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
        return round(self.jitter(bound))

    def _count(self, name: str, job_type: str | None = None) -> None:
        """One of `name`; job-level metrics pass their job's type and get the JobType dimension."""
        self._emit(name, MetricUnit.Count, 1, job_type=job_type)

    def _count_halt(self) -> None:
        """This worker's action halted a workspace. Only the `service` dimension, which the alarm names exactly."""
        self._emit(WORKSPACES_HALTED, MetricUnit.Count, 1, dimensions={})

    def _emit(
        self,
        name: str,
        unit: MetricUnit,
        value: float,
        *,
        job_type: str | None = None,
        dimensions: dict[str, str] | None = None,
    ) -> None:
        """A metric with its own dimensions, written at once as its own EMF document (as Powertools' `single_metric`).

        Powertools' Metrics gives one dimension set to everything it flushes together, and one batch mixes job types
        and halts; so a metric whose dimensions matter (JobType, or the exact set an alarm names) is not added to it.
        Without either argument the metric joins the invocation's shared set (service dimension only).
        Groups of a batch emit from their own threads: one lock keeps the shared set and stdout whole.
        """
        with self._emit_lock:
            if job_type is None and dimensions is None:
                self.metrics.add_metric(name=name, unit=unit, value=value)
                return
            own = dict(dimensions or {})
            if job_type is not None:
                own[JOB_TYPE_DIMENSION] = job_type
            # What `single_metric` does, but written in one call: its print writes the document and its newline
            # separately, and a job of another group logging in between would break both lines.
            metric = SingleMetric(namespace=self.metrics.namespace)
            metric.add_metric(name=name, unit=unit, value=value)
            for dimension, dimension_value in {**self.metrics.default_dimensions, **own}.items():
                metric.add_dimension(name=dimension, value=dimension_value)
            if self.metrics.service:  # a SingleMetric drops the Metrics' service dimension unless it is set again
                metric.add_dimension(name="service", value=str(self.metrics.service))
            sys.stdout.write(json.dumps(metric.serialize_metric_set(), separators=(",", ":")) + "\n")


def _is_drain_marker(record: SQSRecord) -> bool:
    attributes = record.message_attributes
    # SQSMessageAttributes.get returns the raw dict; indexing gives the typed attribute
    kind = attributes["type"] if "type" in attributes else None  # noqa: SIM401
    return kind is not None and kind.string_value == DRAIN_MESSAGE_TYPE


def _describe(error: Exception) -> str:
    if isinstance(error, ValidationError):
        parts = [f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in error.errors()[:5]]
        return "invalid job message: " + "; ".join(parts)
    return f"invalid job message: {error}"


def _job_type_if_any(record: SQSRecord) -> str:
    """A rejected message's job type for its metric: the body's `type`, else the producer's `type` attribute, when it
    names a known job type; otherwise UNKNOWN_JOB_TYPE."""
    try:
        candidates: list[Any] = [json.loads(record.body).get("type")]
    except Exception:  # not JSON, not an object, or nested too deep (RecursionError)
        candidates = []
    attribute = record.message_attributes["type"] if "type" in record.message_attributes else None  # noqa: SIM401
    if attribute is not None:
        candidates.append(attribute.string_value)
    known = {str(job_type) for job_type in JobType}
    return next((str(c) for c in candidates if isinstance(c, str) and c in known), UNKNOWN_JOB_TYPE)


# AWS error codes by what they mean for a record that failed on them.
_THROTTLED_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "ThrottlingException",
        "Throttling",
        "TooManyRequestsException",
    }
)
_CONFLICT_CODES = frozenset(
    {"TransactionConflictException", "TransactionCanceledException", "TransactionInProgressException"}
)
_UNAVAILABLE_CODES = frozenset({"InternalServerError", "ServiceUnavailable", "InternalFailure", "RequestTimeout"})


def failure_cause(error: BaseException) -> str:
    """What kind of failure a record met: Throttled, Conflict (a transaction that lost to another writer),
    Unavailable (the service could not be reached or answered 5xx), Aws (another AWS error), or Other."""
    if isinstance(error, ClientError):
        code = str(error.response.get("Error", {}).get("Code", ""))
        status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if code in _THROTTLED_CODES:
            return "Throttled"
        if code in _CONFLICT_CODES:
            return "Conflict"
        if code in _UNAVAILABLE_CODES or status >= 500:
            return "Unavailable"
        return "Aws"
    if isinstance(error, BotoCoreError):  # no answer at all: connection refused, timed out, closed
        return "Unavailable"
    return "Other"


def _job_id_if_any(body: str) -> str | None:
    try:
        job_id = json.loads(body).get("jobId")
    except Exception:  # not JSON, not an object, or nested too deep (RecursionError)
        return None
    if isinstance(job_id, str) and len(job_id) <= 64 and re.match(ID_PATTERN, job_id):
        return job_id
    return None
