"""The worker's batch logic (its phases are the modules of `worker`): the names its users import."""

from job_worker.worker.batch import BatchWorker
from job_worker.worker.telemetry import (
    JOB_TYPE_DIMENSION,
    MESSAGES_REFUSED,
    UNKNOWN_JOB_TYPE,
    WORKSPACES_HALTED,
    failure_cause,
)

__all__ = [
    "JOB_TYPE_DIMENSION",
    "MESSAGES_REFUSED",
    "UNKNOWN_JOB_TYPE",
    "WORKSPACES_HALTED",
    "BatchWorker",
    "failure_cause",
]
