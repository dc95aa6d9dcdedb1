"""Claim, run, complete: one job's conditional claim, its check for jobs left unsettled ahead of it, its run by the
handler of its type, and its outcome recorded (SUCCEEDED, FAILED for a retry, DEAD and the workspace halted)."""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from agent_jobs.guard import ClaimOutcome, ClaimResult, FailOutcome, Item, JobsAhead, Lease
from agent_jobs.keys import unplaced_since
from agent_jobs.models import JobMessage, PayloadUnavailableError
from job_worker.jobs import run_job
from job_worker.jobs.context import JobContext
from job_worker.jobs.errors import OutOfTimeError, PermanentJobError
from job_worker.worker.records import RecordParsing
from job_worker.worker.redelivery import RetryLaterError, RunFailedError, SuspectError

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

    from job_worker.jobs.sandbox import TestSandbox

# False while the groups of a batch run at once: a claim then never takes over a lease whose worker never came back.
running_alone: contextvars.ContextVar[bool] = contextvars.ContextVar("running_alone", default=True)


class JobRunning(RecordParsing):
    """A parsed job's claim, run and completion, for a queue record and for a parked job a drain claimed alike."""

    def _running_invocation_id(self, message: JobMessage) -> str | None:
        """The id under which a claim of `message` counts against its tenant's share, None when it does not count
        (`BatchWorker` decides)."""
        return None

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
            alone=running_alone.get(),
            invocation_id=self._running_invocation_id(message),
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
        if outcome is ClaimOutcome.STALE_COPY:
            place = (claim.previous or {}).get("sequenceNumber")
            self.logger.info(
                "an earlier copy of a job placed later in its queue: acknowledged, the copy at its place runs it",
                extra={"place": place, "sequenceNumber": record.attributes.sequence_number},
            )
            self._count("StaleCopiesAcknowledged", job_type)
            return
        if outcome is ClaimOutcome.BUSY:
            lease_left_ms = int((claim.previous or {}).get("leaseExpiresAt", 0)) - guard.now()
            self.logger.info("job is leased by another worker: retry after its lease")
            raise RetryLaterError("leased by another worker", max(1, lease_left_ms // 1000 + 1))
        if (
            outcome is ClaimOutcome.WORKSPACE_HALTED
            and claim.lease is not None
            and self._parked_behind_the_halt(record, message, claim.lease, claim.place)
        ):
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
        if self._parked_behind_jobs_ahead(record, message, claim):
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

    def _parked_behind_the_halt(self, record: SQSRecord, message: JobMessage, lease: Lease, place: str | None) -> bool:
        """The claim found the workspace HALTED or RESUMING: park the job under its new lease, at its place, and take
        the claim back. False when the park was refused but the job is still ours (the workspace became ACTIVE again
        between the claim and the park: a resume ended): it runs. Raises RetryLaterError when the lease was lost
        meanwhile."""
        if self._park(record, message, reason="workspace halted", lease=lease, unclaim=True, place=place):
            return True
        if self.services.guard.holds(lease):
            self.logger.info("the workspace became ACTIVE again before the job could be parked: it runs")
            return False
        raise RetryLaterError("lease lost before the job could be parked: claim again", 0)

    def _parked_behind_jobs_ahead(self, record: SQSRecord, message: JobMessage, claim: ClaimResult) -> bool:
        """True if jobs the workspace accepted ahead of this one left the queue unsettled: this job, just claimed, is
        parked behind them and the workspace halted naming them (a resume runs it after they were redriven and
        retried, or skipped). Checked after the claim, so a duplicate delivery still costs one write and no read.

        A job accepted ahead of it whose send is not confirmed yet (unplaced, `jobs_ahead`) is waited for while its
        producer may still confirm it: the claim is given back uncounted and the record comes back when that may have
        happened (RetryLaterError), as long as the record's deliveries leave its job every attempt
        (`Settings.deferrable`); past that, or past the grace, it is missing like the others."""
        lease = claim.lease
        if lease is None:
            return False
        ahead = self._jobs_ahead(
            message.workspace_id, str(message.tenant_id), message.job_id, claim.place, _sent_at(record, claim)
        )
        receives = int(record.attributes.approximate_receive_count)
        if ahead.unplaced and not ahead.missing and self.services.settings.deferrable(receives):
            self._wait_for_unplaced(record, message, lease, ahead.unplaced)
        missing = ahead.all
        if not missing:
            return False
        missing_ids = [str(item.get("jobId")) for item in missing]
        self.logger.error(
            "jobs accepted ahead of this one never took effect: workspace halted", extra={"missingJobIds": missing_ids}
        )
        reason = f"jobs ahead of it never took effect: {', '.join(missing_ids)}"
        if not self._park(record, message, reason=reason, lease=lease, missing=missing, place=claim.place):
            raise RetryLaterError("lease lost before the job could be parked", 1)
        return True

    def _jobs_ahead(
        self, workspace_id: str, tenant_id: str, job_id: str, place: str | None, sent_at: int | None
    ) -> JobsAhead:
        """The jobs of `tenant_id` the workspace accepted ahead of `job_id`, placed at `place` and sent at `sent_at`
        (`JobGuard.jobs_ahead`), unplaced ones within the grace the settings give them."""
        return self.services.guard.jobs_ahead(
            workspace_id,
            tenant_id=tenant_id,
            job_id=job_id,
            sequence_number=place,
            sent_at=sent_at,
            unplaced_grace_ms=self.services.settings.unplaced_grace_seconds * 1000,
        )

    def _wait_for_unplaced(self, record: SQSRecord, message: JobMessage, lease: Lease, unplaced: list[Item]) -> None:
        """Give the claim back and have the record come back once the unplaced jobs ahead were confirmed or their
        grace ended (always raises RetryLaterError)."""
        guard, settings = self.services.guard, self.services.settings
        waiting_on = [str(item.get("jobId")) for item in unplaced]
        grace_left_ms = max(
            settings.unplaced_grace_seconds * 1000 - (guard.now() - unplaced_since(str(item["queueSeq"])))
            for item in unplaced
        )
        delay = max(1, min(self._backoff_seconds(record), -(-grace_left_ms // 1000)))
        reason = f"waits for {', '.join(waiting_on)}, accepted ahead of it, whose send is not confirmed yet"
        if not guard.release(lease, reason=reason):
            raise RetryLaterError("lease lost before the claim could be given back", 1)
        self.logger.info(
            "a job accepted ahead of this one is not placed in the queue yet: waiting for it",
            extra={"waitingOn": waiting_on, "delaySeconds": delay},
        )
        self._count("JobsWaitingOnUnplaced", str(message.type))
        raise RetryLaterError(reason, delay)

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
            # Unplanned (a bug, a resource gone): the traceback is what finds its cause.
            self.logger.warning("job failed, will retry", extra={"error": repr(error)}, exc_info=error)
            self._count("JobsFailed", job_type)
            failed = guard.fail(lease, f"{type(error).__name__}: {error}", body=body)
            if failed is FailOutcome.DEAD:
                self.logger.error("attempts exhausted: DEAD, workspace halted")
                self._count("JobsDead", job_type)
                self._count_halt()
                return False
            # Its own failure, unless the invocation's time ran out on it (it started late: no fault of the job's).
            handed_back = RetryLaterError if isinstance(error, OutOfTimeError) else RunFailedError
            raise handed_back(str(error), backoff_seconds()) from error
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
        job_context = JobContext(
            workspace=self.workspaces.open(workspace_id),
            remaining_ms=context.get_remaining_time_in_millis,
            safety_margin_ms=self.services.settings.time_safety_margin_ms,
            invocation_ms=self._invocation_ms,
            test_sandbox=self._test_sandbox,
        )
        return self.workspaces.job_context(workspace_id, job_context)

    def _test_sandbox(self) -> TestSandbox | None:
        from job_worker.jobs.sandbox import TestSandbox  # the first run_tests job loads it, not the cold start

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
        unclaim: bool = False,
        place: str | None = None,
    ) -> bool:
        parked = self.services.guard.park(
            message,
            message_id=record.message_id,
            sequence_number=place or record.attributes.sequence_number,
            body=self._storable_body(record, message),
            reason=reason,
            halt_workspace=halt,
            lease=lease,
            missing=missing or (),
            unclaim=unclaim,
        )
        if parked:
            self.logger.warning(f"job parked: {reason}")
            self._count("JobsParked", str(message.type))
            if halt or missing:
                self._count_halt()
        return parked


def _sent_at(record: SQSRecord, claim: ClaimResult) -> int | None:
    """When the message at the job's place was sent (epoch ms), as far as is known: the queue's own SentTimestamp when
    the copy claimed is that message (also when the producer never recorded its send), else when the producer recorded
    the send (later than the send itself: a job accepted meanwhile is taken to be ahead, which only makes this one
    wait). None when neither is known."""
    sent = record.attributes.get("SentTimestamp")
    if record.attributes.sequence_number == claim.place and sent and str(sent).isdigit():
        return int(sent)
    recorded = (claim.previous or {}).get("sentAt")
    return int(recorded) if recorded is not None else None
