"""Job handlers, one module per job type. Each is idempotent with respect to the workspace itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent_jobs.models import ApplyPatchJob, JobType, OpenPrJob, RunTestsJob
from jobs import apply_patch, open_pr, run_tests
from jobs.context import JobContext

JOB_HANDLERS: dict[JobType, Callable[[Any, JobContext], dict[str, Any]]] = {
    JobType.APPLY_PATCH: apply_patch.run,
    JobType.RUN_TESTS: run_tests.run,
    JobType.OPEN_PR: open_pr.run,
}


def run_job(job: ApplyPatchJob | RunTestsJob | OpenPrJob, context: JobContext) -> dict[str, Any]:
    """Dispatch by type. Returns the result stored on the job; raises RetryableJobError or PermanentJobError."""
    return JOB_HANDLERS[job.type](job, context)
