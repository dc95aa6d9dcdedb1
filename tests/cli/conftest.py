"""Fixtures for the command line: a real local runtime (moto's server, the API over HTTP, worker processes fed by the
event-source poller), its connection file, a CliRunner bound to it, git remotes registered through the API.

`RouteFallbackProxy` sits between the CLI and the local API. It forwards every request; only when the API answers
that it has no route (API Gateway's 404 `{"message": "Not Found"}`) for one of the status routes listed in
`FALLBACK_ROUTES` does it answer from the table instead, as the route's contract says. Where the real route exists,
it is the one under test."""

from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import boto3
import pytest
from typer.testing import CliRunner

from agent_jobs.guard import to_item
from agent_jobs.keys import job_key
from agent_jobs_cli.main import OPERATOR_SCOPE, app
from agent_jobs_local.runtime import LocalRuntime
from agent_jobs_local.workload import create_remote, register_workspaces

TENANT = "default"
OPERATOR_TOKEN = "operator-token"
AGENT_TOKEN = "agent-token"
PATCH = "--- a/f\n+++ b/f\n@@ -0,0 +1 @@\n+x\n"
PUBLIC_JOB_FIELDS = (
    "jobId",
    "workspaceId",
    "tenantId",
    "type",
    "status",
    "attempt",
    "acceptedAt",
    "updatedAt",
    "finishedAt",
    "messageId",
    "sequenceNumber",
    "result",
    "error",
    "history",
)
_WORKSPACE_JOBS = re.compile(r"^/workspaces/([^/]+)/jobs$")


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


def claims_for(headers: Mapping[str, str]) -> dict[str, Any]:
    """Stands in for the JWT authorizer: the operator token carries the operator scope; anything else is an agent of
    the same tenant (so registering workspaces without a token works too)."""
    if headers.get("authorization") == f"Bearer {OPERATOR_TOKEN}":
        return {"tenant_id": TENANT, "scope": OPERATOR_SCOPE}
    return {"tenant_id": TENANT}


def table_items(runtime: LocalRuntime) -> list[dict[str, Any]]:
    client = boto3.client("dynamodb", endpoint_url=runtime.endpoint_url, region_name=runtime.resources.region)
    items: list[dict[str, Any]] = []
    for page in client.get_paginator("scan").paginate(TableName=runtime.resources.table_name, ConsistentRead=True):
        items.extend(to_item(raw) for raw in page["Items"])
    return items


def job_item(runtime: LocalRuntime, job_id: str) -> dict[str, Any]:
    return next(item for item in table_items(runtime) if item["pk"] == job_key(job_id))


def _sequence(item: Mapping[str, Any]) -> tuple[int, int]:
    sequence = str(item.get("sequenceNumber") or "")
    return (0, int(sequence)) if sequence.isdigit() else (1, int(item.get("acceptedAt") or 0))


def fallback_workspace_jobs(runtime: LocalRuntime, workspace_id: str, query: Mapping[str, list[str]]) -> Any:
    """`GET /workspaces/{id}/jobs` as its contract says: public job views, oldest accepted first, paged."""
    jobs = sorted(
        (
            item
            for item in table_items(runtime)
            if str(item["pk"]).startswith("job#") and item.get("workspaceId") == workspace_id
        ),
        key=_sequence,
    )
    limit = int(query.get("limit", ["2"])[0])  # small pages, so the CLI's following of nextToken is exercised
    start = int(query.get("nextToken", ["0"])[0])
    page = jobs[start : start + limit]
    next_token = str(start + limit) if start + limit < len(jobs) else None
    return {"jobs": [{name: job.get(name) for name in PUBLIC_JOB_FIELDS} for job in page], "nextToken": next_token}


def fallback_halted_workspaces(runtime: LocalRuntime) -> Any:
    """`GET /workspaces?state=HALTED` as its contract says: the HALTED and RESUMING workspaces."""
    views = [
        {
            "workspaceId": item.get("workspaceId"),
            "tenantId": item.get("tenantId"),
            "state": item.get("state"),
            "haltingJobId": item.get("haltingJobId"),
            "haltReason": item.get("haltReason"),
        }
        for item in table_items(runtime)
        if str(item["pk"]).startswith("ws#") and item.get("state") in ("HALTED", "RESUMING")
    ]
    return {"workspaces": views, "nextToken": None}


class RouteFallbackProxy:
    """Forwards to the local API; answers the missing status routes from the table (see the module docstring)."""

    def __init__(self, runtime: LocalRuntime) -> None:
        self.runtime = runtime
        self.fallbacks_served: list[str] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.1,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> RouteFallbackProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def fallback(self, method: str, path: str, query: Mapping[str, list[str]]) -> Any | None:
        match = _WORKSPACE_JOBS.match(path)
        if method == "GET" and match:
            return fallback_workspace_jobs(self.runtime, match.group(1), query)
        if method == "GET" and path == "/workspaces" and query.get("state") == ["HALTED"]:
            return fallback_halted_workspaces(self.runtime)
        return None

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                request = urllib.request.Request(
                    proxy.runtime.api_url + self.path, data=body, headers=headers, method=self.command
                )
                try:
                    with urllib.request.urlopen(request, timeout=60) as response:
                        status, answer = response.status, response.read()
                except urllib.error.HTTPError as error:
                    status, answer = error.code, error.read()
                if status == 404 and json.loads(answer or b"{}") == {"message": "Not Found"}:
                    parts = urlsplit(self.path)
                    fallback = proxy.fallback(self.command, parts.path, parse_qs(parts.query))
                    if fallback is not None:
                        proxy.fallbacks_served.append(f"{self.command} {parts.path}")
                        status, answer = 200, json.dumps(fallback).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            do_GET = do_POST = do_PUT = _forward

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


@dataclass
class CliHarness:
    runtime: LocalRuntime
    proxy: RouteFallbackProxy
    connection_file: Path
    root: Path
    default_claims: Any  # the API's own authorizer hook, before the tests' stand-in replaced it

    def run(self, *args: str, token: str | None = OPERATOR_TOKEN, input: str | None = None) -> Any:
        """`agent-jobs --connection-file F [--token T] ARGS...` in this process, like the console script."""
        options = ["--connection-file", str(self.connection_file)]
        if token is not None:
            options += ["--token", token]
        return CliRunner().invoke(app, [*options, *args], input=input, env={"AGENT_JOBS_TOKEN": None, "COLUMNS": "160"})

    def run_json(self, *args: str) -> Any:
        result = self.run(*args, "--json")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    def register(self, *workspace_ids: str) -> dict[str, Path]:
        remotes = {ws: create_remote(self.root / "remotes" / f"{ws}.git", ws) for ws in workspace_ids}
        register_workspaces(self.runtime.api_url, remotes, github_api_url="https://api.github.com")
        return remotes

    def patch_file(self) -> Path:
        path = self.root / "change.diff"
        path.write_text(PATCH, encoding="utf-8")
        return path

    def enqueue_patch(self, workspace_id: str, job_id: str) -> Any:
        return self.run(
            "enqueue",
            "apply_patch",
            workspace_id,
            "--patch-file",
            str(self.patch_file()),
            "--message",
            f"change for {job_id}",
            "--job-id",
            job_id,
            "--json",
        )


def start_harness(root: Path, **runtime_options: Any) -> Iterator[CliHarness]:
    runtime = LocalRuntime(workspaces_root=root / "workspaces", **runtime_options).start()
    proxy = None
    try:
        default_claims = runtime.api.authorizer_claims
        runtime.api.authorizer_claims = claims_for
        proxy = RouteFallbackProxy(runtime).start()
        connection_file = runtime.write_connection_file(root / ".agent-jobs" / "local.json")
        # The CLI talks to the API through the proxy; everything else in the file is the runtime's own.
        document = json.loads(connection_file.read_text())
        document["apiUrl"] = proxy.url
        connection_file.write_text(json.dumps(document))
        yield CliHarness(runtime, proxy, connection_file, root, default_claims)
    finally:
        if proxy is not None:
            proxy.stop()
        runtime.stop()


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliHarness]:
    yield from start_harness(tmp_path_factory.mktemp("cli"), time_scale=0.05, concurrency=2)


@pytest.fixture
def fresh_cli(tmp_path: Path) -> Iterator[CliHarness]:
    """A runtime of its own, for tests that stop its pollers or must see an empty dead-letter queue."""
    yield from start_harness(tmp_path, time_scale=0.05, concurrency=2)


Run = Callable[..., Any]
