"""Enqueue a job the way the API does, for any Python service: validate, record QUEUED, send to the FIFO queue."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent_jobs.guard import AcceptOutcome, JobGuard
from agent_jobs.keys import deduplication_id, workspace_group_id
from agent_jobs.models import ApplyPatchJob, JobStatus, OpenPrJob, RunTestsJob, job_message
from agent_jobs.payloads import PayloadStore, message_body

if TYPE_CHECKING:
    from mypy_boto3_sqs.client import SQSClient


DEFAULT_INLINE_MESSAGE_LIMIT_BYTES = 131_072


class PayloadTooLargeError(Exception):
    """The job's message is too large for the queue and no payload bucket is configured to hold its payload."""

    def __init__(self, job_id: str, size: int, limit: int) -> None:
        super().__init__(
            f"job '{job_id}' makes a {size}-byte message, above the {limit}-byte limit of a queue message, and no "
            "payload bucket is configured (PAYLOAD_BUCKET); send a smaller payload"
        )
        self.job_id = job_id


class JobConflictError(Exception):
    """The jobId is already taken by a job with another payload, workspace, type or tenant."""

    def __init__(self, job_id: str) -> None:
        super().__init__(
            f"jobId '{job_id}' was already accepted with a different workspace, type or payload; "
            "use a new jobId for a different job"
        )
        self.job_id = job_id


class WorkspaceForbiddenError(Exception):
    """The job's workspace is registered to (or halted for) another tenant: nothing was recorded or queued."""

    def __init__(self, workspace_id: str) -> None:
        super().__init__(
            f"workspace '{workspace_id}' belongs to another tenant; send jobs only for workspaces your tenant "
            "registered (PUT /workspaces/{workspaceId}), or use another workspaceId"
        )
        self.workspace_id = workspace_id


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
) -> EnqueueResult:
    """Accept a job exactly once per jobId.

    The QUEUED record is written *before* the send, conditional on the jobId being new, so a resubmission with
    another payload is refused (JobConflictError) instead of being silently dropped by SQS deduplication, and a
    resubmission after the 5-minute deduplication window is answered from the record instead of being sent again.
    A record that exists but was never confirmed sent (the sender crashed) is sent again; the deduplication id and
    the worker's claim make that safe. A job for a workspace of another tenant is refused (WorkspaceForbiddenError)
    in the same write, so nothing is recorded or sent.

    A message body above `inline_limit_bytes` is sent as a pointer: the payload is stored in `payloads` first (so no
    QUEUED record or message ever points at an object that is not there; storing is idempotent), then the job is
    recorded and the pointer message sent. Without a payload store such a job raises PayloadTooLargeError.
    """
    message = job_message(job, tenant_id)
    body = message_body(message)
    size = len(body.encode())
    if size > inline_limit_bytes:
        if payloads is None or payloads.bucket is None:
            raise PayloadTooLargeError(job.job_id, size, inline_limit_bytes)
        message = payloads.store(message)
        body = message_body(message)
    accepted = guard.record_accepted(message)
    if accepted.outcome is AcceptOutcome.CONFLICT:
        raise JobConflictError(job.job_id)
    if accepted.outcome is AcceptOutcome.WORKSPACE_FORBIDDEN:
        raise WorkspaceForbiddenError(job.workspace_id)
    if accepted.outcome is AcceptOutcome.EXISTING:
        item = accepted.item
        return EnqueueResult(
            job_id=job.job_id,
            status=str(item.get("status", JobStatus.QUEUED)),
            message_id=item.get("messageId"),
            sequence_number=item.get("sequenceNumber"),
            created=False,
        )
    response = sqs.send_message(
        QueueUrl=queue_url,
        MessageBody=body,
        MessageGroupId=workspace_group_id(job.workspace_id),
        MessageDeduplicationId=deduplication_id(job.job_id, str(job.type)),
        MessageAttributes={
            "tenantId": {"DataType": "String", "StringValue": tenant_id},
            "type": {"DataType": "String", "StringValue": str(job.type)},
        },
    )
    message_id = response["MessageId"]
    sequence_number = response.get("SequenceNumber")
    guard.record_sent(job.job_id, message_id, sequence_number)
    status = str(accepted.item.get("status", JobStatus.QUEUED))
    return EnqueueResult(job.job_id, status, message_id, sequence_number, accepted.outcome is AcceptOutcome.NEW)
