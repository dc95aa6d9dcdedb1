"""Submitting jobs to a running API the way an agent does: over HTTP with a bearer token, through the command line's
API client (standard library only, so a benchmark's worker processes import nothing more for it)."""

from __future__ import annotations

from http import HTTPStatus

from agent_jobs_cli.api import ApiClient


def submit_patch_job(api_url: str, token: str, job_id: str, workspace_id: str, *, patch: str, message: str) -> None:
    """POST /jobs of one apply_patch job; anything but 202 is an error (the client raises ApiError for 4xx and 5xx)."""
    body = {
        "jobId": job_id,
        "workspaceId": workspace_id,
        "type": "apply_patch",
        "payload": {"patch": patch, "commitMessage": message},
    }
    status, _ = ApiClient(api_url, token, timeout=60).request("POST", "/jobs", body)
    if status != HTTPStatus.ACCEPTED:
        raise RuntimeError(f"POST /jobs for {job_id} answered {status}")
