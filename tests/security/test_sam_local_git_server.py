"""The `sam local` git server of the sample workspaces (LOCAL_GIT_SERVER, its CA in LOCAL_GIT_CA): a private host that
registrations and the worker admit only when SAM CLI runs the function (AWS_SAM_LOCAL=true), and there only for a
repository in the registering tenant's own folder; its CA is trusted for that server's remotes alone.

host.docker.internal is the docker bridge's gateway in a container, so every test resolves it there.
"""

from __future__ import annotations

import http.client
import os
import ssl
import stat
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import pytest
from dulwich.client import get_transport_and_path
from dulwich.errors import GitProtocolError
from dulwich.repo import Repo

from agent_jobs.registration import WorkspaceRegistration
from agent_jobs.settings import Settings
from agent_jobs.tenancy import TenantBounds
from agent_jobs.workspaces import WorkspaceRegistry
from agent_jobs_local.fake_github import FakeGitHub
from agent_jobs_local.git_server import GITHUB_BODY_LIMIT_BYTES, GitHttpsServer, local_ca
from enqueue_api import app
from job_worker.jobs.context import JobContext
from job_worker.jobs.errors import PermanentJobError, RetryableJobError
from job_worker.jobs.git.transport import git_config_trusting
from job_worker.jobs.github import GitHubClient
from job_worker.jobs.registered import RegisteredWorkspaceStore
from job_worker.jobs.workspace import Workspace
from tests.conftest import Stack
from tests.integration.test_enqueue_api import Api, use_environment
from tests.integration.test_workspace_api import put_event

SERVER = "host.docker.internal:8443"
BRIDGE_GATEWAY = "172.17.0.1"


@pytest.fixture(scope="module")
def ca_pem(tmp_path_factory: pytest.TempPathFactory) -> str:
    return local_ca(tmp_path_factory.mktemp("ca") / "ca.pem").certificate_pem


@pytest.fixture(autouse=True)
def bridge_resolves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agent_jobs.tenancy.resolve_host", lambda host, port: [BRIDGE_GATEWAY])


def sam_local_env(ca_pem: str, aws_sam_local: str | None = "true") -> dict[str, str]:
    env = {"LOCAL_GIT_SERVER": SERVER, "LOCAL_GIT_CA": ca_pem}
    return {**env, "AWS_SAM_LOCAL": aws_sam_local} if aws_sam_local is not None else env


def api_with(stack: Stack, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> Api:
    use_environment(monkeypatch, {**stack.env("EnqueueApiFunction"), **env})
    if "AWS_SAM_LOCAL" not in env:
        monkeypatch.delenv("AWS_SAM_LOCAL", raising=False)
    monkeypatch.setattr(app.metrics, "namespace", "AgentJobsTest")
    app.reset_services()
    return Api(stack)


@pytest.fixture
def sam_local_api(stack: Stack, monkeypatch: pytest.MonkeyPatch, ca_pem: str) -> Iterator[Api]:
    yield api_with(stack, monkeypatch, sam_local_env(ca_pem))
    app.reset_services()


def put(api: Api, tenant_id: str, workspace_id: str, remote: str, **overrides: Any) -> tuple[int, str]:
    body = {"remoteUrl": remote, "branch": "agent/work", **overrides}
    answer = api.invoke(put_event(workspace_id, body, claims={"tenant_id": tenant_id, "sub": f"{tenant_id}-agent"}))
    return answer.status, str(answer.body)


@pytest.mark.parametrize("aws_sam_local", [None, "false", "TRUE", "1", ""])
def test_the_git_server_setting_is_ignored_unless_sam_cli_runs_the_function(
    monkeypatch: pytest.MonkeyPatch, ca_pem: str, aws_sam_local: str | None
) -> None:
    # Given the settings as a deployed function would see them, if someone set them there
    for name, value in sam_local_env(ca_pem, aws_sam_local).items():
        monkeypatch.setenv(name, value)
    if aws_sam_local is None:
        monkeypatch.delenv("AWS_SAM_LOCAL", raising=False)

    bounds = TenantBounds.from_settings(Settings(table_name="jobs", queue_url="https://sqs.example/q.fifo"))

    # Then neither the private host nor the CA is admitted
    assert (bounds.local_git_server, bounds.local_git_ca) == (None, None)
    assert bounds.host_error(f"https://{SERVER}/acme/repo.git", "remoteUrl") is not None


@pytest.mark.parametrize(("server", "ca"), [("", "ca"), ("   ", "ca"), (SERVER, "not a certificate"), (SERVER, "")])
def test_an_empty_git_server_or_a_ca_without_a_certificate_admits_nothing(
    monkeypatch: pytest.MonkeyPatch, ca_pem: str, server: str, ca: str
) -> None:
    monkeypatch.setenv("AWS_SAM_LOCAL", "true")
    monkeypatch.setenv("LOCAL_GIT_SERVER", server)
    monkeypatch.setenv("LOCAL_GIT_CA", ca_pem if ca == "ca" else ca)

    bounds = TenantBounds.from_settings(Settings(table_name="jobs", queue_url="https://sqs.example/q.fifo"))

    assert (bounds.local_git_server, bounds.local_git_ca) == (None, None)


def test_registering_the_git_server_outside_sam_local_is_422(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, ca_pem: str
) -> None:
    api = api_with(stack, monkeypatch, sam_local_env(ca_pem, aws_sam_local=None))
    try:
        status, body = put(api, "acme", "acme-repo", f"https://{SERVER}/acme/repo.git")
    finally:
        app.reset_services()

    assert status == 422
    assert "must name a public host" in body


def test_a_tenant_registers_its_own_folder_of_the_git_server(sam_local_api: Api) -> None:
    assert put(sam_local_api, "acme", "acme-repo", f"https://{SERVER}/acme/repo.git")[0] == 201


@pytest.mark.parametrize(
    "remote",
    [
        f"https://{SERVER}/acme/repo.git",  # the victim's folder
        f"https://{SERVER}/mallory/../acme/repo.git",
        f"https://{SERVER}/mallory/%2e%2e/acme/repo.git",
        f"https://{SERVER}/mallory/repo.git/../../acme/repo.git",
        f"https://{SERVER}/mallory//acme/repo.git",
        f"https://{SERVER}/mallory/..",
        f"https://{SERVER}/mallory/repo.git?x=/acme/repo.git",
        f"https://mallory@{SERVER}/mallory/repo.git",
        f"http://{SERVER}/mallory/repo.git",
        f"https://{SERVER}/",
        f"https://{SERVER}/mallory/",
        "https://HOST.DOCKER.INTERNAL:8443/acme/repo.git",  # the victim's folder, by other spellings of the server
        "https://host.docker.internal.:8443/acme/repo.git",
        "https://host.docker.internal:08443/acme/repo.git",
    ],
)
def test_a_tenant_cannot_reach_another_folder_of_the_git_server(sam_local_api: Api, remote: str) -> None:
    status, body = put(sam_local_api, "mallory", "mallory-repo", remote)

    assert status == 422, remote
    assert "remoteUrl" in body


@pytest.mark.parametrize(
    "remote",
    [
        "https://host.docker.internal:8444/mallory/repo.git",  # another port of the same host
        "https://host.docker.internal/mallory/repo.git",
        f"https://{BRIDGE_GATEWAY}:8443/mallory/repo.git",  # the same server by its address
        "https://127.0.0.1:8443/mallory/repo.git",
    ],
)
def test_the_git_server_admits_no_other_private_host(sam_local_api: Api, remote: str) -> None:
    status, body = put(sam_local_api, "mallory", "mallory-repo", remote)

    assert status == 422, remote
    assert "must name a public host" in body


def test_a_tenant_names_the_github_api_of_its_own_folder(sam_local_api: Api) -> None:
    remote = f"https://{SERVER}/acme/repo.git"

    status, body = put(sam_local_api, "acme", "acme-repo", remote, githubApiUrl=f"https://{SERVER}/acme/github")

    assert status == 201, body


@pytest.mark.parametrize(
    "api_url",
    [
        f"https://{SERVER}/api",
        f"https://{SERVER}/acme/github",  # the victim's pull requests
        f"https://{SERVER}/mallory/github/../../acme/github",
        f"https://{SERVER}/mallory/github/repos",
        f"https://{SERVER}/mallory/githubx",
        f"https://{SERVER}/mallory/repo.git",
        f"https://mallory@{SERVER}/mallory/github",
        f"http://{SERVER}/mallory/github",
        "https://host.docker.internal:8444/mallory/github",
    ],
)
def test_a_tenant_cannot_name_another_github_api_of_the_git_server(sam_local_api: Api, api_url: str) -> None:
    remote = f"https://{SERVER}/mallory/repo.git"

    status, body = put(sam_local_api, "mallory", "mallory-repo", remote, githubApiUrl=api_url)

    assert status == 422, api_url
    assert "githubApiUrl" in body


@pytest.mark.parametrize(
    ("url", "refused"),
    [
        (f"https://{SERVER}/mallory/github/repos/o/r/pulls?head=o:agent/w&state=open", False),
        (f"https://{SERVER}/mallory/github/repos/o/r/pulls", False),
        (f"https://{SERVER}/acme/github/repos/o/r/pulls", True),
        (f"https://{SERVER}/mallory/github/../../acme/github/repos/o/r/pulls", True),
        (f"https://{SERVER}/mallory/github/repos/%2e%2e/%2e%2e/acme/github/repos/o/r/pulls", True),
        (f"https://{SERVER}/mallory/github/repos/o/r/pulls#x", True),
        (f"https://{SERVER}/mallory/repo.git/info/refs", True),
    ],
)
def test_the_worker_keeps_github_requests_in_the_tenants_folder(
    stack: Stack, ca_pem: str, url: str, refused: bool
) -> None:
    bounds = TenantBounds(local_git_server=SERVER, local_git_ca=ca_pem)
    store = worker_store(stack, bounds, {})

    problem = store.check_host(url, "githubApiUrl", "mallory")

    assert (problem is not None) == refused, (url, problem)


def test_the_worker_trusts_the_local_ca_for_the_git_servers_urls_alone(stack: Stack, ca_pem: str) -> None:
    store = worker_store(stack, TenantBounds(local_git_server=SERVER, local_git_ca=ca_pem), {})

    assert store.trusted_ca(f"https://{SERVER}/acme/github") == ca_pem
    assert store.trusted_ca("https://api.github.com") is None
    assert store.trusted_ca(f"https://{BRIDGE_GATEWAY}:8443/acme/github") is None
    assert worker_store(stack, TenantBounds(), {}).trusted_ca(f"https://{SERVER}/acme/github") is None


def test_pull_requests_go_over_tls_to_the_tenants_github_api_only(tmp_path: Path) -> None:
    # Given the git server with acme's GitHub API, on this machine's loopback (its certificate names the address)
    ca = local_ca(tmp_path / "ca.pem")
    with FakeGitHub() as github:
        github.add_repository("acme", "repo")
        server = GitHttpsServer({}, "127.0.0.1", ca=ca, github_apis={"/acme/github": github}).start()
        try:
            api_url = f"https://127.0.0.1:{server.port}/acme/github"
            trusting = GitHubClient("", api_url=api_url, ca_pem=ca.certificate_pem, max_attempts=1)
            pull = trusting.open_pull_request("acme", "repo", head="agent/w", base="main", title="t", body="b")
            # Then the system's CAs do not vouch for the server, and another folder holds no GitHub API
            untrusting = GitHubClient("", api_url=api_url, max_attempts=1)
            with pytest.raises(RetryableJobError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
                untrusting.open_pull_request("acme", "repo", head="agent/x", base="main", title="t", body="b")
            elsewhere = GitHubClient(
                "", api_url=f"https://127.0.0.1:{server.port}/mallory/github", ca_pem=ca.certificate_pem, max_attempts=1
            )
            with pytest.raises(PermanentJobError):
                elsewhere.open_pull_request("acme", "repo", head="agent/y", base="main", title="t", body="b")
        finally:
            server.stop()

    assert (pull.number, pull.created) == (1, True)
    assert [(pr.owner, pr.repo, pr.head) for pr in github.list_pulls()] == [("acme", "repo", "agent/w")]


def worker_store(stack: Stack, bounds: TenantBounds, registrations: dict[str, tuple[str, str]]) -> Any:
    registry = WorkspaceRegistry(stack.services.dynamodb, stack.table_name)
    for workspace_id, (tenant_id, remote) in registrations.items():
        registry.register(workspace_id, WorkspaceRegistration(remote_url=remote, branch="agent/w"), tenant_id)
    return RegisteredWorkspaceStore(registry, Path("/nonexistent"), tokens=lambda name: "x", bounds=bounds)


def test_the_worker_refuses_another_tenants_folder_of_the_git_server_at_use(stack: Stack, ca_pem: str) -> None:
    # Given a registration stored without the API's check, naming the victim's folder
    bounds = TenantBounds(local_git_server=SERVER, local_git_ca=ca_pem)
    store = worker_store(stack, bounds, {"mallory-repo": ("mallory", f"https://{SERVER}/acme/repo.git")})

    with pytest.raises(PermanentJobError, match="mallory"):
        store._remote("mallory-repo")


def test_the_worker_trusts_the_local_ca_for_the_git_server_alone(stack: Stack, ca_pem: str) -> None:
    bounds = TenantBounds(local_git_server=SERVER, local_git_ca=ca_pem, resolve=lambda host, port: ["93.184.216.34"])
    store = worker_store(
        stack,
        bounds,
        {
            "acme-local": ("acme", f"https://{SERVER}/acme/repo.git"),
            "acme-public": ("acme", "https://git.example.com/acme/repo.git"),
        },
    )

    assert store._remote("acme-local").ca_pem == ca_pem
    assert store._remote("acme-public").ca_pem == ""


def test_the_git_server_never_listens_on_every_interface(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="one address"):
        GitHttpsServer({}, "0.0.0.0", ca=local_ca(tmp_path / "ca.pem"))


def test_the_worker_keeps_the_ca_in_a_file_of_its_own(ca_pem: str) -> None:
    # Given the groups of a batch, on threads of one process, each opening a remote of the git server at once
    with ThreadPoolExecutor(max_workers=8) as pool:
        configs = list(pool.map(lambda _: git_config_trusting(ca_pem), range(8)))

    (path,) = {config.get((b"http",), b"sslCAInfo") for config in configs}
    # Then one file holds the CA, readable by this process's user alone, at a name nobody could have planted
    assert Path(os.fsdecode(path)).read_text() == ca_pem
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_a_workspaces_job_context_checks_and_trusts_for_its_own_tenant(stack: Stack, ca_pem: str) -> None:
    # Given acme's workspace on the git server, with its GitHub API there
    registry = WorkspaceRegistry(stack.services.dynamodb, stack.table_name)
    registration = WorkspaceRegistration(
        remote_url=f"https://{SERVER}/acme/repo.git", branch="agent/w", github_api_url=f"https://{SERVER}/acme/github"
    )
    registry.register("acme-repo", registration, "acme")
    bounds = TenantBounds(local_git_server=SERVER, local_git_ca=ca_pem, resolve=lambda host, port: ["93.184.216.34"])
    store = RegisteredWorkspaceStore(registry, Path("/nonexistent"), tokens=lambda name: "x", bounds=bounds)

    context = store.job_context("acme-repo", JobContext(workspace=cast("Workspace", None), remaining_ms=lambda: 1000))

    # Then its open_pr job may call acme's folder alone, and trusts the CA for the git server alone
    assert context.check_host(f"https://{SERVER}/acme/github/repos/o/r/pulls", "githubApiUrl") is None
    assert context.check_host(f"https://{SERVER}/mallory/github/repos/o/r/pulls", "githubApiUrl") is not None
    assert context.trusted_ca(f"https://{SERVER}/acme/github") == ca_pem
    assert context.trusted_ca("https://api.github.com") is None


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[GitHttpsServer, FakeGitHub]]:
    """The git server on loopback (its certificate names 127.0.0.1), with acme's repository and GitHub API."""
    Repo.init_bare(str(tmp_path / "repo.git"), mkdir=True)
    with FakeGitHub() as github:
        github.add_repository("acme", "repo")
        server = GitHttpsServer(
            {"/acme/repo.git": tmp_path / "repo.git"},
            "127.0.0.1",
            ca=local_ca(tmp_path / "ca.pem"),
            github_apis={"/acme/github": github},
        ).start()
        try:
            yield server, github
        finally:
            server.stop()


@pytest.mark.parametrize("trusted", ["another CA", "the right CA, the wrong name"])
def test_the_local_ca_vouches_only_for_the_server_it_signed(
    served: tuple[GitHttpsServer, FakeGitHub], tmp_path: Path, trusted: str
) -> None:
    server, _ = served
    other_ca = local_ca(tmp_path / "other-ca.pem").certificate_pem
    ca_pem, host = (other_ca, "127.0.0.1") if trusted == "another CA" else (server.ca.certificate_pem, "localhost")
    github = GitHubClient("", api_url=f"https://{host}:{server.port}/acme/github", ca_pem=ca_pem, max_attempts=1)
    client, path = get_transport_and_path(
        f"https://{host}:{server.port}/acme/repo.git", config=git_config_trusting(ca_pem)
    )

    with pytest.raises(RetryableJobError, match=r"CERTIFICATE_VERIFY_FAILED|Hostname mismatch"):
        github.open_pull_request("acme", "repo", head="agent/w", base="main", title="t", body="b")
    with pytest.raises(GitProtocolError, match=r"CERTIFICATE_VERIFY_FAILED|Hostname mismatch"):
        client.get_refs(path.encode())


def _post_to_github(server: GitHttpsServer, body: bytes, length: int | None = None) -> int:
    """POST `body` to acme's GitHub API, saying it is `length` bytes long (default its length)."""
    context = ssl.create_default_context(cadata=server.ca.certificate_pem)
    connection = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=30)
    try:
        connection.putrequest("POST", "/acme/github/repos/acme/repo/pulls")
        connection.putheader("Content-Length", str(len(body) if length is None else length))
        connection.endheaders(body)
        return connection.getresponse().status
    finally:
        connection.close()


def test_the_github_api_refuses_bodies_too_large_or_too_deep(served: tuple[GitHttpsServer, FakeGitHub]) -> None:
    server, github = served

    assert _post_to_github(server, b"{}", length=GITHUB_BODY_LIMIT_BYTES + 1) == 413
    assert _post_to_github(server, b"[" * 100_000) == 400
    assert github.list_pulls() == []


def test_the_github_client_checks_each_requests_whole_url(served: tuple[GitHttpsServer, FakeGitHub]) -> None:
    server, _ = served
    seen: list[str] = []

    def host_check(url: str) -> None:
        seen.append(url)

    api_url = f"https://127.0.0.1:{server.port}/acme/github"
    github = GitHubClient("", api_url=api_url, ca_pem=server.ca.certificate_pem, host_check=host_check)

    github.open_pull_request("acme", "repo", head="agent/w", base="main", title="t", body="b")

    assert seen
    assert all(url.startswith(f"{api_url}/repos/acme/repo/pulls") for url in seen), seen
