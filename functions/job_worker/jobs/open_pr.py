"""open_pr: open a pull request from the workspace branch, or return the one already open."""

from __future__ import annotations

from typing import Any

from agent_jobs.models import OpenPrJob
from jobs.context import JobContext


def run(job: OpenPrJob, context: JobContext) -> dict[str, Any]:
    workspace = context.workspace
    branch = f"agent/{workspace.workspace_id}"
    existing = workspace.find_open_pull_request(branch)
    if existing is not None:
        return {"number": existing["number"], "url": existing["url"], "alreadyOpen": True}
    pull = workspace.open_pull_request(branch, job.payload.title, job.payload.body)
    return {"number": pull["number"], "url": pull["url"], "alreadyOpen": False}
