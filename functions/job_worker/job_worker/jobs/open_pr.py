"""open_pr: open a pull request from the workspace branch to its base, or return the one already open."""

from __future__ import annotations

from typing import Any

from agent_jobs.models import OpenPrJob
from job_worker.jobs.context import JobContext
from job_worker.jobs.errors import PermanentJobError
from job_worker.jobs.github import GitHubClient

GITHUB_API_URL = "https://api.github.com"


def run(job: OpenPrJob, context: JobContext) -> dict[str, Any]:
    workspace = context.workspace
    if context.registration is None:
        # A folder workspace keeps its pull requests beside its branch.
        branch = f"agent/{workspace.workspace_id}"
        existing = workspace.find_open_pull_request(branch)
        if existing is not None:
            return {"number": existing["number"], "url": existing["url"], "alreadyOpen": True}
        pull = workspace.open_pull_request(branch, job.payload.title, job.payload.body)
        return {"number": pull["number"], "url": pull["url"], "alreadyOpen": False}

    registration = context.registration.registration
    if not registration.github_repository:
        raise PermanentJobError(
            f"workspace {workspace.workspace_id!r} has no githubRepository: register it with"
            f" PUT /workspaces/{workspace.workspace_id} to open pull requests"
        )
    owner, repo = registration.github_repository.split("/", 1)
    api_url = registration.github_api_url or GITHUB_API_URL
    client = GitHubClient(
        context.token() or "",
        api_url=api_url,
        host_check=lambda url: context.check_host(url, "githubApiUrl"),
        ca_pem=context.trusted_ca(api_url),
    )
    pull_request = client.open_pull_request(
        owner,
        repo,
        head=registration.branch,
        base=registration.base_branch,
        title=job.payload.title,
        body=job.payload.body,
    )
    return {"number": pull_request.number, "url": pull_request.url, "alreadyOpen": not pull_request.created}
