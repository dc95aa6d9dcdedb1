"""A TypeScript client generated from the document the API serves: openapi-typescript at its default options writes the
types, `tsc --strict` checks examples/typescript-client's flow against them, and the compiled flow runs with
openapi-fetch against the local API over real HTTP (the producer's handler on the template's queue and table in the
emulator). The npm packages are the example's locked ones, installed with `npm ci` outside the repository (npm's own
cache keeps the downloads between runs)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_jobs.models import job_request_adapter, payload_hash
from agent_jobs_local.api_server import LocalApiServer
from agent_jobs_local.auth import mint_token
from enqueue_api import app
from tests.conftest import REPO, Stack

EXAMPLE = REPO / "examples" / "typescript-client"
TENANT = "acme-ts"
WORKSPACE = "ws-typescript"


def run(command: list[str], folder: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def node_modules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example's locked dependencies (openapi-typescript, openapi-fetch, typescript), installed with npm ci."""
    npm = shutil.which("npm")
    assert npm, "npm (with Node.js 18+) is needed for the TypeScript client example"
    folder = tmp_path_factory.mktemp("typescript-client-install")
    for name in ("package.json", "package-lock.json"):
        shutil.copy(EXAMPLE / name, folder / name)
    installed = run([npm, "ci", "--no-audit", "--no-fund", "--prefer-offline", "--loglevel=error"], folder, 600)
    assert installed.returncode == 0, installed.stderr
    return folder / "node_modules"


@pytest.fixture
def client_folder(node_modules: Path, tmp_path: Path) -> Path:
    """A copy of the example's sources with the installed dependencies."""
    folder = tmp_path / "typescript-client"
    shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns("node_modules", "dist", "schema.d.ts"))
    (folder / "node_modules").symlink_to(node_modules, target_is_directory=True)
    return folder


@pytest.fixture
def local_api(server_stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalApiServer]:
    """The producer's handler with the environment template.yaml gives it, behind the local HTTP API; file-system
    remotes allowed under a folder of this test (the workspace's remote is never fetched: no worker runs)."""
    for name, value in server_stack.env("EnqueueApiFunction").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WORKSPACES_REMOTE_ROOT", str(tmp_path / "remotes"))
    app.reset_services()
    server = LocalApiServer(server_stack.model, app.lambda_handler).start()
    try:
        yield server
    finally:
        server.stop()
        app.reset_services()


def generate_types(folder: Path, document: str) -> None:
    """src/schema.d.ts from `document` (a URL or a file), openapi-typescript's options all left at their defaults."""
    generated = run([str(folder / "node_modules/.bin/openapi-typescript"), document, "-o", "src/schema.d.ts"], folder)
    assert generated.returncode == 0, generated.stderr


def compile_client(folder: Path) -> subprocess.CompletedProcess[str]:
    """tsc --strict on the example (tsconfig.json: noEmitOnError, so dist/ is written only when everything checks)."""
    return run([str(folder / "node_modules/.bin/tsc"), "-p", "tsconfig.json", "--strict"], folder)


def test_typescript_client_generated_at_default_options_compiles_and_completes_its_flow(
    client_folder: Path, local_api: LocalApiServer, server_stack: Stack, tmp_path: Path
) -> None:
    # Given types generated from the document the running API serves, and the example's flow checked against them
    generate_types(client_folder, f"{local_api.url}/openapi.json")
    compiled = compile_client(client_folder)
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr

    # When the compiled flow runs against the API with a tenant's token
    settings = tmp_path / "settings.json"
    settings.write_text(
        json.dumps(
            {
                "baseUrl": local_api.url,
                "token": mint_token(TENANT),
                "workspaceId": WORKSPACE,
                "remoteUrl": str(tmp_path / "remotes" / TENANT / "repo.git"),
            }
        )
    )
    flow = run([shutil.which("node") or "node", "dist/flow.js", str(settings)], client_folder, 120)
    assert flow.returncode == 0, flow.stderr
    steps = [json.loads(line) for line in flow.stdout.splitlines()]

    # Then every answer is the documented one, typed as the document describes it
    by_step: dict[str, list[dict[str, Any]]] = {}
    for step in steps:
        by_step.setdefault(step.pop("step"), []).append(step)
    assert by_step["registerWorkspace"] == [
        {"status": 201, "baseBranch": "main", "location": f"/workspaces/{WORKSPACE}"}
    ]
    assert by_step["submitJob"] == [
        {"jobId": "ts-tests-1", "status": "QUEUED", "created": True},
        {"jobId": "ts-patch-1", "status": "QUEUED", "created": True},
        {"jobId": "ts-tests-1", "status": "QUEUED", "created": False},
    ]
    assert by_step["submitJobConflict"] == [{"status": 409, "jobId": "ts-tests-1"}]
    assert by_step["submitJobBatch"] == [
        {
            "results": [
                {"jobId": "ts-pr-1", "statusCode": 202, "created": True},
                {"jobId": "ts-patch-2", "statusCode": 202, "created": True},
            ]
        }
    ]
    assert by_step["readJob"] == [
        {"jobId": "ts-patch-1", "type": "apply_patch", "status": "QUEUED", "workspaceId": WORKSPACE}
    ]
    assert by_step["readJobMissing"] == [{"status": 404, "hasMessage": True}]
    (timeline,) = by_step["listWorkspaceJobs"]
    assert len(timeline["pages"]) >= 2
    assert all(len(page) <= 2 for page in timeline["pages"])
    jobs = [job_id for page in timeline["pages"] for job_id in page]
    assert jobs[:2] == ["ts-tests-1", "ts-patch-1"]
    assert set(jobs[2:]) == {"ts-pr-1", "ts-patch-2"}
    assert len(jobs) == 4

    # And a job the client sent without its optional fields is recorded as the same job with them filled in
    explicit = job_request_adapter.validate_python(
        {"jobId": "ts-tests-1", "workspaceId": WORKSPACE, "type": "run_tests", "payload": {"suite": "default"}}
    )
    assert server_stack.job("ts-tests-1", TENANT)["payloadHash"] == payload_hash(explicit)
    assert server_stack.workspace(WORKSPACE)["baseBranch"] == "main"


def test_typescript_client_types_refuse_a_request_the_api_refuses(client_folder: Path) -> None:
    # Given types generated from the committed document (a test keeps it equal to the served one)
    generate_types(client_folder, str(REPO / "docs" / "openapi.json"))
    (client_folder / "src" / "flow.ts").write_text(
        'import createClient from "openapi-fetch";\n'
        'import type { paths } from "./schema.js";\n'
        'const client = createClient<paths>({ baseUrl: "http://127.0.0.1:1" });\n'
        "await client.POST('/jobs', { body: { jobId: 'j-1', workspaceId: 'ws-a', type: 'apply_patch', "
        "payload: { patch: '--- a/f' } } });\n"
    )

    # When an apply_patch job without its commitMessage is compiled
    compiled = compile_client(client_folder)

    # Then tsc refuses it, naming the field: the flow's success above is the types', not an `any`'s
    assert compiled.returncode != 0
    assert "commitMessage" in compiled.stdout


def test_typescript_client_schema_defaults_would_make_the_flows_minimal_requests_fail_to_compile(
    client_folder: Path, tmp_path: Path
) -> None:
    # Given the committed document with two of the defaults the API fills in put back as schema defaults
    document = json.loads((REPO / "docs" / "openapi.json").read_text())
    schemas = document["components"]["schemas"]
    schemas["WorkspaceRegistration"]["properties"]["baseBranch"]["default"] = "main"
    schemas["RunTestsJob"]["properties"]["payload"]["default"] = {"suite": "default"}
    with_defaults = tmp_path / "with-defaults.json"
    with_defaults.write_text(json.dumps(document))
    generate_types(client_folder, str(with_defaults))

    # When the example's flow is compiled against them
    compiled = compile_client(client_folder)

    # Then openapi-typescript's defaults have made those fields required: why the document carries no such default
    assert compiled.returncode != 0
    assert "baseBranch" in compiled.stdout
    assert "Property 'payload' is missing" in compiled.stdout
