"""The git remote as a compare-and-swap ref store: one branch per workspace, each commit naming the job that made it,
the branch moved only from the head its writer read (as a push with a lease is). Each call is a yield point, may
fail, and may take effect and lose its answer, as a push over the network can.

The workspace speaks the worker's `Workspace` protocol, so the product's own apply_patch and open_pr handlers run
on it unchanged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent_jobs_local.unregistered_workspaces import UnregisteredWorkspaces
from job_worker.jobs.errors import PermanentJobError
from job_worker.jobs.workspace import ROOT_HEAD, Commit, HeadMovedError


class RemoteUnavailableError(ConnectionError):
    """The remote failed the call (a 5xx, a reset connection): it may or may not have taken effect."""


@dataclass
class Branch:
    commits: list[Commit] = field(default_factory=list)
    pulls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def head(self) -> str:
        return self.commits[-1].sha if self.commits else ROOT_HEAD


class RemoteFaults:
    """How the world perturbs a remote call: `before(name)` may raise (nothing happened), `after(name)` may raise
    (it happened, the answer is lost). Both may yield to other actors."""

    def before(self, name: str) -> None:  # pragma: no cover - the fault-free default
        return None

    def after(self, name: str) -> None:  # pragma: no cover - the fault-free default
        return None


class RefStore:
    """Every workspace's branch. `on_commit(workspace_id, job_id)` is told of each commit as it lands (the world
    checks ordering there); `refuses(job_id)` names the patches the remote never accepts (a permanent failure)."""

    def __init__(
        self,
        faults: RemoteFaults,
        *,
        on_commit: Callable[[str, str], None],
        refuses: Callable[[str], bool],
    ) -> None:
        self.branches: dict[str, Branch] = {}
        self.faults = faults
        self.on_commit = on_commit
        self.refuses = refuses

    def branch(self, workspace_id: str) -> Branch:
        return self.branches.setdefault(workspace_id, Branch())


class SimWorkspace:
    def __init__(self, store: RefStore, workspace_id: str) -> None:
        self.workspace_id = workspace_id
        self._store = store

    def _call(self, name: str) -> Branch:
        self._store.faults.before(name)
        return self._store.branch(self.workspace_id)

    def head(self) -> str:
        head = self._call("head").head
        self._store.faults.after("head")
        return head

    def history(self) -> list[Commit]:
        commits = list(self._call("history").commits)
        self._store.faults.after("history")
        return commits

    def find_commit(self, job_id: str) -> Commit | None:
        branch = self._call("find_commit")
        found = next((c for c in branch.commits if c.job_id == job_id), None)
        self._store.faults.after("find_commit")
        return found

    def commit(self, *, job_id: str, message: str, patch: str, expected_head: str, author: str | None = None) -> Commit:
        branch = self._call("commit")
        if self._store.refuses(job_id):
            raise PermanentJobError(f"patch of job {job_id} does not apply to {self.workspace_id}")
        if branch.head != expected_head:
            raise HeadMovedError(f"{self.workspace_id} is at {branch.head}, not {expected_head}")
        sha = hashlib.sha1(f"{expected_head}:{job_id}:{patch}".encode()).hexdigest()
        commit = Commit(sha=sha, parent=expected_head, job_id=job_id, message=message, patch=patch)
        branch.commits.append(commit)
        self._store.on_commit(self.workspace_id, job_id)
        self._store.faults.after("commit")
        return commit

    def stored_test_result(self, job_id: str, head: str) -> dict[str, Any] | None:
        return None

    def store_test_result(self, job_id: str, head: str, result: dict[str, Any]) -> None:
        return None

    def find_open_pull_request(self, head_branch: str) -> dict[str, Any] | None:
        branch = self._call("find_open_pull_request")
        found = next((dict(p) for p in branch.pulls if p["head"] == head_branch), None)
        self._store.faults.after("find_open_pull_request")
        return found

    def open_pull_request(self, head_branch: str, title: str, body: str) -> dict[str, Any]:
        branch = self._call("open_pull_request")
        number = len(branch.pulls) + 1
        pull = {"number": number, "url": f"sim://{self.workspace_id}/pull/{number}", "head": head_branch}
        branch.pulls.append(pull)
        self._store.faults.after("open_pull_request")
        return dict(pull)


class SimWorkspaceStore(UnregisteredWorkspaces):
    """The worker's workspace store over the ref store. Every workspace is registered (the producer accepts jobs
    only for registered ones), so a workspace and its records belong to its registered owner, as in the deployed
    worker; a job gets no token (the remote asks for none)."""

    binds_tenants = True

    def __init__(self, store: RefStore, owners: dict[str, str]) -> None:
        self._store = store
        self._owners = owners

    def owner(self, workspace_id: str) -> str | None:
        return self._owners.get(workspace_id)

    def open(self, workspace_id: str) -> SimWorkspace:
        return SimWorkspace(self._store, workspace_id)
