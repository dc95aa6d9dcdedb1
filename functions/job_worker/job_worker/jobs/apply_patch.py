"""apply_patch: commit the agent's patch on the workspace branch, exactly once per jobId.

A git workspace does the whole job itself (`GitWorkspace.apply_once`: one push on a warm cache's happy path); a
folder workspace is driven here, through the `Workspace` protocol.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, TypedDict, runtime_checkable

from agent_jobs.models import ApplyPatchJob
from job_worker.jobs.context import JobContext
from job_worker.jobs.errors import PermanentJobError, RetryableJobError
from job_worker.jobs.workspace import Commit, HeadMovedError, Workspace

if TYPE_CHECKING:
    from job_worker.jobs.git_workspace import AppliedPatch

MAX_HEAD_RACES = 3


class _PatchCommit(TypedDict):
    """What the job's commit is made of, as `Workspace.commit` and `apply_once` take it."""

    job_id: str
    message: str
    patch: str | bytes
    author: str | None


@runtime_checkable
class AppliesPatchesOnce(Protocol):
    """A workspace that runs an apply_patch job itself: looks for the job's commit, commits, retries a moved head."""

    def apply_once(
        self, *, job_id: str, message: str, patch: str | bytes, author: str | None = None, races: int
    ) -> AppliedPatch: ...


def _looks_like_a_diff(patch: str) -> bool:
    # A git section needs no '---' or '@@' line: a pure rename, a mode change, an empty file added or deleted are
    # its 'diff --git' line and extended headers alone, also inside a `git format-patch` mail.
    # A plain diff that only says "Binary files a/x and b/x differ" is parsed too, to be refused naming the file.
    return (
        patch.startswith(("diff --git ", "--- ", "Index: ", "Binary files "))
        or "\ndiff --git " in patch
        or "\nBinary files " in patch
        or "\n--- " in patch
        or "\n@@ " in patch
    )


def run(job: ApplyPatchJob, context: JobContext) -> dict[str, Any]:
    workspace = context.workspace
    if not _looks_like_a_diff(job.payload.patch_text()):
        raise PermanentJobError(
            f"payload.patch of job {job.job_id} is not a unified diff (no 'diff --git', '---' or '@@' lines)"
        )
    author = job.payload.author
    request = _PatchCommit(
        job_id=job.job_id,
        message=job.payload.commit_message,
        patch=job.payload.patch_content(),
        author=f"{author.name} <{author.email}>" if author else None,
    )
    if isinstance(workspace, AppliesPatchesOnce):
        applied = workspace.apply_once(**request, races=MAX_HEAD_RACES)
        return _result(applied.commit, already_applied=applied.already_applied)
    # The `Workspace` protocol takes the patch as text (bytes that are not UTF-8 as lone surrogates).
    commit, already_applied = _commit_once(workspace, {**request, "patch": job.payload.patch_text()})
    return _result(commit, already_applied=already_applied)


def _commit_once(workspace: Workspace, request: _PatchCommit) -> tuple[Commit, bool]:
    """The job's commit on the branch, and whether it was there already, through the `Workspace` protocol."""
    for _ in range(MAX_HEAD_RACES):
        # The head is read first: a commit of this job that lands after the look below moves the branch, so the
        # compare-and-swap on this head fails and the next round finds it.
        head = workspace.head()
        # The workspace, not the job table, says whether this job already took effect: a worker that crashed after
        # committing, or a stale worker whose lease was taken over, finds its own trailer here and commits nothing.
        existing = workspace.find_commit(request["job_id"])
        if existing is not None:
            return existing, True
        try:
            patch = request["patch"]
            assert isinstance(patch, str)
            return (
                workspace.commit(
                    job_id=request["job_id"],
                    message=request["message"],
                    patch=patch,
                    author=request["author"],
                    expected_head=head,
                ),
                False,
            )
        except HeadMovedError:
            continue  # someone moved the branch: look for our trailer again on the new head
    raise RetryableJobError(f"branch of {workspace.workspace_id} kept moving; will retry")


def _result(commit: Commit, *, already_applied: bool) -> dict[str, Any]:
    if already_applied:
        return {"commit": commit.sha, "alreadyApplied": True}
    return {"commit": commit.sha, "parent": commit.parent, "alreadyApplied": False}
