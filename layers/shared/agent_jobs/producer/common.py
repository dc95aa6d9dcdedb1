"""What sending a job and sending a batch share: quota admission, the message attributes, and the answer to a repeat
of an accepted job."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agent_jobs.guard import AcceptOutcome, AcceptResult, JobGuard
from agent_jobs.models import ApplyPatchJob, JobStatus, OpenPrJob, RunTestsJob
from agent_jobs.quotas import Admission, JobQuotas

if TYPE_CHECKING:
    from mypy_boto3_sqs.type_defs import MessageAttributeValueTypeDef


def admit(
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


def counted(
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


def message_attributes(tenant_id: str, job_type: str) -> dict[str, MessageAttributeValueTypeDef]:
    return {
        "tenantId": {"DataType": "String", "StringValue": tenant_id},
        "type": {"DataType": "String", "StringValue": job_type},
    }


def repeat_fields(item: Mapping[str, Any]) -> dict[str, Any]:
    """A repeat of an accepted job is answered from its record: its status, message id and SequenceNumber, not
    created."""
    return {
        "status": str(item.get("status", JobStatus.QUEUED)),
        "message_id": item.get("messageId"),
        "sequence_number": item.get("sequenceNumber"),
        "created": False,
    }
