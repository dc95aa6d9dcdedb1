"""Enqueue up to ten jobs in one request: one transaction to record them, SendMessageBatch to send them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from agent_jobs.guard import AcceptOutcome, AcceptResult, JobGuard
from agent_jobs.keys import deduplication_id, workspace_group_id
from agent_jobs.models import ApplyPatchJob, JobMessage, JobStatus, OpenPrJob, RunTestsJob, job_message
from agent_jobs.payloads import PayloadStore, message_body
from agent_jobs.quotas import JobQuotas, QuotaExceededError

if TYPE_CHECKING:
    from mypy_boto3_sqs.client import SQSClient
    from mypy_boto3_sqs.type_defs import SendMessageBatchRequestEntryTypeDef

from agent_jobs.producer.common import admit, counted, message_attributes, repeat_fields
from agent_jobs.producer.errors import (
    InvalidBatchError,
    JobConflictError,
    PayloadTooLargeError,
    WorkspaceUnregisteredError,
)
from agent_jobs.producer.single import DEFAULT_INLINE_MESSAGE_LIMIT_BYTES

MAX_BATCH_JOBS = 10  # SendMessageBatch's limit, and the batch route's


# SendMessageBatch carries at most 1 MiB in all (bodies and attributes); a batch above it is sent in several calls,
# one after the other, so the jobs of one group keep their order. The margin covers attribute names and types.
BATCH_PAYLOAD_LIMIT_BYTES = 1_048_576 - 16_384


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
    admission = admit(jobs, tenant_id, guard, quotas)
    refused = {
        index: _quota_refused(jobs[index], error) for index, error in (admission.refused if admission else {}).items()
    }
    results, pending = _prepare(jobs, tenant_id, payloads, inline_limit_bytes, skip=refused)

    to_send: list[tuple[_Pending, AcceptResult]] = []
    messages = [item.message for item in pending]
    accepted = counted(quotas, admission, lambda: guard.record_accepted_batch(messages) if messages else [])
    for item, outcome in zip(pending, accepted, strict=True):
        answered = _answer_known(item.job, outcome)
        if answered is None:
            to_send.append((item, outcome))
        else:
            results[item.index] = answered

    sent, sent_items = _send(to_send, tenant_id, results, sqs=sqs, queue_url=queue_url)
    if sent:
        # Each job is answered with its place as recorded (`JobGuard.record_sent`), not the send's answer alone.
        places = guard.record_sent_batch(sent)
        for (item, outcome), place in zip(sent_items, places, strict=True):
            results[item.index] = BatchItemResult(
                item.job.job_id,
                HTTPStatus.ACCEPTED,
                status=str(outcome.item.get("status", JobStatus.QUEUED)),
                message_id=place.message_id,
                sequence_number=place.sequence_number,
                created=outcome.outcome is AcceptOutcome.NEW,
            )
    return [results[index] for index in range(len(jobs))]


def _send(
    to_send: list[tuple[_Pending, AcceptResult]],
    tenant_id: str,
    results: dict[int, BatchItemResult],
    *,
    sqs: SQSClient,
    queue_url: str,
) -> tuple[list[tuple[str, str, str, str | None]], list[tuple[_Pending, AcceptResult]]]:
    """Send the jobs to send, in order: the sends to record, with their items; a job the queue did not take is
    answered in `results`, and the jobs of its workspace after it wait for a later submission."""
    sent: list[tuple[str, str, str, str | None]] = []
    sent_items: list[tuple[_Pending, AcceptResult]] = []
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
                "MessageAttributes": message_attributes(tenant_id, str(item.job.type)),
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
                sent_items.append((item, outcome))
            else:
                refusal = failed.get(entry_id)
                reason = (refusal.get("Message") or refusal["Code"]) if refusal else "no answer for its entry"
                results[item.index] = _unsent(job, reason)
                refused_groups.add(job.workspace_id)
    return sent, sent_items


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
        return BatchItemResult(job.job_id, HTTPStatus.ACCEPTED, **repeat_fields(outcome.item))
    return None


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
