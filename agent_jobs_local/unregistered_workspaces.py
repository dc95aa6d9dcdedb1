"""Workspace stores without registrations: the folder store and the test doubles that wrap it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from job_worker.jobs.context import JobContext


class UnregisteredWorkspaces:
    """What a store without registrations answers the worker (`job_worker.jobs.workspace.JobWorkspaceStore`): no
    workspace has an owner or a binding of direct producers, so a message's own tenant stands, and a job gets no
    registration, token or host check.

    It imports nothing of the worker's code, so a store defined before the function's folder is on the import path
    (the benchmarks') can build on it."""

    binds_tenants = False

    def owner(self, workspace_id: str) -> str | None:
        return None

    def direct_producers(self, workspace_id: str) -> list[str] | None:
        return None

    def job_context(self, workspace_id: str, context: JobContext) -> JobContext:
        return context
