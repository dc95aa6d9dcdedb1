"""`make local` (`python -m agent_jobs_local local`) as a person runs it: the terminal shows the stack and its counts,
and the functions' output (Powertools logs, EMF metrics, Python warnings) goes to the log folder, as a deployed
function's goes to its log group."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_jobs_local.auth import mint_token
from agent_jobs_local.workload import create_remote

TENANT = "default"
# Powertools warns of every invocation that publishes no metric (a GET of a job publishes none).
NO_METRICS_WARNING = "No application metrics to publish"


def _call(api: str, method: str, path: str, body: object | None = None) -> tuple[int, dict[str, object]]:
    headers = {"Authorization": f"Bearer {mint_token(TENANT)}", "content-type": "application/json"}
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{api}{path}", data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def local_stack(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str], Path]]:
    port = _free_port()
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in {"POWERTOOLS_METRICS_DISABLED", "AWS_ENDPOINT_URL"} and not name.startswith("PYTEST")
    }
    terminal = tmp_path / "terminal.txt"
    with terminal.open("w") as output:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agent_jobs_local",
                "local",
                "--api-port",
                str(port),
                "--env-file",
                str(tmp_path / "env.local.json"),
                "--connection-file",
                str(tmp_path / "local.json"),
                "--workspaces-root",
                str(tmp_path / "workspaces"),
                "--log-dir",
                str(tmp_path / "logs"),
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=tmp_path,
        )
    try:
        deadline = time.monotonic() + 90
        while "Ctrl-C stops everything" not in terminal.read_text():
            assert process.poll() is None, terminal.read_text()
            assert time.monotonic() < deadline, terminal.read_text()
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}", process, tmp_path
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=60)


def test_the_terminal_shows_the_stack_and_the_log_folder_holds_the_functions_output(
    local_stack: tuple[str, subprocess.Popen[str], Path],
) -> None:
    api, process, folder = local_stack
    remote = create_remote(folder / "remotes" / TENANT / "repo-x.git", "repo-x")
    status, answer = _call(api, "PUT", "/workspaces/repo-x", {"remoteUrl": str(remote), "branch": "agent/repo-x"})
    assert status == 201, answer
    job = {
        "jobId": "manual-1",
        "workspaceId": "repo-x",
        "type": "apply_patch",
        "payload": {"patch": "--- a/a\n+++ b/a\n@@ -0,0 +1 @@\n+hi\n", "commitMessage": "hi"},
    }
    status, answer = _call(api, "POST", "/jobs", job)
    assert status == 202, answer
    deadline = time.monotonic() + 60
    while (answer := _call(api, "GET", "/jobs/manual-1")[1])["status"] != "SUCCEEDED":
        assert answer["status"] in {"QUEUED", "IN_FLIGHT"}, answer
        assert time.monotonic() < deadline, answer
        time.sleep(0.3)
    process.terminate()
    process.wait(timeout=60)

    terminal = (folder / "terminal.txt").read_text()
    assert "Ctrl-C stops everything" in terminal
    assert "UserWarning" not in terminal, terminal
    assert '"CloudWatchMetrics"' not in terminal, terminal
    logs = {path.name: path.read_text() for path in (folder / "logs").glob("*.log")}
    # Nothing is lost: the warnings and the metrics are in the functions' logs.
    assert any(NO_METRICS_WARNING in text for text in logs.values()), logs
    assert any('"CloudWatchMetrics"' in text for text in logs.values()), logs
    assert any('"job succeeded"' in text for name, text in logs.items() if name.startswith("worker-")), logs
