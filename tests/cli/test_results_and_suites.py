"""A workspace's timeline at 80 columns, run_tests results as people read them (passed or failed, the counts of the
output's summary line, the output as text), and the suite a run_tests job names, against a real local runtime whose
test sandbox runs the suites."""

from __future__ import annotations

import json
import re

from rich.console import Console

from agent_jobs_cli.render import job_panel
from agent_jobs_cli.results import printable, suite_counts
from agent_jobs_local.workload import create_remote, remote_path
from tests.cli.conftest import BAD_PATCH, TENANT, CliHarness

# A failing pytest run's last lines, and a passing unittest run whose output colours a word.
FAILING_SUITE = "import sys; print('..F'); print('=== 1 failed, 2 passed in 0.05s ==='); sys.exit(1)"
COLOURED_SUITE = "print('\\x1b[31mred\\x1b[0m'); print('Ran 3 tests in 0.001s'); print(); print('OK')"
SEQUENCE_NUMBER = re.compile(r"\b\d{20}\b")


def register_suites(cli: CliHarness, workspace_id: str) -> None:
    remote = create_remote(remote_path(cli.runtime.remotes_root, workspace_id, TENANT), workspace_id)
    registered = cli.run(
        "workspaces",
        "register",
        workspace_id,
        "--remote-url",
        str(remote),
        "--branch",
        f"agent/{workspace_id}",
        "--test-command",
        f"unit=python3 -c {json.dumps(FAILING_SUITE)}",
        "--test-command",
        f"smoke=python3 -c {json.dumps(COLOURED_SUITE)}",
    )
    assert registered.exit_code == 0, registered.output


def settle(cli: CliHarness, workspace_id: str) -> None:
    watched = cli.run("watch", workspace_id, "--until-idle", "--interval", "0.2", "--timeout", "120")
    assert watched.exit_code == 0, watched.output


def test_run_tests_without_a_suite_runs_the_workspaces_only_suite(cli: CliHarness) -> None:
    # Given a workspace whose registration has one test suite ("unit")
    cli.register("ws-rt-one")

    # When a run_tests job is submitted without --suite
    sent = cli.run("enqueue", "run_tests", "ws-rt-one", "--job-id", "rt-one-1")

    # Then it runs that suite, and passes
    assert sent.exit_code == 0, sent.output
    assert "unit" in sent.stdout
    settle(cli, "ws-rt-one")
    job = cli.run_json("status", "job", "rt-one-1")
    assert job["status"] == "SUCCEEDED", job
    assert (job["result"]["suite"], job["result"]["outcome"]) == ("unit", "passed")


def test_run_tests_names_the_suites_when_the_registration_has_several_or_lacks_one(cli: CliHarness) -> None:
    register_suites(cli, "ws-rt-two")

    several = cli.run("enqueue", "run_tests", "ws-rt-two")
    missing = cli.run("enqueue", "run_tests", "ws-rt-two", "--suite", "default")

    assert several.exit_code == 1
    assert "workspace ws-rt-two has several test suites (smoke, unit): name one with --suite" in several.stderr
    assert missing.exit_code == 1
    assert "has no test suite 'default' (its suites: smoke, unit)" in missing.stderr
    assert "would end DEAD and halt the workspace" in missing.stderr
    # and nothing was sent: the workspace has no job and is not halted
    assert cli.run_json("jobs", "ws-rt-two")["jobs"] == []
    assert cli.run_json("status", "workspace", "ws-rt-two")["state"] == "ACTIVE"


def test_run_tests_results_show_passed_or_failed_their_counts_and_the_output_as_text(cli: CliHarness) -> None:
    register_suites(cli, "ws-rt-out")
    assert cli.run("enqueue", "run_tests", "ws-rt-out", "--suite", "unit", "--job-id", "rt-out-1").exit_code == 0
    assert cli.run("enqueue", "run_tests", "ws-rt-out", "--suite", "smoke", "--job-id", "rt-out-2").exit_code == 0
    settle(cli, "ws-rt-out")

    failing = cli.run("status", "job", "rt-out-1")
    passing = cli.run("status", "job", "rt-out-2")
    timeline = cli.run("jobs", "ws-rt-out")

    # The job view says failed, with the exit code and the counts, and the output tail as lines of text
    assert failing.exit_code == 0, failing.output
    assert "failed (exit code 1)" in failing.stdout
    assert "1 failed, 2 passed" in failing.stdout
    assert any(line.strip(" │") == "..F" for line in failing.stdout.splitlines()), failing.stdout
    assert "outputTail" not in failing.stdout
    assert "\\n" not in failing.stdout
    # and the output's control characters are written out, never sent to the terminal
    assert "\x1b" not in passing.stdout
    assert "\\x1b[31mred\\x1b[0m" in passing.stdout
    assert "3 passed" in passing.stdout
    # and the timeline shows each result beside its job
    rows = {line.split()[1]: line for line in timeline.stdout.splitlines() if line.strip()[:1].isdigit()}
    assert "failed 2/3" in rows["rt-out-1"]
    assert "passed 3/3" in rows["rt-out-2"]


def test_timeline_is_one_line_a_job_at_80_columns(cli: CliHarness) -> None:
    # Given a workspace with jobs of generated (36-character) ids, a run_tests result and a failed job's long error
    cli.register("ws-rt-80")
    for _ in range(2):
        sent = cli.run("enqueue", "apply_patch", "ws-rt-80", "--patch-file", str(cli.patch_file()), "-m", "change")
        assert sent.exit_code == 0, sent.output
    assert cli.run("enqueue", "run_tests", "ws-rt-80", "--suite", "unit").exit_code == 0
    bad = cli.run("enqueue", "apply_patch", "ws-rt-80", "--patch-file", str(cli.patch_file(BAD_PATCH)), "-m", "bad")
    assert bad.exit_code == 0, bad.output
    settle(cli, "ws-rt-80")
    jobs = cli.run_json("jobs", "ws-rt-80")["jobs"]

    # When the timeline is shown on an 80-column terminal
    shown = cli.run("jobs", "ws-rt-80", columns=80)

    # Then each job is one line of at most 80 characters with its position, whole id, status and result
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.rstrip("\n").splitlines()
    assert all(len(line) <= 80 for line in lines), shown.stdout
    assert len(lines) == 2 + len(jobs), shown.stdout  # the title, the header, a line a job
    for position, (job, line) in enumerate(zip(jobs, lines[2:], strict=True), start=1):
        assert line.split()[:4] == [str(position), job["jobId"], job["type"], job["status"]], line
    assert "passed" in lines[4]
    assert "DEAD" in lines[5]
    assert "…" in lines[5]
    # and the full SequenceNumbers only with --wide, or in --json
    assert not SEQUENCE_NUMBER.search(shown.stdout)
    wide = cli.run("jobs", "ws-rt-80", "--wide")
    assert [match.group(0) for match in SEQUENCE_NUMBER.finditer(wide.stdout)] == [j["sequenceNumber"] for j in jobs]


def test_results_read_the_summary_lines_of_pytest_and_unittest() -> None:
    assert suite_counts("..F\n=== 1 failed, 2 passed, 1 skipped in 0.05s ===\n") == {
        "passed": 2,
        "failed": 1,
        "errors": 0,
        "skipped": 1,
    }
    assert suite_counts("3 passed in 0.01s\n") == {"passed": 3, "failed": 0, "errors": 0}
    assert suite_counts("Ran 5 tests in 0.002s\n\nFAILED (failures=1, errors=1, skipped=1)\n") == {
        "passed": 2,
        "failed": 1,
        "errors": 1,
        "skipped": 1,
    }
    assert suite_counts("tests pass\n") is None


def test_a_result_cannot_send_control_sequences_to_the_operators_terminal() -> None:
    # Given a job whose test output and error carry terminal control sequences (retitle the window, clear the screen)
    hostile = "\x1b]0;owned\x07\x1b[2J\x1b[1Ahidden\r"
    job = {
        "jobId": "j",
        "status": "SUCCEEDED",
        "error": hostile,
        "result": {"suite": "unit", "outcome": "passed", "exitCode": 0, "outputTail": hostile},
    }
    console = Console(width=120, record=True, force_terminal=False)

    console.print(job_panel(job))

    shown = console.export_text()
    assert "\x1b" not in shown
    assert "\x07" not in shown
    assert "\r" not in shown
    assert printable(hostile) in shown
