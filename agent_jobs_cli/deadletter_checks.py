"""What a redrive reads to decide a dead-lettered message's fate: its job message as the worker validates it, whether
a drain marker belongs to a resume still under way, and who owns a workspace."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from agent_jobs.guard import JobGuard
from agent_jobs.keys import workspace_group_id
from agent_jobs.models import (
    DrainMarker,
    JobMessage,
    WorkspaceState,
    parse_queue_message,
)
from agent_jobs.registration import RegisteredWorkspace
from agent_jobs.workspaces import WorkspaceRegistry
from agent_jobs_cli.deadletter_messages import DeadLetter

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient


def registered_owners(client: DynamoDBClient, table_name: str) -> Callable[[str], RegisteredWorkspace | None]:
    """`owner_of` for `DeadLetterQueue.redrive`: a workspace's registration (its owner and the direct producers it
    bound), read from the table (None when nobody registered it)."""
    registry = WorkspaceRegistry(client, table_name)
    return registry.get


def is_current_marker(guard: JobGuard, message: DeadLetter) -> bool:
    """A drain marker of its own group's workspace whose resume is still under way (RESUMING with its resumeId). Such
    a marker is rejected like any other message that is not a job: that halts the workspace, and the operator's resume
    (skip) sends a fresh marker."""
    try:
        marker = DrainMarker.model_validate_json(message.body)
    except ValueError:
        return False
    if message.group_id != workspace_group_id(marker.workspace_id):
        return False
    workspace = guard.get_workspace(marker.workspace_id) or {}
    return workspace.get("state") == WorkspaceState.RESUMING and workspace.get("resumeId") == marker.resume_id


def parse_job_message(message: DeadLetter) -> tuple[JobMessage | None, str]:
    """The job message, validated as the worker validates it, or None and what is wrong with it."""
    try:
        job = parse_queue_message(message.body)
        if job.payload is not None:  # a pointer's payload is checked when the job runs, as the worker does
            job.request()
    except ValueError as error:
        return None, first_line(error)
    if message.group_id != workspace_group_id(job.workspace_id):
        return None, f"message group {message.group_id!r} is not workspace {job.workspace_id!r}'s group"
    return job, ""


def first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return " ".join(text[:3])[:300] if text else type(error).__name__
