"""The *built* functions, as sam build laid them out, run on the events/ files: the function folder first on the path
(like /var/task), then the built layer (like /opt/python), against moto's server over HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_jobs_local.template import TemplateModel
from tests.conftest import REPO, Stack, register_workspace
from tests.integration.lambda_invoke import LambdaInvokeServer, presigned_get

RUNNER = r"""
import importlib, json, sys
function_dir, layer_dir, event_path, handler_module = sys.argv[1:5]
sys.path[:0] = [function_dir, layer_dir]   # /var/task, then /opt/python, as in Lambda
app = importlib.import_module(handler_module)
from agent_jobs_local.event_source import LambdaContextStub
loaded = {name: importlib.import_module(name).__file__ for name in ("agent_jobs", "pydantic", "aws_lambda_powertools")}
result = app.lambda_handler(json.load(open(event_path)), LambdaContextStub(timeout_seconds=120))
print(json.dumps({"result": result, "app": app.__file__, "loaded": loaded}))
"""


def run_built(build_dir: Path, function: str, event: Path, env: dict[str, str]) -> dict[str, Any]:
    process = subprocess.run(
        [
            sys.executable,
            "-c",
            RUNNER,
            str(build_dir / function),
            str(build_dir / "SharedLayer" / "python"),
            str(event),
            TemplateModel.from_path().function_settings(function).handler.rsplit(".", 1)[0],  # as Lambda reads Handler
        ],
        env={**os.environ, **env, "PYTHONPATH": str(REPO), "POWERTOOLS_TRACE_DISABLED": "true"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert process.returncode == 0, process.stderr
    output: dict[str, Any] = json.loads(process.stdout.strip().splitlines()[-1])
    for name, path in output["loaded"].items():
        assert path.startswith(str(build_dir / "SharedLayer" / "python")), f"{name} not from the built layer: {path}"
    assert output["app"].startswith(str(build_dir / function))
    return output["result"]  # type: ignore[no-any-return]


SANDBOX_RUNNER = r"""
import json, sys
sys.path[:0] = [sys.argv[1]]   # /var/task: the sandbox has no layer
from test_sandbox import app as sandbox_app
print(json.dumps({"result": sandbox_app.lambda_handler(json.load(sys.stdin), None), "app": sandbox_app.__file__}))
"""


def run_built_sandbox(build_dir: Path, event: dict[str, Any], work_root: Path) -> dict[str, Any]:
    """The built sandbox handler in a process of its own, with nothing of this environment but PATH."""
    process = subprocess.run(
        [sys.executable, "-I", "-c", SANDBOX_RUNNER, str(build_dir / "TestSandboxFunction")],
        input=json.dumps(event),
        env={"PATH": os.environ["PATH"], "SANDBOX_WORK_ROOT": str(work_root)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert process.returncode == 0, process.stderr
    output: dict[str, Any] = json.loads(process.stdout.strip().splitlines()[-1])
    assert output["app"].startswith(str(build_dir / "TestSandboxFunction"))
    return output["result"]  # type: ignore[no-any-return]


@pytest.fixture
def built_sandbox(local_build_dir: Path, server_stack: Stack, tmp_path: Path) -> Iterator[LambdaInvokeServer]:
    """The built test sandbox behind a Lambda Invoke endpoint, each invocation in a process of its own."""
    work_root = tmp_path / "sandbox"
    work_root.mkdir()
    name = server_stack.env()["TEST_SANDBOX_FUNCTION"]

    def handler(event: dict[str, Any], context: Any) -> Any:
        return run_built_sandbox(local_build_dir, event, work_root)

    with LambdaInvokeServer(name, handler=handler, fetch=presigned_get(server_stack)) as server:
        yield server


@pytest.fixture
def built_env(
    server_stack: Stack,
    moto_server: str,
    tmp_path: Path,
    built_sandbox: LambdaInvokeServer,
    git_workspaces: Any,
) -> dict[str, str]:
    return {
        **server_stack.env(),
        **git_workspaces.env(),
        "AWS_ENDPOINT_URL": moto_server,
        "AWS_ENDPOINT_URL_LAMBDA": built_sandbox.url,
        "WORKSPACES_ROOT": str(tmp_path / "ws"),
    }


def test_built_worker_runs_the_sqs_events(
    local_build_dir: Path,
    built_env: dict[str, str],
    server_stack: Stack,
    register_git_workspace: Any,
    built_sandbox: LambdaInvokeServer,
):
    # Given the events' workspaces registered on bare git remotes (the built layer brings dulwich)
    register_git_workspace(server_stack, "repo-alpha", {"src/app.py": b"old\n"}, tenant_id="tenant-demo")
    git = register_git_workspace(server_stack, "repo-beta", {"README.md": b"old\n"}, tenant_id="tenant-demo")
    result = run_built(local_build_dir, "JobWorkerFunction", REPO / "events/sqs_fifo_two_workspaces.json", built_env)
    assert result == {"batchItemFailures": []}
    assert server_stack.job("job-a-003")["status"] == "SUCCEEDED"
    # run_tests ran the registered command in the built test sandbox, for the workspace's tenant
    tests_result = server_stack.job("job-a-002")["result"]
    assert (tests_result["outcome"], tests_result["outputTail"]) == ("passed", "tests pass\n")
    assert sorted((tenant, event["jobId"]) for tenant, event in built_sandbox.invocations) == [
        ("tenant-demo", "job-a-002"),
        ("tenant-demo", "job-b-002"),
    ]
    # the built worker applied the patches to the remotes: one commit per job, with its trailer
    assert git.branch("repo-alpha") == ["job-a-001"]
    assert git.branch("repo-beta") == ["job-b-001"]
    # the duplicate-delivery event on the same table: its jobs already took effect, nothing runs twice
    result = run_built(
        local_build_dir, "JobWorkerFunction", REPO / "events/sqs_fifo_duplicate_delivery.json", built_env
    )
    assert result == {"batchItemFailures": []}
    assert server_stack.job("job-a-001")["attempt"] == 1


def test_built_producer_runs_the_http_events(local_build_dir: Path, built_env: dict[str, str], server_stack: Stack):
    register_workspace(server_stack, "repo-gamma", "tenant-demo")  # the event's workspace, of the event's tenant
    posted = run_built(local_build_dir, "EnqueueApiFunction", REPO / "events/http_post_job.json", built_env)
    assert posted["statusCode"] == 202
    job_id = json.loads(posted["body"])["jobId"]
    assert server_stack.queue_depth() == 1
    got = run_built(local_build_dir, "EnqueueApiFunction", REPO / "events/http_get_job.json", built_env)
    assert got["statusCode"] == 200
    assert json.loads(got["body"])["jobId"] == job_id
    invalid = run_built(local_build_dir, "EnqueueApiFunction", REPO / "events/http_post_job_invalid.json", built_env)
    assert 400 <= invalid["statusCode"] < 500
    assert server_stack.queue_depth() == 1


def test_built_sandbox_runs_a_checkout_with_nothing_of_the_callers_environment(local_build_dir: Path, tmp_path: Path):
    from tests.sandbox.conftest import file_member, inline, sandbox_event, tar_gz

    checkout = tar_gz([file_member("env.sh", b"#!/bin/sh\nenv | sort\n", mode=0o755)])
    work_root = tmp_path / "work"
    work_root.mkdir()

    result = run_built_sandbox(local_build_dir, sandbox_event(inline(checkout), ["./env.sh"]), work_root)

    assert (result["outcome"], result["exitCode"]) == ("passed", 0)
    assert "AWS_" not in result["outputTail"]
    assert list(work_root.iterdir()) == []
