"""Enqueue one job the way the API does, for any Python service: validate, record QUEUED, send to the FIFO queue."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent_jobs.guard import AcceptOutcome, AcceptResult, JobGuard
from agent_jobs.keys import deduplication_id, workspace_group_id
from agent_jobs.models import ApplyPatchJob, JobStatus, OpenPrJob, RunTestsJob, job_message
from agent_jobs.payloads import PayloadStore, message_body
from agent_jobs.quotas import JobQuotas

if TYPE_CHECKING:
    from mypy_boto3_sqs.client import SQSClient

from agent_jobs.producer.common import admit, counted, message_attributes, repeat_fields
from agent_jobs.producer.errors import (
    JobConflictError,
    PayloadTooLargeError,
    WorkspaceForbiddenError,
    WorkspaceUnregisteredError,
)

DEFAULT_INLINE_MESSAGE_LIMIT_BYTES = 131_072


@dataclass(frozen=True)
class EnqueueResult:
    job_id: str
    status: str
    message_id: str | None
    sequence_number: str | None
    created: bool  # False when this was an idempotent repeat of an accepted job

    def as_response(self) -> dict[str, Any]:
        return {
            "jobId": self.job_id,
            "status": self.status,
            "messageId": self.message_id,
            "sequenceNumber": self.sequence_number,
            "created": self.created,
        }


def enqueue_job(
    job: ApplyPatchJob | RunTestsJob | OpenPrJob,
    tenant_id: str,
    *,
    guard: JobGuard,
    sqs: SQSClient,
    queue_url: str,
    payloads: PayloadStore | None = None,
    inline_limit_bytes: int = DEFAULT_INLINE_MESSAGE_LIMIT_BYTES,
    quotas: JobQuotas | None = None,
) -> EnqueueResult:
    """Accept a job exactly once per jobId.

    The QUEUED record is written *before* the send, conditional on the jobId being new, so a resubmission with
    another payload is refused (JobConflictError) instead of being silently dropped by SQS deduplication, and a
    resubmission after the 5-minute deduplication window is answered from the record instead of being sent again.
    A record that exists but was never confirmed sent (the sender crashed, or the write confirming it failed) is sent
    again; the deduplication id and the worker's claim make that safe. The answer's sequenceNumber is the job's place
    in its workspace's order as recorded (`JobGuard.record_sent`): within SQS's 5-minute deduplication window a resend
    is answered with the first message's SequenceNumber, so the job keeps the place its first send took; after it,
    the resend is a second message, and its SequenceNumber becomes the place (an earlier copy still queued is then
    acknowledged without effect), unless a worker already placed the job by a copy it claimed. A job for a workspace
    of another tenant is refused (WorkspaceForbiddenError), and one for a workspace nobody registered
    (WorkspaceUnregisteredError), checked against the registration before the write: nothing is recorded or sent.

    A message body above `inline_limit_bytes` is sent as a pointer: the payload is stored in `payloads` first (so no
    QUEUED record or message ever points at an object that is not there; storing is idempotent), then the job is
    recorded and the pointer message sent. Without a payload store such a job raises PayloadTooLargeError.

    With `quotas`, a new job is refused when its workspace has MaxQueuedJobsPerWorkspace jobs pending
    (WorkspaceQueueFullError) or its tenant had MaxJobsPerSecondPerTenant new jobs accepted this second
    (TenantRateLimitError): nothing is recorded or sent. A repeat of an accepted job is answered as always.
    """
    message = job_message(job, tenant_id)
    body = message_body(message)
    size = len(body.encode())
    if size > inline_limit_bytes and (payloads is None or payloads.bucket is None):
        raise PayloadTooLargeError(job.job_id, size, inline_limit_bytes)  # before a quota counts it
    admission = admit([job], tenant_id, guard, quotas)
    if admission is not None and admission.refused:
        raise admission.refused[0]

    def record() -> list[AcceptResult]:
        # The payload is stored under the quota's count too, so that a failed store gives the count back.
        nonlocal message, body
        if size > inline_limit_bytes and payloads is not None:
            message = payloads.store(message)
            body = message_body(message)
        return [guard.record_accepted(message)]

    accepted = counted(quotas, admission, record)[0]
    if accepted.outcome is AcceptOutcome.CONFLICT:
        raise JobConflictError(job.job_id)
    if accepted.outcome is AcceptOutcome.WORKSPACE_FORBIDDEN:
        raise WorkspaceForbiddenError(job.workspace_id)
    if accepted.outcome is AcceptOutcome.WORKSPACE_UNREGISTERED:
        raise WorkspaceUnregisteredError(job.workspace_id)
    if accepted.outcome is AcceptOutcome.EXISTING:
        return EnqueueResult(job_id=job.job_id, **repeat_fields(accepted.item))
    response = sqs.send_message(
        QueueUrl=queue_url,
        MessageBody=body,
        MessageGroupId=workspace_group_id(job.workspace_id),
        MessageDeduplicationId=deduplication_id(tenant_id, job.job_id, str(job.type)),
        MessageAttributes=message_attributes(tenant_id, str(job.type)),
    )
    # The answer is the job's place as recorded: the send's, or the one a worker's claim of an earlier copy recorded.
    place = guard.record_sent(tenant_id, job.job_id, response["MessageId"], response.get("SequenceNumber"))
    status = str(accepted.item.get("status", JobStatus.QUEUED))
    return EnqueueResult(
        job.job_id, status, place.message_id, place.sequence_number, accepted.outcome is AcceptOutcome.NEW
    )
