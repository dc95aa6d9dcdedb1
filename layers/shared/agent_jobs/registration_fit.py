"""What a job needs of its workspace's registration: a run_tests job a test suite the registration names, an open_pr
job a GitHub repository. The API refuses a job that does not fit (a 422 naming the fix) instead of accepting it to
halt the workspace; the worker refuses it again when it runs (the registration may have changed since).
"""

from __future__ import annotations

from dataclasses import dataclass

from agent_jobs.models import ApplyPatchJob, OpenPrJob, RunTestsJob
from agent_jobs.registration import RegisteredWorkspace


@dataclass(frozen=True)
class Misfit:
    """Why a job does not fit its workspace's registration: the job's field at fault and what to do."""

    field: str
    message: str


def needs_registration(job: ApplyPatchJob | RunTestsJob | OpenPrJob) -> bool:
    """Whether checking the job needs its workspace's registration (an apply_patch job needs nothing of it)."""
    return isinstance(job, RunTestsJob | OpenPrJob)


def registration_misfit(job: ApplyPatchJob | RunTestsJob | OpenPrJob, workspace: RegisteredWorkspace) -> Misfit | None:
    """Why `job` cannot run on `workspace` as registered, or None."""
    registration = workspace.registration
    fix = f"PUT /workspaces/{workspace.workspace_id}"
    if isinstance(job, RunTestsJob) and job.payload.suite not in registration.test_commands:
        suite = job.payload.suite
        if not registration.test_commands:
            message = (
                f"workspace {workspace.workspace_id} has no test suites; add the suite '{suite}' to its testCommands "
                f"with {fix}"
            )
        else:
            suites = ", ".join(sorted(registration.test_commands))
            message = (
                f"workspace {workspace.workspace_id} has no test suite '{suite}'; its suites are: {suites}; name one "
                f"of them, or add the suite with {fix}"
            )
        return Misfit("payload.suite", message)
    if isinstance(job, OpenPrJob) and not registration.github_repository:
        return Misfit(
            "workspaceId",
            f"workspace {workspace.workspace_id} has no githubRepository, which an open_pr job opens its pull request "
            f"on; add it (owner/repository) with {fix}",
        )
    return None
