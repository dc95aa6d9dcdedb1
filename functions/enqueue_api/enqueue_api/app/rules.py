"""What a request must also satisfy once Powertools has validated its shape: the deployment's patch limits and a
patch that is a diff, a batch's distinct jobIds, a job that fits its workspace's registration, a registration's size,
the tenant's bounds and a file-system remote that is there. Each refusal is a 422 worded as the shape's."""

from __future__ import annotations

from collections.abc import Sequence
from http import HTTPStatus

from agent_jobs.models import ApplyPatchJob, OpenPrJob, RunTestsJob
from agent_jobs.patch_limits import PatchLimits, not_a_diff_error, patch_bytes_error, patch_hunks_error
from agent_jobs.registration import WorkspaceRegistration, test_commands_size_error
from agent_jobs.settings import Settings
from agent_jobs.tenancy import TenantBounds

from .errors import RequestRefused
from .operations import Operation
from .registration_checks import RegistrationChecks
from .remotes import missing_file_remote_error
from .validation import body_refusal, counted

Job = ApplyPatchJob | RunTestsJob | OpenPrJob


def check_job(job: Job, settings: Settings) -> None:
    """An apply_patch job whose patch is over PATCH_MAX_BYTES or PATCH_MAX_HUNKS, or is no diff at all, is refused
    here (422) rather than accepted to end DEAD in the worker."""
    errors = _patch_errors(job, settings)
    if errors:
        raise body_refusal(Operation.SUBMIT_JOB, errors)


def check_job_fits(job: Job, tenant: str, checks: RegistrationChecks) -> None:
    """A job that does not fit its workspace's registration (`RegistrationChecks`) is refused (422), its message the
    fix."""
    misfit = checks.misfits([job], tenant).get(0)
    if misfit is not None:
        raise RequestRefused(
            HTTPStatus.UNPROCESSABLE_ENTITY, misfit.message, [{"field": misfit.field, "message": misfit.message}]
        )


def check_batch_fits(jobs: Sequence[Job], tenant: str, checks: RegistrationChecks) -> None:
    """A batch with a job that does not fit its workspace's registration is refused (422) naming each such job's
    field (`jobs.3.payload.suite`): nothing is accepted, so a later job of a workspace never runs without the one
    before it."""
    misfits = checks.misfits(jobs, tenant)
    if misfits:
        errors = [
            {"field": f"jobs.{index}.{misfit.field}", "message": misfit.message}
            for index, misfit in sorted(misfits.items())
        ]
        raise body_refusal(Operation.SUBMIT_BATCH, errors)


def check_batch(jobs: list[Job], settings: Settings) -> None:
    """A batch holds distinct jobs (a jobId twice is refused, 422) within the patch limits, each patch a diff; nothing
    is accepted otherwise."""
    errors: list[dict[str, str]] = []
    first_index: dict[str, int] = {}
    for index, job in enumerate(jobs):
        if job.job_id in first_index:
            errors.append(
                {
                    "field": f"jobs.{index}.jobId",
                    "message": f"jobId '{job.job_id}' is also the jobId of jobs.{first_index[job.job_id]}; give each "
                    "job of a batch its own jobId",
                }
            )
        first_index.setdefault(job.job_id, index)
        errors.extend(_patch_errors(job, settings, f"jobs.{index}."))
    if errors:
        raise body_refusal(Operation.SUBMIT_BATCH, errors)


def check_registration(registration: WorkspaceRegistration, tenant: str, settings: Settings) -> None:
    """A registration whose test commands are over their size, or that names a token, remote or host outside
    `tenant`'s bounds (`agent_jobs.tenancy`), is refused (422) naming each."""
    too_large = test_commands_size_error(registration)
    if too_large:
        raise body_refusal(Operation.REGISTER_WORKSPACE, [{"field": "testCommands", "message": too_large}])
    errors = TenantBounds.from_settings(settings).registration_errors(registration, tenant)
    if errors:
        raise RequestRefused(
            HTTPStatus.UNPROCESSABLE_ENTITY,
            f"the workspace registration names what this tenant may not use ({counted(len(errors))}); fix the fields "
            "listed in 'errors' and send it again",
            errors,
        )
    missing = missing_file_remote_error(registration.remote_url, settings.workspaces_remote_root)
    if missing:
        raise RequestRefused(HTTPStatus.UNPROCESSABLE_ENTITY, missing, [{"field": "remoteUrl", "message": missing}])


def _patch_errors(job: Job, settings: Settings, prefix: str = "") -> list[dict[str, str]]:
    if not isinstance(job, ApplyPatchJob):
        return []
    limits = PatchLimits.from_settings(settings)
    patch = job.payload.patch_text()
    error = patch_bytes_error(patch, limits) or patch_hunks_error(patch, limits) or not_a_diff_error(patch)
    return [{"field": f"{prefix}payload.patch", "message": error}] if error else []
