"""Workspace registration: the model's rules, and the registry on the workspace item (moto in-process, the table
created from template.yaml)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from agent_jobs.guard import ClaimOutcome, JobGuard
from agent_jobs.models import WorkspaceState
from agent_jobs.registration import GITHUB_API_URL, RegisteredWorkspace, WorkspaceRegistration
from agent_jobs.workspaces import WorkspaceOwnedElsewhereError, WorkspaceRegistry
from tests.conftest import ManualClock, Stack, make_message


def registration(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "remoteUrl": "/srv/git/repo-alpha.git",
        "branch": "agent/repo-alpha",
        "testCommands": {"unit": ["python", "-m", "pytest", "-q"]},
    }
    body.update(overrides)
    return body


def refused_fields(body: dict[str, Any]) -> dict[str, str]:
    """The camelCase field paths the model refuses, with their messages."""
    with pytest.raises(ValidationError) as caught:
        WorkspaceRegistration.model_validate(body)
    return {".".join(str(part) for part in error["loc"]): error["msg"] for error in caught.value.errors()}


# ---- the model: accepted -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "remote_url",
    [
        "/srv/git/repo-alpha.git",
        "file:///srv/git/repo-alpha.git",
        "file://localhost/srv/git/repo-alpha.git",
        "https://github.com/acme/repo-alpha.git",
        "https://git.example.com:8443/acme/repo-alpha",
    ],
)
def test_registration_accepts_local_paths_file_and_https_urls(remote_url: str) -> None:
    assert WorkspaceRegistration.model_validate(registration(remoteUrl=remote_url)).remote_url == remote_url


def test_registration_defaults() -> None:
    parsed = WorkspaceRegistration.model_validate({"remoteUrl": "/srv/git/r.git", "branch": "agent/r"})

    assert parsed.base_branch == "main"
    assert parsed.test_commands == {}
    assert (parsed.token_parameter, parsed.github_repository, parsed.github_api_url) == (None, None, None)
    assert parsed.effective_github_api_url == GITHUB_API_URL


def test_registration_with_every_field_round_trips_by_alias() -> None:
    body = registration(
        baseBranch="release/2.x",
        tokenParameter="secretsmanager:arn:aws:secretsmanager:us-east-1:123456789012:secret:gh-token-AbCdEf",
        githubRepository="acme/repo-alpha",
        githubApiUrl="https://github.example.com/api/v3",
        directProducers=["AROAEXAMPLEPRODUCER01:session", "AIDAEXAMPLEPRODUCER01"],
    )

    parsed = WorkspaceRegistration.model_validate(body)

    assert parsed.model_dump(by_alias=True) == body
    assert parsed.effective_github_api_url == "https://github.example.com/api/v3"
    assert WorkspaceRegistration.model_validate(registration(tokenParameter="ssm:/agent-jobs/github-token"))


# ---- the model: each rule refused, naming the field ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "field", "fragment"),
    [
        ({"remoteUrl": "ssh://git@github.com/acme/r.git"}, "remoteUrl", "file:// URL or an https:// URL"),
        ({"remoteUrl": "git@github.com:acme/r.git"}, "remoteUrl", "absolute local path"),
        ({"remoteUrl": "http://git.example.com/r.git"}, "remoteUrl", "http"),
        ({"remoteUrl": "relative/path.git"}, "remoteUrl", "absolute local path"),
        ({"remoteUrl": "https://user:secret@github.com/acme/r.git"}, "remoteUrl", "credentials"),
        ({"remoteUrl": "https://ghp_token@github.com/acme/r.git"}, "remoteUrl", "tokenParameter"),
        ({"remoteUrl": "https://github.com/acme/r.git?access_token=x"}, "remoteUrl", "query"),
        ({"remoteUrl": "https:///no-host"}, "remoteUrl", "host"),
        ({"remoteUrl": "file://otherhost/srv/r.git"}, "remoteUrl", "file:///"),
        ({"remoteUrl": "/srv/git/r.git\n--upload-pack=x"}, "remoteUrl", "control characters"),
        ({"remoteUrl": ""}, "remoteUrl", "at least 1"),
        ({"remoteUrl": "/" + "r" * 2048}, "remoteUrl", "at most 2048"),
        ({"branch": ""}, "branch", "at least 1"),
        ({"branch": "b" * 201}, "branch", "at most 200"),
        ({"branch": "-force"}, "branch", "pattern"),
        ({"branch": "agent branch"}, "branch", "pattern"),
        ({"branch": "agent/../main"}, "branch", "'..'"),
        ({"branch": "agent/x.lock"}, "branch", ".lock"),
        ({"branch": "agent/"}, "branch", "'/'"),
        ({"branch": "agent//x"}, "branch", "'//'"),
        ({"branch": "agent/.hidden"}, "branch", "start with '.'"),
        ({"branch": "HEAD"}, "branch", "HEAD"),
        ({"baseBranch": "main..x"}, "baseBranch", "'..'"),
        ({"baseBranch": "agent/repo-alpha"}, "baseBranch", "differ"),
        ({"branch": "main"}, "baseBranch", "differ"),
        ({"testCommands": {"unit": []}}, "testCommands.unit", "at least 1"),
        ({"testCommands": {"unit": ["python", ""]}}, "testCommands.unit.1", "at least 1"),
        ({"testCommands": {"unit": ["x" * 1001]}}, "testCommands.unit.0", "at most 1000"),
        ({"testCommands": {"unit": ["a"] * 51}}, "testCommands.unit", "at most 50"),
        ({"testCommands": {"unit": ["py\x00thon"]}}, "testCommands.unit.0", "NUL"),
        ({"testCommands": {"unit": "python -m pytest"}}, "testCommands.unit", "list"),
        ({"testCommands": {"bad name": ["python"]}}, "testCommands.bad name.[key]", "pattern"),
        ({"testCommands": {"n" * 65: ["python"]}}, f"testCommands.{'n' * 65}.[key]", "at most 64"),
        ({"testCommands": {f"c{i}": ["true"] for i in range(21)}}, "testCommands", "at most 20"),
        ({"tokenParameter": "vault:secret/gh"}, "tokenParameter", "ssm:<parameter name>"),
        ({"tokenParameter": "ssm:"}, "tokenParameter", "secretsmanager:"),
        ({"tokenParameter": "ghp_plaintexttoken"}, "tokenParameter", "ssm:"),
        ({"githubRepository": "acme"}, "githubRepository", "pattern"),
        ({"githubRepository": "acme/repo/extra"}, "githubRepository", "pattern"),
        ({"githubApiUrl": "http://github.example.com/api/v3"}, "githubApiUrl", "https://"),
        ({"githubApiUrl": "https://u:p@github.example.com/api/v3"}, "githubApiUrl", "credentials"),
        ({"githubApiUrl": "http://127.0.0.1.example.com/api"}, "githubApiUrl", "https://"),
        ({"githubApiUrl": "http://10.0.0.5:8080/api"}, "githubApiUrl", "loopback"),
        ({"tenantId": "tenant-b"}, "tenantId", "Extra inputs"),
        ({"remote_url": "/srv/git/r.git", "remoteUrl": "/srv/git/r.git"}, "remote_url", "Extra inputs"),
    ],
)
def test_registration_refuses_each_rule_naming_the_field(overrides: dict[str, Any], field: str, fragment: str) -> None:
    errors = refused_fields(registration(**overrides))

    assert set(errors) == {field}
    assert fragment in errors[field]


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080", "http://localhost:9000/api/v3", "http://[::1]:8080"])
def test_registration_accepts_plain_http_github_api_only_on_loopback(url: str) -> None:
    assert WorkspaceRegistration.model_validate(registration(githubApiUrl=url)).github_api_url == url


def test_registration_requires_remote_url_and_branch() -> None:
    assert set(refused_fields({})) == {"remoteUrl", "branch"}


# ---- the registry --------------------------------------------------------------------------------------------------


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def registry(stack: Stack, clock: ManualClock) -> WorkspaceRegistry:
    return WorkspaceRegistry(stack.services.dynamodb, stack.table_name, clock=clock)


def register(registry: WorkspaceRegistry, tenant: str = "tenant-a", workspace_id: str = "repo-alpha", **kw: Any):
    return registry.register(workspace_id, WorkspaceRegistration.model_validate(registration(**kw)), tenant)


def test_register_new_workspace_is_created_and_read_back(
    registry: WorkspaceRegistry, stack: Stack, clock: ManualClock
) -> None:
    outcome = register(registry)

    assert outcome.created is True
    assert outcome.workspace.registered_at == clock.now
    stored = registry.get("repo-alpha")
    assert stored == RegisteredWorkspace(
        "repo-alpha", "tenant-a", WorkspaceRegistration.model_validate(registration()), clock.now
    )
    assert stored == outcome.workspace
    item = stack.item("ws#repo-alpha")
    assert item["testCommands"] == {"unit": ["python", "-m", "pytest", "-q"]}
    assert (item["workspaceId"], item["tenantId"], item["baseBranch"]) == ("repo-alpha", "tenant-a", "main")


def test_register_again_updates_and_keeps_the_first_registration_time(
    registry: WorkspaceRegistry, stack: Stack, clock: ManualClock
) -> None:
    first = register(registry)
    clock.advance(60)

    again = register(registry, branch="agent/other", testCommands={"lint": ["ruff", "check", "."]})

    assert again.created is False
    assert again.workspace.registered_at == first.workspace.registered_at
    stored = registry.get("repo-alpha")
    assert stored is not None
    assert stored.registration.branch == "agent/other"
    assert stored.registration.test_commands == {"lint": ["ruff", "check", "."]}
    assert stack.item("ws#repo-alpha")["updatedAt"] == clock.now


def test_register_removes_optional_fields_no_longer_given(registry: WorkspaceRegistry, stack: Stack) -> None:
    register(
        registry,
        tokenParameter="ssm:/agent-jobs/github-token",
        githubRepository="acme/repo-alpha",
        githubApiUrl="https://github.example.com/api/v3",
    )
    assert {"tokenParameter", "githubRepository", "githubApiUrl"} <= set(stack.item("ws#repo-alpha"))

    register(registry)

    item = stack.item("ws#repo-alpha")
    assert not {"tokenParameter", "githubRepository", "githubApiUrl"} & set(item)
    stored = registry.get("repo-alpha")
    assert stored is not None
    assert (stored.registration.token_parameter, stored.registration.github_repository) == (None, None)


def test_register_another_tenants_workspace_is_refused_and_writes_nothing(
    registry: WorkspaceRegistry, stack: Stack
) -> None:
    register(registry, tenant="tenant-a")
    before = stack.item("ws#repo-alpha")

    with pytest.raises(WorkspaceOwnedElsewhereError) as refused:
        register(registry, tenant="tenant-b", remoteUrl="https://github.com/evil/fork.git")

    assert "tenant-a" not in str(refused.value)
    assert "another tenant" in str(refused.value)
    assert stack.item("ws#repo-alpha") == before


def test_register_keeps_the_halt_state_the_guard_wrote(registry: WorkspaceRegistry, stack: Stack) -> None:
    # Given a workspace the guard halted for one of tenant-a's jobs before it was registered
    stack.guard.halt_workspace("repo-alpha", tenant_id="tenant-a", job_id="job-7", reason="job job-7 is DEAD")
    halted = stack.item("ws#repo-alpha")
    assert registry.get("repo-alpha") is None  # halt state alone is not a registration

    outcome = register(registry, tenant="tenant-a")

    assert outcome.created is True
    item = stack.item("ws#repo-alpha")
    for attribute in ("state", "haltingJobId", "haltReason", "haltedAt"):
        assert item[attribute] == halted[attribute], attribute
    status = registry.status("repo-alpha")
    assert status is not None
    assert status.state is WorkspaceState.HALTED
    assert (status.halting_job_id, status.halt_reason) == ("job-7", "job job-7 is DEAD")
    assert status.registered == outcome.workspace


def test_register_a_workspace_halted_for_another_tenant_is_refused(registry: WorkspaceRegistry, stack: Stack) -> None:
    stack.guard.halt_workspace("repo-alpha", tenant_id="tenant-a", job_id="job-7", reason="dead")

    with pytest.raises(WorkspaceOwnedElsewhereError):
        register(registry, tenant="tenant-b")

    assert "remoteUrl" not in stack.item("ws#repo-alpha")


def test_guard_halting_a_registered_workspace_keeps_the_registration(registry: WorkspaceRegistry, stack: Stack) -> None:
    outcome = register(registry)

    JobGuard(stack.services.dynamodb, stack.table_name).halt_workspace(
        "repo-alpha", tenant_id="tenant-a", job_id="job-9", reason="rejected: bad message"
    )

    assert registry.get("repo-alpha") == outcome.workspace
    status = registry.status("repo-alpha")
    assert status is not None
    assert status.state is WorkspaceState.HALTED


def test_jobs_of_a_registered_workspace_can_be_claimed(registry: WorkspaceRegistry, stack: Stack) -> None:
    # The guard's claim refuses a workspace item whose state is not ACTIVE: registering must not look like a halt
    register(registry, tenant="tenant-1")

    result = stack.guard.claim(make_message("j1", "repo-alpha"), message_id="m-1", sequence_number="1", remaining_ms=1)

    assert result.outcome is ClaimOutcome.CLAIMED
    assert stack.item("ws#repo-alpha")["state"] == WorkspaceState.ACTIVE


def test_get_unknown_workspace_is_none(registry: WorkspaceRegistry) -> None:
    assert registry.get("nope") is None
    assert registry.status("nope") is None


def test_status_of_a_registered_workspace_is_active(registry: WorkspaceRegistry) -> None:
    register(registry)

    status = registry.status("repo-alpha")

    assert status is not None
    assert (status.state, status.tenant_id, status.halting_job_id) == (WorkspaceState.ACTIVE, "tenant-a", None)
