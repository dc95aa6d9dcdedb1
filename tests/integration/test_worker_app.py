"""The worker's Lambda handler as deployed (app.lambda_handler, Powertools wiring, settings from the environment),
run on the real-shaped events in events/."""

from __future__ import annotations

import json
import shutil
from typing import Any

import pytest

from agent_jobs.models import JobStatus
from tests.conftest import REPO, GitWorkspaces, Stack, enqueue, make_message

EVENTS = REPO / "events"


ALPHA_FILES = {"src/app.py": b"old\n", "README.md": b"# alpha\n"}  # what events/ patches apply to
BETA_FILES = {"README.md": b"old\n"}


@pytest.fixture
def git(any_stack: Stack, register_git_workspace: Any) -> GitWorkspaces:
    register_git_workspace(any_stack, "repo-alpha", ALPHA_FILES, tenant_id="tenant-demo")
    return register_git_workspace(any_stack, "repo-beta", BETA_FILES, tenant_id="tenant-demo")  # type: ignore[no-any-return]


def load_event(name: str) -> dict[str, Any]:
    event: dict[str, Any] = json.loads((EVENTS / name).read_text())
    return event


def test_worker_app_runs_the_two_workspace_event(worker_app, any_stack, git, lambda_context):
    event = load_event("sqs_fifo_two_workspaces.json")
    response = worker_app.lambda_handler(event, lambda_context())
    assert response == {"batchItemFailures": []}
    # the branches on the git remotes carry each apply_patch commit once, with its trailer
    assert git.branch("repo-alpha") == ["job-a-001"]
    assert git.branch("repo-beta") == ["job-b-001"]
    for record in event["Records"]:
        job = any_stack.job(json.loads(record["body"])["jobId"])
        assert job["status"] == JobStatus.SUCCEEDED
        assert job["tenantId"] == "tenant-demo"
        assert job["sequenceNumber"] == record["attributes"]["SequenceNumber"]
    # run_tests ran the registered command on the branch head; open_pr opened one pull request
    tests_result = any_stack.job("job-a-002")["result"]
    assert (tests_result["outcome"], tests_result["exitCode"]) == ("passed", 0)
    assert "tests pass" in tests_result["outputTail"]
    pulls = git.github.list_pulls()
    assert [(p.owner, p.repo, p.head, p.base) for p in pulls] == [("agents", "repo-alpha", "agent/repo-alpha", "main")]
    assert any_stack.job("job-a-003")["result"]["number"] == pulls[0].number


def test_worker_app_absorbs_the_duplicate_delivery_event(worker_app, any_stack, git, lambda_context):
    event = load_event("sqs_fifo_duplicate_delivery.json")
    response = worker_app.lambda_handler(event, lambda_context())
    assert response == {"batchItemFailures": []}
    assert git.branch("repo-alpha") == ["job-a-001"]
    job = any_stack.job("job-a-001")
    assert job["attempt"] == 1
    assert job["messageId"] == event["Records"][0]["messageId"]  # the resent message never claimed it


def test_worker_app_unregistered_workspace_is_dead_and_halted(worker_app, any_stack, lambda_context):
    event = load_event("sqs_fifo_two_workspaces.json")
    event["Records"] = event["Records"][:1]
    assert worker_app.lambda_handler(event, lambda_context()) == {"batchItemFailures": []}
    job = any_stack.job("job-a-001")
    assert job["status"] == JobStatus.DEAD
    assert "PUT /workspaces/repo-alpha" in job["error"]
    assert any_stack.workspace("repo-alpha")["state"] == "HALTED"


def test_worker_app_reports_a_leased_record_and_never_raises(worker_app, any_stack, lambda_context):
    # Given a job another worker holds with a live lease
    message = make_message("job-a-001", workspace_id="repo-alpha", tenant_id="tenant-demo")
    any_stack.guard.claim(message, message_id="other", sequence_number=None, remaining_ms=60_000)
    event = load_event("sqs_fifo_duplicate_delivery.json")
    event["Records"][0]["body"] = message.model_dump_json(by_alias=True)
    event["Records"][1]["body"] = message.model_dump_json(by_alias=True)
    # When the handler gets it, Then the record and the rest of its group are reported, not acknowledged
    response = worker_app.lambda_handler(event, lambda_context())
    assert [f["itemIdentifier"] for f in response["batchItemFailures"]] == [r["messageId"] for r in event["Records"]]


def test_worker_app_settings_come_from_the_environment(worker_app, any_stack, monkeypatch, lambda_context):
    monkeypatch.setenv("MAX_ATTEMPTS", "7")
    worker = worker_app.worker()
    assert worker.services.settings.max_attempts == 7
    assert worker.services.settings.table_name == any_stack.table_name
    assert worker_app.worker() is worker  # built once, reused while warm


def test_worker_app_message_from_the_producer_runs(worker_app, any_stack, register_git_workspace, lambda_context):
    from tests.conftest import make_job

    git = register_git_workspace(any_stack, "ws-prod", {"README.md": b"# prod\n"})
    enqueue(any_stack, make_job("p-1", "ws-prod"))
    event = any_stack.receive()
    assert worker_app.lambda_handler(event, lambda_context()) == {"batchItemFailures": []}
    assert git.branch("ws-prod") == ["p-1"]


def test_worker_app_patch_that_does_not_apply_halts_with_file_and_hunk(
    worker_app, any_stack, register_git_workspace, lambda_context
):
    # Given a registered workspace whose README does not have the line the patch removes
    git = register_git_workspace(any_stack, "ws-bad", {"README.md": b"# actual\n"})
    patch = "--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n-# expected\n+# changed\n"
    from tests.conftest import make_job

    enqueue(any_stack, make_job("bad-1", "ws-bad", payload={"patch": patch, "commitMessage": "change"}))
    enqueue(any_stack, make_job("after-1", "ws-bad"))
    # When the worker runs them
    assert worker_app.lambda_handler(any_stack.receive(), lambda_context()) == {"batchItemFailures": []}
    # Then the job is DEAD at once (a permanent error), its message names the file and the hunk, the workspace is
    # halted, the job behind it parked, and the branch untouched
    job = any_stack.job("bad-1")
    assert (job["status"], job["attempt"]) == ("DEAD", 1)
    assert "README.md, hunk 1 of 1" in job["error"]
    assert any_stack.workspace("ws-bad")["state"] == "HALTED"
    assert any_stack.job("after-1")["status"] == "PARKED"
    assert git.branch("ws-bad") == []


def test_worker_app_patch_over_its_limits_is_dead_at_once_naming_the_limit(
    worker_app, any_stack, register_git_workspace, lambda_context, monkeypatch
):
    # Given a worker whose patches may have 1 hunk, and a patch of 2 that reached the queue without the API
    monkeypatch.setenv("PATCH_MAX_HUNKS", "1")
    git = register_git_workspace(any_stack, "ws-big", {"README.md": b"a\nb\nc\nd\ne\n"})
    patch = "--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n-a\n+A\n@@ -5 +5 @@\n-e\n+E\n"
    from tests.conftest import make_job

    enqueue(any_stack, make_job("big-1", "ws-big", payload={"patch": patch, "commitMessage": "change"}))
    # When the worker runs it
    assert worker_app.lambda_handler(any_stack.receive(), lambda_context()) == {"batchItemFailures": []}
    # Then the job is DEAD at once, its error naming the limit and how to raise it, and the branch is untouched
    job = any_stack.job("big-1")
    assert (job["status"], job["attempt"]) == ("DEAD", 1)
    assert "the patch has 2 hunks; the limit is 1 (PATCH_MAX_HUNKS)" in job["error"]
    assert "raise PATCH_MAX_HUNKS" in job["error"]
    assert git.branch("ws-big") == []


@pytest.mark.parametrize("remote_left", ["nothing", "a folder that is not a git repository"])
def test_worker_app_missing_remote_is_dead_at_once_saying_to_fix_the_registration(
    worker_app, any_stack, register_git_workspace, lambda_context, remote_left
):
    # Given a workspace registered on a remote that is not there (any more)
    git = register_git_workspace(any_stack, "ws-gone", {"README.md": b"# gone\n"})
    remote = git.remotes["ws-gone"]
    shutil.rmtree(remote)
    if remote_left != "nothing":
        (remote / "objects").mkdir(parents=True)
    from tests.conftest import make_job

    enqueue(any_stack, make_job("gone-1", "ws-gone"))
    # When the worker runs its job
    assert worker_app.lambda_handler(any_stack.receive(), lambda_context()) == {"batchItemFailures": []}
    # Then the job is DEAD at its first attempt, saying what is wrong and what to do, and the workspace is halted
    job = any_stack.job("gone-1")
    assert (job["status"], job["attempt"]) == ("DEAD", 1)
    assert job["error"] == (
        f"the remote at {remote} does not exist or is not a git repository; fix the registration with "
        "PUT /workspaces/ws-gone and resume the workspace"
    )
    assert any_stack.workspace("ws-gone")["state"] == "HALTED"
