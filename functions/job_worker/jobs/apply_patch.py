"""apply_patch: commit the agent's patch on the workspace branch, exactly once per jobId."""

from __future__ import annotations

from typing import Any

from agent_jobs.models import ApplyPatchJob
from jobs.context import JobContext
from jobs.errors import PermanentJobError, RetryableJobError
from jobs.workspace import HeadMovedError

MAX_HEAD_RACES = 3


def _looks_like_a_diff(patch: str) -> bool:
    return patch.startswith(("diff --git ", "--- ", "Index: ")) or "\n--- " in patch or "\n@@ " in patch


def run(job: ApplyPatchJob, context: JobContext) -> dict[str, Any]:
    workspace = context.workspace
    if not _looks_like_a_diff(job.payload.patch):
        raise PermanentJobError(f"payload.patch of job {job.job_id} is not a unified diff (no '---' or '@@' lines)")
    author = job.payload.author
    for _ in range(MAX_HEAD_RACES):
        # The head is read first: a commit of this job that lands after the look below moves the branch, so the
        # compare-and-swap on this head fails and the next round finds it.
        head = workspace.head()
        # The workspace, not the job table, says whether this job already took effect: a worker that crashed after
        # committing, or a stale worker whose lease was taken over, finds its own trailer here and commits nothing.
        existing = workspace.find_commit(job.job_id)
        if existing is not None:
            return {"commit": existing.sha, "alreadyApplied": True}
        try:
            commit = workspace.commit(
                job_id=job.job_id,
                message=job.payload.commit_message,
                patch=job.payload.patch,
                expected_head=head,
                author=f"{author.name} <{author.email}>" if author else None,
            )
        except HeadMovedError:
            continue  # someone moved the branch: look for our trailer again on the new head
        return {"commit": commit.sha, "parent": commit.parent, "alreadyApplied": False}
    raise RetryableJobError(f"branch of {workspace.workspace_id} kept moving; will retry")
