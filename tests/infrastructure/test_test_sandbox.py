"""The test sandbox function in template.yaml: isolated per tenant, with no permission but its own logs, none of the
other functions' settings or code, and a worker that may invoke it and nothing else."""

from __future__ import annotations

from typing import Any

from agent_jobs.settings import LAMBDA_MAX_TIMEOUT_SECONDS, SANDBOX_HEADROOM_SECONDS
from agent_jobs_local.template import TemplateModel

Template = dict[str, Any]
SANDBOX = "TestSandboxFunction"


def _props(template: Template, logical_id: str) -> dict[str, Any]:
    properties: dict[str, Any] = template["Resources"][logical_id]["Properties"]
    return properties


def _worker_statements(template: Template) -> list[dict[str, Any]]:
    return [s for policy in _props(template, "JobWorkerFunction")["Policies"] for s in policy["Statement"]]


def test_sandbox_is_isolated_per_tenant(template: Template) -> None:
    assert _props(template, SANDBOX)["TenancyConfig"] == {"TenantIsolationMode": "PER_TENANT"}


def test_sandbox_runs_the_stdlib_handler_without_layer_or_tracing(model: TemplateModel) -> None:
    properties = model.function_properties(SANDBOX)  # Globals merged in, as SAM deploys it
    assert properties["CodeUri"] == "functions/test_sandbox"
    assert properties["Handler"] == "test_sandbox.app.lambda_handler"
    assert properties["Runtime"] == "python3.13"
    assert "Layers" not in properties
    assert "Tracing" not in properties
    assert model.resource(SANDBOX)["Metadata"]["BuildMethod"] == "makefile"
    assert not model.resource(SANDBOX)["Properties"].get("Events")  # invoked by the worker only


def test_sandbox_has_none_of_the_other_functions_environment(model: TemplateModel) -> None:
    properties = model.function_properties(SANDBOX)
    assert "Environment" not in properties
    for function_id in ("EnqueueApiFunction", "JobWorkerFunction"):
        for name in model.function_properties(function_id)["Environment"]["Variables"]:
            assert model.function_environment_variable(SANDBOX, name) is None, name


def test_sandbox_role_may_only_write_its_own_log_group(template: Template) -> None:
    sandbox = _props(template, SANDBOX)
    assert sandbox["Role"] == {"Fn::GetAtt": ["TestSandboxRole", "Arn"]}
    assert "Policies" not in sandbox  # SAM would add them to a role of its own making, not to this one
    role = _props(template, "TestSandboxRole")
    assert "ManagedPolicyArns" not in role
    assert "PermissionsBoundary" not in role
    (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
    assert trust == {"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}
    statements = [s for policy in role["Policies"] for s in policy["PolicyDocument"]["Statement"]]
    assert len(statements) == 1
    (statement,) = statements
    assert statement["Effect"] == "Allow"
    assert sorted(statement["Action"]) == ["logs:CreateLogStream", "logs:PutLogEvents"]
    assert statement["Resource"] == {"Fn::Sub": "${TestSandboxLogGroup.Arn}:*"}
    # and no other IAM resource grants it anything
    for logical_id, resource in template["Resources"].items():
        if resource["Type"] in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
            assert "TestSandboxRole" not in str(resource["Properties"]), logical_id


def test_sandbox_log_group_is_its_own_with_a_retention(template: Template) -> None:
    sandbox = _props(template, SANDBOX)
    group = _props(template, "TestSandboxLogGroup")
    assert sandbox["FunctionName"] == {"Fn::Sub": "${AWS::StackName}-test-sandbox"}
    assert group["LogGroupName"] == {"Fn::Sub": "/aws/lambda/${AWS::StackName}-test-sandbox"}
    assert sandbox["LoggingConfig"] == {"LogGroup": {"Ref": "TestSandboxLogGroup"}}
    assert group["RetentionInDays"] == {"Ref": "LogRetentionDays"}


def test_sandbox_timeout_memory_and_storage_are_bounded_parameters(template: Template, model: TemplateModel) -> None:
    sandbox = _props(template, SANDBOX)
    assert sandbox["Timeout"] == {"Ref": "SandboxTimeout"}
    assert sandbox["MemorySize"] == {"Ref": "SandboxMemorySize"}
    assert sandbox["EphemeralStorage"] == {"Size": {"Ref": "SandboxEphemeralStorage"}}
    parameters = template["Parameters"]
    timeout = parameters["SandboxTimeout"]
    assert timeout["MaxValue"] == LAMBDA_MAX_TIMEOUT_SECONDS  # the most a Lambda function can run
    assert timeout["MinValue"] > SANDBOX_HEADROOM_SECONDS
    # The default leaves the tests time within one worker invocation: below its Timeout less its safety margin.
    worker_margin = int(model.function_environment_variable("JobWorkerFunction", "TIME_SAFETY_MARGIN_MS") or 0) / 1000
    assert timeout["Default"] - SANDBOX_HEADROOM_SECONDS < model.worker.timeout_seconds - worker_margin
    assert (parameters["SandboxMemorySize"]["MinValue"], parameters["SandboxMemorySize"]["MaxValue"]) == (128, 10240)
    assert (parameters["SandboxEphemeralStorage"]["MinValue"], parameters["SandboxEphemeralStorage"]["MaxValue"]) == (
        512,
        10240,
    )
    assert parameters["SandboxEphemeralStorage"]["Default"] >= 1024 + 256  # the unpacked limit and the archive


def test_worker_knows_the_sandbox_and_its_timeout(template: Template) -> None:
    variables = _props(template, "JobWorkerFunction")["Environment"]["Variables"]
    assert variables["TEST_SANDBOX_FUNCTION"] == {"Ref": SANDBOX}
    assert variables["TEST_SANDBOX_TIMEOUT_SECONDS"] == {"Ref": "SandboxTimeout"}


def test_worker_may_invoke_the_sandbox_and_no_other_function(template: Template) -> None:
    invoking = [s for s in _worker_statements(template) if any(a.startswith("lambda:") for a in s["Action"])]
    assert invoking == [
        {
            "Sid": "RunTestsInTheSandbox",
            "Effect": "Allow",
            "Action": ["lambda:InvokeFunction"],
            "Resource": {"Fn::GetAtt": [SANDBOX, "Arn"]},
        }
    ]
    for statement in _worker_statements(template):
        assert statement["Resource"] != "*"
        assert all("*" not in action for action in statement["Action"])


def test_worker_writes_and_reads_checkouts_only_under_sandbox_prefix(template: Template) -> None:
    (statement,) = [s for s in _worker_statements(template) if "s3:PutObject" in s["Action"]]
    assert sorted(statement["Action"]) == ["s3:GetObject", "s3:PutObject"]
    assert statement["Resource"] == {"Fn::Sub": "${PayloadBucket.Arn}/sandbox/*"}


def test_payload_bucket_expires_sandbox_checkouts_after_a_day(template: Template) -> None:
    rules = {rule["Id"]: rule for rule in _props(template, "PayloadBucket")["LifecycleConfiguration"]["Rules"]}
    assert rules["ExpireSandboxCheckouts"] == {
        "Id": "ExpireSandboxCheckouts",
        "Status": "Enabled",
        "Prefix": "sandbox/",
        "ExpirationInDays": 1,
    }


def test_sandbox_build_copies_only_its_own_modules(model: TemplateModel) -> None:
    from tests.conftest import REPO

    makefile = (REPO / "functions" / "test_sandbox" / "Makefile").read_text()
    assert makefile.count("build-TestSandboxFunction:") == 1
    assert 'cp -R test_sandbox "$(ARTIFACTS_DIR)/"' in makefile
