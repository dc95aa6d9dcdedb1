"""The producer API's workspace routes (`PUT` and `GET /workspaces/{workspaceId}`) driven through the Lambda handler
with HTTP API (payload 2.0) events, against the table of template.yaml in moto (in-process and moto's server)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dulwich.repo import Repo

from agent_jobs.models import WorkspaceState
from enqueue_api import app
from tests.conftest import Stack
from tests.integration.test_enqueue_api import (
    Api,
    ApiResponse,
    _with_claims,
    load_event,
    use_environment,
    without_authorizer,
)

REGISTRATION_FIELDS = set(app.PUBLIC_WORKSPACE_FIELDS)
# The API's WORKSPACES_REMOTE_ROOT here: a tenant's file-system remotes lie in REMOTES_ROOT/<tenantId>.
REMOTES_ROOT = "/srv/git"
STATUS_FIELDS = REGISTRATION_FIELDS | set(app.PUBLIC_WORKSPACE_STATE_FIELDS)


def registration(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "remoteUrl": "/srv/git/tenant-demo/repo-alpha.git",
        "branch": "agent/repo-alpha",
        "testCommands": {"unit": ["python", "-m", "pytest", "-q"]},
    }
    body.update(overrides)
    return body


def _at_workspace(event: dict[str, Any], workspace_id: str, method: str) -> dict[str, Any]:
    event["requestContext"]["requestId"] = uuid.uuid4().hex
    event["routeKey"] = event["requestContext"]["routeKey"] = f"{method} /workspaces/{{workspaceId}}"
    event["requestContext"]["http"]["method"] = method
    event["rawPath"] = event["requestContext"]["http"]["path"] = f"/workspaces/{workspace_id}"
    event["pathParameters"] = {"workspaceId": workspace_id}
    return event


def put_event(
    workspace_id: str = "repo-alpha",
    body: Any = None,
    *,
    raw: str | None = None,
    claims: dict[str, str] | None = None,
    content_type: str = "application/json",
) -> dict[str, Any]:
    """events/http_put_workspace.json for another workspace (as it appears in the URL path), body and claims."""
    event = _at_workspace(load_event("http_put_workspace.json"), workspace_id, "PUT")
    if body is None:  # the tenant's own remote, in its folder of the remotes root
        tenant = (claims or {}).get("tenant_id", "tenant-demo")
        body = registration(remoteUrl=f"{REMOTES_ROOT}/{tenant}/repo-alpha.git")
    text = raw if raw is not None else json.dumps(body)
    event["headers"]["content-length"] = str(len(text.encode("utf-8", "surrogatepass")))
    event["headers"]["content-type"] = content_type
    event["body"] = text
    return _with_claims(event, claims)


def get_event(workspace_id: str = "repo-alpha", *, claims: dict[str, str] | None = None) -> dict[str, Any]:
    """events/http_get_job.json turned into `GET /workspaces/{workspaceId}`."""
    return _with_claims(_at_workspace(load_event("http_get_job.json"), workspace_id, "GET"), claims)


class WorkspaceApi(Api):
    def put(self, workspace_id: str = "repo-alpha", body: Any = None, **kwargs: Any) -> ApiResponse:
        return self.invoke(put_event(workspace_id, body, **kwargs))

    def read(self, workspace_id: str = "repo-alpha", **kwargs: Any) -> ApiResponse:
        return self.invoke(get_event(workspace_id, **kwargs))


@pytest.fixture
def api(any_stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[WorkspaceApi]:
    """The function's environment from the stack (as template.yaml sets it), and no services cached from before."""
    use_environment(monkeypatch, {**any_stack.env("EnqueueApiFunction"), "WORKSPACES_REMOTE_ROOT": REMOTES_ROOT})
    monkeypatch.setattr(app.metrics, "namespace", "AgentJobsTest")
    yield WorkspaceApi(any_stack)
    app.reset_services()


# ---- PUT /workspaces/{workspaceId} ---------------------------------------------------------------------------------


def test_register_workspace_is_201_then_200(api: WorkspaceApi) -> None:
    created = api.put(body=registration())
    updated = api.put(body=registration(branch="agent/second", githubRepository="acme/repo-alpha"))

    assert created.status == 201
    assert created.headers["Location"] == "/workspaces/repo-alpha"
    assert set(created.body) == REGISTRATION_FIELDS
    assert created.body == {
        "workspaceId": "repo-alpha",
        "tenantId": "tenant-demo",
        "remoteUrl": "/srv/git/tenant-demo/repo-alpha.git",
        "branch": "agent/repo-alpha",
        "baseBranch": "main",
        "testCommands": {"unit": ["python", "-m", "pytest", "-q"]},
        "tokenParameter": None,
        "githubRepository": None,
        "githubApiUrl": None,
        "directProducers": None,
        "registeredAt": created.body["registeredAt"],
    }
    assert isinstance(created.body["registeredAt"], int)
    assert updated.status == 200
    assert updated.body["branch"] == "agent/second"
    assert updated.body["githubRepository"] == "acme/repo-alpha"
    assert updated.body["registeredAt"] == created.body["registeredAt"]
    item = api.stack.item("ws#repo-alpha")
    assert (item["tenantId"], item["branch"], item["githubRepository"]) == (
        "tenant-demo",
        "agent/second",
        "acme/repo-alpha",
    )


def test_register_workspace_takes_the_tenant_from_jwt_claims(api: WorkspaceApi) -> None:
    response = api.put(claims={"sub": "agent-7", "tenant_id": "acme"})

    assert response.status == 201
    assert response.body["tenantId"] == "acme"
    assert api.stack.item("ws#repo-alpha")["tenantId"] == "acme"


def test_register_another_tenants_workspace_is_403_and_changes_nothing(api: WorkspaceApi) -> None:
    assert api.put(claims={"tenant_id": "tenant-a"}).status == 201
    before = api.stack.item("ws#repo-alpha")

    other = api.put(body=registration(remoteUrl="https://evil.example.com/fork.git"), claims={"tenant_id": "tenant-b"})

    assert other.status == 403
    assert "another tenant" in other.body["message"]
    assert "tenant-a" not in json.dumps(other.body)
    assert api.stack.item("ws#repo-alpha") == before


OVERSIZE = object()  # marker: a body just over the limit, built from the stack's settings


@pytest.mark.parametrize(
    ("request_kwargs", "status", "fields"),
    [
        pytest.param({"raw": '{"remoteUrl": '}, 400, {}, id="malformed-json"),
        pytest.param({"raw": ""}, 400, {}, id="empty-body"),
        pytest.param({"raw": "[1]"}, 400, {}, id="array-body"),
        pytest.param({"content_type": "text/plain"}, 415, {}, id="not-json"),
        pytest.param({"body": OVERSIZE}, 413, {}, id="oversize"),
        pytest.param({"body": {}}, 422, {"remoteUrl": "Field required", "branch": "Field required"}, id="empty"),
        pytest.param(
            {"body": registration(tenantId="tenant-b")}, 422, {"tenantId": "never from the body"}, id="tenant-in-body"
        ),
        pytest.param(
            {"body": registration(remoteUrl="ssh://git@github.com/acme/r.git")},
            422,
            {"remoteUrl": "https:// URL"},
            id="ssh-remote",
        ),
        pytest.param(
            {"body": registration(remoteUrl="https://u:p@github.com/acme/r.git")},
            422,
            {"remoteUrl": "credentials"},
            id="credentials-in-url",
        ),
        pytest.param(
            {"body": registration(testCommands={"unit": ["python", ""]})},
            422,
            {"testCommands.unit.1": "at least 1"},
            id="empty-argument",
        ),
        pytest.param(
            {"body": registration(testCommands={"unit": "python -m pytest"})},
            422,
            {"testCommands.unit": "list"},
            id="shell-string",
        ),
        pytest.param({"body": registration(branch="main")}, 422, {"baseBranch": "differ"}, id="same-branch"),
        pytest.param({"body": registration(branch="a/../b")}, 422, {"branch": "'..'"}, id="dotdot-branch"),
        pytest.param({"body": registration(tokenParameter="vault:x")}, 422, {"tokenParameter": "ssm:"}, id="token"),
        pytest.param({"workspace_id": "bad%20id"}, 422, {"workspaceId": "letters, digits"}, id="bad-path-id"),
        pytest.param({"workspace_id": "w" * 101}, 422, {"workspaceId": "at most 100"}, id="long-path-id"),
    ],
)
def test_register_workspace_refuses_bad_input_without_writing(
    api: WorkspaceApi, request_kwargs: dict[str, Any], status: int, fields: dict[str, str]
) -> None:
    if request_kwargs.get("body") is OVERSIZE:
        limit = app.body_limit_bytes(api.stack.settings)
        request_kwargs = {"body": registration(testCommands={"unit": ["x" * 1000] * 50}, pad="x" * limit)}

    response = api.put(**request_kwargs)

    assert response.status == status, response.body
    assert response.body["message"]
    errors = response.field_errors()
    assert set(errors) == set(fields)
    for field, fragment in fields.items():
        assert fragment in errors[field], (field, errors[field])
    assert api.items() == []


# ---- GET /workspaces/{workspaceId} ---------------------------------------------------------------------------------


def test_read_workspace_shows_the_registration_and_active_state(api: WorkspaceApi) -> None:
    registered = api.put(body=registration(tokenParameter="ssm:/agent-jobs/tenant-demo/github-token"))

    response = api.read()

    assert response.status == 200
    assert set(response.body) == STATUS_FIELDS
    assert {name: response.body[name] for name in REGISTRATION_FIELDS} == registered.body
    assert response.body["tokenParameter"] == "ssm:/agent-jobs/tenant-demo/github-token"
    assert (response.body["state"], response.body["haltingJobId"], response.body["haltReason"]) == (
        WorkspaceState.ACTIVE,
        None,
        None,
    )


def test_read_workspace_shows_halted_after_the_guard_halted_it(api: WorkspaceApi) -> None:
    api.put()
    api.stack.guard.halt_workspace("repo-alpha", tenant_id="tenant-demo", job_id="job-7", reason="job job-7 is DEAD")

    response = api.read()

    assert response.status == 200
    assert response.body["state"] == WorkspaceState.HALTED
    assert response.body["haltingJobId"] == "job-7"
    assert response.body["haltReason"] == "job job-7 is DEAD"
    assert response.body["remoteUrl"] == "/srv/git/tenant-demo/repo-alpha.git"


def test_read_workspace_halted_before_registration_shows_its_state(api: WorkspaceApi) -> None:
    api.stack.guard.halt_workspace("repo-beta", tenant_id="tenant-demo", job_id="job-1", reason="rejected: bad")

    response = api.read("repo-beta")

    assert response.status == 200
    assert response.body["state"] == WorkspaceState.HALTED
    assert (response.body["workspaceId"], response.body["tenantId"]) == ("repo-beta", "tenant-demo")
    assert response.body["remoteUrl"] is None


def test_read_workspace_halted_without_a_tenant_is_404(api: WorkspaceApi) -> None:
    # Given a workspace halted by a message that named no tenant: it belongs to nobody yet
    api.stack.guard.halt_workspace("repo-beta", tenant_id=None, job_id="msg#1", reason="rejected: no tenant")

    assert api.read("repo-beta").status == 404


def test_read_workspace_unknown_is_404(api: WorkspaceApi) -> None:
    response = api.read("repo-unknown")

    assert response.status == 404
    assert "PUT /workspaces/repo-unknown" in response.body["message"]


def test_read_workspace_of_another_tenant_is_404(api: WorkspaceApi) -> None:
    api.put(claims={"tenant_id": "tenant-a"})

    other = api.read(claims={"tenant_id": "tenant-b"})
    owner = api.read(claims={"tenant_id": "tenant-a"})
    anonymous = api.invoke(without_authorizer(get_event()))

    assert other.status == 404
    assert "another tenant" not in other.body["message"]
    assert "remoteUrl" not in other.body
    assert owner.status == 200
    assert anonymous.status == 401
    assert "remoteUrl" not in anonymous.body


@pytest.mark.parametrize("raw_workspace_id", ["bad%20id", "-dash", "w" * 101])
def test_read_workspace_malformed_id_is_422(api: WorkspaceApi, raw_workspace_id: str) -> None:
    response = api.read(raw_workspace_id)

    assert response.status == 422
    assert set(response.field_errors()) == {"workspaceId"}


# ---- the sample event ----------------------------------------------------------------------------------------------


def test_sample_put_workspace_event_runs_unchanged(api: WorkspaceApi) -> None:
    created = api.invoke(load_event("http_put_workspace.json"))
    again = api.invoke(load_event("http_put_workspace.json"))

    assert created.status == 201
    assert again.status == 200
    assert created.body["workspaceId"] == "repo-delta"
    assert created.body["remoteUrl"] == "https://git.example.com/tenant-demo/repo-delta.git"
    assert created.body["branch"] == "agent/repo-delta"
    assert created.body["testCommands"] == {"unit": ["python", "-m", "pytest", "-q"]}
    assert api.read("repo-delta").body["state"] == WorkspaceState.ACTIVE


# ---- a file-system remote the API can see -------------------------------------------------------------------------


@pytest.fixture
def local_remotes(api: WorkspaceApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A remotes root that is a folder of this machine, as under `make local`: the API sees the remotes in it."""
    root = tmp_path / "remotes"
    (root / "tenant-demo").mkdir(parents=True)
    monkeypatch.setenv("WORKSPACES_REMOTE_ROOT", str(root))
    app.reset_services()
    return root


@pytest.mark.parametrize("remote_left", ["nothing", "a folder that is not a git repository", "a file"])
def test_register_workspace_whose_file_remote_is_not_there_is_422_saying_what_to_do(
    api: WorkspaceApi, local_remotes: Path, remote_left: str
) -> None:
    remote = local_remotes / "tenant-demo" / "repo-alpha.git"
    if remote_left == "a file":
        remote.write_text("not a repository")
    elif remote_left != "nothing":
        (remote / "objects").mkdir(parents=True)

    response = api.put(body=registration(remoteUrl=str(remote)))

    assert response.status == 422
    expected = (
        f"the remote at {remote} does not exist or is not a git repository; create it first (git init --bare "
        f"{remote}), or register the path of a repository that exists"
    )
    assert response.body["message"] == expected
    assert response.field_errors() == {"remoteUrl": expected}
    assert api.stack.workspace("repo-alpha") is None


def test_register_workspace_whose_file_remote_is_a_repository_is_accepted(
    api: WorkspaceApi, local_remotes: Path
) -> None:
    bare = local_remotes / "tenant-demo" / "repo-alpha.git"
    Repo.init_bare(str(bare), mkdir=True).close()
    work_tree = local_remotes / "tenant-demo" / "repo-beta"
    Repo.init(str(work_tree), mkdir=True).close()

    assert api.put("repo-alpha", body=registration(remoteUrl=str(bare))).status == 201
    assert api.put("repo-beta", body=registration(remoteUrl=f"file://{work_tree}")).status == 201
