"""Job handlers, one module per job type. Each is idempotent with respect to the workspace itself."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agent_jobs.models import JobType

if TYPE_CHECKING:
    from agent_jobs.models import ApplyPatchJob, OpenPrJob, RunTestsJob
    from job_worker.jobs.context import JobContext


def _handler(module: str) -> Callable[[Any, JobContext], dict[str, Any]]:
    """`jobs.<module>.run`, imported on the first job of its type: a cold start pays for the git library, the GitHub
    client or the test runner only when a job needs them."""

    def run(job: Any, context: JobContext) -> dict[str, Any]:
        handler: Callable[[Any, JobContext], dict[str, Any]] = importlib.import_module(f"{__name__}.{module}").run
        return handler(job, context)

    return run


JOB_HANDLERS: dict[JobType, Callable[[Any, JobContext], dict[str, Any]]] = {
    JobType.APPLY_PATCH: _handler("apply_patch"),
    JobType.RUN_TESTS: _handler("run_tests"),
    JobType.OPEN_PR: _handler("open_pr"),
}


def run_job(job: ApplyPatchJob | RunTestsJob | OpenPrJob, context: JobContext) -> dict[str, Any]:
    """Dispatch by type. Returns the result stored on the job; raises RetryableJobError or PermanentJobError."""
    return JOB_HANDLERS[job.type](job, context)
