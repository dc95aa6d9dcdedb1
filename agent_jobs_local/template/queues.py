"""The template's SQS queues and DynamoDB table as the arguments of the API calls that create them."""

from __future__ import annotations

import json
from typing import Any, Final

from agent_jobs_local.template.intrinsics import IntrinsicResolver
from agent_jobs_local.template.loading import References, TemplateError
from agent_jobs_local.template.values import as_bool, as_int, attribute_string

# CloudFormation property -> CreateQueue attribute (same names), and the properties that are not attributes.
_QUEUE_ATTRIBUTE_PROPERTIES: Final = frozenset(
    {
        "ContentBasedDeduplication",
        "DeduplicationScope",
        "DelaySeconds",
        "FifoQueue",
        "FifoThroughputLimit",
        "KmsDataKeyReusePeriodSeconds",
        "KmsMasterKeyId",
        "MaximumMessageSize",
        "MessageRetentionPeriod",
        "ReceiveMessageWaitTimeSeconds",
        "RedriveAllowPolicy",
        "RedrivePolicy",
        "SqsManagedSseEnabled",
        "VisibilityTimeout",
    }
)
_QUEUE_JSON_ATTRIBUTES: Final = frozenset({"RedrivePolicy", "RedriveAllowPolicy"})
_QUEUE_OTHER_PROPERTIES: Final = frozenset({"QueueName", "Tags"})

# CloudFormation table properties that CreateTable takes under the same name and shape.
_TABLE_CREATE_PROPERTIES: Final = frozenset(
    {
        "AttributeDefinitions",
        "BillingMode",
        "DeletionProtectionEnabled",
        "KeySchema",
        "LocalSecondaryIndexes",
        "OnDemandThroughput",
        "ProvisionedThroughput",
        "TableClass",
        "Tags",
        "WarmThroughput",
    }
)
# Applied after CreateTable (TTL, PITR), named (TableName), or reshaped (indexes, streams, SSE).
_TABLE_OTHER_PROPERTIES: Final = frozenset(
    {
        "GlobalSecondaryIndexes",
        "PointInTimeRecoverySpecification",
        "SSESpecification",
        "StreamSpecification",
        "TableName",
        "TimeToLiveSpecification",
        # CloudWatch Contributor Insights has no local effect.
        "ContributorInsightsSpecification",
    }
)


class QueueReader(IntrinsicResolver):
    """AWS::SQS::Queue resources as CreateQueue arguments."""

    def queue_name(self, queue_id: str) -> str:
        """QueueName resolved for this stack; without one, a stable `<stack>-<id>` name (CloudFormation would add a
        random suffix)."""
        properties = self.resource(queue_id, "AWS::SQS::Queue").get("Properties") or {}
        if "QueueName" in properties:
            return str(self.resolve(properties["QueueName"]))
        fifo = as_bool(self.resolve(properties.get("FifoQueue", False)), f"{queue_id} FifoQueue")
        suffix = ".fifo" if fifo else ""
        return f"{self.stack_name}-{queue_id}"[: 80 - len(suffix)] + suffix

    def queue_attributes(self, queue_id: str, references: References | None = None) -> dict[str, str]:
        """The queue's properties as CreateQueue `Attributes` (string values, policies as JSON). A RedrivePolicy needs
        the dead-letter queue's Arn in `references`."""
        properties = self.resource(queue_id, "AWS::SQS::Queue").get("Properties") or {}
        unknown = sorted(set(properties) - _QUEUE_ATTRIBUTE_PROPERTIES - _QUEUE_OTHER_PROPERTIES)
        if unknown:
            raise TemplateError(f"{queue_id}: no CreateQueue attribute for {', '.join(unknown)}")
        attributes: dict[str, str] = {}
        for name in sorted(set(properties) & _QUEUE_ATTRIBUTE_PROPERTIES):
            value = self.resolve(properties[name], references)
            if value is None:
                continue
            if name in _QUEUE_JSON_ATTRIBUTES:
                if name == "RedrivePolicy" and "maxReceiveCount" in value:
                    value = {**value, "maxReceiveCount": as_int(value["maxReceiveCount"], "maxReceiveCount")}
                attributes[name] = json.dumps(value, separators=(",", ":"))
            else:
                attributes[name] = attribute_string(value)
        return attributes

    def queue_tags(self, queue_id: str) -> dict[str, str]:
        tags = self.resolve(self.properties(queue_id).get("Tags") or [])
        return {str(tag["Key"]): str(tag["Value"]) for tag in tags}


class TableReader(IntrinsicResolver):
    """The AWS::DynamoDB::Table resource as CreateTable, UpdateTimeToLive and UpdateContinuousBackups arguments."""

    @property
    def table_id(self) -> str:
        return self._single("AWS::DynamoDB::Table")

    def table_name(self, table_id: str | None = None) -> str:
        """TableName resolved for this stack; without one, `<stack>-<id>` (CloudFormation would add a suffix)."""
        table_id = table_id or self.table_id
        properties = self.resource(table_id, "AWS::DynamoDB::Table").get("Properties") or {}
        if "TableName" in properties:
            return str(self.resolve(properties["TableName"]))
        return f"{self.stack_name}-{table_id}"

    def table_create_kwargs(self, table_id: str | None = None) -> dict[str, Any]:
        """CreateTable keyword arguments from the table's properties (TTL and PITR are separate calls)."""
        table_id = table_id or self.table_id
        properties = self.resolve(self.resource(table_id, "AWS::DynamoDB::Table").get("Properties") or {})
        unknown = sorted(set(properties) - _TABLE_CREATE_PROPERTIES - _TABLE_OTHER_PROPERTIES)
        if unknown:
            raise TemplateError(f"{table_id}: no CreateTable argument for {', '.join(unknown)}")
        kwargs: dict[str, Any] = {"TableName": self.table_name(table_id)}
        kwargs.update({name: properties[name] for name in sorted(set(properties) & _TABLE_CREATE_PROPERTIES)})
        if "GlobalSecondaryIndexes" in properties:
            # Contributor Insights is per index in CloudFormation, a separate API call in DynamoDB.
            kwargs["GlobalSecondaryIndexes"] = [
                {key: value for key, value in index.items() if key != "ContributorInsightsSpecification"}
                for index in properties["GlobalSecondaryIndexes"]
            ]
        if "StreamSpecification" in properties:
            kwargs["StreamSpecification"] = {"StreamEnabled": True, **properties["StreamSpecification"]}
        if "SSESpecification" in properties:
            sse = properties["SSESpecification"]
            kwargs["SSESpecification"] = {
                "Enabled": as_bool(sse.get("SSEEnabled", False), f"{table_id} SSEEnabled"),
                **({"SSEType": sse["SSEType"]} if "SSEType" in sse else {}),
                **({"KMSMasterKeyId": sse["KMSMasterKeyId"]} if "KMSMasterKeyId" in sse else {}),
            }
        return kwargs

    def table_time_to_live(self, table_id: str | None = None) -> dict[str, Any] | None:
        """UpdateTimeToLive's TimeToLiveSpecification, or None when the table has no TTL."""
        spec = self.resolve(self.properties(table_id or self.table_id).get("TimeToLiveSpecification"))
        if spec is None:
            return None
        return {"AttributeName": str(spec["AttributeName"]), "Enabled": as_bool(spec["Enabled"], "TTL Enabled")}

    def table_point_in_time_recovery(self, table_id: str | None = None) -> dict[str, Any] | None:
        """UpdateContinuousBackups' PointInTimeRecoverySpecification, or None when the template sets none."""
        spec = self.resolve(self.properties(table_id or self.table_id).get("PointInTimeRecoverySpecification"))
        if spec is None:
            return None
        enabled = as_bool(spec.get("PointInTimeRecoveryEnabled", False), "PointInTimeRecoveryEnabled")
        result: dict[str, Any] = {"PointInTimeRecoveryEnabled": enabled}
        if "RecoveryPeriodInDays" in spec:
            result["RecoveryPeriodInDays"] = as_int(spec["RecoveryPeriodInDays"], "RecoveryPeriodInDays")
        return result
