"""Drain: a resume's drain marker runs its workspace's PARKED jobs in SequenceNumber order through the same
claim/run/complete path, a bounded number per marker, then sends the next marker or makes the workspace ACTIVE."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from agent_jobs.core import decisions
from agent_jobs.guard import ClaimOutcome, Item
from agent_jobs.keys import parked_sequence, workspace_group_id
from agent_jobs.models import DrainMarker, JobStatus, WorkspaceState
from agent_jobs.resume import send_drain_marker
from job_worker.worker.records import describe_invalid, parse_job_message
from job_worker.worker.redelivery import RetryLaterError
from job_worker.worker.running import JobRunning

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext


class Draining(JobRunning):
    """The PARKED jobs of a resuming workspace, run in their order; a stale marker is acknowledged without effect."""

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
                    # other job: it is undecided, and nothing behind it may run (halt on failure). Halt by it for the
                    # operator.
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
                if self._halted_behind_missing_jobs(marker, job) or not self._drain_job(
                    record, marker, job, context, reclaim=False
                ):
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

    def _halted_behind_missing_jobs(self, marker: DrainMarker, job: Item) -> bool:
        """True if jobs the workspace accepted ahead of this parked one left the queue unsettled (dead-lettered while
        the workspace was halted, for example): the drain stops before it, and the workspace is halted by the
        earliest of them (the resume under way ends), so the operator redrives and decides them first. The parked
        jobs stay PARKED in their place."""
        guard, settings = self.services.guard, self.services.settings
        job_id, tenant_id = str(job.get("jobId")), str(job.get("tenantId", ""))
        sent_at = job.get("sentAt")
        ahead = self._jobs_ahead(
            marker.workspace_id, tenant_id, job_id, _sequence_of(job), int(sent_at) if sent_at is not None else None
        )
        if ahead.unplaced and not ahead.missing:
            # A job accepted ahead of it may still be confirmed by its producer: the marker comes back after a while.
            self.logger.info("a job accepted ahead of a parked one is not placed yet: drain later")
            raise RetryLaterError("an unplaced job ahead", settings.drain_lag_retry_seconds or 1)
        missing = ahead.all
        if not missing:
            return False
        missing_ids = [str(item.get("jobId")) for item in missing]
        guard.halt_workspace(
            marker.workspace_id,
            tenant_id=tenant_id,
            job_id=missing_ids[0],
            reason=decisions.missing_reason(marker.workspace_id, job_id, missing_ids),
        )
        self.logger.error(
            "jobs accepted ahead of a parked job never took effect: drain stopped, workspace halted",
            extra={"jobId": job_id, "missingJobIds": missing_ids},
        )
        self._count_halt()
        return True

    def _send_next_marker(self, marker: DrainMarker) -> None:
        next_marker = marker.model_copy(update={"round": marker.round + 1})
        send_drain_marker(self.services.sqs, self.services.settings.queue_url, next_marker)
        self.logger.info("drain continues with the next marker", extra={"round": next_marker.round})

    def _time_is_short(self, context: LambdaContext) -> bool:
        return context.get_remaining_time_in_millis() < self.services.settings.time_safety_margin_ms


def _sequence_of(job: Item) -> str | None:
    """A parked job's SequenceNumber: recorded on the job, or read back from its parked-index key."""
    sequence = job.get("sequenceNumber")
    if sequence:
        return str(sequence)
    parked_seq = str(job.get("parkedSeq") or "")
    return parked_seq.lstrip("0") or None if parked_seq.isdigit() else None
