"""`make local` (`python -m agent_jobs_local local`) as a person runs it: the terminal shows the stack and its counts,
and the functions' output (Powertools logs, EMF metrics, Python warnings) goes to the log folder, as a deployed
function's goes to its log group."""

from __future__ import annotations

import json
import os
import shlex
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agent_jobs_cli.main import app
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


LocalStack = tuple[str, subprocess.Popen[str], Path]


@pytest.fixture
def local_stack(tmp_path: Path) -> Iterator[LocalStack]:
    """`make local` of its own, for a test that stops it."""
    yield from _run_local(tmp_path)


@pytest.fixture(scope="module")
def shared_local_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """`make local` for the tests that only use it (one start for them all)."""
    yield from _run_local(tmp_path_factory.mktemp("local"))


def _run_local(tmp_path: Path) -> Iterator[LocalStack]:
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


def test_the_terminal_shows_the_stack_and_the_log_folder_holds_the_functions_output(local_stack: LocalStack) -> None:
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


def _printed_line(terminal: str, start: str) -> str:
    return next(line.strip() for line in terminal.splitlines() if line.strip().startswith(start))


def test_the_terminal_says_the_state_is_in_memory_and_where_the_remotes_stay(shared_local_stack: LocalStack) -> None:
    _, _, folder = shared_local_stack

    terminal = (folder / "terminal.txt").read_text()

    remotes = folder / "remotes"
    assert (
        f"state is in memory: workspaces and jobs are gone when this process ends; the remotes under {remotes} stay"
    ) in terminal


def test_a_workspace_registered_as_printed_opens_its_pull_request_on_the_github_stand_in(
    shared_local_stack: LocalStack,
) -> None:
    # Given `make local` printed how to register a workspace that opens pull requests on its GitHub stand-in
    _, _, folder = shared_local_stack
    terminal = (folder / "terminal.txt").read_text()
    register = shlex.split(_printed_line(terminal, "agent-jobs workspaces register"))
    remote = Path(register[register.index("--remote-url") + 1])
    api_url = register[register.index("--github-api-url") + 1]
    ca_file = Path(shlex.split(_printed_line(terminal, "curl --cacert"))[2])
    create_remote(remote, "my-repo")

    # When the user registers it with that command and submits a patch and an open_pr job
    def agent_jobs(*args: str) -> Any:
        options = ["--connection-file", str(folder / "local.json")]
        return CliRunner().invoke(app, [*options, *args], env={"AGENT_JOBS_TOKEN": None, "COLUMNS": "160"})

    registered = agent_jobs(*register[1:])
    assert registered.exit_code == 0, registered.output
    patch = folder / "change.diff"
    patch.write_text("--- a/a\n+++ b/a\n@@ -0,0 +1 @@\n+hi\n")
    assert agent_jobs("enqueue", "apply_patch", "my-repo", "--patch-file", str(patch), "-m", "hi").exit_code == 0
    opened = agent_jobs("enqueue", "open_pr", "my-repo", "--title", "Agent changes", "--job-id", "pr-1")
    assert opened.exit_code == 0, opened.output
    watched = agent_jobs("watch", "my-repo", "--until-idle", "--interval", "0.3", "--timeout", "90")
    assert watched.exit_code == 0, watched.output

    # Then the job succeeded and the stand-in holds the pull request, in the tenant's own folder
    job = json.loads(agent_jobs("status", "job", "pr-1", "--json").stdout)
    assert job["status"] == "SUCCEEDED", job
    assert job["result"]["number"] == 1
    context = ssl.create_default_context(cafile=str(ca_file))
    with urllib.request.urlopen(f"{api_url}/repos/you/my-repo/pulls", context=context, timeout=30) as answer:
        pulls = json.loads(answer.read())
    assert [(pull["title"], pull["head"]["ref"], pull["base"]["ref"]) for pull in pulls] == [
        ("Agent changes", "agent/my-repo", "main")
    ]
    assert api_url.endswith(f"/{TENANT}/github")
