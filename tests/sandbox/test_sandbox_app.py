"""The sandbox's handler: a checkout unpacked safely, the registered command run on it with nothing of the function's
environment, and nothing of the run left behind afterwards."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from test_sandbox import app as sandbox_app
from tests.sandbox.conftest import file_member, inline, link_member, sandbox_event, tar_gz
from tests.sandbox.test_sandbox_runner import wait_until_gone

PYTHON = sys.executable
RUN_TESTS_SH = b'#!/bin/sh\necho "running $1"\ncat data/input.txt\nexec ./data/link-to-check.sh\n'


@pytest.fixture(autouse=True)
def work_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "work-root"
    root.mkdir()
    monkeypatch.setenv("SANDBOX_WORK_ROOT", str(root))
    monkeypatch.delenv("SANDBOX_KILL_WHOLE_UID", raising=False)
    return root


class RemainingTime:
    def __init__(self, milliseconds: int) -> None:
        self.milliseconds = milliseconds

    def get_remaining_time_in_millis(self) -> int:
        return self.milliseconds


def a_checkout() -> bytes:
    return tar_gz(
        [
            file_member("run-tests.sh", RUN_TESTS_SH, mode=0o755),
            file_member("data/input.txt", b"input line\n"),
            file_member("data/check.sh", b"#!/bin/sh\necho checked; exit 4\n", mode=0o755),
            link_member("data/link-to-check.sh", "check.sh"),
        ]
    )


def invoke(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    response = sandbox_app.lambda_handler(event, context)
    json.dumps(response)  # what the function answers must be JSON
    return response


def test_sandbox_runs_the_command_on_the_unpacked_checkout(work_root: Path):
    response = invoke(sandbox_event(inline(a_checkout()), ["./run-tests.sh", "unit suite"]))

    # executable bits and the in-tree symlink survived the round trip; the exit code is the command's
    assert response == {
        "outcome": "failed",
        "exitCode": 4,
        "durationSeconds": response["durationSeconds"],
        "outputTail": "running unit suite\ninput line\nchecked\n",
        "truncated": False,
    }
    assert list(work_root.iterdir()) == []  # the work folder is gone


def test_sandbox_reports_a_pass_and_keeps_the_output_tail():
    checkout = tar_gz([file_member("ok.py", b"import sys\nsys.stdout.write('x' * 5000 + 'END')\n")])

    response = invoke(sandbox_event(inline(checkout), [PYTHON, "ok.py"], outputLimitBytes=100))

    assert (response["outcome"], response["exitCode"], response["truncated"]) == ("passed", 0, True)
    assert response["outputTail"] == "x" * 97 + "END"


def test_sandbox_refuses_an_archive_whose_checksum_does_not_match(work_root: Path):
    archive = inline(a_checkout())
    archive["sha256"] = hashlib.sha256(b"another archive").hexdigest()

    response = invoke(sandbox_event(archive, ["./run-tests.sh"]))

    assert response["permanent"] is True
    assert "sha256" in response["error"]
    assert list(work_root.iterdir()) == []


@pytest.mark.parametrize(
    ("members", "named"),
    [
        pytest.param([file_member("../escaped.txt", b"x")], "../escaped.txt", id="dot-dot"),
        pytest.param([file_member("/tmp/escaped-absolute.txt", b"x")], "escaped-absolute.txt", id="absolute-path"),
        pytest.param([link_member("etc", "/etc")], "etc", id="absolute-symlink"),
        pytest.param([link_member("up", "../../../../..")], "up", id="symlink-outside"),
        pytest.param(
            [link_member("up", ".."), file_member("up/escaped-through-link.txt", b"x")],
            "up",
            id="write-through-symlink",
        ),
        pytest.param([link_member("passwd", "/etc/passwd", hard=True)], "passwd", id="hardlink-outside"),
    ],
)
@pytest.mark.parametrize("data_filter", [True, False], ids=["data-filter", "interpreter-without-data-filter"])
def test_sandbox_refuses_members_that_would_land_outside_the_checkout(
    members: list[Any], named: str, data_filter: bool, work_root: Path, monkeypatch: pytest.MonkeyPatch
):
    if not data_filter:  # Python before 3.11.4 (e.g. a distribution's 3.11.2): the sandbox's own checks alone
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    checkout = tar_gz([file_member("run.sh", b"#!/bin/sh\necho ran\n", mode=0o755), *members])

    response = invoke(sandbox_event(inline(checkout), ["./run.sh"]))

    assert response["permanent"] is True
    assert "unsafe entry" in response["error"]
    assert named in response["error"]
    assert not (work_root / "escaped.txt").exists()
    assert not (work_root / "escaped-through-link.txt").exists()
    assert not Path("/tmp/escaped-absolute.txt").exists()
    assert list(work_root.iterdir()) == []


def test_sandbox_refuses_a_gzip_bomb_before_inflating_it(monkeypatch: pytest.MonkeyPatch):
    # Given a 64 MiB file of zeros that compresses to about 64 KiB, and a 1 MiB unpacked limit
    monkeypatch.setenv("SANDBOX_MAX_EXTRACTED_BYTES", str(1024 * 1024))
    checkout = tar_gz([file_member("zeros.bin", bytes(64 * 1024 * 1024))])
    assert len(checkout) < 1024 * 1024

    response = invoke(sandbox_event(inline(checkout), ["true"]))

    assert response["permanent"] is True
    assert "SANDBOX_MAX_EXTRACTED_BYTES" in response["error"]


def test_sandbox_refuses_too_many_members(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SANDBOX_MAX_MEMBERS", "50")
    checkout = tar_gz(file_member(f"f{index}.txt", b"") for index in range(51))

    response = invoke(sandbox_event(inline(checkout), ["true"]))

    assert response["permanent"] is True
    assert "SANDBOX_MAX_MEMBERS" in response["error"]


def test_sandbox_refuses_an_archive_above_its_size_limit(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SANDBOX_MAX_ARCHIVE_BYTES", "1000")
    checkout = tar_gz([file_member("noise.bin", os.urandom(5000))])

    response = invoke(sandbox_event(inline(checkout), ["true"]))

    assert response["permanent"] is True
    assert "SANDBOX_MAX_ARCHIVE_BYTES" in response["error"]


def test_sandbox_refuses_something_that_is_not_a_tar_gz():
    response = invoke(sandbox_event(inline(b"not a tarball"), ["true"]))

    assert response["permanent"] is True
    assert "not a readable .tar.gz" in response["error"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        pytest.param({"v": 2}, '"v": 1', id="version"),
        pytest.param({"argv": "pytest -q; rm -rf /"}, '"argv"', id="argv-string"),
        pytest.param({"argv": []}, '"argv"', id="argv-empty"),
        pytest.param({"timeoutSeconds": 0}, '"timeoutSeconds"', id="timeout"),
        pytest.param({"outputLimitBytes": 10**9}, '"outputLimitBytes"', id="output-limit"),
        pytest.param({"commit": "main"}, '"commit"', id="commit"),
        pytest.param({"archive": {"inline": "", "sha256": "x"}}, "sha256", id="sha256"),
        pytest.param({"archive": {"sha256": "0" * 64}}, "neither", id="no-archive"),
    ],
)
def test_sandbox_refuses_a_malformed_event(overrides: dict[str, Any], message: str):
    event = {**sandbox_event(inline(a_checkout()), ["./run-tests.sh"]), **overrides}

    response = invoke(event)

    assert response["permanent"] is True
    assert message in response["error"]


def test_sandbox_missing_command_is_a_permanent_error():
    response = invoke(sandbox_event(inline(a_checkout()), ["no-such-test-runner-xyz"]))

    assert response == {"error": response["error"], "permanent": True}
    assert "fix the workspace's registered test command" in response["error"]


def test_sandbox_command_never_sees_the_function_environment(monkeypatch: pytest.MonkeyPatch):
    # Given a function whose environment holds credentials and Lambda's variables
    secrets = {
        "AWS_ACCESS_KEY_ID": "AKIASANDBOXKEY0000",
        "AWS_SECRET_ACCESS_KEY": "sandbox-secret-access-key",
        "AWS_SESSION_TOKEN": "sandbox-session-token",
        "AWS_LAMBDA_FUNCTION_NAME": "agent-jobs-test-sandbox",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://169.254.170.2/creds",
        "_HANDLER": "test_sandbox.app.lambda_handler",
        "TABLE_NAME": "agent-jobs-table",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    printer = tar_gz([file_member("env.py", b"import json, os\nprint(json.dumps(dict(os.environ)))\n")])

    response = invoke(sandbox_event(inline(printer), [PYTHON, "env.py"]))

    environment = json.loads(response["outputTail"])
    assert not any(name.startswith("AWS_") for name in environment)
    for name, value in secrets.items():
        assert name not in environment
        assert value not in response["outputTail"]
    assert Path(environment["HOME"]).name == "home"  # a home and a temp folder of its own, removed afterwards
    assert Path(environment["TMPDIR"]).name == "tmp"


def test_sandbox_kills_a_setsid_daemon_after_the_run(work_root: Path):
    # Given a test that starts a daemon in a session of its own, which outlives the test command
    code = (
        "import subprocess, sys\n"
        "d = subprocess.Popen(['setsid', sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True,"
        " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "print(f'daemon pid {d.pid}', flush=True)\n"
    )
    checkout = tar_gz([file_member("daemon.py", code.encode())])

    response = invoke(sandbox_event(inline(checkout), [PYTHON, "daemon.py"]))

    assert response["outcome"] == "passed"
    daemon = int(response["outputTail"].split("daemon pid ")[1].split()[0])
    assert wait_until_gone(daemon)
    assert list(work_root.iterdir()) == []


def test_sandbox_removes_a_work_folder_the_tests_locked(work_root: Path):
    code = b"import os\nos.makedirs('locked/inner')\nopen('locked/inner/f', 'w').close()\nos.chmod('locked', 0)\n"
    checkout = tar_gz([file_member("lock.py", code)])

    response = invoke(sandbox_event(inline(checkout), [PYTHON, "lock.py"]))

    assert response["outcome"] == "passed"
    assert list(work_root.iterdir()) == []


def test_sandbox_caps_the_timeout_by_its_remaining_time():
    checkout = tar_gz([file_member("slow.py", b"import time\nprint('started', flush=True)\ntime.sleep(60)\n")])
    started = time.monotonic()

    # 7 s left in the invocation, 5 s of them kept back: the tests get 2 s, not the 30 s asked for
    response = invoke(sandbox_event(inline(checkout), [PYTHON, "slow.py"]), RemainingTime(7_000))

    assert (response["outcome"], response["exitCode"]) == ("timed_out", None)
    assert response["outputTail"] == "started\n"
    assert time.monotonic() - started < 15


def test_sandbox_without_time_left_asks_for_a_retry():
    response = invoke(sandbox_event(inline(a_checkout()), ["./run-tests.sh"]), RemainingTime(3_000))

    assert response["permanent"] is False
    assert "no time left" in response["error"]


SYSTEM_PYTHON = Path("/usr/bin/python3")


@pytest.mark.skipif(os.geteuid() != 0 or not SYSTEM_PYTHON.exists(), reason="needs root and a system interpreter")
def test_sandbox_in_lambda_kills_every_other_process_of_its_uid_and_hides_its_environment():
    # Given a process of the function's uid left by an earlier invocation, outside the handler's process tree
    uid = 54_321
    task = Path(tempfile.mkdtemp(prefix="sandbox-task-"))
    work_root = Path(tempfile.mkdtemp(prefix="sandbox-work-"))
    shutil.copytree(
        Path(sandbox_app.__file__).parent, task / "test_sandbox", ignore=shutil.ignore_patterns("__pycache__")
    )
    task.chmod(0o755)
    work_root.chmod(0o777)
    earlier = subprocess.Popen(["sleep", "300"], user=uid, group=uid, start_new_session=True)
    # And a test command that reads its parent's environment, where Lambda keeps the function's credentials
    reader = b"#!/bin/sh\ntr '\\0' '\\n' < /proc/$PPID/environ\necho read=$?\n"
    event = sandbox_event(inline(tar_gz([file_member("ok.sh", reader, mode=0o755)])), ["./ok.sh"])
    script = (
        "import json, sys\n"
        "from test_sandbox import app\n"
        "print(json.dumps(app.lambda_handler(json.load(sys.stdin), None)))\n"
    )
    environment = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(task),
        "SANDBOX_WORK_ROOT": str(work_root),
        "AWS_LAMBDA_RUNTIME_API": "127.0.0.1:9001",  # as in Lambda: the whole uid is the sandbox's
        "AWS_SECRET_ACCESS_KEY": "the-function-role-secret",
    }
    try:
        # When the handler runs as that uid
        handler = subprocess.run(
            [str(SYSTEM_PYTHON), "-c", script],
            input=json.dumps(event),
            capture_output=True,
            text=True,
            env=environment,
            user=uid,
            group=uid,
            cwd="/",
            timeout=60,
            check=False,
        )

        # Then the run passed, the earlier process is gone, and so is the work folder
        assert handler.returncode == 0, handler.stderr
        response = json.loads(handler.stdout)
        assert response["outcome"] == "passed", handler.stderr
        assert "the-function-role-secret" not in response["outputTail"]
        assert "read=0" not in response["outputTail"]  # the parent's environ is not readable at all
        assert earlier.wait(timeout=10) == -9
        assert list(work_root.iterdir()) == []
    finally:
        if earlier.poll() is None:
            earlier.kill()
        earlier.wait()
        shutil.rmtree(task)
        shutil.rmtree(work_root)


def test_sandbox_url_archive_must_be_https():
    data = a_checkout()
    archive = {"url": "http://127.0.0.1:1/a.tar.gz", "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}

    response = invoke(sandbox_event(archive, ["./run-tests.sh"]))

    assert response["permanent"] is True
    assert "https" in response["error"]


def test_sandbox_response_never_holds_base64_of_the_archive():
    # the archive is input only: a refused one is not echoed back
    archive = inline(a_checkout())
    archive["sha256"] = "0" * 64

    response = invoke(sandbox_event(archive, ["true"]))

    assert archive["inline"][:40] not in json.dumps(response)
    assert base64.b64decode(archive["inline"])  # (the fixture itself is valid base64)


def test_sandbox_refuses_a_device_member():
    device = tarfile.TarInfo("dev-null")
    device.type = tarfile.CHRTYPE
    device.devmajor, device.devminor = 1, 3

    response = invoke(sandbox_event(inline(tar_gz([(device, None)])), ["true"]))

    assert response["permanent"] is True
    assert "not a file, a folder or a link" in response["error"]


def test_sandbox_runs_the_sample_event():
    # events/sandbox_run_tests.json is what the worker sends (`sam local invoke TestSandboxFunction -e ...`)
    event = json.loads((Path(__file__).resolve().parents[2] / "events" / "sandbox_run_tests.json").read_text())

    response = invoke(event)

    assert (response["outcome"], response["exitCode"], response["outputTail"]) == ("passed", 0, "unit: 3 passed\n")
