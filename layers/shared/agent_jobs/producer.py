"""Enqueue a job the way the API does, for any Python service: validate, record QUEUED, send to the FIFO queue."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from agent_jobs.guard import AcceptOutcome, AcceptResult, JobGuard
from agent_jobs.keys import deduplication_id, workspace_group_id
from agent_jobs.models import ApplyPatchJob, JobMessage, JobStatus, OpenPrJob, RunTestsJob, job_message
from agent_jobs.payloads import PayloadStore, message_body
from agent_jobs.quotas import Admission, JobQuotas, QuotaExceededError

if TYPE_CHECKING:
    from mypy_boto3_sqs.client import SQSClient
    from mypy_boto3_sqs.type_defs import MessageAttributeValueTypeDef, SendMessageBatchRequestEntryTypeDef


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


class WorkspaceUnregisteredError(Exception):
    """The job's tenant has not registered the job's workspace: nothing was recorded or queued."""

    def __init__(self, workspace_id: str) -> None:
        super().__init__(
            f"workspace '{workspace_id}' is not registered; register it first with PUT /workspaces/{workspace_id} "
            "(its git remote and branch), then send the job again"
        )
        self.workspace_id = workspace_id


class WorkspaceForbiddenError(WorkspaceUnregisteredError):
    """The job's workspace is registered to (or halted for) another tenant: nothing was recorded or queued. Its
    message is an unregistered workspace's, word for word, so that a caller cannot tell another tenant's workspace
    from a name nobody registered; only the logs tell the two apart."""


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
    A record that exists but was never confirmed sent (the sender crashed) is sent again; the deduplication id and
    the worker's claim make that safe. A job for a workspace of another tenant is refused (WorkspaceForbiddenError),
    and one for a workspace nobody registered (WorkspaceUnregisteredError), in the same write: nothing is recorded
    or sent.

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
    admission = _admit([job], tenant_id, guard, quotas)
    if admission is not None and admission.refused:
        raise admission.refused[0]

    def record() -> list[AcceptResult]:
        # The payload is stored under the quota's count too, so that a failed store gives the count back.
        nonlocal message, body
        if size > inline_limit_bytes and payloads is not None:
            message = payloads.store(message)
            body = message_body(message)
        return [guard.record_accepted(message)]

    accepted = _counted(quotas, admission, record)[0]
    if accepted.outcome is AcceptOutcome.CONFLICT:
        raise JobConflictError(job.job_id)
    if accepted.outcome is AcceptOutcome.WORKSPACE_FORBIDDEN:
        raise WorkspaceForbiddenError(job.workspace_id)
    if accepted.outcome is AcceptOutcome.WORKSPACE_UNREGISTERED:
        raise WorkspaceUnregisteredError(job.workspace_id)
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
        MessageDeduplicationId=deduplication_id(tenant_id, job.job_id, str(job.type)),
        MessageAttributes={
            "tenantId": {"DataType": "String", "StringValue": tenant_id},
            "type": {"DataType": "String", "StringValue": str(job.type)},
        },
    )
    message_id = response["MessageId"]
    sequence_number = response.get("SequenceNumber")
    guard.record_sent(tenant_id, job.job_id, message_id, sequence_number)
    status = str(accepted.item.get("status", JobStatus.QUEUED))
    return EnqueueResult(job.job_id, status, message_id, sequence_number, accepted.outcome is AcceptOutcome.NEW)


# ---- batches -----------------------------------------------------------------------------------------------------

MAX_BATCH_JOBS = 10  # SendMessageBatch's limit, and the batch route's
# SendMessageBatch carries at most 1 MiB in all (bodies and attributes); a batch above it is sent in several calls,
# one after the other, so the jobs of one group keep their order. The margin covers attribute names and types.
BATCH_PAYLOAD_LIMIT_BYTES = 1_048_576 - 16_384


class InvalidBatchError(ValueError):
    """The batch itself cannot be accepted (empty, more than MAX_BATCH_JOBS jobs, or a jobId twice): nothing was
    recorded or sent."""


@dataclass(frozen=True)
class BatchItemResult:
    """The outcome of one job of a batch. `status_code` is what `POST /jobs` would have answered for the job alone:
    202 accepted (`created` false: already accepted with the same payload), 409 the jobId is taken by another job of
    the tenant, 404 the workspace is not registered to the tenant (another tenant's is answered the same), 413 the job
    is too large, 503 the queue refused the job's message (its record stays; send the same job again), 429 a quota
    refused it (nothing recorded; send it again after `retry_after` seconds)."""

    job_id: str
    status_code: int
    status: str | None = None
    message_id: str | None = None
    sequence_number: str | None = None
    created: bool = False
    message: str | None = None  # why, for a job that was not accepted
    retry_after: int | None = None  # seconds to wait before sending a job a quota refused (429) again

    @property
    def accepted(self) -> bool:
        return self.status_code == HTTPStatus.ACCEPTED

    def as_response(self) -> dict[str, Any]:
        return {
            "jobId": self.job_id,
            "statusCode": self.status_code,
            "status": self.status,
            "messageId": self.message_id,
            "sequenceNumber": self.sequence_number,
            "created": self.created,
            "message": self.message,
        }


@dataclass
class _Pending:
    index: int
    job: ApplyPatchJob | RunTestsJob | OpenPrJob
    message: JobMessage
    body: str


def enqueue_jobs(
    jobs: Sequence[ApplyPatchJob | RunTestsJob | OpenPrJob],
    tenant_id: str,
    *,
    guard: JobGuard,
    sqs: SQSClient,
    queue_url: str,
    payloads: PayloadStore | None = None,
    inline_limit_bytes: int = DEFAULT_INLINE_MESSAGE_LIMIT_BYTES,
    quotas: JobQuotas | None = None,
) -> list[BatchItemResult]:
    """Accept up to MAX_BATCH_JOBS jobs at once, each exactly once per jobId: one result per job, in `jobs` order.

    Each job is accepted as `enqueue_job` accepts it, with the calls shared: large payloads are stored first, the
    QUEUED records are written in one transaction (`JobGuard.record_accepted_batch`: the conditional puts and one
    workspace-ownership check per workspace), the jobs to send go to the queue in one SendMessageBatch (several
    only when their messages exceed its 1 MiB), and the message ids are recorded in one more write
    (`JobGuard.record_sent_batch`). The queue keeps the order of a batch's entries within a message group, so the
    jobs of one workspace take effect in the order they have in `jobs`. A job the queue refused (503) keeps its
    record and is sent by a later submission of the same job, as `enqueue_job` does; jobs of its workspace after it
    in the same SendMessageBatch call may have been taken (they come before it then), those in a later call are not
    sent (503 too). Raises InvalidBatchError for an empty batch, one
    above MAX_BATCH_JOBS or one naming a jobId twice (nothing recorded or sent); AWS errors propagate (retrying the
    whole batch is safe).

    With `quotas`, the batch counts each of its new jobs: those beyond what their workspace may still queue, or
    beyond the tenant's jobs per second, are 429 (nothing recorded or sent), the later ones of the batch first; the
    jobs before them are accepted. Repeats of accepted jobs are answered as always and count nothing.
    """
    _check_batch(jobs)
    admission = _admit(jobs, tenant_id, guard, quotas)
    refused = {
        index: _quota_refused(jobs[index], error) for index, error in (admission.refused if admission else {}).items()
    }
    results, pending = _prepare(jobs, tenant_id, payloads, inline_limit_bytes, skip=refused)

    to_send: list[tuple[_Pending, AcceptResult]] = []
    messages = [item.message for item in pending]
    accepted = _counted(quotas, admission, lambda: guard.record_accepted_batch(messages) if messages else [])
    for item, outcome in zip(pending, accepted, strict=True):
        answered = _answer_known(item.job, outcome)
        if answered is None:
            to_send.append((item, outcome))
        else:
            results[item.index] = answered

    sent: list[tuple[str, str, str, str | None]] = []
    refused_groups: set[str] = set()  # a job of the group was not taken: later ones wait, to keep their order
    for whole_chunk in _send_chunks(to_send):
        chunk = []
        for item, outcome in whole_chunk:
            if item.job.workspace_id in refused_groups:
                results[item.index] = _unsent(item.job, "a job before it in its workspace was not taken")
            else:
                chunk.append((item, outcome))
        if not chunk:
            continue
        entries: list[SendMessageBatchRequestEntryTypeDef] = [
            {
                "Id": f"e{item.index}",
                "MessageBody": item.body,
                "MessageGroupId": workspace_group_id(item.job.workspace_id),
                "MessageDeduplicationId": deduplication_id(tenant_id, item.job.job_id, str(item.job.type)),
                "MessageAttributes": _message_attributes(tenant_id, str(item.job.type)),
            }
            for item, _ in chunk
        ]
        response = sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)
        successful = {entry["Id"]: entry for entry in response.get("Successful", [])}
        failed = {entry["Id"]: entry for entry in response.get("Failed", [])}
        for item, outcome in chunk:
            job = item.job
            entry_id = f"e{item.index}"
            if entry_id in successful:
                message_id = successful[entry_id]["MessageId"]
                sequence_number = successful[entry_id].get("SequenceNumber")
                sent.append((tenant_id, job.job_id, message_id, sequence_number))
                results[item.index] = BatchItemResult(
                    job.job_id,
                    HTTPStatus.ACCEPTED,
                    status=str(outcome.item.get("status", JobStatus.QUEUED)),
                    message_id=message_id,
                    sequence_number=sequence_number,
                    created=outcome.outcome is AcceptOutcome.NEW,
                )
            else:
                refusal = failed.get(entry_id)
                reason = (refusal.get("Message") or refusal["Code"]) if refusal else "no answer for its entry"
                results[item.index] = _unsent(job, reason)
                refused_groups.add(job.workspace_id)
    if sent:
        guard.record_sent_batch(sent)
    return [results[index] for index in range(len(jobs))]


def _check_batch(jobs: Sequence[ApplyPatchJob | RunTestsJob | OpenPrJob]) -> None:
    if not 1 <= len(jobs) <= MAX_BATCH_JOBS:
        raise InvalidBatchError(f"a batch holds 1 to {MAX_BATCH_JOBS} jobs, not {len(jobs)}")
    seen: set[str] = set()
    for job in jobs:
        if job.job_id in seen:
            raise InvalidBatchError(
                f"jobId '{job.job_id}' appears twice in the batch; give each job of a batch its own jobId"
            )
        seen.add(job.job_id)


def _admit(
    jobs: Sequence[ApplyPatchJob | RunTestsJob | OpenPrJob], tenant_id: str, guard: JobGuard, quotas: JobQuotas | None
) -> Admission | None:
    """The quotas' decision on `jobs` (None without quotas): a job already recorded is never refused."""
    if quotas is None:
        return None
    return quotas.admit(
        [(job.job_id, job.workspace_id) for job in jobs],
        tenant_id,
        lambda job_id: guard.get_job(tenant_id, job_id) is not None,
    )


def _counted(
    quotas: JobQuotas | None, admission: Admission | None, record: Callable[[], list[AcceptResult]]
) -> list[AcceptResult]:
    """`record()`, then the tenant's count given back for every job it did not record as new (repeats, refusals),
    or for all of them when it fails."""
    try:
        accepted = record()
    except BaseException:
        if quotas is not None and admission is not None:
            quotas.give_back(admission.permit, admission.permit.taken)
        raise
    if quotas is not None and admission is not None:
        new = sum(1 for outcome in accepted if outcome.outcome is AcceptOutcome.NEW)
        quotas.give_back(admission.permit, admission.permit.taken - new)
    return accepted


def _quota_refused(job: ApplyPatchJob | RunTestsJob | OpenPrJob, error: QuotaExceededError) -> BatchItemResult:
    return BatchItemResult(job.job_id, HTTPStatus.TOO_MANY_REQUESTS, message=str(error), retry_after=error.retry_after)


def _prepare(
    jobs: Sequence[ApplyPatchJob | RunTestsJob | OpenPrJob],
    tenant_id: str,
    payloads: PayloadStore | None,
    inline_limit_bytes: int,
    *,
    skip: Mapping[int, BatchItemResult] | None = None,
) -> tuple[dict[int, BatchItemResult], list[_Pending]]:
    """Each job's message, its payload stored first when the message is too large (a 413 result without a store).
    The jobs of `skip` keep the results given there."""
    results: dict[int, BatchItemResult] = dict(skip or {})
    pending: list[_Pending] = []
    for index, job in enumerate(jobs):
        if index in results:
            continue
        message = job_message(job, tenant_id)
        body = message_body(message)
        size = len(body.encode())
        if size > inline_limit_bytes:
            if payloads is None or payloads.bucket is None:
                too_large = PayloadTooLargeError(job.job_id, size, inline_limit_bytes)
                results[index] = BatchItemResult(
                    job.job_id, HTTPStatus.REQUEST_ENTITY_TOO_LARGE, message=str(too_large)
                )
                continue
            message = payloads.store(message)
            body = message_body(message)
        pending.append(_Pending(index, job, message, body))
    return results, pending


def _unsent(job: ApplyPatchJob | RunTestsJob | OpenPrJob, reason: str) -> BatchItemResult:
    return BatchItemResult(
        job.job_id,
        HTTPStatus.SERVICE_UNAVAILABLE,
        status=str(JobStatus.QUEUED),
        message=(
            f"the queue did not take job '{job.job_id}' ({reason}); its record is kept: send the same job again "
            "(same jobId and payload) to queue it, it cannot be queued twice"
        ),
    )


def _answer_known(job: ApplyPatchJob | RunTestsJob | OpenPrJob, outcome: AcceptResult) -> BatchItemResult | None:
    """The result of a job that is not to be sent (refused, or accepted and sent before); None: send it."""
    if outcome.outcome is AcceptOutcome.CONFLICT:
        return BatchItemResult(job.job_id, HTTPStatus.CONFLICT, message=str(JobConflictError(job.job_id)))
    if outcome.outcome in (AcceptOutcome.WORKSPACE_FORBIDDEN, AcceptOutcome.WORKSPACE_UNREGISTERED):
        # Another tenant's workspace is answered as one nobody registered, word for word.
        unregistered = WorkspaceUnregisteredError(job.workspace_id)
        return BatchItemResult(job.job_id, HTTPStatus.NOT_FOUND, message=str(unregistered))
    if outcome.outcome is AcceptOutcome.EXISTING:
        stored = outcome.item
        return BatchItemResult(
            job.job_id,
            HTTPStatus.ACCEPTED,
            status=str(stored.get("status", JobStatus.QUEUED)),
            message_id=stored.get("messageId"),
            sequence_number=stored.get("sequenceNumber"),
            created=False,
        )
    return None


def _message_attributes(tenant_id: str, job_type: str) -> dict[str, MessageAttributeValueTypeDef]:
    return {
        "tenantId": {"DataType": "String", "StringValue": tenant_id},
        "type": {"DataType": "String", "StringValue": job_type},
    }


def _send_chunks(to_send: list[tuple[_Pending, AcceptResult]]) -> list[list[tuple[_Pending, AcceptResult]]]:
    """The entries in order, cut where the next one would take a SendMessageBatch call above its payload limit."""
    chunks: list[list[tuple[_Pending, AcceptResult]]] = []
    size = 0
    for entry in to_send:
        entry_size = len(entry[0].body.encode()) + 256  # the attributes: names, types and values
        if not chunks or size + entry_size > BATCH_PAYLOAD_LIMIT_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append(entry)
        size += entry_size
    return chunks
