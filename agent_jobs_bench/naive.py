"""The naive pattern Agent Jobs is measured against, on the same table and queue (a faithful baseline, not a straw man).

Producer, per job: GetItem (was this jobId seen?), PutItem QUEUED, SendMessage (the same message group and
deduplication id as Agent Jobs). Worker, per record in a sequential loop over the batch: GetItem (skip it when
SUCCEEDED), PutItem IN_FLIGHT (`attribute_not_exists(pk) OR status <> SUCCEEDED`), the side effect, PutItem
SUCCEEDED. The items carry what a job record needs to be queryable (ids, tenant, type, payload hash, status, times),
so item sizes compare like for like. A failed record is reported in `batchItemFailures` and the loop carries on;
nothing is written on a failure (the next delivery starts again from its GetItem).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_jobs.keys import deduplication_id, workspace_group_id

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef
    from mypy_boto3_sqs.client import SQSClient

SideEffect = Callable[[dict[str, Any]], None]


def _job_key(job_id: str) -> dict[str, AttributeValueTypeDef]:
    return {"pk": {"S": f"job#{job_id}"}}


def _now_ms() -> str:
    return str(int(time.time() * 1000))


def naive_enqueue(
    job: dict[str, Any], tenant_id: str, *, dynamodb: DynamoDBClient, sqs: SQSClient, table_name: str, queue_url: str
) -> str | None:
    """GetItem, PutItem QUEUED, SendMessage; returns SQS's message id, or None when the jobId was already recorded.

    `job` is the request as sent: jobId, workspaceId, type, payload."""
    key = _job_key(job["jobId"])
    if "Item" in dynamodb.get_item(TableName=table_name, Key=key):
        return None
    body = json.dumps({**job, "tenantId": tenant_id})
    dynamodb.put_item(
        TableName=table_name,
        Item={
            **key,
            "jobId": {"S": job["jobId"]},
            "workspaceId": {"S": job["workspaceId"]},
            "tenantId": {"S": tenant_id},
            "type": {"S": job["type"]},
            "payloadHash": {"S": hashlib.sha256(json.dumps(job["payload"], sort_keys=True).encode()).hexdigest()},
            "status": {"S": "QUEUED"},
            "createdAt": {"N": _now_ms()},
            "updatedAt": {"N": _now_ms()},
        },
    )
    response = sqs.send_message(
        QueueUrl=queue_url,
        MessageBody=body,
        MessageGroupId=workspace_group_id(job["workspaceId"]),
        MessageDeduplicationId=deduplication_id(tenant_id, job["jobId"], job["type"]),
        MessageAttributes={
            "tenantId": {"DataType": "String", "StringValue": tenant_id},
            "type": {"DataType": "String", "StringValue": job["type"]},
        },
    )
    return response["MessageId"]


@dataclass
class NaiveWorker:
    """The naive worker: `handle(event)` loops over the batch's records one after the other."""

    dynamodb: DynamoDBClient
    table_name: str
    side_effect: SideEffect

    def handle(self, event: dict[str, Any], context: Any = None) -> dict[str, Any]:
        failures = []
        for record in event.get("Records", []):
            try:
                self.process(record)
            except Exception:  # the naive loop: report the record, carry on with the next one
                failures.append({"itemIdentifier": record["messageId"]})
        return {"batchItemFailures": failures}

    def process(self, record: dict[str, Any]) -> None:
        message = json.loads(record["body"])
        key = _job_key(message["jobId"])
        item = self.dynamodb.get_item(TableName=self.table_name, Key=key).get("Item")
        if item is not None and item.get("status", {}).get("S") == "SUCCEEDED":
            return  # a duplicate delivery: acknowledged without effect
        base: dict[str, AttributeValueTypeDef] = dict(item) if item is not None else {**key}
        base.update(
            {
                "jobId": {"S": message["jobId"]},
                "workspaceId": {"S": message["workspaceId"]},
                "tenantId": {"S": message.get("tenantId", "")},
                "type": {"S": message["type"]},
                "messageId": {"S": record["messageId"]},
            }
        )
        self.dynamodb.put_item(
            TableName=self.table_name,
            Item={**base, "status": {"S": "IN_FLIGHT"}, "updatedAt": {"N": _now_ms()}},
            ConditionExpression="attribute_not_exists(pk) OR #s <> :succeeded",
            ExpressionAttributeNames={"#s": "status"},
            ExpressionAttributeValues={":succeeded": {"S": "SUCCEEDED"}},
        )
        self.side_effect(message)
        self.dynamodb.put_item(
            TableName=self.table_name,
            Item={**base, "status": {"S": "SUCCEEDED"}, "updatedAt": {"N": _now_ms()}},
        )


def commit_to_folder(root: Path) -> SideEffect:
    """The same side effect as Agent Jobs' apply_patch on a local folder workspace: commit the job's patch onto the
    workspace's branch (the folder store the worker's tests use). The naive pattern looks for nothing first."""
    from agent_jobs_local.folder_workspaces import LocalWorkspaceStore

    store = LocalWorkspaceStore(root)

    def apply(message: dict[str, Any]) -> None:
        workspace = store.open(message["workspaceId"])
        payload = message.get("payload", {})
        workspace.commit(
            job_id=message["jobId"],
            message=payload.get("commitMessage", message["type"]),
            patch=payload.get("patch", ""),
            expected_head=workspace.head(),
        )

    return apply
