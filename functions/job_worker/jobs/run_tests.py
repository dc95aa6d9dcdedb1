"""run_tests: record the outcome of a named test suite for the branch head, reusing a stored result."""

from __future__ import annotations

from typing import Any

from agent_jobs.models import RunTestsJob
from jobs.context import JobContext


def run(job: RunTestsJob, context: JobContext) -> dict[str, Any]:
    workspace = context.workspace
    head = workspace.head()
    stored = workspace.stored_test_result(job.job_id, head)
    if stored is not None:
        return {**stored, "reused": True}
    result = {"suite": job.payload.suite, "commit": head, "commits": len(workspace.history()), "outcome": "recorded"}
    workspace.store_test_result(job.job_id, head, result)
    return {**result, "reused": False}
