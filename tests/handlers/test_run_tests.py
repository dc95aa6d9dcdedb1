"""run_tests on a git workspace: the checkout goes to the test sandbox function (inline or by presigned URL) for the
job's tenant, and the sandbox's answer becomes the job's result or error. The sandbox here is the real handler, run
in this process behind a fake Lambda client."""

from __future__ import annotations

import base64
import fcntl
import io
import json
import os
import stat
import sys
import tarfile
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError, ReadTimeoutError
from dulwich.repo import Repo
from moto import mock_aws
from pydantic import ValidationError

from agent_jobs.models import RunTestsJob
from agent_jobs.payloads import PayloadStore
from agent_jobs.registration import RegisteredWorkspace, WorkspaceRegistration
from agent_jobs.services import build_services, sandbox_client_config
from agent_jobs.settings import Settings
from job_worker.jobs import run_tests
from job_worker.jobs.context import JobContext
from job_worker.jobs.errors import OutOfTimeError, PermanentJobError, RetryableJobError
from job_worker.jobs.git_workspace import GitRemote, GitWorkspace, GitWorkspaceStore
from job_worker.jobs.sandbox import SANDBOX_PREFIX, TestSandbox, pack_checkout, test_timeout_seconds
from job_worker.jobs.scratch import IN_USE, SCRATCH_PREFIX
from test_sandbox import app as sandbox_app
from test_sandbox.archive import ArchiveLimits, extract_archive
from tests.git.conftest import BASE_BRANCH, SEED_FILES, commit_files

BUCKET = "agent-jobs-payloads-test"
TENANT = "tenant-a"
PYTHON = sys.executable


class RemainingTime:
    def __init__(self, milliseconds: int) -> None:
        self.milliseconds = milliseconds

    def get_remaining_time_in_millis(self) -> int:
        return self.milliseconds


class FakeLambda:
    """Lambda's Invoke as boto3 returns it, answered by `answer(event)`; every call is recorded."""

    def __init__(self, answer: Callable[[dict[str, Any]], Any], *, function_error: str | None = None) -> None:
        self.answer = answer
        self.function_error = function_error
        self.calls: list[dict[str, Any]] = []

    def invoke(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(kwargs)
        payload = json.dumps(self.answer(json.loads(kwargs["Payload"]))).encode()
        response: dict[str, Any] = {"StatusCode": 200, "Payload": io.BytesIO(payload)}
        if self.function_error:
            response["FunctionError"] = self.function_error
        return response

    @property
    def event(self) -> dict[str, Any]:
        event: dict[str, Any] = json.loads(self.calls[-1]["Payload"])
        return event


def real_sandbox(s3: Any) -> Callable[[dict[str, Any]], Any]:
    """The sandbox's handler; a URL archive is fetched from the bucket first, as the local endpoint does (moto in
    this process answers boto3, not urllib)."""

    def answer(event: dict[str, Any]) -> Any:
        archive = event["archive"]
        if "url" in archive:
            url = urllib.parse.urlsplit(archive["url"])
            bucket, key = url.path.lstrip("/").split("/", 1) if url.netloc.startswith("s3.") else (BUCKET, url.path)
            body = s3.get_object(Bucket=bucket, Key=urllib.parse.unquote(key).lstrip("/"))["Body"].read()
            event["archive"] = {"inline": base64.b64encode(body).decode(), "sha256": archive["sha256"]}
        return sandbox_app.lambda_handler(event, RemainingTime(60_000))

    return answer


@pytest.fixture
def s3() -> Iterator[Any]:
    with mock_aws():
        settings = Settings(table_name="t", queue_url="q", payload_bucket=BUCKET)
        client = build_services(settings, boto3.Session(region_name="us-east-1")).payloads.client  # as deployed
        client.create_bucket(Bucket=BUCKET)
        yield client


@pytest.fixture(autouse=True)
def sandbox_work_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sandbox").mkdir()
    monkeypatch.setenv("SANDBOX_WORK_ROOT", str(tmp_path / "sandbox"))


@pytest.fixture
def workspace(tmp_path: Path) -> GitWorkspace:
    """ws-1 on a bare remote seeded with SEED_FILES (scripts/check.sh executable), with a cache of its own."""
    remote = tmp_path / "remote.git"
    Repo.init_bare(str(remote), mkdir=True, default_branch=BASE_BRANCH.encode()).close()
    commit_files(remote, BASE_BRANCH, SEED_FILES, "Initial commit\n")
    store = GitWorkspaceStore(tmp_path / "cache", lambda _: GitRemote(str(remote), "agent/ws-1", BASE_BRANCH))
    opened = store.open("ws-1")
    assert isinstance(opened, GitWorkspace)
    return opened


def registered(test_commands: dict[str, list[str]]) -> RegisteredWorkspace:
    registration = WorkspaceRegistration.model_validate(
        {"remoteUrl": "/srv/git/ws-1.git", "branch": "agent/ws-1", "testCommands": test_commands}
    )
    return RegisteredWorkspace(workspace_id="ws-1", tenant_id=TENANT, registration=registration, registered_at=0)


def job_context(
    workspace: GitWorkspace,
    sandbox: TestSandbox | None,
    *,
    command: list[str] | None = None,
    remaining_ms: int = 100_000,
    invocation_ms: int | None = None,
) -> JobContext:
    return JobContext(
        workspace=workspace,
        remaining_ms=lambda: remaining_ms,
        invocation_ms=remaining_ms if invocation_ms is None else invocation_ms,
        registration=registered({"default": command or ["sh", "scripts/check.sh"]}),
        safety_margin_ms=10_000,
        test_sandbox=lambda: sandbox,
    )


def sandbox_for(fake: Any, s3: Any, *, timeout_seconds: int = 90, inline_limit: int = 3 * 1024 * 1024) -> TestSandbox:
    payloads = PayloadStore(BUCKET, lambda: s3)
    return TestSandbox(
        "agent-jobs-TestSandbox", timeout_seconds, lambda: fake, payloads, inline_limit_bytes=inline_limit
    )


PASSED = {"outcome": "passed", "exitCode": 0, "durationSeconds": 1, "outputTail": "", "truncated": False}


TESTS_JOB = RunTestsJob.model_validate({"jobId": "tests-1", "workspaceId": "ws-1", "type": "run_tests"})


def test_run_tests_runs_the_command_in_the_sandbox_for_the_jobs_tenant(workspace: GitWorkspace, s3: Any):
    fake = FakeLambda(real_sandbox(s3))
    command = [PYTHON, "-c", "import os; print('tests pass in', sorted(os.listdir('.')))"]

    result = run_tests.run(TESTS_JOB, job_context(workspace, sandbox_for(fake, s3), command=command))

    head = workspace.head()
    assert result == {
        "suite": "default",
        "commit": head,
        "outcome": "passed",
        "exitCode": 0,
        "durationSeconds": result["durationSeconds"],
        "outputTail": "tests pass in ['README.md', 'docs', 'old', 'scripts', 'src', 'tail.txt']\n",
        "truncated": False,
        "reused": False,
    }
    (call,) = fake.calls
    assert (call["FunctionName"], call["InvocationType"], call["TenantId"]) == (
        "agent-jobs-TestSandbox",
        "RequestResponse",
        TENANT,
    )
    assert fake.event["argv"] == command
    assert (fake.event["jobId"], fake.event["workspaceId"], fake.event["tenantId"], fake.event["commit"]) == (
        "tests-1",
        "ws-1",
        TENANT,
        head,
    )
    assert "inline" in fake.event["archive"]
    assert s3.list_objects_v2(Bucket=BUCKET).get("KeyCount") == 0  # small: nothing uploaded


def test_run_tests_result_is_stored_and_reused_without_invoking_again(workspace: GitWorkspace, s3: Any):
    fake = FakeLambda(real_sandbox(s3))
    context = job_context(workspace, sandbox_for(fake, s3))

    first = run_tests.run(TESTS_JOB, context)
    second = run_tests.run(TESTS_JOB, context)

    assert (first["outcome"], first["exitCode"]) == ("passed", 0)  # scripts/check.sh exits 0: its bit survived
    assert second == {**first, "reused": True}
    assert len(fake.calls) == 1


def test_run_tests_failing_tests_are_a_result_not_an_error(workspace: GitWorkspace, s3: Any):
    fake = FakeLambda(real_sandbox(s3))
    command = [PYTHON, "-c", "import sys; print('2 failed'); sys.exit(1)"]

    result = run_tests.run(TESTS_JOB, job_context(workspace, sandbox_for(fake, s3), command=command))

    assert (result["outcome"], result["exitCode"], result["outputTail"]) == ("failed", 1, "2 failed\n")


def test_run_tests_large_checkout_goes_by_presigned_url(workspace: GitWorkspace, s3: Any):
    fake = FakeLambda(real_sandbox(s3))
    sandbox = sandbox_for(fake, s3, inline_limit=100, timeout_seconds=90)

    result = run_tests.run(TESTS_JOB, job_context(workspace, sandbox))

    head = workspace.head()
    key = f"{SANDBOX_PREFIX}{TENANT}/ws-1/tests-1/{head}.tar.gz"
    assert result["outcome"] == "passed"
    stored = s3.get_object(Bucket=BUCKET, Key=key)
    assert stored["ServerSideEncryption"] == "AES256"
    archive = fake.calls[0]["Payload"]
    sent = json.loads(archive)["archive"]
    assert set(sent) == {"url", "sha256", "size"}
    assert sent["size"] == stored["ContentLength"]
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(sent["url"]).query)
    assert query["X-Amz-Expires"] == ["150"]  # the sandbox's timeout and a minute
    assert key in urllib.parse.unquote(sent["url"])


def test_run_tests_large_checkout_without_a_bucket_is_permanent(workspace: GitWorkspace, s3: Any):
    fake = FakeLambda(real_sandbox(s3))
    sandbox = TestSandbox("fn", 90, lambda: fake, PayloadStore(None, lambda: s3), inline_limit_bytes=100)

    with pytest.raises(PermanentJobError, match="PAYLOAD_BUCKET"):
        run_tests.run(TESTS_JOB, job_context(workspace, sandbox))
    assert fake.calls == []


def test_run_tests_without_a_sandbox_is_permanent_and_runs_nothing(workspace: GitWorkspace, tmp_path: Path):
    marker = tmp_path / "ran"
    command = [PYTHON, "-c", f"open({str(marker)!r}, 'w').close()"]

    with pytest.raises(PermanentJobError, match="set TEST_SANDBOX_FUNCTION"):
        run_tests.run(TESTS_JOB, job_context(workspace, None, command=command))
    assert not marker.exists()


def test_run_tests_timeout_is_the_workers_time_or_the_sandboxs_whichever_is_shorter(workspace: GitWorkspace, s3: Any):
    fake = FakeLambda(lambda event: PASSED)

    run_tests.run(TESTS_JOB, job_context(workspace, sandbox_for(fake, s3, timeout_seconds=60), remaining_ms=110_000))
    assert fake.event["timeoutSeconds"] == 50.0  # the sandbox's 60 s less its 10 s of headroom

    other = RunTestsJob.model_validate({"jobId": "tests-2", "workspaceId": "ws-1", "type": "run_tests"})
    run_tests.run(other, job_context(workspace, sandbox_for(fake, s3, timeout_seconds=900), remaining_ms=40_000))
    assert fake.event["timeoutSeconds"] == 30.0  # the worker's 40 s less its 10 s safety margin


TIMED_OUT = {"outcome": "timed_out", "exitCode": None, "durationSeconds": 5, "outputTail": "", "truncated": False}


def test_run_tests_cut_short_by_a_late_start_is_retried_not_recorded(workspace: GitWorkspace, s3: Any):
    # Given a run_tests job that starts with 16 s left of an invocation that had 110 s (behind other jobs of its batch)
    fake = FakeLambda(lambda event: TIMED_OUT)
    context = job_context(workspace, sandbox_for(fake, s3), remaining_ms=16_000, invocation_ms=110_000)

    # When its 6 s run times out
    with pytest.raises(OutOfTimeError, match=r"stopped after 6.0 s.*gives them 80.0 s"):
        run_tests.run(TESTS_JOB, context)

    # Then nothing is recorded as the suite's verdict: the job runs again
    assert fake.event["timeoutSeconds"] == 6.0
    assert workspace.stored_test_result("tests-1", workspace.head()) is None


def test_run_tests_timed_out_with_most_of_an_invocation_is_the_suites_verdict(workspace: GitWorkspace, s3: Any):
    # Given a run that had more than half of what a whole invocation gives the tests (50 of 80 s)
    fake = FakeLambda(lambda event: TIMED_OUT)
    context = job_context(workspace, sandbox_for(fake, s3), remaining_ms=60_000, invocation_ms=110_000)

    result = run_tests.run(TESTS_JOB, context)

    # Then its timeout is the result, stored like a failure
    assert result["outcome"] == "timed_out"
    assert workspace.stored_test_result("tests-1", workspace.head()) is not None


def test_run_tests_with_no_time_left_retries_without_invoking(workspace: GitWorkspace, s3: Any):
    fake = FakeLambda(real_sandbox(s3))

    with pytest.raises(OutOfTimeError, match="not enough time"):
        run_tests.run(TESTS_JOB, job_context(workspace, sandbox_for(fake, s3), remaining_ms=9_000))
    assert fake.calls == []


def test_run_tests_unknown_suite_is_permanent(workspace: GitWorkspace, s3: Any):
    fake = FakeLambda(real_sandbox(s3))
    job = RunTestsJob.model_validate(
        {"jobId": "tests-1", "workspaceId": "ws-1", "type": "run_tests", "payload": {"suite": "e2e"}}
    )

    with pytest.raises(PermanentJobError, match="no test command 'e2e'"):
        run_tests.run(job, job_context(workspace, sandbox_for(fake, s3)))
    assert fake.calls == []


def test_run_tests_missing_command_in_the_sandbox_is_permanent(workspace: GitWorkspace, s3: Any):
    fake = FakeLambda(real_sandbox(s3))

    with pytest.raises(PermanentJobError, match=r"no-such-test-runner.*fix the workspace's registered test command"):
        run_tests.run(TESTS_JOB, job_context(workspace, sandbox_for(fake, s3), command=["no-such-test-runner"]))


@pytest.mark.parametrize(
    ("answer", "function_error", "error", "message"),
    [
        pytest.param(
            {"error": "bad archive", "permanent": True}, None, PermanentJobError, "bad archive", id="permanent"
        ),
        pytest.param({"error": "HTTP 403", "permanent": False}, None, RetryableJobError, "HTTP 403", id="retryable"),
        pytest.param(
            {"errorMessage": "Task timed out after 90.00 seconds", "errorType": "Sandbox.Timedout"},
            "Unhandled",
            RetryableJobError,
            r"\(Sandbox.Timedout\): Task timed out after 90.00 seconds",
            id="function-error",
        ),
        pytest.param({"outcome": "exploded"}, None, RetryableJobError, "not a test run", id="malformed"),
        pytest.param(None, None, RetryableJobError, "not a test run", id="empty"),
    ],
)
def test_run_tests_maps_the_sandboxs_answer(
    answer: Any, function_error: str | None, error: type[Exception], message: str, workspace: GitWorkspace, s3: Any
):
    fake = FakeLambda(lambda event: answer, function_error=function_error)

    with pytest.raises(error, match=message):
        run_tests.run(TESTS_JOB, job_context(workspace, sandbox_for(fake, s3)))
    assert workspace.stored_test_result("tests-1", workspace.head()) is None  # nothing stored: the job tries again


@pytest.mark.parametrize(
    "failure",
    [
        ClientError({"Error": {"Code": "TooManyRequestsException", "Message": "Rate exceeded"}}, "Invoke"),
        ReadTimeoutError(endpoint_url="https://lambda.us-east-1.amazonaws.com"),
    ],
    ids=["throttled", "read-timeout"],
)
def test_run_tests_unreachable_sandbox_is_retryable(failure: Exception, workspace: GitWorkspace, s3: Any):
    class Failing:
        def invoke(self, **kwargs: Any) -> Any:
            raise failure

    sandbox = sandbox_for(Failing(), s3)

    with pytest.raises(
        RetryableJobError, match="'agent-jobs-TestSandbox' \\(TEST_SANDBOX_FUNCTION\\) could not be invoked"
    ):
        run_tests.run(TESTS_JOB, job_context(workspace, sandbox))


# -- the checkout as an archive ---------------------------------------------------------------------------------


def test_pack_checkout_keeps_executable_bits_and_in_tree_links_only(tmp_path: Path):
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    (tree / "scripts" / "check.sh").write_text("#!/bin/sh\nexit 0\n")
    (tree / "scripts" / "check.sh").chmod(0o755)
    (tree / "README.md").write_text("# demo\n")
    (tree / "docs").symlink_to("scripts")
    (tree / "scripts" / "readme-link").symlink_to("../README.md")
    (tree / "etc-passwd").symlink_to("/etc/passwd")
    (tree / "climbs").symlink_to("../../outside")

    archive = pack_checkout(tree)

    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as opened:
        names = sorted(opened.getnames())
        assert all(member.uid == 0 and member.uname == "" for member in opened.getmembers())
    assert names == ["README.md", "docs", "scripts", "scripts/check.sh", "scripts/readme-link"]
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    extract_archive(archive, unpacked, ArchiveLimits())  # the sandbox accepts what the worker packs
    assert os.stat(unpacked / "scripts" / "check.sh").st_mode & stat.S_IXUSR
    assert os.readlink(unpacked / "docs") == "scripts"
    assert (unpacked / "scripts" / "readme-link").read_text() == "# demo\n"


def test_pack_checkout_of_a_git_checkout_round_trips(workspace: GitWorkspace, tmp_path: Path):
    checkout = tmp_path / "checkout"
    workspace.checkout(workspace.head(), checkout)
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()

    extract_archive(pack_checkout(checkout), unpacked, ArchiveLimits())

    for path, content in SEED_FILES.items():
        assert (unpacked / path).read_bytes() == content
    assert os.access(unpacked / "scripts" / "check.sh", os.X_OK)


# -- settings and the client ------------------------------------------------------------------------------------


def test_timeout_seconds_is_bounded_by_the_invocation_and_the_ceiling():
    assert test_timeout_seconds(120_000, 10_000, 900.0) == 110.0
    assert test_timeout_seconds(120_000, 10_000, 60.0) == 60.0
    assert test_timeout_seconds(8_000, 10_000, 60.0) == 0.0


def test_settings_refuse_a_sandbox_timeout_above_what_lambda_can_run():
    with pytest.raises(
        ValidationError, match=r"TEST_SANDBOX_TIMEOUT_SECONDS \(901\) is above 900 s, the longest a Lambda"
    ):
        Settings(table_name="t", queue_url="q", test_sandbox_timeout_seconds=901)
    with pytest.raises(ValidationError, match="leaves no time for the tests"):
        Settings(table_name="t", queue_url="q", test_sandbox_timeout_seconds=10)
    assert Settings(table_name="t", queue_url="q", test_sandbox_timeout_seconds=900).test_sandbox_timeout_seconds == 900


def test_sandbox_client_never_retries_and_outwaits_the_sandbox():
    settings = Settings(table_name="t", queue_url="q", test_sandbox_timeout_seconds=300)

    config = sandbox_client_config(settings)

    assert config.retries == {"mode": "standard", "total_max_attempts": 1}  # type: ignore[attr-defined]
    assert config.read_timeout > 300  # type: ignore[attr-defined]


def test_sandbox_client_is_built_once_on_first_use():
    settings = Settings(table_name="t", queue_url="q", test_sandbox_function="fn")
    with mock_aws():
        services = build_services(settings, boto3.Session(region_name="us-east-1"))
        started = time.monotonic()
        first, second = services.sandbox_lambda(), services.sandbox_lambda()
    assert first is second
    assert time.monotonic() - started < 30
    sandbox = TestSandbox.from_services(services)
    assert sandbox is not None
    assert (sandbox.function_name, sandbox.timeout_seconds) == ("fn", 90)
    without = build_services(Settings(table_name="t", queue_url="q"), boto3.Session(region_name="us-east-1"))
    assert TestSandbox.from_services(without) is None


@pytest.fixture
def worker_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The worker's /tmp: where tempfile puts what a job writes outside its workspace's cache."""
    folder = tmp_path / "worker-tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_run_tests_leaves_nothing_in_tmp_whether_it_succeeds_or_fails(
    workspace: GitWorkspace, s3: Any, worker_tmp: Path
):
    seen: list[list[str]] = []

    def answer(event: dict[str, Any]) -> Any:
        seen.append(sorted(path.name for path in worker_tmp.iterdir()))  # packed and removed before the sandbox runs
        return real_sandbox(s3)(event)

    run_tests.run(TESTS_JOB, job_context(workspace, sandbox_for(FakeLambda(answer), s3)))
    assert seen == [[]]
    assert list(worker_tmp.iterdir()) == []

    failing = RunTestsJob.model_validate({"jobId": "tests-2", "workspaceId": "ws-1", "type": "run_tests"})
    with pytest.raises(RetryableJobError):
        run_tests.run(failing, job_context(workspace, sandbox_for(FakeLambda(answer, function_error="Unhandled"), s3)))
    assert list(worker_tmp.iterdir()) == []


def test_run_tests_removes_what_a_killed_job_left_in_tmp_but_not_a_live_jobs(
    workspace: GitWorkspace, s3: Any, worker_tmp: Path
):
    # Given the checkout of a job whose process was killed mid-run (its lock died with it), and one of a live job
    abandoned = worker_tmp / f"{SCRATCH_PREFIX}killed"
    (abandoned / "work").mkdir(parents=True)
    (abandoned / IN_USE).touch()
    (abandoned / "work" / "big.bin").write_bytes(bytes(1024 * 1024))
    live = worker_tmp / f"{SCRATCH_PREFIX}live"
    live.mkdir()
    with (live / IN_USE).open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)

        # When a run_tests job runs
        result = run_tests.run(TESTS_JOB, job_context(workspace, sandbox_for(FakeLambda(real_sandbox(s3)), s3)))

        # Then the abandoned checkout is gone, the live one stays
        assert result["outcome"] == "passed"
        assert sorted(path.name for path in worker_tmp.iterdir()) == [live.name]
