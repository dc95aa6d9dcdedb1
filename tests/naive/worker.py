"""The naive worker pattern that Agent Jobs replaces, kept only so tests can show each of its failure modes.

GetItem, then PutItem IN_FLIGHT with `attribute_not_exists(pk) OR status <> SUCCEEDED`, run the job, PutItem
SUCCEEDED; a plain loop over the batch that reports a failed record and carries on with the next one.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from job_worker.jobs.workspace import WorkspaceStore

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient


class NaiveWorker:
    def __init__(self, dynamodb: DynamoDBClient, table_name: str, workspaces: WorkspaceStore) -> None:
        self.dynamodb = dynamodb
        self.table_name = table_name
        self.workspaces = workspaces

    def handle(self, event: dict[str, Any], context: Any = None) -> dict[str, Any]:
        failures = []
        for record in event["Records"]:
            try:
                self._process(record)
            except Exception:
                failures.append({"itemIdentifier": record["messageId"]})
        return {"batchItemFailures": failures}

    def _process(self, record: dict[str, Any]) -> None:
        message = json.loads(record["body"])
        key = {"pk": {"S": f"job#{message['jobId']}"}}
        item = self.dynamodb.get_item(TableName=self.table_name, Key=key).get("Item")
        if item and item["status"]["S"] == "SUCCEEDED":
            return
        self.dynamodb.put_item(
            TableName=self.table_name,
            Item={**key, "status": {"S": "IN_FLIGHT"}},
            ConditionExpression="attribute_not_exists(pk) OR #s <> :succeeded",
            ExpressionAttributeNames={"#s": "status"},
            ExpressionAttributeValues={":succeeded": {"S": "SUCCEEDED"}},
        )
        workspace = self.workspaces.open(message["workspaceId"])
        payload = message["payload"]
        # The naive side effect trusts the job table alone: no look for its own commit on the branch, and it commits
        # onto whatever the branch is at (expected_head=None: no compare-and-swap).
        workspace.commit(
            job_id=message["jobId"],
            message=payload.get("commitMessage", message["type"]),
            patch=payload.get("patch", ""),
            expected_head=None,  # type: ignore[arg-type]  # tests' HookedWorkspaceStore reads None as "any head"
        )
        self.complete(key)

    def complete(self, key: dict[str, Any]) -> None:
        self.dynamodb.put_item(TableName=self.table_name, Item={**key, "status": {"S": "SUCCEEDED"}})
