"""Waiting for a job: `enqueue ... --wait` and `wait JOBID` end at the first state in which nothing more happens
without an operator, and their exit code says which, against a real local runtime."""

from __future__ import annotations

import json

import pytest

from agent_jobs_cli.commands.wait import WaitOutcome, settled_outcome
from tests.cli.conftest import BAD_PATCH, CliHarness

WAIT = ("--interval", "0.2", "--timeout", "120")


def test_wait_enqueue_waits_until_the_job_succeeds_and_exits_0(cli: CliHarness) -> None:
    cli.register("ws-wait-ok")

    result = cli.run(
        "enqueue",
        "apply_patch",
        "ws-wait-ok",
        "--patch-file",
        str(cli.patch_file()),
        "-m",
        "m",
        "--wait",
        "--json",
        *WAIT,
    )

    assert result.exit_code == 0, result.output
    job = json.loads(result.stdout)
    assert job["status"] == "SUCCEEDED"
    assert job["result"]["commit"]


def test_wait_ends_on_a_dead_job_a_parked_one_and_a_skipped_one_each_with_its_code(cli: CliHarness) -> None:
    cli.register("ws-wait-halt")

    # A job that cannot take effect ends DEAD and halts its workspace: exit 3
    dead = cli.run(
        "enqueue", "apply_patch", "ws-wait-halt", "--patch-file", str(cli.patch_file(BAD_PATCH)), "-m", "bad",
        "--job-id", "wait-dead", "--wait", *WAIT,
    )  # fmt: skip
    assert dead.exit_code == 3, dead.output
    assert "DEAD" in dead.stdout
    assert "agent-jobs resume ws-wait-halt --retry|--skip" in dead.stderr

    # A job behind it parks and waits for an operator: exit 4 at once, not at the timeout
    parked = cli.run(
        "enqueue", "apply_patch", "ws-wait-halt", "--patch-file", str(cli.patch_file()), "-m", "good",
        "--job-id", "wait-parked", "--wait", "--json", *WAIT,
    )  # fmt: skip
    assert parked.exit_code == 4, parked.output
    assert json.loads(parked.stdout)["status"] == "PARKED"
    assert "PARKED behind the halt of workspace ws-wait-halt" in parked.stderr

    # When the operator skips the dead job, it is SKIPPED (exit 5) and the parked one runs: waited on, it succeeds
    assert cli.run("resume", "ws-wait-halt", "--skip", "--yes").exit_code == 0
    assert cli.run("wait", "wait-parked", *WAIT).exit_code == 0
    skipped = cli.run("wait", "wait-dead", "--json", *WAIT)
    assert skipped.exit_code == 5, skipped.output
    assert json.loads(skipped.stdout)["status"] == "SKIPPED"


def test_wait_gives_up_at_the_timeout_with_6(fresh_cli: CliHarness) -> None:
    # Given no worker takes jobs: a job stays QUEUED
    fresh_cli.runtime.poller.stop()
    fresh_cli.register("ws-wait-slow")
    assert fresh_cli.enqueue_patch("ws-wait-slow", "wait-slow").exit_code == 0

    result = fresh_cli.run("wait", "wait-slow", "--timeout", "0.5", "--interval", "0.2", "--json")

    assert result.exit_code == 6, result.output
    assert json.loads(result.stdout)["status"] == "QUEUED"
    assert "still QUEUED after 0.5 s" in result.stderr


def test_wait_of_an_unknown_job_is_an_error(cli: CliHarness) -> None:
    result = cli.run("wait", "no-such-job", *WAIT)

    assert result.exit_code == 1
    assert "no job 'no-such-job'" in result.stderr


@pytest.mark.parametrize(
    ("status", "workspace_state", "outcome"),
    [
        ("SUCCEEDED", None, WaitOutcome.SUCCEEDED),
        ("DEAD", None, WaitOutcome.FAILED),
        ("REJECTED", None, WaitOutcome.FAILED),
        ("SKIPPED", None, WaitOutcome.SKIPPED),
        ("PARKED", "HALTED", WaitOutcome.PARKED),
        ("PARKED", "RESUMING", None),  # the resume's drain runs it
        ("QUEUED", None, None),
        ("IN_FLIGHT", None, None),
        ("FAILED", None, None),  # delivered again
    ],
)
def test_wait_settles_only_where_nothing_happens_without_an_operator(
    status: str, workspace_state: str | None, outcome: WaitOutcome | None
) -> None:
    assert settled_outcome({"status": status}, workspace_state) is outcome
