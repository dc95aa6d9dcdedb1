"""Attacks one tenant could try on another, each shown to fail: jobs for a workspace not yet registered, messages
naming another tenant, another tenant's tokens and remotes, hosts inside the deployment's network, answers made
huge by a body, and registrations beyond a tenant's quota."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aws_lambda_powertools import Logger, Metrics
from botocore.exceptions import ClientError
from dulwich.repo import Repo

from agent_jobs.models import JobStatus, job_message
from agent_jobs.producer import WorkspaceUnregisteredError, enqueue_job
from agent_jobs.registration import MAX_TEST_COMMANDS_BYTES, WorkspaceRegistration
from agent_jobs.tenancy import TenantBounds, non_public_reason
from agent_jobs.workspaces import WorkspaceQuotaError, WorkspaceRegistry
from enqueue_api import app
from enqueue_api.app import routes_jobs, validation
from job_worker.jobs.errors import PermanentJobError
from job_worker.jobs.github import GitHubClient
from job_worker.jobs.registered import RegisteredWorkspaceStore
from job_worker.processing import BatchWorker
from tests.conftest import GitWorkspaces, Stack, enqueue, make_job, register_workspace
from tests.integration.test_batch_enqueue import batch_event
from tests.integration.test_enqueue_api import Api, job_body, post_event, use_environment
from tests.integration.test_resume_api import resume_event
from tests.integration.test_workspace_api import put_event

ATTACKER = {"tenant_id": "mallory", "sub": "mallory-agent"}
VICTIM = {"tenant_id": "acme", "sub": "acme-agent"}


@pytest.fixture
def remotes_root(tmp_path: Path) -> Path:
    root = tmp_path / "remotes"
    (root / "acme").mkdir(parents=True)
    (root / "mallory").mkdir(parents=True)
    return root


@pytest.fixture
def api(stack: Stack, remotes_root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    """The API function with a remotes root and the template's token prefix, its tenants acme and mallory; acme's
    remote repo.git is there (the API refuses to register a remote it sees is missing)."""
    Repo.init_bare(str(remotes_root / "acme" / "repo.git"), mkdir=True).close()
    use_environment(monkeypatch, {**stack.env("EnqueueApiFunction"), "WORKSPACES_REMOTE_ROOT": str(remotes_root)})
    monkeypatch.setattr(app.metrics, "namespace", "AgentJobsTest")
    yield Api(stack)
    app.reset_services()


def register_body(remote: str, **overrides: Any) -> dict[str, Any]:
    return {"remoteUrl": remote, "branch": "agent/work", **overrides}


def put(api: Api, workspace_id: str, body: dict[str, Any], claims: dict[str, str] = VICTIM) -> Any:
    return api.invoke(put_event(workspace_id, body, claims=claims))


# ---- 1. a job's tenant is the workspace owner's: no jobs for a workspace nobody registered -----------------------


def test_enqueue_to_an_unregistered_workspace_is_404_and_records_nothing(api: Api) -> None:
    # Given mallory sends a job for a workspace acme will register later
    answer = api.invoke(post_event(job_body("planted", "acme-repo"), claims=ATTACKER), register=False)

    # Then it is refused, says to register first, and neither a record nor a message exists
    assert answer.status == 404
    assert "register it first with PUT /workspaces/acme-repo" in answer.body["message"]
    assert api.stack.job("planted") is None
    assert api.stack.queue_depth() == 0

    # And once acme registers the workspace, mallory's job is refused just the same (404), acme's accepted
    register_workspace(api.stack, "acme-repo", "acme")
    assert api.invoke(post_event(job_body("planted", "acme-repo"), claims=ATTACKER), register=False).status == 404
    assert api.invoke(post_event(job_body("own", "acme-repo"), claims=VICTIM), register=False).status == 202


def test_enqueue_batch_answers_404_per_job_of_an_unregistered_workspace(api: Api) -> None:
    register_workspace(api.stack, "mine", "mallory")
    body = {"jobs": [job_body("j-1", "mine"), job_body("j-2", "not-yet-registered")]}

    answer = api.invoke(batch_event(body, claims=ATTACKER), register=False)

    assert answer.status == 200
    results = answer.body["results"]
    assert [r["statusCode"] for r in results] == [202, 404]
    assert "PUT /workspaces/not-yet-registered" in results[1]["message"]
    assert api.stack.job("j-2") is None


@pytest.mark.parametrize("job_type", ["run_tests", "open_pr"])
def test_jobs_for_another_tenants_workspace_tell_nothing_of_its_registration(
    api: Api, remotes_root: Path, job_type: str
) -> None:
    # Given acme's workspace with one test suite and no GitHub repository
    body = register_body(f"{remotes_root}/acme/repo.git", testCommands={"unit": ["x"]})
    assert put(api, "acme-repo", body).status == 201

    # When mallory sends jobs that would not fit it (a suite it lacks, a pull request), and one that would, alone
    # and in a batch, and the same to a workspace nobody registered
    def answers(workspace_id: str) -> list[Any]:
        jobs = [
            job_body(
                "probe-1",
                workspace_id,
                type=job_type,
                payload={"suite": "e2e"} if job_type == "run_tests" else {"title": "t"},
            ),
            job_body("probe-2", workspace_id, type="run_tests", payload={"suite": "unit"}),
        ]
        single = [api.invoke(post_event(job, claims=ATTACKER), register=False) for job in jobs]
        batch = api.invoke(batch_event({"jobs": jobs}, claims=ATTACKER), register=False)
        return [(answer.status, answer.body) for answer in single] + [(batch.status, batch.body)]

    theirs, nobodys = answers("acme-repo"), answers("nobody-repo")

    # Then each is the 404 of a workspace nobody registered, word for word: never a word of acme's suites
    assert [status for status, _ in theirs] == [404, 404, 200]
    assert json.dumps(theirs).replace("acme-repo", "nobody-repo") == json.dumps(nobodys)
    assert api.stack.job("probe-1") is None


def test_producer_refuses_a_job_for_an_unregistered_workspace(stack: Stack) -> None:
    with pytest.raises(WorkspaceUnregisteredError, match="register it first"):
        enqueue_job(
            make_job("planted", "acme-repo"),
            "mallory",
            guard=stack.guard,
            sqs=stack.services.sqs,
            queue_url=stack.queue_url,
        )
    assert stack.job("planted") is None
    assert stack.queue_depth() == 0


# ---- 2. the worker refuses a message whose tenant is not the owner's ----------------------------------------------


def git_worker(stack: Stack, git: GitWorkspaces, tmp_path: Path) -> BatchWorker:
    registry = WorkspaceRegistry(stack.services.dynamodb, stack.table_name)
    store = RegisteredWorkspaceStore(registry, tmp_path / "cache", bounds=git.bounds())
    return BatchWorker(
        services=stack.services,
        workspaces=store,
        logger=Logger(service="agent-jobs-test"),
        metrics=Metrics(namespace="AgentJobsTest"),
    )


def test_worker_refuses_a_message_naming_another_tenant_without_halting_the_owner(
    stack: Stack, register_git_workspace: Any, sqs_fifo_record: Any, lambda_context: Any, tmp_path: Path
) -> None:
    # Given acme's registered workspace (no direct producers bound), and a message sent straight to the queue that
    # names mallory
    git = register_git_workspace(stack, "acme-repo", {"README.md": b"acme\n"}, tenant_id="acme")
    message = job_message(make_job("planted", "acme-repo"), "mallory")
    record = sqs_fifo_record("ws#acme-repo", message.model_dump(mode="json", by_alias=True), tenant_id="mallory")

    response = git_worker(stack, git, tmp_path).handle({"Records": [record]}, lambda_context())

    # Then it is refused with a reason naming both and recorded under the message's id for the operator alone (no
    # record of acme's): nothing reached the branch, acme's workspace runs on, and the jobId stays free for acme
    assert response == {"batchItemFailures": []}
    job = stack.item(f"msg#{record['messageId']}")
    assert job["status"] == JobStatus.REJECTED
    assert job["error"] == (
        "message names tenant mallory but workspace acme-repo belongs to another tenant: refused, nothing was applied"
    )
    assert (job["namedTenantId"], "tenantId" in job, "workspaceId" in job) == ("mallory", False, False)
    assert git.branch("acme-repo") == []
    assert stack.workspace("acme-repo")["state"] == "ACTIVE"
    assert stack.job("planted") is None
    (own,) = enqueue(stack, make_job("planted", "acme-repo"), tenant_id="acme")
    assert own.created


def test_a_bad_message_naming_another_tenant_takes_no_jobid_of_the_owner_and_halts_nothing(
    stack: Stack, register_git_workspace: Any, sqs_fifo_record: Any, lambda_context: Any, tmp_path: Path
) -> None:
    # Given acme's workspace, and a body that is no job, naming acme's next jobId, whose attribute names mallory
    git = register_git_workspace(stack, "acme-repo", {"README.md": b"acme\n"}, tenant_id="acme")
    record = sqs_fifo_record("ws#acme-repo", {"jobId": "acme-next", "not": "a job"}, tenant_id="mallory")

    response = git_worker(stack, git, tmp_path).handle({"Records": [record]}, lambda_context())

    # Then it is refused under its message id; neither tenant's acme-next is taken, acme's workspace runs on
    assert response == {"batchItemFailures": []}
    refused = stack.item(f"msg#{record['messageId']}")
    assert (refused["status"], refused["namedTenantId"]) == (JobStatus.REJECTED, "mallory")
    assert "belongs to another tenant" in refused["error"]
    assert stack.workspace("acme-repo")["state"] == "ACTIVE"
    assert stack.job("acme-next") is None
    (own,) = enqueue(stack, make_job("acme-next", "acme-repo"), tenant_id="acme")
    assert own.created


def test_the_owners_own_broken_message_still_halts_its_workspace(
    stack: Stack, register_git_workspace: Any, sqs_fifo_record: Any, lambda_context: Any, tmp_path: Path
) -> None:
    # Given acme's workspace, and a body that is no job, naming acme, from a sender acme may use (none bound)
    git = register_git_workspace(stack, "acme-repo", {"README.md": b"acme\n"}, tenant_id="acme")
    record = sqs_fifo_record("ws#acme-repo", {"jobId": "acme-bad", "not": "a job"}, tenant_id="acme")

    response = git_worker(stack, git, tmp_path).handle({"Records": [record]}, lambda_context())

    # Then it is acme's broken job: REJECTED under its jobId, and acme's workspace halted for acme to decide
    assert response == {"batchItemFailures": []}
    assert stack.job("acme-bad", "acme")["status"] == JobStatus.REJECTED
    workspace = stack.workspace("acme-repo")
    assert (workspace["state"], workspace["haltingJobId"]) == ("HALTED", "acme-bad")


def test_worker_gives_a_message_without_a_tenant_the_owners(
    stack: Stack, register_git_workspace: Any, sqs_fifo_record: Any, lambda_context: Any, tmp_path: Path
) -> None:
    git = register_git_workspace(stack, "acme-repo", {"README.md": b"acme\n"}, tenant_id="acme")
    body = job_message(make_job("direct", "acme-repo"), "acme").model_dump(mode="json", by_alias=True)
    del body["tenantId"]
    record = sqs_fifo_record("ws#acme-repo", body, tenant_id=None)

    assert git_worker(stack, git, tmp_path).handle({"Records": [record]}, lambda_context()) == {"batchItemFailures": []}

    job = stack.job("direct")
    assert (job["status"], job["tenantId"]) == (JobStatus.SUCCEEDED, "acme")
    assert git.branch("acme-repo") == ["direct"]


def test_a_rejection_never_overwrites_another_messages_rejected_record(stack: Stack) -> None:
    # Given acme's message rejected under its jobId
    assert stack.guard.reject(
        message_id="m-acme", job_id="j-1", workspace_id="ws-a", tenant_id="acme", reason="bad patch", body="{}"
    )
    # When mallory's message with the same jobId is rejected
    assert stack.guard.reject(
        message_id="m-mallory", job_id="j-1", workspace_id="ws-b", tenant_id="mallory", reason="evil", body="{!}"
    )
    # Then acme's record is untouched; mallory's is a record of mallory's own jobId
    job = stack.job("j-1", "acme")
    assert (job["tenantId"], job["error"], job["messageId"], job["body"]) == ("acme", "bad patch", "m-acme", "{}")
    assert stack.job("j-1", "mallory")["error"] == "evil"
    # And a second message of acme's jobId cannot take acme's record either: it goes under its own message id
    assert stack.guard.reject(
        message_id="m-other", job_id="j-1", workspace_id="ws-a", tenant_id="acme", reason="other", body="{?}"
    )
    assert stack.job("j-1", "acme")["messageId"] == "m-acme"
    assert stack.item("msg#m-other")["error"] == "other"


# ---- 3. secrets are bound to their tenant -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "token_parameter",
    [
        "ssm:/agent-jobs/mallory/github-token",  # another tenant's
        "ssm:/agent-jobs/github-token",  # the shared folder
        "ssm:/agent-jobs/acme",  # the folder itself
        "ssm:/agent-jobs/acme/../mallory/token",
        "ssm:/agent-jobs/acme//token",
        "ssm:/agent-jobs/acme/./token",
        "ssm:/other-prefix/acme/token",
        "ssm:agent-jobs/acme/token",  # not absolute
        "secretsmanager:agent-jobs/mallory/token",
        "secretsmanager:arn:aws:secretsmanager:us-east-1:123456789012:secret:agent-jobs/mallory/token-AbCdEf",
        "secretsmanager:/agent-jobs/acme/token",
    ],
)
def test_registering_a_token_outside_the_tenants_folder_is_422(
    api: Api, remotes_root: Path, token_parameter: str
) -> None:
    answer = put(api, "acme-repo", register_body(f"{remotes_root}/acme/repo.git", tokenParameter=token_parameter))

    assert answer.status == 422
    assert answer.field_errors()["tokenParameter"].startswith(
        "tokenParameter must name ssm:/agent-jobs/acme/... or secretsmanager:agent-jobs/acme/..."
    )
    assert api.stack.workspace("acme-repo") is None


@pytest.mark.parametrize("token_parameter", ["ssm:/agent-jobs/acme/github-token", "secretsmanager:agent-jobs/acme/gh"])
def test_registering_the_tenants_own_token_is_accepted(api: Api, remotes_root: Path, token_parameter: str) -> None:
    answer = put(api, "acme-repo", register_body(f"{remotes_root}/acme/repo.git", tokenParameter=token_parameter))
    assert answer.status == 201


def test_worker_never_reads_a_token_of_another_tenant(stack: Stack) -> None:
    # Given a registration stored before tokens were bound to tenants, naming mallory's token for acme's workspace
    registry = WorkspaceRegistry(stack.services.dynamodb, stack.table_name)
    registration = WorkspaceRegistration(
        remote_url="https://git.example.com/acme/repo.git",
        branch="agent/work",
        token_parameter="ssm:/agent-jobs/mallory/github-token",
    )
    registry.register("acme-repo", registration, "acme")
    read: list[str] = []

    def read_token(name: str) -> str:
        read.append(name)
        return "secret"

    store = RegisteredWorkspaceStore(registry, Path("/nonexistent"), tokens=read_token)

    with pytest.raises(PermanentJobError, match=r"ssm:/agent-jobs/acme/\.\.\. .*PUT /workspaces/acme-repo"):
        store.token("acme-repo")
    assert read == []


# ---- 4. file-system remotes are bound to their tenant -------------------------------------------------------------


def _escapes(remotes_root: Path) -> list[str]:
    return [
        f"{remotes_root}/mallory/repo.git",  # another tenant's
        "/etc/passwd",
        "/proc/self/root",
        f"{remotes_root}/acme/../mallory/repo.git",
        f"{remotes_root}/acme//repo.git",
        f"{remotes_root}/acme/./repo.git",
        f"{remotes_root}/acme",  # the tenant's root itself
        f"{remotes_root}/acme/",
        str(remotes_root),
        f"file://{remotes_root}/mallory/repo.git",
        f"file://{remotes_root}/acme/%2e%2e/mallory/repo.git",
        f"{remotes_root}/acme/escape/repo.git",  # a symlink out of the tenant's root
    ]


@pytest.mark.parametrize("index", range(12))
def test_registering_a_file_remote_outside_the_tenants_root_is_422(api: Api, remotes_root: Path, index: int) -> None:
    (remotes_root / "acme" / "escape").symlink_to(remotes_root / "mallory")
    remote = _escapes(remotes_root)[index]

    answer = put(api, "acme-repo", register_body(remote))

    assert answer.status == 422, remote
    assert f"remoteUrl must be a path under {remotes_root}/acme/" in answer.field_errors()["remoteUrl"]
    assert api.stack.workspace("acme-repo") is None


@pytest.mark.parametrize("remote", ["repo.git", "./repo.git", "../repo.git"])
def test_registering_a_relative_remote_is_422(api: Api, remote: str) -> None:
    assert put(api, "acme-repo", register_body(remote)).status == 422


def test_registering_a_file_remote_inside_the_tenants_root_is_accepted(api: Api, remotes_root: Path) -> None:
    (remotes_root / "acme" / "team" / "repo.git").mkdir(parents=True)
    Repo.init_bare(str(remotes_root / "acme" / "team" / "repo.git")).close()
    assert put(api, "a", register_body(f"{remotes_root}/acme/repo.git")).status == 201
    assert put(api, "b", register_body(f"file://{remotes_root}/acme/team/repo.git")).status == 201


def test_registering_tells_nothing_of_whether_another_tenants_remote_exists(api: Api, remotes_root: Path) -> None:
    # Given mallory's remote, and a name beside it that is no remote
    Repo.init_bare(str(remotes_root / "mallory" / "repo.git"), mkdir=True).close()

    # When acme registers each
    there = put(api, "acme-repo", register_body(f"{remotes_root}/mallory/repo.git"))
    not_there = put(api, "acme-repo", register_body(f"{remotes_root}/mallory/other.git"))

    # Then both are refused for lying outside acme's remotes, in the same words: never that one is missing
    assert (there.status, not_there.status) == (422, 422)
    assert there.body == not_there.body
    assert "does not exist" not in json.dumps(there.body)


def test_file_remotes_are_refused_without_a_remotes_root(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKSPACES_REMOTE_ROOT", "")
    app.reset_services()

    answer = put(api, "acme-repo", register_body("/mnt/remotes/acme/repo.git"))

    assert answer.status == 422
    message = answer.field_errors()["remoteUrl"]
    assert "file-system remotes are not enabled" in message
    assert "WorkspacesRemoteRoot" in message


def test_worker_refuses_a_remote_that_a_symlink_leads_out_of_the_tenants_root(stack: Stack, remotes_root: Path) -> None:
    # Given acme's registration inside its root, and later a symlink there that leads to mallory's remote
    (remotes_root / "mallory" / "repo.git").mkdir()
    registry = WorkspaceRegistry(stack.services.dynamodb, stack.table_name)
    registry.register(
        "acme-repo", WorkspaceRegistration(remote_url=f"{remotes_root}/acme/repo.git", branch="agent/work"), "acme"
    )
    os.symlink(remotes_root / "mallory" / "repo.git", remotes_root / "acme" / "repo.git")
    store = RegisteredWorkspaceStore(
        registry, remotes_root.parent / "cache", bounds=TenantBounds(remote_root=str(remotes_root))
    )

    with pytest.raises(PermanentJobError, match="symbolic link"):
        store.open("acme-repo")


def test_worker_refuses_a_remote_whose_alternates_borrow_another_tenants_objects(
    stack: Stack, remotes_root: Path
) -> None:
    # Given mallory's registered remote inside mallory's root, whose objects/info/alternates and main name acme's
    from dulwich.repo import Repo

    from tests.git.conftest import commit_files

    acme = remotes_root / "acme" / "secret.git"
    Repo.init_bare(str(acme), mkdir=True).close()
    commit_files(acme, "main", {"key.pem": b"acme's key\n"}, "secret\n")
    evil = remotes_root / "mallory" / "evil.git"
    Repo.init_bare(str(evil), mkdir=True).close()
    (evil / "objects" / "info" / "alternates").write_text(f"{acme / 'objects'}\n")
    (evil / "refs" / "heads" / "main").write_text((acme / "refs" / "heads" / "main").read_text())
    registry = WorkspaceRegistry(stack.services.dynamodb, stack.table_name)
    registry.register("evil", WorkspaceRegistration(remote_url=str(evil), branch="agent/work"), "mallory")
    store = RegisteredWorkspaceStore(
        registry, remotes_root.parent / "cache", bounds=TenantBounds(remote_root=str(remotes_root))
    )

    # When a job of mallory's workspace reads it, it is refused before anything of acme's is read
    with pytest.raises(PermanentJobError, match=r"reaches outside .*/mallory/ \(this tenant's remotes\)"):
        store.open("evil").head()


# ---- 5. no hosts inside the deployment's network ------------------------------------------------------------------

PRIVATE_URLS = [
    "https://169.254.169.254/latest",  # the instance metadata service
    "https://[fd00:ec2::254]/",
    "https://127.0.0.1/api/v3",
    "https://127.1/api/v3",  # resolves to loopback
    "https://[::1]/",
    "https://[::ffff:127.0.0.1]/",
    "https://[::ffff:10.0.0.1]/",
    "https://10.1.2.3/",
    "https://172.16.0.1/",
    "https://192.168.1.1/",
    "https://100.64.0.1/",  # carrier-grade NAT
    "https://0.0.0.0/",
    "https://224.0.0.1/",
    "https://240.0.0.1/",
    "https://[fe80::1]/",
    "https://localhost/",
    "https://api.localhost/",
    "http://127.0.0.1:8080/",  # http, not allowed
]


@pytest.mark.parametrize("url", PRIVATE_URLS)
def test_registering_a_private_github_api_url_is_422(api: Api, remotes_root: Path, url: str) -> None:
    answer = put(api, "acme-repo", register_body(f"{remotes_root}/acme/repo.git", githubApiUrl=url))
    assert answer.status == 422, url
    assert "githubApiUrl" in answer.field_errors()


@pytest.mark.parametrize("url", PRIVATE_URLS[:12])
def test_registering_a_private_https_remote_is_422(api: Api, url: str) -> None:
    answer = put(api, "acme-repo", register_body(url.replace("http://", "https://") + "acme/repo.git"))
    assert answer.status == 422, url
    assert "must name a public host" in answer.field_errors()["remoteUrl"]


def test_registering_a_name_that_resolves_to_a_private_address_is_422(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("agent_jobs.tenancy.resolve_host", lambda host, port: ["93.184.216.34", "10.0.0.7"])

    answer = put(api, "acme-repo", register_body("https://git.internal.example/acme/repo.git"))

    assert answer.status == 422
    assert "resolves to 10.0.0.7" in answer.field_errors()["remoteUrl"]


def test_a_host_of_allowed_private_hosts_may_be_registered(
    api: Api, remotes_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ALLOWED_PRIVATE_HOSTS", "127.0.0.1:8080")
    app.reset_services()
    body = register_body(f"{remotes_root}/acme/repo.git", githubApiUrl="http://127.0.0.1:8080")
    assert put(api, "acme-repo", body).status == 201
    assert put(api, "acme-two", {**body, "githubApiUrl": "http://127.0.0.1:8081"}).status == 422


def test_github_client_checks_the_host_again_right_before_it_connects(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a name that resolved to a public address at registration and resolves to the metadata service now
    monkeypatch.setattr("agent_jobs.tenancy.resolve_host", lambda host, port: ["169.254.169.254"])
    bounds = TenantBounds()
    client = GitHubClient(
        "token", api_url="https://ghe.example.com/api/v3", host_check=lambda url: bounds.host_error(url, "githubApiUrl")
    )

    with pytest.raises(PermanentJobError, match=r"169\.254\.169\.254"):
        client.open_pull_request("acme", "repo", head="agent/work", base="main", title="t", body="")


def test_the_git_transport_checks_an_https_remote_again_right_before_use(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = WorkspaceRegistry(stack.services.dynamodb, stack.table_name)
    registry.register(
        "acme-repo", WorkspaceRegistration(remote_url="https://git.example.com/acme/repo.git", branch="agent/w"), "acme"
    )
    monkeypatch.setattr("agent_jobs.tenancy.resolve_host", lambda host, port: ["127.0.0.1"])
    store = RegisteredWorkspaceStore(registry, Path("/nonexistent"), tokens=lambda name: "x")

    with pytest.raises(PermanentJobError, match="loopback"):
        store.open("acme-repo")


@pytest.mark.parametrize(
    ("address", "public"),
    [("8.8.8.8", True), ("2606:4700::1111", True), ("::ffff:169.254.169.254", False), ("2002:7f00:1::", False)],
)
def test_embedded_ipv4_addresses_are_judged_by_the_address_inside(address: str, public: bool) -> None:
    assert (non_public_reason(address) is None) is public


# ---- 6. bounded answers -------------------------------------------------------------------------------------------


def _with_unknown_keys(document: dict[str, Any], keys: int) -> str:
    return json.dumps(document)[:-1] + "".join(f',"k{n}":0' for n in range(keys)) + "}"


@pytest.mark.parametrize("route", ["job", "batch", "batch job", "workspace", "resume"])
def test_a_body_with_200000_unknown_keys_gets_a_small_422(
    api: Api, route: str, remotes_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a body of about 2.6 MB whose every key but the expected ones is unknown
    keys = 200_000
    document = {
        "job": job_body("j-1", "acme-repo"),
        "batch": {"jobs": [job_body("j-1", "acme-repo")]},
        "batch job": job_body("j-1", "acme-repo"),
        "workspace": register_body(f"{remotes_root}/acme/repo.git"),
        "resume": {"decision": "retry", "haltingJobId": "j-1"},
    }[route]
    raw = _with_unknown_keys(document, keys)
    if route == "job":
        event = post_event(raw=raw, claims=VICTIM)
    elif route == "batch":
        event = batch_event(None, raw=raw, claims=VICTIM)
    elif route == "batch job":
        event = batch_event(None, raw='{"jobs": [' + raw + "]}", claims=VICTIM)
    elif route == "workspace":
        event = put_event("acme-repo", raw=raw, claims=VICTIM)
    else:
        event = resume_event("acme-repo", None, claims={**VICTIM, "scope": app.OPERATOR_SCOPE})
        event["body"] = raw

    described: list[Any] = []  # the field errors the API put into words
    describe = validation._body_errors

    def counted(detail: Any, document: Any) -> list[dict[str, str]]:
        described.append(detail)
        return describe(detail, document)

    monkeypatch.setattr(validation, "_body_errors", counted)

    started = time.process_time()
    answer = api.invoke(event, register=False)
    cpu = time.process_time() - started
    size = len(json.dumps(answer.body))
    print(f"{route}: a {len(raw):,}-byte body of {keys:,} unknown keys got a {size:,}-byte 422 in {cpu:.2f} s of CPU")

    # Then the answer lists MAX_FIELD_ERRORS of them and counts the rest
    assert answer.status == 422
    assert size < 10_000
    assert len(answer.body["errors"]) == app.MAX_FIELD_ERRORS
    assert answer.body["moreErrors"] == keys - app.MAX_FIELD_ERRORS
    assert len(described) <= app.MAX_FIELD_ERRORS  # the rest are counted, not described


def test_a_registration_too_large_for_a_workspace_item_is_refused_not_retried(api: Api, remotes_root: Path) -> None:
    # Given a registration of about 1 MB of test commands: 20 commands of 50 arguments of 1,000 characters, each within
    # its own limits, but more than a DynamoDB item (400 KB) holds
    commands = {f"suite-{n}": [f"{n:02}" + "x" * 998] * 50 for n in range(20)}
    body = register_body(f"{remotes_root}/acme/repo.git", testCommands=commands)

    answer = put(api, "acme-repo", body)

    # Then it is refused for good, naming the limit: a 503 would have the client retry it forever
    assert answer.status == 422, answer.body
    assert answer.body["errors"] == [
        {
            "field": "testCommands",
            "message": f"the test commands hold 1,000,000 bytes; the limit is {MAX_TEST_COMMANDS_BYTES:,} bytes of "
            "arguments in all (a registration is stored as one DynamoDB item, at most 400 KB): register shorter "
            "commands, e.g. a script in the repository that runs the suite",
        }
    ]
    assert api.stack.workspace("acme-repo") is None
    # One of exactly the limit is registered
    within = {"a": ["x" * 1000] * 50, "b": ["x" * 1000] * 15 + ["x" * (MAX_TEST_COMMANDS_BYTES - 65_000)]}
    assert put(api, "acme-repo", register_body(f"{remotes_root}/acme/repo.git", testCommands=within)).status == 201


SIZE_MESSAGE = "Item size has exceeded the maximum allowed size"
SIZE_ERRORS = {
    "write": {"Error": {"Code": "ValidationException", "Message": SIZE_MESSAGE}},
    "transaction": {
        "Error": {"Code": "TransactionCanceledException", "Message": "Transaction cancelled [ValidationError, None]"},
        "CancellationReasons": [{"Code": "ValidationError", "Message": SIZE_MESSAGE}, {"Code": "None"}],
    },
}


@pytest.mark.parametrize("refusal", sorted(SIZE_ERRORS))
@pytest.mark.parametrize("route", ["job", "workspace"])
def test_a_write_refused_for_the_item_size_is_a_413_never_a_503(
    api: Api, route: str, refusal: str, remotes_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a store that refuses the request's write for its size, as DynamoDB does above 400 KB (a single write
    # with a ValidationException, a transaction by cancelling it with a ValidationError reason)
    def too_large(*args: Any, **kwargs: Any) -> Any:
        raise ClientError(SIZE_ERRORS[refusal], "TransactWriteItems")  # type: ignore[arg-type]

    register_workspace(api.stack, "acme-repo", "acme")
    monkeypatch.setattr(WorkspaceRegistry, "register", too_large)
    monkeypatch.setattr(routes_jobs, "enqueue_job", too_large)
    if route == "job":
        answer = api.invoke(post_event(job_body("j-1", "acme-repo"), claims=VICTIM), register=False)
    else:
        answer = put(api, "acme-repo", register_body(f"{remotes_root}/acme/repo.git"))

    # Then the client is told to send less, not to retry the same request
    assert answer.status == 413
    assert "400 KB" in answer.body["message"]
    assert "Retry-After" not in answer.headers


@pytest.mark.parametrize(
    ("env", "limit"),
    [
        ({"PATCH_MAX_BYTES": "1024"}, "the limit is 1024 bytes (PATCH_MAX_BYTES)"),
        ({"PATCH_MAX_HUNKS": "2"}, "the patch has 3 hunks; the limit is 2 (PATCH_MAX_HUNKS)"),
    ],
)
@pytest.mark.parametrize("route", ["job", "batch"])
def test_a_patch_over_a_limit_is_refused_at_enqueue(
    api: Api, route: str, env: dict[str, str], limit: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a patch of 3 hunks and over 1 KiB, which the worker would refuse with these limits
    use_environment(monkeypatch, env)
    hunks = [f"@@ -{n},1 +{n},1 @@\n-{'x' * 200} {n}\n+{'y' * 200} {n}\n" for n in (1, 3, 5)]
    patch = "--- a/f.txt\n+++ b/f.txt\n" + "".join(hunks)
    job = job_body("j-1", "acme-repo", payload={"patch": patch, "commitMessage": "change"})
    register_workspace(api.stack, "acme-repo", "acme")

    if route == "job":
        answer = api.invoke(post_event(job, claims=VICTIM), register=False)
    else:
        answer = api.invoke(batch_event({"jobs": [job_body("j-0", "acme-repo"), job]}, claims=VICTIM), register=False)

    # Then the job is refused naming the limit, and nothing is accepted or queued
    assert answer.status == 422, answer.body
    [error] = answer.body["errors"]
    assert error["field"] == ("payload.patch" if route == "job" else "jobs.1.payload.patch")
    assert limit in error["message"]
    assert api.stack.job("j-1") is None
    assert api.drain() == []


@pytest.mark.parametrize("character", ["\ufffe", "\uffff"])
def test_a_character_the_queue_refuses_is_a_400_not_a_503(api: Api, character: str) -> None:
    # Given a patch holding a character SQS refuses in a message body (JSON escapes the others it refuses)
    register_workspace(api.stack, "acme-repo", "acme")
    patch = f"--- a/f.txt\n+++ b/f.txt\n@@ -0,0 +1 @@\n+{character}\n"
    job = job_body("j-1", "acme-repo", payload={"patch": patch, "commitMessage": "change"})

    answer = api.invoke(post_event(job, claims=VICTIM), register=False)

    # Then it is refused for good, before anything is recorded: the queue would refuse it on every retry
    assert answer.status == 400
    assert "U+FFFE or U+FFFF" in answer.body["message"]
    assert api.stack.job("j-1") is None
    assert api.drain() == []


# ---- 7. a workspace quota per tenant ------------------------------------------------------------------------------


def test_a_first_registration_beyond_the_quota_is_429_and_updates_still_pass(
    api: Api, remotes_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MAX_WORKSPACES_PER_TENANT", "2")
    app.reset_services()
    body = register_body(f"{remotes_root}/acme/repo.git")
    assert [put(api, ws, body).status for ws in ("one", "two")] == [201, 201]

    refused = put(api, "three", body)

    assert refused.status == 429
    assert "MaxWorkspacesPerTenant = 2" in refused.body["message"]
    assert api.stack.workspace("three") is None
    assert put(api, "two", {**body, "branch": "agent/other"}).status == 200  # an update does not count
    assert put(api, "three", body, claims=ATTACKER).status == 422  # another tenant has its own count (and root)


def test_concurrent_first_registrations_never_pass_the_quota(stack: Stack) -> None:
    registry = WorkspaceRegistry(stack.services.dynamodb, stack.table_name, max_workspaces_per_tenant=3)
    registration = WorkspaceRegistration(remote_url="https://git.example.com/acme/r.git", branch="agent/w")
    outcomes: list[str] = []

    def register(workspace_id: str) -> None:
        for _ in range(20):  # a transaction that collides with another is cancelled without a verdict: try again
            try:
                registry.register(workspace_id, registration, "acme")
            except WorkspaceQuotaError:
                outcomes.append("refused")
            except Exception as error:  # TransactionConflict
                if "TransactionConflict" not in str(error) and "TransactionCanceled" not in str(error):
                    raise
                continue
            else:
                outcomes.append("created")
            return

    threads = [threading.Thread(target=register, args=(f"ws-{n}",)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert outcomes.count("created") == 3
    assert outcomes.count("refused") == 5
    assert stack.item("tenant#acme")["workspaceCount"] == 3
