"""Observability and the security scan, as template facts cfn-lint cannot see: the alarms watch the metrics the worker
really emits (namespace, name, exact dimensions), both functions trace, the dashboard is JSON about this template's
resources, the HTTP API keeps access logs, and `make test` runs checkov, which passes offline."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from aws_lambda_powertools import Logger, Metrics

from agent_jobs.models import JobType
from agent_jobs_local.template import DEFAULT_TEMPLATE_PATH, TemplateModel
from job_worker.jobs.errors import PermanentJobError
from job_worker.processing import JOB_TYPE_DIMENSION, MESSAGES_REFUSED, WORKSPACES_HALTED, BatchWorker
from tests.conftest import Stack, enqueue, make_job, make_message
from tests.integration.test_worker_metrics import Emitted, emitted_metrics, named

REPO = DEFAULT_TEMPLATE_PATH.parent
CHECKOV = REPO / ".venv-checkov" / "bin" / "checkov"
WORKER_DIR = REPO / "functions" / "job_worker" / "job_worker"
PROCESSING_SOURCE = "".join(
    path.read_text() for path in [WORKER_DIR / "processing.py", *sorted((WORKER_DIR / "worker").glob("*.py"))]
)
PSEUDO_PARAMETERS = {"AWS::AccountId", "AWS::Partition", "AWS::Region", "AWS::StackName", "AWS::URLSuffix"}


def _props(model: TemplateModel, logical_id: str) -> dict[str, Any]:
    return model.properties(logical_id)


def _worker_environment(model: TemplateModel, name: str) -> str:
    value = model.function_environment_variable("JobWorkerFunction", name)
    assert value, f"JobWorkerFunction has no {name}"
    return value


def _dimensions(model: TemplateModel, dimensions: list[dict[str, Any]]) -> dict[str, str]:
    return {d["Name"]: str(model.resolve(d["Value"])) for d in dimensions}


@pytest.fixture
def emitted_on_a_dead_job(stack: Stack, workspaces: Any, hooks: Any, model: TemplateModel, lambda_context, capsys):
    """What the worker prints when a job ends DEAD, with the namespace and service the template gives the worker."""
    worker = BatchWorker(
        services=stack.services,
        workspaces=workspaces,
        logger=Logger(service="obs-test"),
        metrics=Metrics(
            namespace=_worker_environment(model, "POWERTOOLS_METRICS_NAMESPACE"),
            service=_worker_environment(model, "POWERTOOLS_SERVICE_NAME"),
        ),
    )
    enqueue(stack, make_job("obs-dead", "ws-obs"))

    def fail() -> None:
        raise PermanentJobError("the patch names a file outside the workspace")

    hooks.before_commit["obs-dead"] = fail
    capsys.readouterr()
    worker.handle(stack.receive(), lambda_context())
    return emitted_metrics(capsys.readouterr().out)


# ---- alarms watch what the worker emits ---------------------------------------------------------------------------


def test_workspaces_halted_alarm_names_exactly_the_metric_the_worker_emits(
    model: TemplateModel, emitted_on_a_dead_job: list[Emitted]
) -> None:
    (halted,) = named(emitted_on_a_dead_job, WORKSPACES_HALTED)
    alarm = _props(model, "WorkspacesHaltedAlarm")
    assert (alarm["Namespace"], alarm["MetricName"]) == (halted.namespace, halted.name)
    assert _dimensions(model, alarm["Dimensions"]) == halted.dimensions
    assert (alarm["Statistic"], alarm["ComparisonOperator"], alarm["Threshold"]) == ("Sum", "GreaterThanThreshold", 0)


def test_messages_refused_alarm_names_exactly_the_metric_the_worker_emits(
    stack: Stack, workspaces: Any, model: TemplateModel, lambda_context: Any, sqs_fifo_record: Any, capsys: Any
) -> None:
    # Given the worker with the template's namespace and service, and a message for a workspace that another tenant
    # owns (a store whose every workspace is acme's)
    worker = BatchWorker(
        services=stack.services,
        workspaces=OwnedWorkspaces(workspaces),
        logger=Logger(service="obs-test"),
        metrics=Metrics(
            namespace=_worker_environment(model, "POWERTOOLS_METRICS_NAMESPACE"),
            service=_worker_environment(model, "POWERTOOLS_SERVICE_NAME"),
        ),
    )
    record = sqs_fifo_record("ws#ws-obs", make_message("obs-foreign", "ws-obs", "mallory").model_dump(by_alias=True))
    capsys.readouterr()

    worker.handle({"Records": [record]}, lambda_context())

    (refused,) = named(emitted_metrics(capsys.readouterr().out), MESSAGES_REFUSED)
    alarm = _props(model, "MessagesRefusedAlarm")
    assert (alarm["Namespace"], alarm["MetricName"]) == (refused.namespace, refused.name)
    assert _dimensions(model, alarm["Dimensions"]) == refused.dimensions
    assert (alarm["Statistic"], alarm["ComparisonOperator"], alarm["Threshold"]) == ("Sum", "GreaterThanThreshold", 0)


class OwnedWorkspaces:
    """A folder store whose every workspace is acme's, bound to no direct producer."""

    binds_tenants = True

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def owner(self, workspace_id: str) -> str | None:
        return "acme"

    def direct_producers(self, workspace_id: str) -> list[str] | None:
        return None

    def open(self, workspace_id: str) -> Any:
        return self._inner.open(workspace_id)

    def job_context(self, workspace_id: str, context: Any) -> Any:
        return context


def test_dead_jobs_alarm_sums_the_metric_the_worker_emits_for_every_job_type(
    model: TemplateModel, emitted_on_a_dead_job: list[Emitted]
) -> None:
    (dead,) = named(emitted_on_a_dead_job, "JobsDead")
    queries = _props(model, "DeadJobsAlarm")["Metrics"]
    stats = [query for query in queries if "MetricStat" in query]
    # One MetricStat per job type, each with the emitted namespace, name and exact dimension names and service
    watched: set[str] = set()
    for query in stats:
        metric = query["MetricStat"]["Metric"]
        dimensions = _dimensions(model, metric["Dimensions"])
        assert (metric["Namespace"], metric["MetricName"]) == (dead.namespace, dead.name)
        assert set(dimensions) == set(dead.dimensions)
        assert dimensions["service"] == dead.dimensions["service"]
        assert query["MetricStat"]["Stat"] == "Sum"
        assert query.get("ReturnData") is False
        watched.add(dimensions[JOB_TYPE_DIMENSION])
    assert watched == {str(job_type) for job_type in JobType}
    assert dead.dimensions[JOB_TYPE_DIMENSION] in watched
    # and the one returned series is their sum
    (returned,) = [query for query in queries if query.get("ReturnData", True)]
    assert returned["Expression"] == "SUM(METRICS())"
    assert _props(model, "DeadJobsAlarm")["ComparisonOperator"] == "GreaterThanThreshold"


def test_new_alarms_notify_the_alarm_topic_like_the_others(model: TemplateModel) -> None:
    expected = _props(model, "DeadLetterQueueDepthAlarm")["AlarmActions"]
    for alarm_id in ("WorkspacesHaltedAlarm", "DeadJobsAlarm", "MessagesRefusedAlarm"):
        alarm = _props(model, alarm_id)
        assert alarm["AlarmActions"] == expected == alarm["OKActions"]
        assert alarm["TreatMissingData"] == "notBreaching"


def test_metrics_service_dimension_is_the_stack_name_so_stacks_do_not_share_alarms(template: dict[str, Any]) -> None:
    other = TemplateModel(template, stack_name="another-stack")
    assert other.function_environment_variable("JobWorkerFunction", "POWERTOOLS_SERVICE_NAME") == "another-stack"
    assert _dimensions(other, other.properties("WorkspacesHaltedAlarm")["Dimensions"]) == {"service": "another-stack"}


# ---- tracing ------------------------------------------------------------------------------------------------------


def test_both_functions_trace_actively(model: TemplateModel) -> None:
    functions = model.resources_of_type("AWS::Serverless::Function")
    assert set(functions) == {"EnqueueApiFunction", "JobWorkerFunction", "TestSandboxFunction"}
    for function_id in ("EnqueueApiFunction", "JobWorkerFunction"):
        assert model.function_properties(function_id)["Tracing"] == "Active", function_id
    # The test sandbox does not trace: active tracing needs X-Ray permissions, and it has none but its logs.
    assert "Tracing" not in model.function_properties("TestSandboxFunction")


# ---- dashboard ----------------------------------------------------------------------------------------------------


def _dashboard(model: TemplateModel) -> tuple[dict[str, Any], set[str]]:
    """The dashboard body as JSON (each ${...} replaced by a placeholder), and the names it substitutes."""
    body = _props(model, "OperationsDashboard")["DashboardBody"]["Fn::Sub"]
    references = set(re.findall(r"\$\{([^}]+)\}", body))
    return json.loads(re.sub(r"\$\{([^}]+)\}", lambda m: f"<{m.group(1)}>", body)), references


def _metric_rows(dashboard: dict[str, Any]) -> list[list[Any]]:
    return [row for widget in dashboard["widgets"] for row in widget["properties"]["metrics"]]


def test_dashboard_body_is_json_that_substitutes_only_this_templates_resources(model: TemplateModel) -> None:
    dashboard, references = _dashboard(model)
    for reference in references:
        if reference in PSEUDO_PARAMETERS:
            continue
        logical_id = reference.split(".")[0]
        assert logical_id in model.resources, f"the dashboard names ${{{reference}}}, which is not in the template"
    for widget in dashboard["widgets"]:
        assert widget["properties"]["region"] == "<AWS::Region>"


def test_dashboard_graphs_queues_and_functions_of_this_stack(model: TemplateModel) -> None:
    dashboard, _ = _dashboard(model)
    plain = {tuple(row[:4]) for row in _metric_rows(dashboard) if isinstance(row[0], str)}
    queues = {f"<{queue_id}.QueueName>" for queue_id in model.resources_of_type("AWS::SQS::Queue")}
    functions = {f"<{function_id}>" for function_id in model.resources_of_type("AWS::Serverless::Function")}
    for namespace, _name, dimension, value in plain:
        if namespace == "AWS/SQS":
            assert (dimension, value in queues) == ("QueueName", True)
        if namespace == "AWS/Lambda":
            assert (dimension, value in functions) == ("FunctionName", True)
    jobs_queue = f"<{model.jobs_queue_id}.QueueName>"
    for name in ("ApproximateNumberOfMessagesVisible", "ApproximateNumberOfMessagesNotVisible"):
        assert ("AWS/SQS", name, "QueueName", jobs_queue) in plain
    assert ("AWS/SQS", "ApproximateAgeOfOldestMessage", "QueueName", jobs_queue) in plain
    dlq = f"<{model.dead_letter_queue_id}.QueueName>"
    assert ("AWS/SQS", "ApproximateNumberOfMessagesVisible", "QueueName", dlq) in plain
    for function in functions:
        for name in ("Errors", "Throttles", "ConcurrentExecutions", "Duration"):
            assert ("AWS/Lambda", name, "FunctionName", function) in plain, (name, function)
    assert ("AgentJobs", WORKSPACES_HALTED, "service", "<AWS::StackName>") in plain
    assert ("AgentJobs", MESSAGES_REFUSED, "service", "<AWS::StackName>") in plain


def test_dashboard_searches_job_metrics_by_the_dimensions_the_worker_emits(
    model: TemplateModel, emitted_on_a_dead_job: list[Emitted]
) -> None:
    dashboard, _ = _dashboard(model)
    (dead,) = named(emitted_on_a_dead_job, "JobsDead")
    expressions = [row[0]["expression"] for row in _metric_rows(dashboard) if isinstance(row[0], dict)]
    searched: dict[str, set[str]] = {}
    for expression in expressions:
        match = re.search(
            r"SEARCH\('\{([^}]*)\} service=\"<AWS::StackName>\" MetricName=\"(\w+)\"', '(\w+)'", expression
        )
        assert match, expression
        schema, metric_name, statistic = match.groups()
        namespace, *dimension_names = schema.split(",")
        assert namespace == dead.namespace
        assert set(dimension_names) == set(dead.dimensions)  # SEARCH's {schema} matches exactly these dimensions
        assert f'"{metric_name}"' in PROCESSING_SOURCE, f"the worker emits no {metric_name}"
        searched.setdefault(metric_name, set()).add(statistic)
    outcomes = ("JobsSucceeded", "JobsFailed", "JobsDead", "JobsRejected", "JobsParked", "JobsDuplicate")
    assert set(outcomes) <= set(searched)
    assert searched["JobDuration"] >= {"p50", "p99"}


# ---- HTTP API access logs -----------------------------------------------------------------------------------------


def test_http_api_writes_json_access_logs_to_a_log_group_with_retention(model: TemplateModel) -> None:
    settings = _props(model, "JobsHttpApi")["AccessLogSettings"]
    assert settings["DestinationArn"] == {"Fn::GetAtt": ["ApiAccessLogGroup", "Arn"]}
    log_group = model.resource("ApiAccessLogGroup", "AWS::Logs::LogGroup")["Properties"]
    assert int(model.resolve(log_group["RetentionInDays"])) > 0
    fields = json.loads(settings["Format"])
    assert fields["requestId"] == "$context.requestId"
    assert fields["routeKey"] == "$context.routeKey"
    assert fields["status"] == "$context.status"
    assert fields["authorizerError"] == "$context.authorizer.error"
    assert fields["integrationLatency"] == "$context.integrationLatency"


# ---- function logs ------------------------------------------------------------------------------------------------

# The retention periods CloudWatch Logs accepts (PutRetentionPolicy).
CLOUDWATCH_RETENTION_DAYS = {
    *(1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653)
}


def test_every_function_logs_to_a_declared_log_group_kept_for_log_retention_days(model: TemplateModel) -> None:
    functions = model.resources_of_type("AWS::Serverless::Function")
    assert {"EnqueueApiFunction", "JobWorkerFunction", "TestSandboxFunction"} <= set(functions)
    names = set()
    for function_id in functions:
        # LoggingConfig makes the declared group the one Lambda writes to (and the function depend on it, so the
        # group exists before the first line); without it Lambda makes /aws/lambda/<name> and keeps it forever.
        log_group = model.function_properties(function_id).get("LoggingConfig", {}).get("LogGroup")
        assert isinstance(log_group, dict), f"{function_id} has no LoggingConfig.LogGroup"
        assert set(log_group) == {"Ref"}, function_id
        group = model.resource(log_group["Ref"], "AWS::Logs::LogGroup")["Properties"]
        assert group["RetentionInDays"] == {"Ref": "LogRetentionDays"}, function_id
        name = model.resolve(group["LogGroupName"])
        assert name.startswith("/aws/lambda/agent-jobs-test-"), function_id
        names.add(name)
    assert len(names) == len(functions)  # a group of its own for each function
    parameter = model.template["Parameters"]["LogRetentionDays"]
    assert set(parameter["AllowedValues"]) == CLOUDWATCH_RETENTION_DAYS
    assert int(model.parameters["LogRetentionDays"]) in CLOUDWATCH_RETENTION_DAYS


# ---- the security scan --------------------------------------------------------------------------------------------


def test_make_test_runs_the_offline_checkov_scan() -> None:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    # -n prints what `make test` would run without running it
    result = subprocess.run([make, "-n", "test"], cwd=REPO, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    scan = [line for line in result.stdout.splitlines() if "checkov -f template.yaml" in line]
    assert scan, result.stdout
    assert "--framework cloudformation" in scan[0]
    assert "--skip-download" in scan[0]
    assert "BC_SKIP_MAPPING=TRUE" in result.stdout


def _checkov(template: Path) -> subprocess.CompletedProcess[str]:
    if not CHECKOV.exists():
        pytest.skip("checkov is not installed: `make security-lint` creates .venv-checkov")
    env = {"BC_SKIP_MAPPING": "TRUE", "CKV_SKIP_PACKAGE_UPDATE_CHECK": "TRUE", "PATH": "/usr/bin:/bin"}
    command = [str(CHECKOV), "-f", str(template), "--framework", "cloudformation", "--skip-download", "--compact"]
    return subprocess.run(command, capture_output=True, text=True, check=False, env=env)


def test_checkov_finds_nothing_unexplained_in_the_template() -> None:
    result = _checkov(DEFAULT_TEMPLATE_PATH)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Failed checks: 0" in result.stdout


def test_checkov_fails_on_a_finding_whose_skip_is_removed(tmp_path: Path) -> None:
    # Given the template without the reasoned skip on the worker (the short tags are kept as YAML text)
    text = DEFAULT_TEMPLATE_PATH.read_text()
    start = text.index(
        "          - id: CKV_AWS_116\n            comment: >-\n              A function dead-letter queue"
    )
    end = text.index("          - id: CKV_AWS_117", start)
    copy = tmp_path / "template.yaml"
    copy.write_text(text[:start] + text[end:])
    # When checkov scans it, Then it fails and names the check
    result = _checkov(copy)
    assert result.returncode != 0
    assert "CKV_AWS_116" in result.stdout
    assert "JobWorkerFunction" in result.stdout
