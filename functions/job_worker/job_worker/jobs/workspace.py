"""Workspaces as the job handlers see them: a branch whose history records which job made each commit.

A workspace gives the handlers the two properties the exactly-once promise rests on: a commit carries the jobId that
made it (the `Agent-Job-Id` trailer), and the branch moves only by compare-and-swap on its expected head, so a stale
worker cannot move it. The deployed worker's workspaces are git branches of registered remotes
(`job_worker.jobs.registered`, `job_worker.jobs.git_workspace`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from job_worker.jobs.context import JobContext

ROOT_HEAD = "0" * 40
JOB_TRAILER = "Agent-Job-Id"


class HeadMovedError(Exception):
    """The branch is no longer at the head the caller expected (compare-and-swap lost)."""


@dataclass(frozen=True)
class Commit:
    sha: str
    parent: str
    job_id: str
    message: str
    patch: str

    @property
    def trailer(self) -> str:
        return f"{JOB_TRAILER}: {self.job_id}"


class Workspace(Protocol):
    workspace_id: str

    def head(self) -> str: ...
    def history(self) -> list[Commit]: ...
    def find_commit(self, job_id: str) -> Commit | None: ...
    def commit(
        self, *, job_id: str, message: str, patch: str, expected_head: str, author: str | None = None
    ) -> Commit: ...
    def stored_test_result(self, job_id: str, head: str) -> dict[str, Any] | None: ...
    def store_test_result(self, job_id: str, head: str, result: dict[str, Any]) -> None: ...
    def find_open_pull_request(self, head_branch: str) -> dict[str, Any] | None: ...
    def open_pull_request(self, head_branch: str, title: str, body: str) -> dict[str, Any]: ...


class WorkspaceStore(Protocol):
    def open(self, workspace_id: str) -> Workspace: ...


class JobWorkspaceStore(WorkspaceStore, Protocol):
    """What the worker needs of a workspace store: the workspace a job runs on, the tenant a workspace belongs to and
    the direct producers it bound, and what a job may use of the workspace's registration. The deployed store is
    `job_worker.jobs.registered`'s; a store without registrations (folder workspaces) answers that no workspace has an
    owner or a binding and adds nothing to a job."""

    # True: a workspace and its records belong to the tenant that registered it, whatever a sender names (a record
    # that cannot be parsed is recorded as the owner's). False: the store has no registrations, a message's tenant
    # stands.
    binds_tenants: bool

    def owner(self, workspace_id: str) -> str | None:
        """The tenant that registered `workspace_id`; None when nobody did (or the store has no registrations)."""
        ...

    def direct_producers(self, workspace_id: str) -> list[str] | None:
        """The SQS senders the owner bound to `workspace_id` (`agent_jobs.direct_producers`); None when it bound none
        (or nobody registered the workspace, or the store has no registrations)."""
        ...

    def job_context(self, workspace_id: str, context: JobContext) -> JobContext:
        """`context` with what a job may use of the workspace's registration (the registration, its token, the check
        of a URL's host); raises PermanentJobError when the workspace must be registered and is not."""
        ...
