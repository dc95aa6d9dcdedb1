"""Why the producer refuses a job: each error says what to do."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass


class PayloadTooLargeError(Exception):
    """The job's message is too large for the queue and no payload bucket is configured to hold its payload."""

    def __init__(self, job_id: str, size: int, limit: int) -> None:
        super().__init__(
            f"job '{job_id}' makes a {size}-byte message, above the {limit}-byte limit of a queue message, and no "
            "payload bucket is configured (PAYLOAD_BUCKET); send a smaller payload"
        )
        self.job_id = job_id


class JobConflictError(Exception):
    """The jobId is already taken by a job with another payload, workspace, type or tenant."""

    def __init__(self, job_id: str) -> None:
        super().__init__(
            f"jobId '{job_id}' was already accepted with a different workspace, type or payload; "
            "use a new jobId for a different job"
        )
        self.job_id = job_id


class WorkspaceUnregisteredError(Exception):
    """The job's tenant has not registered the job's workspace: nothing was recorded or queued."""

    def __init__(self, workspace_id: str) -> None:
        super().__init__(
            f"workspace '{workspace_id}' is not registered; register it first with PUT /workspaces/{workspace_id} "
            "(its git remote and branch), then send the job again"
        )
        self.workspace_id = workspace_id


class WorkspaceForbiddenError(WorkspaceUnregisteredError):
    """The job's workspace is registered to (or halted for) another tenant: nothing was recorded or queued. Its
    message is an unregistered workspace's, word for word, so that a caller cannot tell another tenant's workspace
    from a name nobody registered; only the logs tell the two apart."""


class InvalidBatchError(ValueError):
    """The batch itself cannot be accepted (empty, more than MAX_BATCH_JOBS jobs, or a jobId twice): nothing was
    recorded or sent."""
