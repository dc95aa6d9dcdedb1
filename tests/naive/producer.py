"""The naive producer that Agent Jobs replaces, kept only so tests can show its failure mode.

A plain SendMessage with a MessageDeduplicationId derived from the jobId and no record of what was accepted: SQS
silently drops a resend of the same jobId inside its 5-minute deduplication window, even with another payload, and
accepts it as a new message after the window.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from agent_jobs.keys import deduplication_id, workspace_group_id

if TYPE_CHECKING:
    from mypy_boto3_sqs.client import SQSClient


def naive_enqueue(sqs: SQSClient, queue_url: str, job: dict[str, Any], tenant_id: str) -> str:
    """Send the job as it came (same group and deduplication ids as Agent Jobs) and return SQS's message id."""
    response = sqs.send_message(
        QueueUrl=queue_url,
        MessageBody=json.dumps({**job, "tenantId": tenant_id}),
        MessageGroupId=workspace_group_id(job["workspaceId"]),
        MessageDeduplicationId=deduplication_id(tenant_id, job["jobId"], job["type"]),
        MessageAttributes={
            "tenantId": {"DataType": "String", "StringValue": tenant_id},
            "type": {"DataType": "String", "StringValue": job["type"]},
        },
    )
    return response["MessageId"]
