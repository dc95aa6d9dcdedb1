"""The template's payload bucket as the arguments of the S3 calls that create and configure it."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from agent_jobs_local.template.intrinsics import IntrinsicResolver
from agent_jobs_local.template.loading import References, TemplateError
from agent_jobs_local.template.values import as_bool, as_int, get_att_resource


class BucketReader(IntrinsicResolver):
    """The AWS::S3::Bucket resource (at most one) and its AWS::S3::BucketPolicy."""

    @property
    def payload_bucket_id(self) -> str | None:
        """The template's S3 bucket (large payloads), if it has one."""
        buckets = self.resources_of_type("AWS::S3::Bucket")
        if len(buckets) > 1:
            raise TemplateError(f"several AWS::S3::Bucket resources {buckets}: expected at most one")
        return buckets[0] if buckets else None

    def bucket_name(self, bucket_id: str) -> str:
        """BucketName resolved for this stack; without one, a stable lower-case `<stack>-<id>` name (CloudFormation
        would add a random suffix), within S3's 63 characters."""
        properties = self.resource(bucket_id, "AWS::S3::Bucket").get("Properties") or {}
        if "BucketName" in properties:
            return str(self.resolve(properties["BucketName"]))
        name = re.sub(r"[^a-z0-9.-]+", "-", f"{self.stack_name}-{bucket_id}".lower()).strip("-.")
        return name[:63].rstrip("-.")

    def bucket_configuration(self, bucket_id: str) -> dict[str, Any]:
        """The bucket's properties as the S3 API calls' arguments: `ServerSideEncryptionConfiguration`,
        `PublicAccessBlockConfiguration`, `OwnershipControls` and `LifecycleConfiguration` (CloudFormation's
        lifecycle shape translated: ExpirationInDays -> Expiration.Days, Prefix -> Filter.Prefix)."""
        properties = self.resolve(self.resource(bucket_id, "AWS::S3::Bucket").get("Properties") or {})
        unknown = sorted(set(properties) - _BUCKET_PROPERTIES)
        if unknown:
            raise TemplateError(f"{bucket_id}: provisioning does not know {', '.join(unknown)}")
        configuration: dict[str, Any] = {}
        if "BucketEncryption" in properties:
            # CloudFormation's ServerSideEncryptionByDefault is the API's ApplyServerSideEncryptionByDefault.
            rules = [
                {
                    ("ApplyServerSideEncryptionByDefault" if k == "ServerSideEncryptionByDefault" else k): v
                    for k, v in rule.items()
                }
                for rule in properties["BucketEncryption"]["ServerSideEncryptionConfiguration"]
            ]
            configuration["ServerSideEncryptionConfiguration"] = {"Rules": rules}
        if "PublicAccessBlockConfiguration" in properties:
            configuration["PublicAccessBlockConfiguration"] = {
                name: as_bool(value, name) for name, value in properties["PublicAccessBlockConfiguration"].items()
            }
        if "OwnershipControls" in properties:
            configuration["OwnershipControls"] = properties["OwnershipControls"]
        if "LifecycleConfiguration" in properties:
            configuration["LifecycleConfiguration"] = {
                "Rules": [_lifecycle_rule(rule) for rule in properties["LifecycleConfiguration"]["Rules"]]
            }
        return configuration

    def bucket_policy(self, bucket_id: str, references: References) -> dict[str, Any] | None:
        """The PolicyDocument of the AWS::S3::BucketPolicy on `bucket_id`, resolved, for a local emulator: without the
        statements that deny requests without TLS (an emulator on loopback speaks plain HTTP, so they would deny
        everything; tests assert them on the template). None when nothing is left."""
        for policy_id in self.resources_of_type("AWS::S3::BucketPolicy"):
            properties = self.properties(policy_id)
            if get_att_resource(properties.get("Bucket")) == bucket_id:
                document: dict[str, Any] = self.resolve(properties["PolicyDocument"], references)
                statements = [s for s in document.get("Statement", []) if not _denies_plain_http(s)]
                return {**document, "Statement": statements} if statements else None
        return None


_BUCKET_PROPERTIES: Final = frozenset(
    {"BucketName", "BucketEncryption", "PublicAccessBlockConfiguration", "OwnershipControls", "LifecycleConfiguration"}
)


def _denies_plain_http(statement: Mapping[str, Any]) -> bool:
    secure = (statement.get("Condition") or {}).get("Bool", {}).get("aws:SecureTransport")
    return statement.get("Effect") == "Deny" and str(secure).lower() == "false"


def _lifecycle_rule(rule: Mapping[str, Any]) -> dict[str, Any]:
    translated: dict[str, Any] = {
        "ID": rule["Id"],
        "Status": rule["Status"],
        "Filter": {"Prefix": rule.get("Prefix", "")},
    }
    if "ExpirationInDays" in rule:
        translated["Expiration"] = {"Days": as_int(rule["ExpirationInDays"], "ExpirationInDays")}
    if "AbortIncompleteMultipartUpload" in rule:
        days = as_int(rule["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"], "DaysAfterInitiation")
        translated["AbortIncompleteMultipartUpload"] = {"DaysAfterInitiation": days}
    return translated
