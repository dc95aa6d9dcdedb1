"""The command line against a real local runtime: enqueue, status, the timeline, watch, halted, and the errors a user
can cause. The DLQ commands are in test_dlq.py."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import boto3
import pytest
from dulwich.repo import Repo

from agent_jobs.guard import JobGuard, ResumeOutcome
from agent_jobs.models import ResumeDecision
from agent_jobs_cli.commands.jobs import build_job
from agent_jobs_cli.commands.workspaces import is_idle
from agent_jobs_cli.context import OPERATOR_SCOPE
from tests.cli.conftest import BAD_PATCH, TENANT, CliHarness, agent_token, job_item


def test_cli_operator_scope_matches_the_api():
    from enqueue_api.app import OPERATOR_SCOPE as API_OPERATOR_SCOPE

    assert OPERATOR_SCOPE == API_OPERATOR_SCOPE


def test_cli_enqueue_status_and_timeline_follow_jobs_to_success(cli: CliHarness):
    cli.register("ws-cli-a")

    # When three jobs are enqueued through the CLI (one with a generated jobId, one from a job file)
    first = cli.enqueue_patch("ws-cli-a", "cli-a-1")
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout)["created"] is True
    generated = cli.run(
        "enqueue", "apply_patch", "ws-cli-a", "--patch-file", str(cli.patch_file()), "-m", "second", "--json"
    )
    assert generated.exit_code == 0, generated.output
    generated_id = json.loads(generated.stdout)["jobId"]
    assert generated_id.startswith("job-")
    job_file = cli.root / "job.json"
    job_file.write_text(
        json.dumps(
            {
                "jobId": "cli-a-3",
                "workspaceId": "ws-cli-a",
                "type": "apply_patch",
                "payload": {"patch": cli.patch_file().read_text(), "commitMessage": "third"},
            }
        )
    )
    from_file = cli.run("enqueue", "--file", str(job_file))
    assert from_file.exit_code == 0, from_file.output
    assert "cli-a-3 accepted" in from_file.stdout

    # and the workspace is watched until idle
    watched = cli.run("watch", "ws-cli-a", "--until-idle", "--interval", "0.2", "--timeout", "90")
    assert watched.exit_code == 0, watched.output

    lines = cli.run("watch", "ws-cli-a", "--until-idle", "--json")
    assert lines.exit_code == 0, lines.output
    assert {job["status"] for job in json.loads(lines.stdout.splitlines()[-1])["jobs"]} == {"SUCCEEDED"}

    # Then every job SUCCEEDED, and the timeline lists them in acceptance order across pages
    job = cli.run_json("status", "job", "cli-a-1")
    assert job["status"] == "SUCCEEDED"
    assert [entry["status"] for entry in job["history"]][-1] == "SUCCEEDED"
    timeline = cli.run_json("jobs", "ws-cli-a")
    assert [j["jobId"] for j in timeline["jobs"]] == ["cli-a-1", generated_id, "cli-a-3"]
    assert {j["status"] for j in timeline["jobs"]} == {"SUCCEEDED"}
    workspace = cli.run_json("status", "workspace", "ws-cli-a")
    assert workspace["state"] == "ACTIVE"
    # and the tables render the same facts
    table = cli.run("jobs", "ws-cli-a")
    assert table.exit_code == 0
    assert "cli-a-3" in table.stdout
    assert "SUCCEEDED" in table.stdout
    panel = cli.run("status", "job", "cli-a-1")
    assert "SUCCEEDED" in panel.stdout


def test_cli_enqueue_repeat_is_idempotent_and_conflict_fails(cli: CliHarness):
    cli.register("ws-cli-b")
    assert cli.enqueue_patch("ws-cli-b", "cli-b-1").exit_code == 0

    repeat = cli.enqueue_patch("ws-cli-b", "cli-b-1")
    assert repeat.exit_code == 0, repeat.output
    assert json.loads(repeat.stdout)["created"] is False

    # Given the same jobId with another payload, the API's 409 becomes a non-zero exit with its message
    conflict = cli.run("enqueue", "run_tests", "ws-cli-b", "--job-id", "cli-b-1")
    assert conflict.exit_code == 1
    assert "409" in conflict.stderr
    assert "use a new jobId" in conflict.stderr


def test_cli_enqueue_names_the_fields_to_fix_before_sending(cli: CliHarness, tmp_path: Path):
    missing = cli.run("enqueue", "apply_patch", "ws-cli-c", "--message", "m")
    assert missing.exit_code == 1
    assert "--patch-file" in missing.stderr

    bad_id = cli.run("enqueue", "open_pr", "ws cli", "--title", "t")
    assert bad_id.exit_code == 1
    assert "workspaceId" in bad_id.stderr

    unknown = cli.run("enqueue", "deploy", "ws-cli-c")
    assert unknown.exit_code == 1
    assert "apply_patch, run_tests, open_pr" in unknown.stderr

    not_json = tmp_path / "job.json"
    not_json.write_text("{")
    assert "cannot read the job file" in cli.run("enqueue", "--file", str(not_json)).stderr


def test_cli_status_of_unknown_job_exits_non_zero_with_the_api_message(cli: CliHarness):
    result = cli.run("status", "job", "no-such-job")
    assert result.exit_code == 1
    assert "404" in result.stderr
    assert "no job 'no-such-job'" in result.stderr


def test_cli_without_a_connection_file_says_how_to_start_the_runtime(tmp_path: Path):
    from typer.testing import CliRunner

    from agent_jobs_cli.main import app

    result = CliRunner().invoke(
        app, ["--connection-file", str(tmp_path / "none.json"), "--token", "t", "status", "job", "j"]
    )
    assert result.exit_code == 1
    assert "make local" in result.stderr
    assert "--stack-name" in result.stderr


def test_cli_unreachable_api_says_what_to_check(tmp_path: Path):
    from typer.testing import CliRunner

    from agent_jobs_cli.main import app

    connection = tmp_path / "local.json"
    connection.write_text(
        json.dumps(
            {
                "apiUrl": "http://127.0.0.1:9",
                "region": "us-east-1",
                "tableName": "t",
                "queueUrl": "q",
                "deadLetterQueueUrl": "d",
            }
        )
    )
    result = CliRunner().invoke(app, ["--connection-file", str(connection), "--token", "t", "status", "job", "j"])
    assert result.exit_code == 1
    assert "cannot reach the API" in result.stderr
    assert "make local" in result.stderr


def test_cli_halted_lists_a_halted_workspace_and_resume_refuses_an_active_one(cli: CliHarness):
    # Given a workspace halted by a job that fails permanently (a patch that does not apply: DEAD)
    cli.register("ws-cli-halted")
    assert cli.enqueue_patch("ws-cli-halted", "cli-u-1", BAD_PATCH).exit_code == 0
    watched = cli.run("watch", "ws-cli-halted", "--until-idle", "--interval", "0.2", "--timeout", "90")
    assert watched.exit_code == 0, watched.output

    # When the operator lists the halted workspaces
    halted = cli.run_json("halted")

    # Then it is there, with the job that halted it
    views = {view["workspaceId"]: view for view in halted["workspaces"]}
    assert views["ws-cli-halted"]["state"] == "HALTED"
    assert views["ws-cli-halted"]["haltingJobId"] == "cli-u-1"
    assert "cli-u-1" in cli.run("halted").stdout

    # and resuming a workspace that is not halted is refused before anything is sent
    cli.register("ws-cli-active")
    refused = cli.run("resume", "ws-cli-active", "--retry", "--yes")
    assert refused.exit_code == 1
    assert "not HALTED" in refused.stderr
    assert "choose one decision" in cli.run("resume", "ws-cli-halted", "--yes").stderr
    # and a resume shows the halting job and asks first: declined, nothing is sent and the halt stays
    declined = cli.run("resume", "ws-cli-halted", "--skip", input="n\n")
    assert declined.exit_code == 1
    assert "DEAD" in declined.stdout
    assert "skip job cli-u-1 and resume workspace ws-cli-halted?" in declined.stderr
    assert "not resumed" in declined.stderr
    assert cli.run_json("status", "workspace", "ws-cli-halted")["state"] == "HALTED"


def test_cli_resume_of_a_resuming_workspace_repeats_its_resume_and_sends_the_marker(cli: CliHarness):
    # Given a workspace halted by a DEAD job, a job parked behind it, and a resume (skip) whose transaction succeeded
    # but whose drain marker was never sent (the API answered 503): RESUMING, and nothing drains it
    cli.register("ws-cli-repeat")
    assert cli.enqueue_patch("ws-cli-repeat", "cli-r-1", BAD_PATCH).exit_code == 0
    assert cli.run("watch", "ws-cli-repeat", "--until-idle", "--interval", "0.2", "--timeout", "90").exit_code == 0
    assert cli.enqueue_patch("ws-cli-repeat", "cli-r-2").exit_code == 0
    assert cli.run("watch", "ws-cli-repeat", "--until-idle", "--interval", "0.2", "--timeout", "90").exit_code == 0
    assert job_item(cli.runtime, "cli-r-2")["status"] == "PARKED"
    runtime = cli.runtime
    dynamodb = boto3.client("dynamodb", endpoint_url=runtime.endpoint_url, region_name=runtime.resources.region)
    begun = JobGuard(dynamodb, runtime.resources.table_name).begin_resume(
        "ws-cli-repeat", tenant_id=TENANT, halting_job_id="cli-r-1", decision=ResumeDecision.SKIP, operator="alice"
    )
    assert begun.outcome is ResumeOutcome.RESUMING
    shown = cli.run("status", "workspace", "ws-cli-repeat")
    assert "skip of job cli-r-1 by alice" in shown.stdout

    # When the operator asks for another decision, it is refused before anything is sent
    other = cli.run("resume", "ws-cli-repeat", "--retry", "--yes")
    assert other.exit_code == 1
    assert "without --retry" in other.stderr

    # When the operator resumes the RESUMING workspace without a decision
    repeated = cli.run("resume", "ws-cli-repeat", "--yes")

    # Then the same resume is repeated: its marker is sent, the parked job runs and the workspace is ACTIVE again
    assert repeated.exit_code == 0, repeated.output
    assert "ws-cli-repeat repeated (skip of job cli-r-1): drain marker sent" in repeated.stdout
    assert cli.run("watch", "ws-cli-repeat", "--until-idle", "--interval", "0.2", "--timeout", "90").exit_code == 0
    assert cli.run_json("status", "workspace", "ws-cli-repeat")["state"] == "ACTIVE"
    assert job_item(cli.runtime, "cli-r-2")["status"] == "SUCCEEDED"
    assert job_item(cli.runtime, "cli-r-1")["status"] == "SKIPPED"


def test_cli_resume_shows_the_next_undecided_halting_job(cli: CliHarness):
    # Given a workspace halted by a DEAD job, then a message rejected while it was halted (the first halt stays)
    cli.register("ws-cli-twice")
    assert cli.enqueue_patch("ws-cli-twice", "cli-t-1", BAD_PATCH).exit_code == 0
    assert cli.run("watch", "ws-cli-twice", "--until-idle", "--interval", "0.2", "--timeout", "90").exit_code == 0
    runtime = cli.runtime
    dynamodb = boto3.client("dynamodb", endpoint_url=runtime.endpoint_url, region_name=runtime.resources.region)
    guard = JobGuard(dynamodb, runtime.resources.table_name)
    assert guard.reject(
        message_id="m-t", job_id=None, workspace_id="ws-cli-twice", tenant_id=TENANT, reason="bad", body="{"
    )

    # When the operator skips the halting job
    first = cli.run("resume", "ws-cli-twice", "--skip", "--yes")

    # Then the CLI says the workspace is still HALTED by the rejected message and what to run next
    assert first.exit_code == 0, first.output
    assert "still HALTED by job msg#m-t" in first.stdout
    assert "agent-jobs resume ws-cli-twice --retry|--skip" in first.stdout
    assert cli.run("resume", "ws-cli-twice", "--skip", "--yes").exit_code == 0
    assert cli.run_json("status", "workspace", "ws-cli-twice")["state"] == "ACTIVE"


def test_cli_is_idle_only_without_pending_jobs_or_a_resume():
    assert is_idle(None, [])
    assert is_idle({"state": "HALTED"}, [{"status": "PARKED"}, {"status": "DEAD"}])
    assert not is_idle({"state": "ACTIVE"}, [{"status": "SUCCEEDED"}, {"status": "QUEUED"}])
    assert not is_idle({"state": "ACTIVE"}, [{"status": "FAILED"}])
    assert not is_idle({"state": "RESUMING"}, [{"status": "PARKED"}])


def test_cli_build_job_generates_a_job_id_and_validates_with_the_layer_model(tmp_path: Path):
    job = build_job(
        "run-tests",
        "ws-1",
        file=None,
        job_id=None,
        patch_file=None,
        message=None,
        suite="unit",
        title=None,
        body="",
    )
    assert job["type"] == "run_tests"
    assert job["payload"] == {"suite": "unit"}
    assert job["jobId"].startswith("job-")


@pytest.mark.parametrize(
    ("diff", "encoding"),
    [
        (b"--- a/f\n+++ b/f\n@@ -0,0 +1 @@\n+caf\xc3\xa9\n", None),  # UTF-8: sent as text
        (b"--- a/f\n+++ b/f\n@@ -0,0 +1 @@\n+caf\xe9\n", "base64"),  # Latin-1
        ("--- a/f\n+++ b/f\n@@ -0,0 +1 @@\n+\uffff\n".encode(), "base64"),  # UTF-8 that SQS cannot carry as text
    ],
    ids=["utf-8", "latin-1", "u+ffff"],
)
def test_cli_build_job_sends_a_diff_that_cannot_be_json_text_as_base64(
    tmp_path: Path, diff: bytes, encoding: str | None
) -> None:
    patch_file = tmp_path / "change.diff"
    patch_file.write_bytes(diff)

    job = build_job(
        "apply_patch",
        "ws-1",
        file=None,
        job_id="job-1",
        patch_file=patch_file,
        message="m",
        suite="default",
        title=None,
        body="",
    )

    assert job["payload"].get("patchEncoding") == encoding
    sent = base64.b64decode(job["payload"]["patch"]) if encoding else job["payload"]["patch"].encode()
    assert sent == diff


def test_cli_status_workspace_shows_the_next_command_for_a_halted_workspace(cli: CliHarness):
    # Given the workspace halted in the test above (or halted now, when this test runs alone)
    if "HALTED" not in cli.run("status", "workspace", "ws-cli-halted").stdout:
        cli.register("ws-cli-halted")
        assert cli.enqueue_patch("ws-cli-halted", "cli-u-1", BAD_PATCH).exit_code == 0
        cli.run("watch", "ws-cli-halted", "--until-idle", "--interval", "0.2", "--timeout", "90")
    result = cli.run("status", "workspace", "ws-cli-halted")
    assert result.exit_code == 0, result.output
    assert "HALTED" in result.stdout
    assert "agent-jobs resume ws-cli-halted --retry" in result.stdout
    assert job_item(cli.runtime, "cli-u-1")["status"] == "DEAD"


def test_cli_agent_token_reads_its_tenants_jobs(cli: CliHarness):
    cli.register("ws-cli-agent")
    assert cli.enqueue_patch("ws-cli-agent", "cli-agent-1").exit_code == 0
    result = cli.run("status", "job", "cli-agent-1", "--json", token=agent_token())
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["tenantId"] == "default"


def test_cli_token_mints_a_local_token_with_the_operator_scope():
    import jwt
    from typer.testing import CliRunner

    from agent_jobs_cli.main import app

    result = CliRunner().invoke(app, ["token", "--tenant", "tenant-7", "--operator"])
    assert result.exit_code == 0, result.output
    claims = jwt.decode(result.stdout.strip(), options={"verify_signature": False})
    assert claims["tenant_id"] == "tenant-7"
    assert OPERATOR_SCOPE in claims["scope"].split()
    assert claims["iss"] == "agent-jobs-local"
    assert claims["aud"] == "agent-jobs"


def test_cli_mints_a_token_for_the_local_runtime_when_none_is_given(cli: CliHarness):
    cli.register("ws-cli-minted")
    assert cli.enqueue_patch("ws-cli-minted", "cli-minted-1").exit_code == 0
    # When no token is given against the local runtime, one is minted for --tenant (default "default")
    minted = cli.run("status", "job", "cli-minted-1", "--json", token="")
    other_tenant = cli.run("--tenant", "someone-else", "status", "job", "cli-minted-1", token="")
    assert minted.exit_code == 0, minted.output
    assert json.loads(minted.stdout)["tenantId"] == "default"
    assert other_tenant.exit_code == 1
    assert "404" in other_tenant.stderr


def test_cli_enqueue_sends_a_diff_that_is_not_utf8_as_base64_and_the_worker_applies_its_bytes(cli: CliHarness):
    # Given a diff made by git of a Latin-1 file and a binary file (git diff --binary)
    remotes = cli.register("ws-cli-bytes")
    made = cli.root / "made-bytes"
    made.mkdir()
    subprocess.run(["git", "init", "-q", str(made)], check=True)
    latin, picture = "caf\xe9 cr\xe8me\n".encode("latin-1"), bytes(range(256)) + b"\0"
    (made / "legacy.txt").write_bytes(latin)
    (made / "logo.png").write_bytes(picture)
    subprocess.run(["git", "-C", str(made), "add", "-A"], check=True)
    diff = subprocess.run(
        ["git", "-C", str(made), "diff", "--cached", "--binary"], check=True, capture_output=True
    ).stdout
    patch_file = cli.root / "bytes.diff"
    patch_file.write_bytes(diff)

    # When the CLI enqueues it and the workspace runs
    sent = cli.run("enqueue", "apply_patch", "ws-cli-bytes", "--patch-file", str(patch_file), "-m", "bytes")
    assert sent.exit_code == 0, sent.output
    watched = cli.run("watch", "ws-cli-bytes", "--until-idle", "--interval", "0.2", "--timeout", "90", "--json")
    assert watched.exit_code == 0, watched.output
    assert {job["status"] for job in json.loads(watched.stdout.splitlines()[-1])["jobs"]} == {"SUCCEEDED"}

    # Then the branch holds the files' very bytes
    with Repo(str(remotes["ws-cli-bytes"])) as repo:
        (branch,) = [ref for ref in repo.refs.allkeys() if ref.startswith(b"refs/heads/") and ref != b"refs/heads/main"]
        tree = repo[repo[repo.refs[branch]].tree]  # type: ignore[attr-defined]
        assert repo[tree[b"legacy.txt"][1]].data == latin  # type: ignore[attr-defined,index]
        assert repo[tree[b"logo.png"][1]].data == picture  # type: ignore[attr-defined,index]
