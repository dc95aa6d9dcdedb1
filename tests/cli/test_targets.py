"""Where the CLI acts: the local runtime's connection file, or a deployed stack's CloudFormation Outputs."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
from moto import mock_aws
from typer.testing import CliRunner

from agent_jobs_cli.main import app
from agent_jobs_cli.targets import TargetError, connection_file_path, load_local_target, load_stack_target

STACK_TEMPLATE = {
    "Resources": {"Queue": {"Type": "AWS::SQS::Queue", "Properties": {"QueueName": "q.fifo", "FifoQueue": True}}},
    "Outputs": {
        "ApiUrl": {"Value": "https://abc.execute-api.us-east-1.amazonaws.com/"},
        "QueueUrl": {"Value": {"Ref": "Queue"}},
        "DeadLetterQueueUrl": {"Value": "https://sqs.us-east-1.amazonaws.com/123456789012/dlq.fifo"},
        "TableName": {"Value": "jobs-table"},
    },
}


def test_targets_stack_outputs_name_the_api_queues_and_table():
    with mock_aws():
        boto3.client("cloudformation", region_name="us-east-1").create_stack(
            StackName="agent-jobs", TemplateBody=json.dumps(STACK_TEMPLATE)
        )
        target = load_stack_target("agent-jobs", "us-east-1")

    assert target.api_url == "https://abc.execute-api.us-east-1.amazonaws.com"
    assert target.queue_url.endswith("/q.fifo")
    assert target.dlq_url.endswith("/dlq.fifo")
    assert (target.table_name, target.region, target.local, target.endpoint_url) == (
        "jobs-table",
        "us-east-1",
        False,
        None,
    )
    assert target.api_sender_id is None  # an older stack has no ApiSenderId: the redrive leaves what it cannot tell


def test_targets_stack_output_names_the_apis_sender_for_the_redrive():
    outputs = {**STACK_TEMPLATE["Outputs"], "ApiSenderId": {"Value": "AROAAPIROLE0000000001"}}  # type: ignore[dict-item]
    with mock_aws():
        boto3.client("cloudformation", region_name="us-east-1").create_stack(
            StackName="agent-jobs", TemplateBody=json.dumps({**STACK_TEMPLATE, "Outputs": outputs})
        )
        target = load_stack_target("agent-jobs", "us-east-1")

    assert target.api_sender_id == "AROAAPIROLE0000000001"


def test_targets_stack_without_an_output_says_to_deploy_this_template():
    template = {**STACK_TEMPLATE, "Outputs": {"ApiUrl": STACK_TEMPLATE["Outputs"]["ApiUrl"]}}  # type: ignore[index]
    with mock_aws():
        boto3.client("cloudformation", region_name="us-east-1").create_stack(
            StackName="old", TemplateBody=json.dumps(template)
        )
        with pytest.raises(TargetError, match="no output QueueUrl, DeadLetterQueueUrl, TableName"):
            load_stack_target("old", "us-east-1")
        with pytest.raises(TargetError, match="check the stack name"):
            load_stack_target("missing", "us-east-1")


def test_targets_deployed_stack_needs_a_token():
    with mock_aws():
        boto3.client("cloudformation", region_name="us-east-1").create_stack(
            StackName="agent-jobs", TemplateBody=json.dumps(STACK_TEMPLATE)
        )
        result = CliRunner().invoke(
            app,
            ["--stack-name", "agent-jobs", "--region", "us-east-1", "status", "job", "j"],
            env={"AGENT_JOBS_TOKEN": None},
        )
    assert result.exit_code == 1
    assert "pass --token or set AGENT_JOBS_TOKEN" in result.stderr


def test_targets_connection_file_written_by_the_runtime_is_read_back(tmp_path: Path):
    from agent_jobs_local.runtime import LocalRuntime

    with LocalRuntime(workspaces_root=tmp_path / "ws") as runtime:
        path = runtime.write_connection_file(tmp_path / ".agent-jobs" / "local.json")
        expected = (runtime.api_url, runtime.endpoint_url, runtime.resources.queue_url, runtime.resources.dlq_url)
        table = runtime.resources.table_name
        api_sender = runtime.function_env["JobWorkerFunction"]["API_SENDER_ID"]

    target = load_local_target(path)
    assert (target.api_url, target.endpoint_url, target.queue_url, target.dlq_url) == expected
    assert target.table_name == table
    assert target.api_sender_id == api_sender
    assert target.local


def test_targets_broken_connection_file_says_to_restart_the_runtime(tmp_path: Path):
    path = tmp_path / "local.json"
    path.write_text(json.dumps({"apiUrl": "http://127.0.0.1:3000"}))
    with pytest.raises(
        TargetError, match=r"lacks region, tableName, queueUrl, deadLetterQueueUrl; restart `make local`"
    ):
        load_local_target(path)


def _connection_file(folder: Path, api_url: str = "http://127.0.0.1:9") -> Path:
    path = folder / ".agent-jobs" / "local.json"
    path.parent.mkdir(parents=True)
    document = {"apiUrl": api_url, "region": "us-east-1", "tableName": "t", "queueUrl": "q", "deadLetterQueueUrl": "d"}
    path.write_text(json.dumps(document))
    return path


def test_targets_connection_file_is_found_from_a_folder_below_the_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given `make local` wrote the project's connection file (its API is not running), and the CLI runs two folders down
    _connection_file(tmp_path / "project")
    below = tmp_path / "project" / "src" / "pkg"
    below.mkdir(parents=True)
    monkeypatch.chdir(below)

    result = CliRunner().invoke(app, ["--token", "t", "status", "job", "j"], env={"AGENT_JOBS_CONNECTION_FILE": None})

    # Then it acts on the API that file names
    assert result.exit_code == 1
    assert "cannot reach the API at http://127.0.0.1:9" in result.stderr


def test_targets_connection_file_is_found_in_the_installed_project_from_any_folder(tmp_path: Path) -> None:
    project_file = _connection_file(tmp_path / "agent-jobs")
    elsewhere = tmp_path / "my-repository"
    elsewhere.mkdir()

    assert connection_file_path(cwd=elsewhere, project_root=tmp_path / "agent-jobs") == project_file
    # and a connection file nearer the current folder comes first
    nearer = _connection_file(elsewhere)
    assert connection_file_path(cwd=elsewhere, project_root=tmp_path / "agent-jobs") == nearer


def test_targets_connection_file_named_by_the_environment_comes_before_any_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _connection_file(tmp_path)
    named = tmp_path / "elsewhere.json"
    monkeypatch.setenv("AGENT_JOBS_CONNECTION_FILE", str(named))

    assert connection_file_path(cwd=tmp_path, project_root=None) == named
    assert connection_file_path(tmp_path / "given.json", cwd=tmp_path) == tmp_path / "given.json"


def test_targets_no_connection_file_says_where_it_looked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENT_JOBS_CONNECTION_FILE", raising=False)

    with pytest.raises(TargetError) as raised:
        connection_file_path(cwd=tmp_path, project_root=tmp_path / "project")

    message = str(raised.value)
    assert f"{tmp_path}/.agent-jobs/local.json and the folders above it" in message
    assert f"{tmp_path}/project/.agent-jobs/local.json" in message
    assert "make local" in message
    assert "AGENT_JOBS_CONNECTION_FILE" in message


def test_targets_help_says_where_the_connection_file_is_looked_for() -> None:
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"})

    assert result.exit_code == 0
    assert "AGENT_JOBS_CONNECTION_FILE" in result.stdout
    assert "in the current folder or a folder above it" in result.stdout
    assert "the project this command is installed from" in result.stdout
