"""`make local`'s GitHub stand-in (`agent_jobs_local.github_stand_in`): a folder per tenant on one loopback server,
which the stack's API admits in a registration's githubApiUrl only as the registering tenant's own folder, as under
`sam local`; nothing else on this machine is admitted, and no tenant's folder shows another's pull requests."""

from __future__ import annotations

import json
import ssl
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_jobs_local.auth import mint_token
from agent_jobs_local.git_server import local_ca
from agent_jobs_local.github_stand_in import GitHubStandIn
from agent_jobs_local.runtime import LocalRuntime
from agent_jobs_local.workload import create_remote, remote_path
from agent_jobs_local.workload_api import send

VICTIM, ATTACKER = "acme", "mallory"


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GitHubStandIn]:
    folder = tmp_path_factory.mktemp("stand-in")
    with GitHubStandIn(ca=local_ca(folder / "ca.pem"), ca_certificate_path=folder / "ca.crt") as github:
        yield github


@pytest.fixture(scope="module")
def runtime(stand_in: GitHubStandIn, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRuntime]:
    # As `make local` runs it: the stand-in for the functions on this machine, no private host allowed.
    folder = tmp_path_factory.mktemp("stack")
    with LocalRuntime(workspaces_root=folder / "workspaces", local_env=stand_in.function_env) as local:
        yield local


def register(runtime: LocalRuntime, tenant_id: str, workspace_id: str, github_api_url: str) -> tuple[int, Any]:
    path = remote_path(runtime.remotes_root, workspace_id, tenant_id)
    remote = path if path.exists() else create_remote(path, workspace_id)
    body = {
        "remoteUrl": str(remote),
        "branch": f"agent/{workspace_id}",
        "githubRepository": f"{tenant_id}/{workspace_id}",
        "githubApiUrl": github_api_url,
    }
    return send("PUT", f"{runtime.api_url}/workspaces/{workspace_id}", body, mint_token(tenant_id))


def refusal(answer: Any) -> str:
    return " ".join(error["message"] for error in answer.get("errors", []) if error["field"] == "githubApiUrl")


def test_a_tenant_registers_its_own_folder_of_the_stand_in(runtime: LocalRuntime, stand_in: GitHubStandIn) -> None:
    status, answer = register(runtime, ATTACKER, "mallory-own", stand_in.api_url(ATTACKER))

    assert status == 201, answer
    assert answer["githubApiUrl"] == f"https://{stand_in.netloc}/{ATTACKER}/github"


@pytest.mark.parametrize(
    "escape",
    [
        "https://{netloc}/acme/github",
        "https://{netloc}/mallory/github/../../acme/github",
        "https://{netloc}/mallory/github/repos",
        "https://{netloc}/mallory/github?x=/acme/github",
        "https://user@{netloc}/mallory/github",
        "http://{netloc}/mallory/github",
        "https://localhost:{port}/mallory/github",
    ],
    ids=["other-folder", "dot-dot", "below", "query", "user", "plain-http", "other-name"],
)
def test_a_tenant_cannot_name_another_tenants_folder_or_the_server_otherwise(
    runtime: LocalRuntime, stand_in: GitHubStandIn, escape: str
) -> None:
    port = stand_in.netloc.rsplit(":", 1)[1]

    status, answer = register(runtime, ATTACKER, "mallory-escape", escape.format(netloc=stand_in.netloc, port=port))

    assert status == 422, answer
    assert refusal(answer), answer


def test_no_other_host_of_this_machine_is_admitted(runtime: LocalRuntime, stand_in: GitHubStandIn) -> None:
    # The API and emulator on loopback: plain `make local` allows no private host besides the stand-in.
    for url in (runtime.api_url, str(runtime.endpoint_url), "https://127.0.0.1:1/mallory/github"):
        status, answer = register(runtime, ATTACKER, "mallory-loopback", url)
        assert status == 422, (url, answer)
        assert refusal(answer), answer


def test_a_tenants_folder_shows_only_its_own_pull_requests(stand_in: GitHubStandIn, tmp_path: Path) -> None:
    context = ssl.create_default_context(cadata=stand_in.ca.certificate_pem)

    def call(tenant_id: str, method: str, body: dict[str, str] | None = None) -> Any:
        url = f"{stand_in.api_url(tenant_id)}/repos/acme/repo/pulls"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, context=context, timeout=30) as answer:
            return json.loads(answer.read())

    opened = call(VICTIM, "POST", {"title": "secret fix", "head": "agent/repo", "base": "main"})

    assert opened["number"] == 1
    assert call(ATTACKER, "GET") == []
    assert [pull["title"] for pull in call(VICTIM, "GET")] == ["secret fix"]
    assert [pull.title for pull in stand_in.tenants.pulls(VICTIM)] == ["secret fix"]
