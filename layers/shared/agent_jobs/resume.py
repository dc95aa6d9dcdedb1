"""Resume of a halted workspace: the operator's decision (through the guard), then one drain marker into the
workspace's own FIFO group, which makes the worker run the workspace's PARKED jobs in SequenceNumber order.

The FIFO group serializes the drain with everything else of the workspace: messages sent before the marker are
delivered (and parked) before it, messages sent after it wait until it is acknowledged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent_jobs.guard import JobGuard, ResumeOutcome, ResumeResult
from agent_jobs.keys import drain_deduplication_id, workspace_group_id
from agent_jobs.models import DRAIN_MESSAGE_TYPE, DrainMarker, ResumeDecision

if TYPE_CHECKING:
    from mypy_boto3_sqs.client import SQSClient


def send_drain_marker(sqs: SQSClient, queue_url: str, marker: DrainMarker) -> str:
    """Send a drain marker into its workspace's group (deduplicated per resume and round); returns its message id."""
    response = sqs.send_message(
        QueueUrl=queue_url,
        MessageBody=marker.model_dump_json(by_alias=True),
        MessageGroupId=workspace_group_id(marker.workspace_id),
        MessageDeduplicationId=drain_deduplication_id(marker.workspace_id, marker.resume_id, marker.round),
        MessageAttributes={"type": {"DataType": "String", "StringValue": DRAIN_MESSAGE_TYPE}},
    )
    return response["MessageId"]


def resume_workspace(
    workspace_id: str,
    *,
    tenant_id: str,
    halting_job_id: str,
    decision: ResumeDecision,
    operator: str,
    guard: JobGuard,
    sqs: SQSClient,
    queue_url: str,
) -> ResumeResult:
    """Begin the resume (`JobGuard.begin_resume`) and, when the workspace is RESUMING, send its first drain marker.

    Repeating the same request is safe: a workspace already RESUMING from the same decision gets its first marker
    again (deduplicated by the queue, and a marker of a finished resume is ignored by the worker), which also
    recovers a resume whose marker could not be sent.
    """
    result = guard.begin_resume(
        workspace_id, tenant_id=tenant_id, halting_job_id=halting_job_id, decision=decision, operator=operator
    )
    if result.outcome in (ResumeOutcome.RESUMING, ResumeOutcome.ALREADY_RESUMING) and result.resume_id:
        send_drain_marker(sqs, queue_url, DrainMarker(workspace_id=workspace_id, resume_id=result.resume_id, round=0))
    return result
