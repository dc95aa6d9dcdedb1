"""template.yaml is code: the facts cfn-lint cannot see, the documented settings, both linters, and
queues and tables created from the template in moto matching what is deployed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from agent_jobs_local.principals import principal_id
from agent_jobs_local.template import (
    DEFAULT_TEMPLATE_PATH,
    AwsClients,
    TemplateError,
    TemplateModel,
    load_template,
    provision,
)
from agent_jobs_local.template_checks import (
    check_alarms,
    check_explicit_deduplication,
    check_fifo_queues,
    check_function_timeouts,
    check_high_throughput_fifo,
    check_least_privilege,
    check_queue_encryption,
    check_redrive_policy,
    check_table,
    check_visibility_timeout,
    check_worker_event_source,
    template_violations,
)
from tests.documentation import doc_section

REPO = DEFAULT_TEMPLATE_PATH.parent
BIN = Path(sys.executable).parent
REGION = "us-east-1"

Template = dict[str, Any]


def _resources(template: Template) -> dict[str, Any]:
    resources: dict[str, Any] = template["Resources"]
    return resources


def _props(template: Template, logical_id: str) -> dict[str, Any]:
    properties: dict[str, Any] = _resources(template)[logical_id]["Properties"]
    return properties


def _worker_event(template: Template) -> dict[str, Any]:
    event: dict[str, Any] = _props(template, "JobWorkerFunction")["Events"]["JobsQueueRecords"]["Properties"]
    return event


def _statements(template: Template, function_id: str) -> list[dict[str, Any]]:
    return [s for policy in _props(template, function_id)["Policies"] for s in policy["Statement"]]


# --- Loading and resolving -----------------------------------------------------------------------------------------


def test_load_template_turns_short_tags_into_long_forms(tmp_path: Path) -> None:
    # Given a template using every short-form tag CloudFormation defines
    path = tmp_path / "template.yaml"
    path.write_text(
        """
AWSTemplateFormatVersion: 2010-09-09
Conditions:
  C: !And [!Equals [a, !Ref P], !Not [!Condition D], !Or [!Condition D, !Condition E]]
Resources:
  R:
    Type: AWS::SQS::Queue
    Properties:
      A: !GetAtt Q.Endpoint.Address
      B: !GetAtt [Q, Arn]
      C: !Sub "${AWS::StackName}-x"
      D: !Join [",", [a, b]]
      E: !If [C, !Select [0, !Split [",", "a,b"]], !FindInMap [M, k, v]]
      F: !GetAZs ""
      G: !ImportValue exported
      H: !Base64 text
      I: !Cidr [10.0.0.0/16, 2, 8]
"""
    )

    # When it is loaded
    loaded = load_template(path)

    # Then every tag is in its long form, and the version date stays a string
    assert loaded["AWSTemplateFormatVersion"] == "2010-09-09"
    assert loaded["Conditions"]["C"] == {
        "Fn::And": [
            {"Fn::Equals": ["a", {"Ref": "P"}]},
            {"Fn::Not": [{"Condition": "D"}]},
            {"Fn::Or": [{"Condition": "D"}, {"Condition": "E"}]},
        ]
    }
    assert _props(loaded, "R") == {
        "A": {"Fn::GetAtt": ["Q", "Endpoint.Address"]},
        "B": {"Fn::GetAtt": ["Q", "Arn"]},
        "C": {"Fn::Sub": "${AWS::StackName}-x"},
        "D": {"Fn::Join": [",", ["a", "b"]]},
        "E": {
            "Fn::If": [
                "C",
                {"Fn::Select": [0, {"Fn::Split": [",", "a,b"]}]},
                {"Fn::FindInMap": ["M", "k", "v"]},
            ]
        },
        "F": {"Fn::GetAZs": ""},
        "G": {"Fn::ImportValue": "exported"},
        "H": {"Fn::Base64": "text"},
        "I": {"Fn::Cidr": ["10.0.0.0/16", 2, 8]},
    }


def test_load_template_rejects_an_unknown_tag(tmp_path: Path) -> None:
    path = tmp_path / "template.yaml"
    path.write_text("Resources:\n  R:\n    Type: !Bogus x\n")
    with pytest.raises(Exception, match="unknown CloudFormation tag !Bogus"):
        load_template(path)


def test_template_model_resolves_parameter_defaults_and_overrides(template: Template) -> None:
    assert TemplateModel(template).worker.batch_size == 5
    assert TemplateModel(template, parameter_overrides={"WorkerBatchSize": 10}).worker.batch_size == 10


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"WorkerBatchSize": 20}, "above its MaxValue"),
        ({"WorkerMaximumConcurrency": 1}, "below its MinValue"),
        ({"LogLevel": "TRACE"}, "AllowedValues"),
        ({"NoSuchParameter": 1}, "name no template parameter"),
    ],
)
def test_template_model_rejects_overrides_cloudformation_would_reject(
    template: Template, overrides: dict[str, object], message: str
) -> None:
    with pytest.raises(TemplateError, match=message):
        TemplateModel(template, parameter_overrides=overrides)


def test_template_model_names_queues_after_the_stack(template: Template) -> None:
    model = TemplateModel(template, stack_name="s1")
    assert model.queue_name("JobsQueue") == "s1-jobs.fifo"
    assert model.queue_name("JobsDeadLetterQueue") == "s1-jobs-dlq.fifo"


def test_template_model_needs_provisioned_resources_to_resolve_the_environment(model: TemplateModel) -> None:
    with pytest.raises(TemplateError, match="Ref JobsTable is not known"):
        model.worker_environment()


# --- template facts cfn-lint cannot see ---------------------------------------------------------------------------


def test_template_violations_are_none_for_the_real_template(model: TemplateModel) -> None:
    assert template_violations(model) == []


def test_queues_are_fifo(model: TemplateModel) -> None:
    assert check_fifo_queues(model) == []
    assert model.queue_attributes("JobsDeadLetterQueue")["FifoQueue"] == "true"
    assert model.queue_attributes("JobsQueue", {"JobsDeadLetterQueue": {"Arn": "arn:dlq"}})["FifoQueue"] == "true"


def test_queues_use_explicit_deduplication_ids(model: TemplateModel) -> None:
    assert check_explicit_deduplication(model) == []


def test_jobs_queue_is_high_throughput_fifo(model: TemplateModel) -> None:
    assert check_high_throughput_fifo(model) == []


def test_jobs_queue_visibility_timeout_is_at_least_six_worker_timeouts(model: TemplateModel) -> None:
    assert check_visibility_timeout(model) == []
    assert model.properties("JobsQueue")["VisibilityTimeout"] >= 6 * model.worker.timeout_seconds


def test_redrive_is_a_backstop_above_the_worker_max_attempts(model: TemplateModel) -> None:
    assert check_redrive_policy(model) == []
    max_attempts = model.function_environment_variable("JobWorkerFunction", "MAX_ATTEMPTS")
    assert max_attempts is not None
    assert model.redrive_max_receive_count() >= 5
    assert model.redrive_max_receive_count() > int(max_attempts)


def test_redrive_target_is_the_fifo_dead_letter_queue(model: TemplateModel) -> None:
    assert model.dead_letter_queue_id == "JobsDeadLetterQueue"
    attributes = model.queue_attributes("JobsQueue", {"JobsDeadLetterQueue": {"Arn": "arn:dlq"}})
    assert json.loads(attributes["RedrivePolicy"]) == {"deadLetterTargetArn": "arn:dlq", "maxReceiveCount": 10}


def test_queues_are_encrypted_at_rest(model: TemplateModel) -> None:
    assert check_queue_encryption(model) == []


def test_worker_event_source_batches_within_fifo_limits_and_reports_partial_failures(model: TemplateModel) -> None:
    assert check_worker_event_source(model) == []
    worker = model.worker
    assert 1 <= worker.batch_size <= 10
    assert worker.function_response_types == ("ReportBatchItemFailures",)
    assert worker.maximum_concurrency is not None
    assert 2 <= worker.maximum_concurrency <= 1000


def test_worker_event_source_parameters_are_bounded(template: Template) -> None:
    parameters = template["Parameters"]
    assert (parameters["WorkerBatchSize"]["MinValue"], parameters["WorkerBatchSize"]["MaxValue"]) == (1, 10)
    assert (parameters["WorkerMaximumConcurrency"]["MinValue"], parameters["WorkerMaximumConcurrency"]["MaxValue"]) == (
        2,
        1000,
    )
    assert parameters["MaxReceiveCount"]["MinValue"] >= 5


def test_function_timeouts_are_within_lambda_limit(model: TemplateModel) -> None:
    assert check_function_timeouts(model) == []


def test_table_is_on_demand_with_ttl_point_in_time_recovery_and_encryption(model: TemplateModel) -> None:
    assert check_table(model) == []
    assert model.table_time_to_live() == {"AttributeName": "ttl", "Enabled": True}


def test_policies_are_least_privilege(model: TemplateModel, template: Template) -> None:
    assert check_least_privilege(model) == []
    # Not vacuous: both functions carry explicit statements on their own resources.
    for function_id in ("EnqueueApiFunction", "JobWorkerFunction"):
        statements = _statements(template, function_id)
        assert statements
        assert all(statement["Resource"] != "*" for statement in statements)


def test_policies_grant_what_each_function_needs(template: Template) -> None:
    def actions(function_id: str) -> set[str]:
        return {action for s in _statements(template, function_id) for action in s["Action"]}

    assert actions("EnqueueApiFunction") == {
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:GetItem",
        "dynamodb:ConditionCheckItem",
        "dynamodb:Query",
        "sqs:SendMessage",
        "s3:PutObject",
    }
    # the API queries three indexes (timeline, halted list, queued-jobs quota), never the table or the parked index
    api_queries = [s for s in _statements(template, "EnqueueApiFunction") if "dynamodb:Query" in s["Action"]]
    assert sorted(str(s["Resource"]) for s in api_queries) == sorted(
        str({"Fn::Sub": f"${{JobsTable.Arn}}/index/{name}"})
        for name in ("byWorkspace", "haltedByTenant", "pendingByWorkspace")
    )
    assert actions("JobWorkerFunction") == {
        "dynamodb:UpdateItem",
        "dynamodb:PutItem",
        "dynamodb:GetItem",
        "dynamodb:BatchGetItem",
        "dynamodb:Query",
        "dynamodb:ConditionCheckItem",
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:GetQueueAttributes",
        "sqs:ChangeMessageVisibility",
        "sqs:SendMessage",
        "ssm:GetParameter",
        "secretsmanager:GetSecretValue",
        "s3:GetObject",
        "s3:PutObject",
        "s3:ListBucket",
        "lambda:InvokeFunction",
    }
    # workspace tokens: only under the configured prefix, never every parameter or secret of the account
    token_resources = next(s for s in _statements(template, "JobWorkerFunction") if s.get("Sid") == "WorkspaceTokens")
    assert all("${WorkspaceTokenPrefix}/*" in resource["Fn::Sub"] for resource in token_resources["Resource"])
    worker_table_resources = _statements(template, "JobWorkerFunction")[0]["Resource"]
    assert {"Fn::Sub": "${JobsTable.Arn}/index/*"} in worker_table_resources


def test_payload_objects_are_written_by_the_producer_and_read_by_the_worker_only_under_their_prefix(
    template: Template,
) -> None:
    def statement(function_id: str, sid: str) -> dict[str, Any]:
        return next(s for s in _statements(template, function_id) if s.get("Sid") == sid)

    assert statement("EnqueueApiFunction", "StoreLargePayloads")["Resource"] == {
        "Fn::Sub": "${PayloadBucket.Arn}/payloads/*"
    }
    assert statement("JobWorkerFunction", "ReadLargePayloads")["Resource"] == {
        "Fn::Sub": "${PayloadBucket.Arn}/payloads/*"
    }
    # Listing only the bucket itself (so a missing object is a 404), never another bucket's objects.
    assert statement("JobWorkerFunction", "TellMissingPayloads")["Resource"] == {"Fn::GetAtt": ["PayloadBucket", "Arn"]}


def test_payload_bucket_is_private_encrypted_and_expires_payloads(model: TemplateModel, template: Template) -> None:
    bucket = template["Resources"]["PayloadBucket"]
    properties = model.resolve(bucket["Properties"])
    assert properties["BucketEncryption"]["ServerSideEncryptionConfiguration"] == [
        {"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}
    ]
    assert all(properties["PublicAccessBlockConfiguration"].values())
    assert len(properties["PublicAccessBlockConfiguration"]) == 4
    assert properties["OwnershipControls"] == {"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]}
    rules = {rule["Id"]: rule for rule in properties["LifecycleConfiguration"]["Rules"]}
    assert rules["ExpirePayloads"]["Prefix"] == "payloads/"
    assert rules["AbortIncompleteUploads"]["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 1}
    # Payloads outlive their job records and the queue's longest retention (14 days) by default.
    retention = int(rules["ExpirePayloads"]["ExpirationInDays"])
    assert retention >= int(model.resolve({"Ref": "JobTtlDays"})) + 14
    assert bucket["DeletionPolicy"] == bucket["UpdateReplacePolicy"] == "Retain"
    skipped = {entry["id"] for entry in bucket["Metadata"]["checkov"]["skip"]}
    assert skipped == {"CKV_AWS_145", "CKV_AWS_18", "CKV_AWS_21", "CKV_AWS_144", "CKV2_AWS_62"}
    assert all(len(entry["comment"]) > 40 for entry in bucket["Metadata"]["checkov"]["skip"])


def test_payload_bucket_refuses_requests_without_tls(template: Template) -> None:
    (statement,) = template["Resources"]["PayloadBucketPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    assert (statement["Effect"], statement["Principal"], statement["Action"]) == ("Deny", "*", "s3:*")
    assert statement["Condition"] == {"Bool": {"aws:SecureTransport": False}}
    assert {"Fn::Sub": "${PayloadBucket.Arn}/*"} in statement["Resource"]
    assert {"Fn::GetAtt": ["PayloadBucket", "Arn"]} in statement["Resource"]


def test_functions_know_the_payload_bucket_and_its_retention(template: Template) -> None:
    for function_id in ("EnqueueApiFunction", "JobWorkerFunction"):
        variables = _props(template, function_id)["Environment"]["Variables"]
        assert variables["PAYLOAD_BUCKET"] == {"Ref": "PayloadBucket"}
        assert variables["PAYLOAD_RETENTION_DAYS"] == {"Ref": "PayloadRetentionDays"}


def test_globals_give_no_function_the_data_plane_settings(template: Template) -> None:
    # SAM merges Globals into every function, the test sandbox included: settings, layers and tracing live on the
    # functions that need them.
    assert set(template["Globals"]["Function"]) == {"Runtime", "Architectures", "MemorySize"}


def test_api_and_worker_share_the_same_data_plane_settings(template: Template) -> None:
    api = _props(template, "EnqueueApiFunction")["Environment"]["Variables"]
    worker = _props(template, "JobWorkerFunction")["Environment"]["Variables"]
    # but for LOCAL_JWT_PUBLIC_KEY: the producer's alone, and declared only for `sam local`
    assert {name: worker[name] for name in api if name != "LOCAL_JWT_PUBLIC_KEY"} == {
        name: value for name, value in api.items() if name != "LOCAL_JWT_PUBLIC_KEY"
    }
    assert {"TABLE_NAME", "QUEUE_URL", "POWERTOOLS_SERVICE_NAME", "AWS_ENDPOINT_URL"} <= set(api)


def test_alarms_watch_dead_letter_depth_and_oldest_message_age(model: TemplateModel) -> None:
    assert check_alarms(model) == []
    assert _props(model.template, "OldestMessageAgeAlarm")["Threshold"] == {"Ref": "OldestMessageAgeAlarmSeconds"}
    assert model.parameters["OldestMessageAgeAlarmSeconds"] == "900"


def test_docs_configuration_names_every_template_parameter(template: Template) -> None:
    section = doc_section("docs/configuration.md", "Template parameters")
    assert [name for name in template["Parameters"] if f"`{name}`" not in section] == []


def test_docs_say_how_to_raise_each_quota(template: Template) -> None:
    quotas = doc_section("docs/operations.md", "Quotas")
    assert "--parameter-overrides" in quotas
    for parameter in ("MaxWorkspacesPerTenant", "MaxJobsPerSecondPerTenant", "MaxQueuedJobsPerWorkspace"):
        assert parameter in template["Parameters"]
        assert f"`{parameter}`" in quotas, parameter


# --- The documented settings ---------------------------------------------------------------------------------------


def test_worker_timeout_is_120_seconds(model: TemplateModel) -> None:
    assert model.worker.timeout_seconds == 120
    assert model.properties("JobsQueue")["VisibilityTimeout"] == 720


def test_functions_run_python313_on_arm64_with_the_shared_layer(model: TemplateModel) -> None:
    for function_id in model.resources_of_type("AWS::Serverless::Function"):
        settings = model.function_settings(function_id)
        assert (settings.runtime, settings.architectures) == ("python3.13", ("arm64",)), function_id
    for function_id in ("EnqueueApiFunction", "JobWorkerFunction"):
        assert {"Ref": "SharedLayer"} in model.function_properties(function_id)["Layers"]
    layer = model.properties("SharedLayer")
    assert layer["CompatibleRuntimes"] == ["python3.13"]
    assert model.resolve(layer["CompatibleArchitectures"]) == ["arm64"]


def test_one_architecture_parameter_sets_the_functions_and_the_layer() -> None:
    # `make build ARCHITECTURE=x86_64` (sam local on an x86_64 machine) passes Architecture=x86_64 to sam build
    model = TemplateModel.from_path(parameter_overrides={"Architecture": "x86_64"})
    for function_id in model.resources_of_type("AWS::Serverless::Function"):
        assert model.function_settings(function_id).architectures == ("x86_64",), function_id
    assert model.resolve(model.properties("SharedLayer")["CompatibleArchitectures"]) == ["x86_64"]
    # the layer's wheels follow the same setting, never a BuildArchitecture of their own
    assert "BuildArchitecture" not in model.resource("SharedLayer")["Metadata"]


def test_functions_and_layer_build_with_makefiles_not_containers(model: TemplateModel) -> None:
    for logical_id in ("SharedLayer", "EnqueueApiFunction", "JobWorkerFunction", "TestSandboxFunction"):
        assert model.resource(logical_id)["Metadata"]["BuildMethod"] == "makefile", logical_id
        code = model.properties(logical_id).get("CodeUri") or model.properties(logical_id)["ContentUri"]
        assert (REPO / code / "Makefile").read_text().count(f"build-{logical_id}:") == 1


def test_worker_environment_carries_the_backoff_and_safety_margin(model: TemplateModel) -> None:
    variables = {
        name: model.function_environment_variable("JobWorkerFunction", name)
        for name in (
            "TIME_SAFETY_MARGIN_MS",
            "BACKOFF_BASE_SECONDS",
            "BACKOFF_MAX_SECONDS",
            "MAX_RECEIVE_COUNT",
            "GROUP_CONCURRENCY",
        )
    }
    assert variables == {
        "GROUP_CONCURRENCY": "10",
        "TIME_SAFETY_MARGIN_MS": "10000",
        "BACKOFF_BASE_SECONDS": "2",
        "BACKOFF_MAX_SECONDS": "300",
        "MAX_RECEIVE_COUNT": "10",
    }


def test_worker_knows_the_apis_messages_by_the_role_sam_generates_for_the_api(model: TemplateModel) -> None:
    # SAM generates <FunctionId>Role for a function that names no Role; its RoleId is what the API's messages'
    # SenderId begins with. The worker is given it, and the stack's outputs name it for the dead-letter redrive.
    api_sender = {"Fn::GetAtt": ["EnqueueApiFunctionRole", "RoleId"]}
    assert "Role" not in model.function_properties("EnqueueApiFunction")
    assert model.function_properties("JobWorkerFunction")["Environment"]["Variables"]["API_SENDER_ID"] == api_sender
    assert model.template["Outputs"]["ApiSenderId"]["Value"] == api_sender
    assert "EnqueueApiFunctionRole" not in model.resources
    # Locally the role resolves to the principal the emulator gives the function's own access key.
    role = model.generated_resources()["EnqueueApiFunctionRole"]
    assert role["RoleId"] == principal_id(model.function_access_key("EnqueueApiFunction"))
    assert model.function_environment_variable("JobWorkerFunction", "API_SENDER_ID") == role["RoleId"]


def test_worker_maximum_concurrency_fits_its_reserved_concurrency(model: TemplateModel) -> None:
    worker = model.worker
    assert worker.maximum_concurrency is not None
    assert worker.function.reserved_concurrency is not None
    assert worker.maximum_concurrency <= worker.function.reserved_concurrency


def test_dead_letter_queue_keeps_messages_14_days(model: TemplateModel) -> None:
    assert model.queue_attributes("JobsDeadLetterQueue")["MessageRetentionPeriod"] == str(14 * 24 * 3600)


def test_jobs_queue_accepts_1_mib_messages(model: TemplateModel) -> None:
    assert model.properties("JobsQueue")["MaximumMessageSize"] == 1024 * 1024


def test_table_indexes_jobs_by_workspace(model: TemplateModel) -> None:
    indexes = {index["IndexName"]: index for index in model.table_create_kwargs()["GlobalSecondaryIndexes"]}
    assert indexes["byWorkspace"] == {
        "IndexName": "byWorkspace",
        "KeySchema": [
            {"AttributeName": "workspaceId", "KeyType": "HASH"},
            {"AttributeName": "acceptedAt", "KeyType": "RANGE"},
        ],
        "Projection": {"ProjectionType": "ALL"},
    }


def test_table_has_the_sparse_indexes_a_resume_and_a_claim_read(model: TemplateModel) -> None:
    kwargs = model.table_create_kwargs()
    indexes = {index["IndexName"]: index for index in kwargs["GlobalSecondaryIndexes"]}
    assert set(indexes) == {
        "byWorkspace",
        "parkedByWorkspace",
        "haltedByTenant",
        "pendingByWorkspace",
        "runningByTenant",
        "refusedByDay",
    }
    # Messages refused without a halt, by day and time: small entries (no bodies) the operator's listing reads
    assert indexes["refusedByDay"] == {
        "IndexName": "refusedByDay",
        "KeySchema": [
            {"AttributeName": "refusedDay", "KeyType": "HASH"},
            {"AttributeName": "acceptedAt", "KeyType": "RANGE"},
        ],
        "Projection": {
            "ProjectionType": "INCLUDE",
            "NonKeyAttributes": ["messageId", "groupId", "senderId", "namedTenantId", "error"],
        },
    }
    # Jobs claimed by a tenant with a share, until they settle, by lease expiry: keys and the invocation only
    assert indexes["runningByTenant"] == {
        "IndexName": "runningByTenant",
        "KeySchema": [
            {"AttributeName": "runningTenant", "KeyType": "HASH"},
            {"AttributeName": "leaseExpiresAt", "KeyType": "RANGE"},
        ],
        "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["runningInvocation"]},
    }
    # Accepted, unsettled jobs by workspace in SequenceNumber order: keys, jobId and tenantId only
    assert indexes["pendingByWorkspace"] == {
        "IndexName": "pendingByWorkspace",
        "KeySchema": [
            {"AttributeName": "pendingWorkspace", "KeyType": "HASH"},
            {"AttributeName": "queueSeq", "KeyType": "RANGE"},
        ],
        "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["jobId", "tenantId"]},
    }
    # PARKED jobs by workspace in SequenceNumber order (zero-padded strings); small entries, no message bodies
    assert indexes["parkedByWorkspace"] == {
        "IndexName": "parkedByWorkspace",
        "KeySchema": [
            {"AttributeName": "parkedWorkspace", "KeyType": "HASH"},
            {"AttributeName": "parkedSeq", "KeyType": "RANGE"},
        ],
        "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["jobId", "workspaceId", "tenantId"]},
    }
    assert indexes["haltedByTenant"]["KeySchema"] == [
        {"AttributeName": "haltedTenant", "KeyType": "HASH"},
        {"AttributeName": "workspaceId", "KeyType": "RANGE"},
    ]
    types = {d["AttributeName"]: d["AttributeType"] for d in kwargs["AttributeDefinitions"]}
    sparse_keys = ("parkedWorkspace", "parkedSeq", "haltedTenant", "pendingWorkspace", "queueSeq")
    assert {name: types[name] for name in sparse_keys} == dict.fromkeys(sparse_keys, "S")
    assert (types["runningTenant"], types["leaseExpiresAt"]) == ("S", "N")


def test_outputs_expose_the_api_queues_and_table(template: Template) -> None:
    assert {"ApiUrl", "QueueUrl", "DeadLetterQueueUrl", "TableName"} <= set(template["Outputs"])
    assert template["Outputs"]["ApiUrl"]["Value"] == {
        "Fn::Sub": "https://${JobsHttpApi}.execute-api.${AWS::Region}.${AWS::URLSuffix}/"
    }


def test_api_routes_post_and_get_jobs(template: Template) -> None:
    events = _props(template, "EnqueueApiFunction")["Events"].values()
    routes = {(e["Properties"]["Method"], e["Properties"]["Path"]) for e in events if e["Type"] == "HttpApi"}
    assert routes == {
        ("POST", "/jobs"),
        ("POST", "/jobs:batch"),
        ("GET", "/jobs/{jobId}"),
        ("PUT", "/workspaces/{workspaceId}"),
        ("GET", "/workspaces/{workspaceId}"),
        ("GET", "/workspaces/{workspaceId}/jobs"),
        ("GET", "/openapi.json"),
        ("POST", "/workspaces/{workspaceId}/resume"),
        ("GET", "/workspaces"),
    }
    assert all(e["Properties"]["ApiId"] == {"Ref": "JobsHttpApi"} for e in events)


# --- Every check can fail ------------------------------------------------------------------------------------------


def _set(path: tuple[str | int, ...], value: Any) -> Callable[[Template], None]:
    def mutate(template: Template) -> None:
        target: Any = template
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def _delete(path: tuple[str | int, ...]) -> Callable[[Template], None]:
    def mutate(template: Template) -> None:
        target: Any = template
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return mutate


def _add_policy(policy: Any) -> Callable[[Template], None]:
    def mutate(template: Template) -> None:
        _props(template, "JobWorkerFunction")["Policies"].append(policy)

    return mutate


def _add_statement(**statement: Any) -> Callable[[Template], None]:
    return _add_policy({"Statement": [{"Effect": "Allow", **statement}]})


R = ("Resources",)
WORKER = (*R, "JobWorkerFunction", "Properties")
WORKER_EVENT = (*WORKER, "Events", "JobsQueueRecords", "Properties")
QUEUE = (*R, "JobsQueue", "Properties")
DLQ = (*R, "JobsDeadLetterQueue", "Properties")
TABLE = (*R, "JobsTable", "Properties")
DLQ_ALARM = (*R, "DeadLetterQueueDepthAlarm", "Properties")
TABLE_ARN = {"Fn::GetAtt": ["JobsTable", "Arn"]}

MUTATIONS = [
    ("batch-size-20", _set((*WORKER_EVENT, "BatchSize"), 20), "check_worker_event_source: worker BatchSize is 20"),
    (
        "batch-size-parameter-max-100",
        _set(("Parameters", "WorkerBatchSize", "MaxValue"), 100),
        "parameter WorkerBatchSize MaxValue 100 allows values outside 1..10",
    ),
    (
        "batch-size-parameter-unbounded",
        _delete(("Parameters", "WorkerBatchSize", "MaxValue")),
        "parameter WorkerBatchSize has no MaxValue",
    ),
    ("no-partial-batch-response", _set((*WORKER_EVENT, "FunctionResponseTypes"), []), "FunctionResponseTypes is []"),
    ("no-scaling-config", _delete((*WORKER_EVENT, "ScalingConfig")), "worker MaximumConcurrency is not set"),
    ("maximum-concurrency-1", _set((*WORKER_EVENT, "ScalingConfig", "MaximumConcurrency"), 1), "is 1, not 2..1000"),
    (
        "maximum-concurrency-parameter-max-5000",
        _set(("Parameters", "WorkerMaximumConcurrency", "MaxValue"), 5000),
        "MaxValue 5000 allows values outside 2..1000",
    ),
    ("worker-timeout-1200", _set((*WORKER, "Timeout"), 1200), "JobWorkerFunction Timeout is 1200, not 1..900"),
    ("worker-timeout-1200-visibility", _set((*WORKER, "Timeout"), 1200), "below 6 x the worker Timeout 1200"),
    ("visibility-timeout-600", _set((*QUEUE, "VisibilityTimeout"), 600), "VisibilityTimeout 600 is below 6 x"),
    ("max-receive-count-1", _set((*QUEUE, "RedrivePolicy", "maxReceiveCount"), 1), "maxReceiveCount is 1, not >= 5"),
    (
        "max-receive-count-parameter-min-2",
        _set(("Parameters", "MaxReceiveCount", "MinValue"), 2),
        "MinValue 2 allows values outside >= 5",
    ),
    (
        "max-attempts-equal-to-max-receive-count",
        _set(("Parameters", "MaxAttempts", "Default"), 10),
        "maxReceiveCount 10 is not above the worker's MAX_ATTEMPTS 10",
    ),
    ("no-redrive", _delete((*QUEUE, "RedrivePolicy")), "has no RedrivePolicy"),
    ("standard-dead-letter-queue", _set((*DLQ, "FifoQueue"), False), "JobsDeadLetterQueue is not a FIFO queue"),
    ("standard-jobs-queue", _delete((*QUEUE, "FifoQueue")), "check_fifo_queues: JobsQueue is not a FIFO queue"),
    ("content-based-dedup", _set((*QUEUE, "ContentBasedDeduplication"), True), "JobsQueue must set Content"),
    ("queue-scoped-dedup", _set((*QUEUE, "DeduplicationScope"), "queue"), "DeduplicationScope is 'queue'"),
    ("per-queue-throughput", _delete((*QUEUE, "FifoThroughputLimit")), "FifoThroughputLimit is None"),
    ("unencrypted-dlq", _delete((*DLQ, "SqsManagedSseEnabled")), "JobsDeadLetterQueue is not encrypted"),
    ("provisioned-table", _set((*TABLE, "BillingMode"), "PROVISIONED"), "BillingMode is 'PROVISIONED'"),
    ("ttl-on-expires", _set((*TABLE, "TimeToLiveSpecification", "AttributeName"), "expires"), "TTL must be"),
    ("ttl-off", _set((*TABLE, "TimeToLiveSpecification", "Enabled"), False), "TTL must be enabled"),
    ("no-pitr", _delete((*TABLE, "PointInTimeRecoverySpecification")), "point-in-time recovery is not enabled"),
    ("table-sse-off", _set((*TABLE, "SSESpecification", "SSEEnabled"), False), "SSEEnabled is not true"),
    ("wildcard-action", _add_statement(Action=["dynamodb:*"], Resource=TABLE_ARN), "'dynamodb:*' uses a wildcard"),
    ("star-action", _add_statement(Action="*", Resource=TABLE_ARN), "action '*' uses a wildcard"),
    ("star-resource", _add_statement(Action=["sqs:SendMessage"], Resource="*"), "Resource is '*'"),
    ("not-action", _add_statement(NotAction=["iam:*"], Resource=TABLE_ARN), "NotAction allows everything else"),
    ("full-access", _add_policy("AmazonSQSFullAccess"), "managed policy AmazonSQSFullAccess grants a whole service"),
    ("policy-template", _add_policy({"DynamoDBCrudPolicy": {"TableName": "t"}}), "SAM policy template DynamoDBCrud"),
    (
        "dlq-alarm-on-jobs-queue",
        _set((*DLQ_ALARM, "Dimensions", 0, "Value"), {"Fn::GetAtt": ["JobsQueue", "QueueName"]}),
        "no alarm fires on one visible message in JobsDeadLetterQueue",
    ),
    ("dlq-alarm-threshold-5", _set((*DLQ_ALARM, "Threshold"), 5), "no alarm fires on one visible message"),
    (
        "no-oldest-age-alarm",
        _delete((*R, "OldestMessageAgeAlarm")),
        "no alarm on ApproximateAgeOfOldestMessage of JobsQueue",
    ),
]


@pytest.mark.parametrize(("mutate", "expected"), [m[1:] for m in MUTATIONS], ids=[m[0] for m in MUTATIONS])
def test_template_violations_report_a_broken_copy(
    template: Template, mutate: Callable[[Template], None], expected: str
) -> None:
    # Given a copy of the real template with one fact broken
    mutate(template)

    # When it is checked
    violations = template_violations(template)

    # Then the broken fact is reported
    assert any(expected in violation for violation in violations), violations


def test_template_violations_report_each_of_several_breaks(template: Template) -> None:
    # Given a FIFO batch of 20, a Timeout above Lambda's limit and a redrive after one receive
    _worker_event(template)["BatchSize"] = 20
    _props(template, "JobWorkerFunction")["Timeout"] = 1200
    _props(template, "JobsQueue")["RedrivePolicy"]["maxReceiveCount"] = 1

    violations = template_violations(template)

    assert any(v.startswith("check_worker_event_source: worker BatchSize is 20") for v in violations), violations
    assert any(v.startswith("check_function_timeouts: JobWorkerFunction Timeout is 1200") for v in violations)
    assert any(v.startswith("check_visibility_timeout:") for v in violations)
    assert any(v.startswith("check_redrive_policy: redrive maxReceiveCount is 1") for v in violations)


def test_template_violations_report_an_unreadable_structure(template: Template) -> None:
    del _props(template, "JobWorkerFunction")["Events"]
    assert any("expected exactly one SQS event source" in v for v in template_violations(template))


# --- Linters -------------------------------------------------------------------------------------------------------


def test_template_passes_cfn_lint() -> None:
    result = subprocess.run(
        [str(BIN / "cfn-lint"), "template.yaml"], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_template_passes_sam_validate_lint() -> None:
    result = subprocess.run(
        [str(BIN / "sam"), "validate", "--lint", "--region", REGION],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "SAM_CLI_TELEMETRY": "0"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "is a valid SAM Template" in result.stdout


# --- Provisioned from the template ---------------------------------------------------------------------------------


def _assert_matches_template(session: boto3.Session, model: TemplateModel) -> None:
    resources = provision(session, model)
    sqs = session.client("sqs")
    dynamodb = session.client("dynamodb")

    # Queues: every attribute the template sets, as SQS reports it back.
    for queue_id, url, references in (
        ("JobsDeadLetterQueue", resources.dlq_url, {}),
        ("JobsQueue", resources.queue_url, resources.references),
    ):
        expected = model.queue_attributes(queue_id, references)
        reported = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        actual = {str(name): value for name, value in reported.items()}
        # moto accepts RedriveAllowPolicy but does not report it back.
        expected.pop("RedriveAllowPolicy", None)
        redrive = expected.pop("RedrivePolicy", None)
        assert {name: actual.get(name) for name in expected} == expected, queue_id
        if redrive is not None:
            assert json.loads(actual["RedrivePolicy"]) == json.loads(redrive)
    redrive_policy = json.loads(
        sqs.get_queue_attributes(QueueUrl=resources.queue_url, AttributeNames=["RedrivePolicy"])["Attributes"][
            "RedrivePolicy"
        ]
    )
    assert redrive_policy == {"deadLetterTargetArn": resources.dlq_arn, "maxReceiveCount": 10}
    assert resources.queue_name == model.queue_name("JobsQueue")

    # Table: key, attributes, billing, index, TTL, PITR, SSE.
    create = model.table_create_kwargs()
    table = dynamodb.describe_table(TableName=resources.table_name)["Table"]
    assert table["KeySchema"] == create["KeySchema"] == [{"AttributeName": "pk", "KeyType": "HASH"}]
    assert sorted(table["AttributeDefinitions"], key=str) == sorted(create["AttributeDefinitions"], key=str)
    assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    indexes = [
        {key: index[key] for key in ("IndexName", "KeySchema", "Projection")}
        for index in table["GlobalSecondaryIndexes"]
    ]
    assert indexes == create["GlobalSecondaryIndexes"]
    assert table["SSEDescription"]["Status"] == "ENABLED"
    ttl = dynamodb.describe_time_to_live(TableName=resources.table_name)["TimeToLiveDescription"]
    assert (ttl["TimeToLiveStatus"], ttl["AttributeName"]) == ("ENABLED", "ttl")
    backups = dynamodb.describe_continuous_backups(TableName=resources.table_name)["ContinuousBackupsDescription"]
    assert backups["PointInTimeRecoveryDescription"]["PointInTimeRecoveryStatus"] == "ENABLED"

    # Bucket: encryption, public access block, ownership, lifecycle and the TLS-only policy, as S3 reports them back.
    s3 = session.client("s3")
    bucket = resources.payload_bucket
    assert bucket is not None
    expected_bucket = model.bucket_configuration("PayloadBucket")
    encryption = s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]
    assert encryption["Rules"][0]["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
    block = s3.get_public_access_block(Bucket=bucket)["PublicAccessBlockConfiguration"]
    assert block == expected_bucket["PublicAccessBlockConfiguration"]
    ownership = s3.get_bucket_ownership_controls(Bucket=bucket)["OwnershipControls"]
    assert ownership == expected_bucket["OwnershipControls"]
    lifecycle = {rule["ID"]: rule for rule in s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]}
    assert lifecycle["ExpirePayloads"]["Expiration"]["Days"] == 90
    assert lifecycle["ExpirePayloads"]["Filter"]["Prefix"] == "payloads/"
    assert lifecycle["AbortIncompleteUploads"]["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"] == 1
    # The TLS-only statement is the policy's only one, and a loopback emulator speaks plain HTTP: not applied here.
    assert model.bucket_policy("PayloadBucket", resources.references) is None

    # The functions' environment points at what was created.
    environment = model.worker_environment(resources.references)
    assert (environment["TABLE_NAME"], environment["QUEUE_URL"]) == (resources.table_name, resources.queue_url)
    assert environment["PAYLOAD_BUCKET"] == bucket


def test_provision_creates_resources_matching_the_template_in_moto(model: TemplateModel) -> None:
    with mock_aws():
        _assert_matches_template(boto3.Session(region_name=REGION), model)


def test_provision_creates_resources_matching_the_template_over_http(
    model: TemplateModel, moto_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given moto's server in its own process; boto3 reads the endpoint from AWS_ENDPOINT_URL
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    model = TemplateModel(model.template, stack_name=f"over-http-{os.getpid()}")
    _assert_matches_template(boto3.Session(region_name=REGION), model)


def test_provision_twice_reuses_the_resources(template: Template) -> None:
    with mock_aws():
        session = boto3.Session(region_name=REGION)
        first = provision(session, template, stack_name="again")
        second = provision(AwsClients.from_session(session), template, stack_name="again")
    assert first == second


def test_provision_takes_the_account_from_sts(template: Template, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given an account other than moto's default, so ARNs built from ${AWS::AccountId} must follow it
    monkeypatch.setenv("MOTO_ACCOUNT_ID", "210987654321")
    with mock_aws():
        resources = provision(boto3.Session(region_name="eu-west-1"), template, stack_name="acct")
    assert resources.account_id == "210987654321"
    assert resources.queue_arn == "arn:aws:sqs:eu-west-1:210987654321:acct-jobs.fifo"


def test_provision_refuses_a_model_with_a_second_stack_name(model: TemplateModel) -> None:
    with mock_aws(), pytest.raises(TemplateError, match="brings its own stack name"):
        provision(boto3.Session(region_name=REGION), model, stack_name="other")


def test_provision_defaults_to_the_repository_template() -> None:
    with mock_aws():
        resources = provision(boto3.Session(region_name=REGION))
    assert resources.queue_name == "agent-jobs-local-jobs.fifo"


def test_sam_local_settings_exist_only_with_an_endpoint_url(template: Template) -> None:
    # Declared with EndpointUrl (so that `sam local`'s env file may set them), absent from a deployed function
    sam_local_only = {"Fn::If": ["HasEndpointUrl", "", {"Ref": "AWS::NoValue"}]}
    declared = {
        function_id: {
            name
            for name, value in _props(template, function_id)["Environment"]["Variables"].items()
            if value == sam_local_only
        }
        for function_id in ("EnqueueApiFunction", "JobWorkerFunction")
    }

    assert declared == {
        "EnqueueApiFunction": {"LOCAL_JWT_PUBLIC_KEY", "LOCAL_GIT_SERVER", "LOCAL_GIT_CA"},
        "JobWorkerFunction": {"LOCAL_GIT_SERVER", "LOCAL_GIT_CA", "AWS_ENDPOINT_URL_LAMBDA"},
    }
