"""Creating the template's queues, table and payload bucket from its own properties, in moto or an account."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import boto3

from agent_jobs_local.template.loading import DEFAULT_LOCAL_STACK_NAME, References, TemplateError, load_template
from agent_jobs_local.template.model import TemplateModel

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient
    from mypy_boto3_s3.client import S3Client
    from mypy_boto3_sqs.client import SQSClient
    from mypy_boto3_sts.client import STSClient


@dataclass(frozen=True)
class AwsClients:
    """The clients `provision` uses. `sts` is optional: without it the template's account id is assumed."""

    sqs: SQSClient
    dynamodb: DynamoDBClient
    sts: STSClient | None = None
    s3: S3Client | None = None  # needed when the template has a bucket

    @classmethod
    def from_session(cls, session: boto3.session.Session, *, endpoint_url: str | None = None) -> AwsClients:
        """Clients of `session`; boto3 also honours AWS_ENDPOINT_URL, so moto's server needs no argument."""
        return cls(
            sqs=session.client("sqs", endpoint_url=endpoint_url),
            dynamodb=session.client("dynamodb", endpoint_url=endpoint_url),
            sts=session.client("sts", endpoint_url=endpoint_url),
            s3=session.client("s3", endpoint_url=endpoint_url),
        )


@dataclass(frozen=True)
class ProvisionedResources:
    """What `provision` created, plus `references` for resolving Ref/GetAtt of these resources
    (e.g. `TemplateModel.function_environment(function_id, resources.references)`)."""

    queue_url: str
    queue_arn: str
    queue_name: str
    dlq_url: str
    dlq_arn: str
    dlq_name: str
    table_name: str
    table_arn: str
    region: str
    account_id: str
    references: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    payload_bucket: str | None = None


def _queue_arn(sqs: SQSClient, queue_url: str) -> str:
    return sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]


def _create_queue(sqs: SQSClient, model: TemplateModel, queue_id: str, references: References) -> tuple[str, str]:
    name = model.queue_name(queue_id)
    tags = model.queue_tags(queue_id)
    attributes = model.queue_attributes(queue_id, references)
    if tags:
        url = sqs.create_queue(QueueName=name, Attributes=attributes, tags=tags)["QueueUrl"]  # type: ignore[arg-type]
    else:
        url = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]  # type: ignore[arg-type]
    return url, _queue_arn(sqs, url)


def _create_table(dynamodb: DynamoDBClient, model: TemplateModel) -> tuple[str, str]:
    kwargs = model.table_create_kwargs()
    name = str(kwargs["TableName"])
    # Provisioned before (a long-lived moto server): keep it.
    with contextlib.suppress(dynamodb.exceptions.ResourceInUseException):
        dynamodb.create_table(**kwargs)
    dynamodb.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 60})
    arn = dynamodb.describe_table(TableName=name)["Table"]["TableArn"]

    ttl = model.table_time_to_live()
    if ttl is not None:
        current = dynamodb.describe_time_to_live(TableName=name).get("TimeToLiveDescription", {})
        # DynamoDB rejects enabling TTL that is already enabled, so a second provision must not ask again.
        already = (
            current.get("TimeToLiveStatus") in ("ENABLED", "ENABLING")
            and current.get("AttributeName") == ttl["AttributeName"]
        )
        if already != ttl["Enabled"]:
            dynamodb.update_time_to_live(TableName=name, TimeToLiveSpecification=ttl)  # type: ignore[arg-type]

    pitr = model.table_point_in_time_recovery()
    if pitr is not None:
        dynamodb.update_continuous_backups(TableName=name, PointInTimeRecoverySpecification=pitr)  # type: ignore[arg-type]
    return name, arn


def _create_bucket(s3: S3Client, model: TemplateModel, bucket_id: str, references: References) -> str:
    name = model.bucket_name(bucket_id)
    region = s3.meta.region_name
    # Provisioned before (a long-lived moto server): keep it.
    with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
        if region in (None, "us-east-1"):
            s3.create_bucket(Bucket=name)
        else:
            s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": region})  # type: ignore[typeddict-item]
    configuration = model.bucket_configuration(bucket_id)
    if "ServerSideEncryptionConfiguration" in configuration:
        s3.put_bucket_encryption(
            Bucket=name, ServerSideEncryptionConfiguration=configuration["ServerSideEncryptionConfiguration"]
        )
    if "PublicAccessBlockConfiguration" in configuration:
        s3.put_public_access_block(
            Bucket=name, PublicAccessBlockConfiguration=configuration["PublicAccessBlockConfiguration"]
        )
    if "OwnershipControls" in configuration:
        s3.put_bucket_ownership_controls(Bucket=name, OwnershipControls=configuration["OwnershipControls"])
    if "LifecycleConfiguration" in configuration:
        s3.put_bucket_lifecycle_configuration(
            Bucket=name, LifecycleConfiguration=configuration["LifecycleConfiguration"]
        )
    policy = model.bucket_policy(bucket_id, references)
    if policy is not None:
        s3.put_bucket_policy(Bucket=name, Policy=json.dumps(policy))
    return name


def provision(
    aws: boto3.session.Session | AwsClients,
    template: TemplateModel | Mapping[str, Any] | None = None,
    stack_name: str | None = None,
    *,
    parameter_overrides: Mapping[str, object] | None = None,
) -> ProvisionedResources:
    """Create the template's dead-letter queue, jobs queue (redrive to it), table and payload bucket (encryption,
    public access block, ownership, lifecycle and bucket policy), from the template's own properties: every queue
    attribute, table and bucket setting is passed, nothing is kept here by hand.

    `template` is a loaded template (default: the repository's template.yaml) or a `TemplateModel`; a model brings its
    own stack name and parameters, so `stack_name`/`parameter_overrides` must then be left out. The account and region
    come from the clients (STS when there is an STS client), so ARNs built with `${AWS::AccountId}` match.

    Provisioning twice with the same stack name reuses what exists. Against moto 5.2.5 (in-process and server) every
    attribute the template sets is accepted, with these differences from SQS that tests must not rely on:
    RedriveAllowPolicy is accepted but not stored (GetQueueAttributes rejects its name); FifoThroughputLimit is
    stored, not enforced; deduplication follows DeduplicationScope and SQS's 5-minute window only with the
    emulator's correction (`agent_jobs_local.emulator`, also applied by the tests' in-process stack): moto alone
    deduplicates per queue, against messages still in the queue. Nothing is dropped.
    """
    clients = aws if isinstance(aws, AwsClients) else AwsClients.from_session(aws)
    if isinstance(template, TemplateModel):
        if stack_name is not None or parameter_overrides is not None:
            raise TemplateError("a TemplateModel brings its own stack name and parameters: pass neither")
        model = template
    else:
        model = TemplateModel(
            load_template() if template is None else template,
            stack_name=stack_name or DEFAULT_LOCAL_STACK_NAME,
            parameter_overrides=parameter_overrides,
        )

    region = clients.sqs.meta.region_name or model.region
    account_id = clients.sts.get_caller_identity()["Account"] if clients.sts is not None else model.account_id
    if (region, account_id) != (model.region, model.account_id):
        model = model.for_account(account_id=account_id, region=region)

    references: dict[str, dict[str, str]] = {}
    dlq_id, queue_id, table_id = model.dead_letter_queue_id, model.jobs_queue_id, model.table_id

    dlq_url, dlq_arn = _create_queue(clients.sqs, model, dlq_id, references)
    references[dlq_id] = {"Ref": dlq_url, "Arn": dlq_arn, "QueueName": model.queue_name(dlq_id), "QueueUrl": dlq_url}

    queue_url, queue_arn = _create_queue(clients.sqs, model, queue_id, references)
    references[queue_id] = {
        "Ref": queue_url,
        "Arn": queue_arn,
        "QueueName": model.queue_name(queue_id),
        "QueueUrl": queue_url,
    }

    table_name, table_arn = _create_table(clients.dynamodb, model)
    references[table_id] = {"Ref": table_name, "Arn": table_arn}

    bucket_id, bucket_name = model.payload_bucket_id, None
    if bucket_id is not None:
        if clients.s3 is None:
            raise TemplateError(f"the template has the bucket {bucket_id}: pass AwsClients with an S3 client")
        bucket_name = model.bucket_name(bucket_id)
        references[bucket_id] = {"Ref": bucket_name, "Arn": f"arn:{model.partition}:s3:::{bucket_name}"}
        _create_bucket(clients.s3, model, bucket_id, references)

    # Functions are not created here, but a function's environment may name another (`!Ref TestSandboxFunction`):
    # the names are the ones the local runtime serves them under.
    for function_id in model.resources_of_type("AWS::Serverless::Function"):
        references[function_id] = {"Ref": model.function_name(function_id), "Arn": model.function_arn(function_id)}

    return ProvisionedResources(
        queue_url=queue_url,
        queue_arn=queue_arn,
        queue_name=model.queue_name(queue_id),
        dlq_url=dlq_url,
        dlq_arn=dlq_arn,
        dlq_name=model.queue_name(dlq_id),
        table_name=table_name,
        table_arn=table_arn,
        region=region,
        account_id=account_id,
        references=references,
        payload_bucket=bucket_name,
    )
