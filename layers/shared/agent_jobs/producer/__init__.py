"""Enqueue jobs the way the API does, for any Python service: validate, record QUEUED, send to the FIFO queue.

`enqueue_job` sends one job (`single`), `enqueue_jobs` up to ten in one request (`batch`); `errors` says why a job is
refused and `common` holds what both share (quota admission, message attributes).
"""

from __future__ import annotations

from agent_jobs.producer.batch import (
    BATCH_PAYLOAD_LIMIT_BYTES,
    MAX_BATCH_JOBS,
    BatchItemResult,
    enqueue_jobs,
)
from agent_jobs.producer.errors import (
    InvalidBatchError,
    JobConflictError,
    PayloadTooLargeError,
    WorkspaceForbiddenError,
    WorkspaceUnregisteredError,
)
from agent_jobs.producer.single import DEFAULT_INLINE_MESSAGE_LIMIT_BYTES, EnqueueResult, enqueue_job

__all__ = [
    "BATCH_PAYLOAD_LIMIT_BYTES",
    "DEFAULT_INLINE_MESSAGE_LIMIT_BYTES",
    "MAX_BATCH_JOBS",
    "BatchItemResult",
    "EnqueueResult",
    "InvalidBatchError",
    "JobConflictError",
    "PayloadTooLargeError",
    "WorkspaceForbiddenError",
    "WorkspaceUnregisteredError",
    "enqueue_job",
    "enqueue_jobs",
]
