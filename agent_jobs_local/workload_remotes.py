"""The demo workspaces' git remotes (bare repositories with a first commit on `main`) and their registration
through the API (`PUT /workspaces/{workspaceId}`), with a bearer token of the tenant."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dulwich.index import commit_tree
from dulwich.objects import Blob, Commit
from dulwich.refs import Ref
from dulwich.repo import Repo

from agent_jobs_local.auth import mint_token
from agent_jobs_local.workload_api import send
from agent_jobs_local.workload_plan import (
    BASE_BRANCH,
    DEFAULT_TENANT,
    PASSING_TEST_COMMAND,
    TEST_SUITE,
    TOKEN_TTL_SECONDS,
    branch_of_workspace,
    github_repository_of,
)

if TYPE_CHECKING:
    pass


def remote_path(remotes_root: Path, workspace_id: str, tenant_id: str = DEFAULT_TENANT) -> Path:
    """Where a workspace's bare remote lives: in its tenant's folder of the remotes root (WORKSPACES_REMOTE_ROOT),
    the only place a file-system remote of that tenant may be registered."""
    return remotes_root / tenant_id / f"{workspace_id}.git"


def create_remote(path: Path, workspace_id: str, files: Mapping[str, bytes] | None = None) -> Path:
    """A bare git repository at `path` (absolute) whose `main` has one commit with a README.md (and `files`, paths
    such as `src/app.py` to contents; a README.md among them replaces the default one), as a person who created the
    repository would leave it. Returns the path."""
    path = path.resolve()
    path.mkdir(parents=True, exist_ok=False)
    with Repo.init_bare(str(path)) as repo:
        readme = Blob.from_string(f"# {workspace_id}\n\nA workspace of the Agent Jobs demo.\n".encode())
        blobs = {"README.md": readme, **{name: Blob.from_string(content) for name, content in (files or {}).items()}}
        for blob in blobs.values():
            repo.object_store.add_object(blob)
        tree_id = commit_tree(repo.object_store, [(name.encode(), blob.id, 0o100644) for name, blob in blobs.items()])
        commit = Commit()
        commit.tree = tree_id
        commit.parents = []
        commit.author = commit.committer = b"Demo Maintainer <maintainer@example.com>"
        commit.author_time = commit.commit_time = int(time.time())
        commit.author_timezone = commit.commit_timezone = 0
        commit.message = b"Initial commit\n"
        repo.object_store.add_object(commit)
        main = Ref(f"refs/heads/{BASE_BRANCH}".encode())
        repo.refs[main] = commit.id
        repo.refs.set_symbolic_ref(Ref(b"HEAD"), main)
    return path


def registration_body(
    remote: Path | str, workspace_id: str, github_api_url: str, test_command: Sequence[str] = PASSING_TEST_COMMAND
) -> dict[str, Any]:
    """The `PUT /workspaces/{workspaceId}` body of a demo workspace (no token: the local fake GitHub needs none); its
    `TEST_SUITE` runs `test_command`."""
    return {
        "remoteUrl": str(remote),
        "branch": branch_of_workspace(workspace_id),
        "baseBranch": BASE_BRANCH,
        "testCommands": {TEST_SUITE: list(test_command)},
        "githubRepository": github_repository_of(workspace_id),
        "githubApiUrl": github_api_url,
    }


def register_workspaces(
    api_url: str,
    remotes: Mapping[str, Path | str],
    github_api_url: str,
    *,
    tenant_id: str = DEFAULT_TENANT,
    test_command: Sequence[str] = PASSING_TEST_COMMAND,
) -> dict[str, int]:
    """Register each workspace's remote through the API for `tenant_id`, its test suite running `test_command`;
    returns workspace -> status (201 created, 200 updated). Retries 5xx and 429 a few times; raises RuntimeError with
    the API's answer on anything else."""
    statuses: dict[str, int] = {}
    token = mint_token(tenant_id, ttl_seconds=TOKEN_TTL_SECONDS)
    for ws, remote in remotes.items():
        url = f"{api_url.rstrip('/')}/workspaces/{ws}"
        body = registration_body(remote, ws, github_api_url, test_command)
        for attempt in range(6):
            status, answer = send("PUT", url, body, token)
            if status in (200, 201):
                statuses[ws] = status
                break
            if status < 500 and status != 429:
                raise RuntimeError(f"PUT /workspaces/{ws} answered {status}: {answer}")
            time.sleep(0.1 * 2**attempt)
        else:
            raise RuntimeError(f"PUT /workspaces/{ws} kept failing: {status} {answer}")
    return statuses
