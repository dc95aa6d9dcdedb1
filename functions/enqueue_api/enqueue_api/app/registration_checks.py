"""Jobs checked at submit against their workspace's registration (`agent_jobs.registration_fit`): a run_tests suite
the registration lacks, an open_pr without a GitHub repository. A refusal is a 422 naming the fix.

A registration can change (its owner never does), so how fresh must the check be? It refuses only on what a
consistent read of the registration says, never on a kept one: a tenant that has just added a suite with PUT is never
refused for naming it. It accepts on the registration this process read last (kept per workspace, as the owners are
kept for ownership), so a job that fits costs no read once its workspace was read: a registration changed since can
let through a job that no longer fits, and the worker refuses it when it runs, as it refuses a job whose registration
changed after it was accepted.

Only the owner's jobs are checked (any other is the producer's 404 to answer, without a word about the registration),
and a job already recorded for the tenant is left to the producer too: a repeat of an accepted job is a 202 and a
jobId taken by another job a 409, whatever the registration says now.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from agent_jobs.guard import JobGuard
from agent_jobs.models import ApplyPatchJob, OpenPrJob, RunTestsJob
from agent_jobs.registration import RegisteredWorkspace
from agent_jobs.registration_fit import Misfit, needs_registration, registration_misfit
from agent_jobs.workspaces import WorkspaceRegistry

Job = ApplyPatchJob | RunTestsJob | OpenPrJob

# Registrations a process keeps (a few kilobytes each at most); past it the oldest read is dropped.
MAX_REGISTRATIONS_KEPT: Final = 2_000


class RegistrationChecks:
    """The registrations this process read last, and the check of jobs against them."""

    def __init__(self, registry: WorkspaceRegistry, guard: JobGuard, *, max_kept: int = MAX_REGISTRATIONS_KEPT) -> None:
        self._registry = registry
        self._guard = guard
        self._max_kept = max_kept
        self._kept: dict[str, RegisteredWorkspace] = {}

    def misfits(self, jobs: Sequence[Job], tenant: str) -> dict[int, Misfit]:
        """Why each of `jobs` (by index) does not fit its workspace's registration; the jobs not named fit, or are not
        this check's to refuse."""
        found: dict[int, Misfit] = {}
        fresh: dict[str, RegisteredWorkspace | None] = {}  # read consistently during this call
        for index, job in enumerate(jobs):
            if not needs_registration(job):
                continue
            workspace_id = job.workspace_id
            workspace = self._kept.get(workspace_id)
            if workspace is None:
                workspace = fresh[workspace_id] = self._read(workspace_id)
            misfit = self._misfit(job, workspace, tenant)
            if misfit is not None and workspace_id not in fresh:
                fresh[workspace_id] = self._read(workspace_id)
                misfit = self._misfit(job, fresh[workspace_id], tenant)
            if misfit is not None and self._guard.get_job(tenant, job.job_id) is None:
                found[index] = misfit
        return found

    def keep(self, workspace: RegisteredWorkspace) -> None:
        """Keep `workspace` as this process registered it (a PUT it answered)."""
        self._kept.pop(workspace.workspace_id, None)  # kept again as the newest read
        if len(self._kept) >= self._max_kept:
            oldest = next(iter(self._kept), None)  # the oldest read goes first
            if oldest is not None:
                self._kept.pop(oldest, None)
        self._kept[workspace.workspace_id] = workspace

    def _read(self, workspace_id: str) -> RegisteredWorkspace | None:
        workspace = self._registry.get(workspace_id)  # one consistent GetItem
        if workspace is not None:
            self.keep(workspace)
        return workspace

    @staticmethod
    def _misfit(job: Job, workspace: RegisteredWorkspace | None, tenant: str) -> Misfit | None:
        if workspace is None or workspace.tenant_id != tenant:
            return None  # not the tenant's registration: the producer answers 404, telling nothing of it
        return registration_misfit(job, workspace)
