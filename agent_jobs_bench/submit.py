"""Submitting jobs to a running API the way an agent does: over HTTP with a bearer token, through the command line's
API client (standard library only, so a benchmark's worker processes import nothing more for it)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from http import HTTPStatus
from typing import Any

from agent_jobs_cli.api import ApiClient


def register_folder_workspaces(api_url: str, token: str, workspace_ids: Iterable[str]) -> None:
    """PUT /workspaces/{workspaceId} for each workspace of a benchmark whose worker runs folder workspaces: the API
    accepts jobs only for its tenant's registrations, and only run_tests jobs naming a suite the registration has; the
    remote and the suite's command named here are never used (a folder workspace records the suite it would run)."""
    client = ApiClient(api_url, token, timeout=60)
    for workspace_id in workspace_ids:
        body = {
            "remoteUrl": f"https://git.example.com/bench/{workspace_id}.git",
            "branch": f"agent/{workspace_id}",
            "testCommands": {"unit": ["true"]},
        }
        status, _ = client.request("PUT", f"/workspaces/{workspace_id}", body)
        if status not in (HTTPStatus.OK, HTTPStatus.CREATED):
            raise RuntimeError(f"PUT /workspaces/{workspace_id} answered {status}")


def patch_job(job_id: str, workspace_id: str, *, patch: str, message: str) -> dict[str, Any]:
    """An apply_patch job as a producer sends it (the body of POST /jobs, an entry of POST /jobs:batch)."""
    return {
        "jobId": job_id,
        "workspaceId": workspace_id,
        "type": "apply_patch",
        "payload": {"patch": patch, "commitMessage": message},
    }


def submit_patch_job(api_url: str, token: str, job_id: str, workspace_id: str, *, patch: str, message: str) -> None:
    """POST /jobs of one apply_patch job; anything but 202 is an error (the client raises ApiError for 4xx and 5xx)."""
    body = patch_job(job_id, workspace_id, patch=patch, message=message)
    status, _ = ApiClient(api_url, token, timeout=60).request("POST", "/jobs", body)
    if status != HTTPStatus.ACCEPTED:
        raise RuntimeError(f"POST /jobs for {job_id} answered {status}")


def submit_in_batches(api_url: str, token: str, jobs: Sequence[dict[str, Any]]) -> None:
    """POST /jobs:batch of `jobs`, 10 a request, in order; every job must be accepted (202)."""
    client = ApiClient(api_url, token, timeout=60)
    for start in range(0, len(jobs), 10):
        batch = list(jobs[start : start + 10])
        status, answer = client.request("POST", "/jobs:batch", {"jobs": batch})
        codes = [result.get("statusCode") for result in (answer or {}).get("results", [])]
        if status != HTTPStatus.OK or codes != [HTTPStatus.ACCEPTED] * len(batch):
            raise RuntimeError(f"POST /jobs:batch answered {status} {codes}")
