"""The sandbox's test runner: outcomes, a scrubbed environment, a timeout that kills the whole process group, bounded
output, and the leftovers of a run killed afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_sandbox import runner as test_runner
from test_sandbox.runner import SandboxRequestError

PYTHON = sys.executable


def python(code: str) -> list[str]:
    return [PYTHON, "-c", code]


def process_is_gone(pid: int) -> bool:
    """True once `pid` no longer runs: no such process, or a zombie waiting for its (new) parent to reap it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        # the state follows the parenthesised command name, which may itself contain spaces
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return Path("/proc/self").exists()  # with procfs, no entry means it just went; without, we cannot tell


def wait_until_gone(pid: int, within_seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + within_seconds
    while time.monotonic() < deadline:
        if process_is_gone(pid):
            return True
        time.sleep(0.05)
    return process_is_gone(pid)


# A child that starts a grandchild (which ignores SIGTERM, so only SIGKILL ends it), prints the grandchild's pid and
# then sleeps far longer than the test allows.
SPAWNS_A_GRANDCHILD = """
import signal, subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('grandchild ready', flush=True); "
    "time.sleep(120)"])
print(f"grandchild pid {grandchild.pid}", flush=True)
time.sleep(120)
"""


def grandchild_pid(output: str) -> int:
    line = next(line for line in output.splitlines() if line.startswith("grandchild pid "))
    return int(line.removeprefix("grandchild pid "))


def test_runner_reports_a_passing_command(tmp_path: Path):
    run = test_runner.run_test_command(
        python("import os; print('ok in', os.getcwd())"), cwd=tmp_path, timeout_seconds=30
    )

    assert run.outcome == "passed"
    assert run.exit_code == 0
    assert run.output_tail == f"ok in {tmp_path.resolve()}\n"
    assert run.truncated is False
    assert run.duration_seconds >= 0


def test_runner_reports_a_failing_command_with_stdout_and_stderr(tmp_path: Path):
    code = "import sys; print('1 failed', flush=True); print('boom', file=sys.stderr, flush=True); sys.exit(3)"

    run = test_runner.run_test_command(python(code), cwd=tmp_path, timeout_seconds=30)

    assert (run.outcome, run.exit_code) == ("failed", 3)
    assert run.output_tail == "1 failed\nboom\n"


def test_runner_child_cannot_see_credentials_or_function_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # Given a function whose environment holds AWS credentials, a token and Lambda's own variables
    withheld = {
        "AWS_ACCESS_KEY_ID": "AKIAWORKERKEY0000",
        "AWS_SECRET_ACCESS_KEY": "worker-secret-access-key",
        "AWS_SESSION_TOKEN": "worker-session-token",
        "GITHUB_TOKEN": "ghp_worker_token",
        "TABLE_NAME": "agent-jobs-table",
        "QUEUE_URL": "https://sqs.example/agent-jobs.fifo",
        "POWERTOOLS_SERVICE_NAME": "agent-jobs-worker",
        "AWS_LAMBDA_RUNTIME_API": "127.0.0.1:9001",
        "_HANDLER": "test_sandbox.app.lambda_handler",
        "LAMBDA_TASK_ROOT": "/var/task",
        "SANDBOX_MAX_MEMBERS": "100",
    }
    for name, value in withheld.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LANG", "C.UTF-8")
    # And a workspace environment that (wrongly) passes some of them on too
    passed = {
        "AWS_SECRET_ACCESS_KEY": "passed-secret",
        "NPM_TOKEN": "passed-npm-token",
        "DATABASE_PASSWORD": "passed-password",
        "TABLE_NAME": "passed-table",
        "my_api_key": "passed-api-key",
        "TEST_SUITE_MODE": "strict",
    }

    run = test_runner.run_test_command(
        python("import json, os; print(json.dumps(dict(os.environ)))"),
        cwd=tmp_path,
        timeout_seconds=30,
        environment=passed,
    )

    child_environment = json.loads(run.output_tail)
    for name in [*withheld, *passed]:
        if name != "TEST_SUITE_MODE":
            assert name not in child_environment, name
    for value in [*withheld.values(), *passed.values()]:
        if value != "strict":
            assert value not in run.output_tail
    assert child_environment["TEST_SUITE_MODE"] == "strict"
    assert child_environment["LANG"] == "C.UTF-8"  # allow-listed
    assert not any(name.startswith("AWS_") for name in child_environment)


def test_runner_scrubbed_environment_keeps_only_the_allow_list(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PATH", "/usr/bin")
    monkeypatch.setenv("SOME_WORKER_VARIABLE", "x")
    monkeypatch.setenv("_X_AMZN_TRACE_ID", "Root=1")

    environment = test_runner.scrubbed_environment({"CI": "1", "Private_Key_Path": "/k", "_HANDLER": "x"})

    assert environment["PATH"] == "/usr/bin"
    assert environment["CI"] == "1"
    for name in ("SOME_WORKER_VARIABLE", "_X_AMZN_TRACE_ID", "Private_Key_Path", "_HANDLER", "AWS_ACCESS_KEY_ID"):
        assert name not in environment


def test_runner_kills_a_hanging_command_and_its_children_at_the_timeout(tmp_path: Path):
    started = time.monotonic()

    run = test_runner.run_test_command(
        python(SPAWNS_A_GRANDCHILD), cwd=tmp_path, timeout_seconds=2, kill_grace_seconds=0.5
    )

    assert time.monotonic() - started < 2 + 10
    assert run.outcome == "timed_out"
    assert run.exit_code is None
    assert "grandchild ready" in run.output_tail  # its output up to the kill is kept
    assert wait_until_gone(grandchild_pid(run.output_tail))


def test_runner_kills_a_command_that_ignores_sigterm_after_the_grace(tmp_path: Path):
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(90)"
    )
    started = time.monotonic()

    run = test_runner.run_test_command(python(code), cwd=tmp_path, timeout_seconds=1, kill_grace_seconds=0.5)

    assert time.monotonic() - started < 1 + 10
    assert (run.outcome, run.exit_code) == ("timed_out", None)
    assert run.output_tail == "ready\n"


def test_runner_kills_what_a_finished_command_left_behind(tmp_path: Path):
    # Given a command that passes but leaves a process behind holding its output open
    code = SPAWNS_A_GRANDCHILD.replace("time.sleep(120)\n", "import time; time.sleep(0.5)\n")
    started = time.monotonic()

    run = test_runner.run_test_command(python(code), cwd=tmp_path, timeout_seconds=60)

    assert time.monotonic() - started < 30  # not held up by the leftover's open pipe
    assert (run.outcome, run.exit_code) == ("passed", 0)
    assert wait_until_gone(grandchild_pid(run.output_tail))


def test_runner_keeps_the_tail_of_long_output(tmp_path: Path):
    # Given 1 MB of output followed by a final line, far more than a pipe buffer holds
    code = "import sys; sys.stdout.write('x' * 1_000_000); sys.stdout.write('\\nLAST LINE\\n')"

    run = test_runner.run_test_command(python(code), cwd=tmp_path, timeout_seconds=30, output_limit_bytes=1000)

    assert run.outcome == "passed"
    assert run.truncated is True
    assert len(run.output_tail.encode()) == 1000
    assert run.output_tail.endswith("x\nLAST LINE\n")


def test_runner_cuts_output_at_a_character_boundary(tmp_path: Path):
    code = "import sys; sys.stdout.buffer.write('é'.encode() * 100)"

    run = test_runner.run_test_command(python(code), cwd=tmp_path, timeout_seconds=30, output_limit_bytes=7)

    assert run.truncated is True
    assert run.output_tail == "ééé"


def test_runner_passes_arguments_literally_without_a_shell(tmp_path: Path):
    argv = [*python("import sys, json; print(json.dumps(sys.argv[1:]))"), "tests; echo hacked", "$HOME", "`id`"]

    run = test_runner.run_test_command(argv, cwd=tmp_path, timeout_seconds=30)

    # a shell would have run `echo hacked` and expanded the rest, and the output would not be this one JSON line
    assert json.loads(run.output_tail) == ["tests; echo hacked", "$HOME", "`id`"]


def test_runner_refuses_a_command_string(tmp_path: Path):
    with pytest.raises(ValueError, match="non-empty list"):
        test_runner.run_test_command("pytest -q; rm -rf /", cwd=tmp_path, timeout_seconds=30)


def test_runner_missing_command_is_permanent_and_names_it(tmp_path: Path):
    with pytest.raises(
        SandboxRequestError, match=r"'no-such-test-runner-xyz'.*fix the workspace's registered test"
    ) as e:
        test_runner.run_test_command(["no-such-test-runner-xyz"], cwd=tmp_path, timeout_seconds=30)
    assert e.value.permanent is True


def test_runner_kill_leftovers_ends_a_setsid_daemon_and_spares_older_descendants(tmp_path: Path):
    # Given a process of ours that ran before the tests, and a test that double-forks a setsid daemon
    older = subprocess.Popen([*python("import time; time.sleep(60)")])
    spared = test_runner.descendants()
    daemon_code = (
        "import os, subprocess, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    d = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], stdout=subprocess.DEVNULL)\n"
        "    print(f'daemon pid {d.pid}', flush=True)\n"
        "    os._exit(0)\n"
        "time.sleep(0.5)\n"
    )
    try:
        assert test_runner.adopt_orphans(True)
        run = test_runner.run_test_command(python(daemon_code), cwd=tmp_path, timeout_seconds=30)
        daemon = int(run.output_tail.split("daemon pid ")[1].split()[0])
        assert not process_is_gone(daemon)  # it outlived the run: out of the group's reach

        # When the leftovers are killed
        killed = test_runner.kill_leftovers(spared=spared, whole_uid=False)
    finally:
        test_runner.adopt_orphans(False)

    # Then the daemon is gone, the older process is not
    assert daemon in killed
    assert wait_until_gone(daemon)
    assert older.pid not in killed
    assert older.poll() is None
    older.kill()
    older.wait()
