"""Fixtures for the command line: a real local runtime (moto's server, the API over HTTP with its JWT checks, worker
processes fed by the event-source poller), its connection file, a CliRunner bound to it, git remotes registered
through the API. Tokens are real: minted with the local development key, verified by the local API."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from typer.testing import CliRunner

from agent_jobs.guard import to_item
from agent_jobs.keys import job_key
from agent_jobs_cli.context import OPERATOR_SCOPE
from agent_jobs_cli.main import app
from agent_jobs_local.auth import mint_token
from agent_jobs_local.runtime import LocalRuntime
from agent_jobs_local.workload import DEFAULT_TENANT, create_remote, register_workspaces, remote_path

TENANT = "default"
PATCH = "--- a/f\n+++ b/f\n@@ -0,0 +1 @@\n+x\n"
# Changes a file the workspace does not have: a permanent error, so the job ends DEAD and halts its workspace.
BAD_PATCH = "--- a/missing.txt\n+++ b/missing.txt\n@@ -1 +1 @@\n-old\n+new\n"


@pytest.fixture(autouse=True)
def aws_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite's fake credentials and region, but AWS_ENDPOINT_URL is left alone: the module's local runtime set it
    for the API it serves in this process (the suite-wide fixture would remove it between tests)."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    # The API runs in this process: its metrics (printed to sys.stdout) would land in the CLI's captured output.
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")


def operator_token() -> str:
    return mint_token(TENANT, scopes=[OPERATOR_SCOPE])


def agent_token() -> str:
    return mint_token(TENANT)


def table_items(runtime: LocalRuntime) -> list[dict[str, Any]]:
    client = boto3.client("dynamodb", endpoint_url=runtime.endpoint_url, region_name=runtime.resources.region)
    items: list[dict[str, Any]] = []
    for page in client.get_paginator("scan").paginate(TableName=runtime.resources.table_name, ConsistentRead=True):
        items.extend(to_item(raw) for raw in page["Items"])
    return items


def job_item(runtime: LocalRuntime, job_id: str) -> dict[str, Any]:
    return next(item for item in table_items(runtime) if item["pk"] == job_key(DEFAULT_TENANT, job_id))


@dataclass
class CliHarness:
    runtime: LocalRuntime
    connection_file: Path
    root: Path

    def run(self, *args: str, token: str | None = None, input: str | None = None, columns: int = 160) -> Any:
        """`agent-jobs --connection-file F [--token T] ARGS...` in this process, like the console script, on a terminal
        `columns` wide; without a token the operator token of the tenant."""
        options = ["--connection-file", str(self.connection_file)]
        token = operator_token() if token is None else token
        if token:
            options += ["--token", token]
        environment = {"AGENT_JOBS_TOKEN": None, "COLUMNS": str(columns)}
        return CliRunner().invoke(app, [*options, *args], input=input, env=environment)

    def run_json(self, *args: str) -> Any:
        result = self.run(*args, "--json")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    def register(self, *workspace_ids: str) -> dict[str, Path]:
        remotes = {ws: create_remote(remote_path(self.runtime.remotes_root, ws), ws) for ws in workspace_ids}
        register_workspaces(self.runtime.api_url, remotes, github_api_url="https://api.github.com")
        return remotes

    def patch_file(self, patch: str = PATCH) -> Path:
        path = self.root / f"change-{hashlib.sha256(patch.encode()).hexdigest()[:12]}.diff"
        path.write_text(patch, encoding="utf-8")
        return path

    def enqueue_patch(self, workspace_id: str, job_id: str, patch: str = PATCH) -> Any:
        return self.run(
            "enqueue",
            "apply_patch",
            workspace_id,
            "--patch-file",
            str(self.patch_file(patch)),
            "--message",
            f"change for {job_id}",
            "--job-id",
            job_id,
            "--json",
        )


def start_harness(root: Path, **runtime_options: Any) -> Iterator[CliHarness]:
    runtime = LocalRuntime(workspaces_root=root / "workspaces", **runtime_options).start()
    try:
        connection_file = runtime.write_connection_file(root / ".agent-jobs" / "local.json")
        yield CliHarness(runtime, connection_file, root)
    finally:
        runtime.stop()


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliHarness]:
    yield from start_harness(tmp_path_factory.mktemp("cli"), time_scale=0.05, concurrency=2)


@pytest.fixture
def fresh_cli(tmp_path: Path) -> Iterator[CliHarness]:
    """A runtime of its own, for tests that stop its pollers or must see an empty dead-letter queue."""
    yield from start_harness(tmp_path, time_scale=0.05, concurrency=2)


Run = Callable[..., Any]
