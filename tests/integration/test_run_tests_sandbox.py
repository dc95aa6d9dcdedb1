"""run_tests through the worker's Lambda handler, with the test sandbox behind a real HTTP Lambda Invoke endpoint:
the worker's own boto3 client (AWS_ENDPOINT_URL_LAMBDA), the tenant header, the checkout inline or through the
payload bucket, and the sandbox's answers and failures as the job's result or error."""

from __future__ import annotations

import json
import sys
from typing import Any

from agent_jobs.models import JobStatus
from tests.conftest import Stack, enqueue, make_job

TENANT = "tenant-sandbox"


def register(any_stack: Stack, register_git_workspace: Any, command: list[str], files: dict[str, bytes]) -> None:
    from agent_jobs.registration import WorkspaceRegistration
    from agent_jobs.workspaces import WorkspaceRegistry

    git = register_git_workspace(any_stack, "ws-tests", files, tenant_id=TENANT)
    registration = WorkspaceRegistration.model_validate(
        {
            "remoteUrl": str(git.remotes["ws-tests"]),
            "branch": "agent/ws-tests",
            "testCommands": {"unit": command},
        }
    )
    WorkspaceRegistry(any_stack.services.dynamodb, any_stack.table_name).register("ws-tests", registration, TENANT)


def run_one(worker_app: Any, any_stack: Stack, lambda_context: Any, job_id: str = "t-1") -> Any:
    enqueue(any_stack, make_job(job_id, "ws-tests", "run_tests"), tenant_id=TENANT)
    assert worker_app.lambda_handler(any_stack.receive(), lambda_context()) == {"batchItemFailures": []}
    return any_stack.job(job_id)


def test_run_tests_runs_in_the_sandbox_for_the_workspace_tenant(
    worker_app, any_stack, register_git_workspace, sandbox_endpoint, lambda_context
):
    command = [sys.executable, "-c", "import os; print('unit tests pass', sorted(os.listdir('.')))"]
    register(any_stack, register_git_workspace, command, {"README.md": b"# tests\n"})

    job = run_one(worker_app, any_stack, lambda_context)

    assert job["status"] == JobStatus.SUCCEEDED
    result = job["result"]
    assert (result["outcome"], result["exitCode"], result["truncated"]) == ("passed", 0, False)
    assert result["outputTail"] == "unit tests pass ['README.md']\n"
    ((tenant, event),) = sandbox_endpoint.invocations
    assert tenant == TENANT
    assert (event["tenantId"], event["workspaceId"], event["jobId"], event["commit"]) == (
        TENANT,
        "ws-tests",
        "t-1",
        result["commit"],
    )
    assert "inline" in event["archive"]


def test_run_tests_large_checkout_goes_through_the_payload_bucket(
    worker_app, any_stack, register_git_workspace, sandbox_endpoint, lambda_context
):
    # Given a checkout of incompressible data above what an invocation carries inline
    import os

    files = {"README.md": b"# big\n", "fixtures/noise.bin": os.urandom(3 * 1024 * 1024 + 1024)}
    command = [sys.executable, "-c", "import os; print(os.path.getsize('fixtures/noise.bin'))"]
    register(any_stack, register_git_workspace, command, files)

    job = run_one(worker_app, any_stack, lambda_context)

    assert (job["status"], job["result"]["outcome"]) == (JobStatus.SUCCEEDED, "passed")
    assert job["result"]["outputTail"] == f"{3 * 1024 * 1024 + 1024}\n"
    ((_, event),) = sandbox_endpoint.invocations
    assert set(event["archive"]) == {"url", "sha256", "size"}
    s3 = any_stack.services.payloads.client
    keys = [item["Key"] for item in s3.list_objects_v2(Bucket=any_stack.settings.payload_bucket)["Contents"]]
    assert keys == [f"sandbox/{TENANT}/ws-tests/t-1/{job['result']['commit']}.tar.gz"]


def test_run_tests_sandbox_refusal_ends_the_job_dead_with_its_reason(
    worker_app, any_stack, register_git_workspace, lambda_context
):
    register(any_stack, register_git_workspace, ["no-such-test-runner"], {"README.md": b"# tests\n"})

    job = run_one(worker_app, any_stack, lambda_context)

    assert job["status"] == JobStatus.DEAD
    assert "'no-such-test-runner'" in job["error"]
    assert "fix the workspace's registered test command" in job["error"]


def test_run_tests_sandbox_crash_is_retried_with_its_message(
    worker_app, any_stack, register_git_workspace, sandbox_endpoint, lambda_context
):
    def crash(event: dict[str, Any], context: Any) -> Any:
        raise MemoryError("Runtime exited with error: signal: killed")

    sandbox_endpoint.handler = crash
    register(any_stack, register_git_workspace, ["true"], {"README.md": b"# tests\n"})

    enqueue(any_stack, make_job("t-1", "ws-tests", "run_tests"), tenant_id=TENANT)
    response = worker_app.lambda_handler(any_stack.receive(), lambda_context())

    assert len(response["batchItemFailures"]) == 1
    job = any_stack.job("t-1")
    assert job["status"] == JobStatus.FAILED
    assert "the test sandbox failed (MemoryError): Runtime exited with error: signal: killed" in job["error"]


def test_run_tests_unreachable_sandbox_is_retried(
    worker_app, any_stack, register_git_workspace, monkeypatch, lambda_context
):
    monkeypatch.setenv("AWS_ENDPOINT_URL_LAMBDA", "http://127.0.0.1:9")  # nothing listens there
    register(any_stack, register_git_workspace, ["true"], {"README.md": b"# tests\n"})

    enqueue(any_stack, make_job("t-1", "ws-tests", "run_tests"), tenant_id=TENANT)
    response = worker_app.lambda_handler(any_stack.receive(), lambda_context())

    assert len(response["batchItemFailures"]) == 1
    job = any_stack.job("t-1")
    assert job["status"] == JobStatus.FAILED
    assert "(TEST_SANDBOX_FUNCTION) could not be invoked" in job["error"]


def test_run_tests_without_a_sandbox_ends_dead_saying_what_to_set(
    worker_app, any_stack, register_git_workspace, monkeypatch, lambda_context, tmp_path
):
    marker = tmp_path / "ran-in-the-worker"
    monkeypatch.delenv("TEST_SANDBOX_FUNCTION")
    register(any_stack, register_git_workspace, [sys.executable, "-c", f"open({str(marker)!r}, 'w')"], {"a": b"a"})

    job = run_one(worker_app, any_stack, lambda_context)

    assert job["status"] == JobStatus.DEAD
    assert "set TEST_SANDBOX_FUNCTION" in job["error"]
    assert not marker.exists()
    assert json.dumps(job).count("ran-in-the-worker") <= 1  # only in the registered command, never run
