"""The worker's batch logic (its phases are the modules of `worker`): the names its users import."""

from worker.batch import BatchWorker
from worker.records import parse_job_message
from worker.redelivery import RetryLaterError, SuspectError
from worker.telemetry import JOB_TYPE_DIMENSION, UNKNOWN_JOB_TYPE, WORKSPACES_HALTED, failure_cause

__all__ = [
    "JOB_TYPE_DIMENSION",
    "UNKNOWN_JOB_TYPE",
    "WORKSPACES_HALTED",
    "BatchWorker",
    "RetryLaterError",
    "SuspectError",
    "failure_cause",
    "parse_job_message",
]
