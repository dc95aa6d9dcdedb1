"""The guard: the only code that writes job and workspace state, under the names its callers use.

The guard is the store (`agent_jobs.store`) over the core (`agent_jobs.core`): this module gathers the names callers
import, so that a caller needs one import for a claim, its outcome and its lease.
"""

from __future__ import annotations

from agent_jobs.core.outcomes import AcceptOutcome, ClaimOutcome, FailOutcome, ResumeOutcome
from agent_jobs.store import JobGuard
from agent_jobs.store.codec import (
    MAX_STORED_BODY_CHARS,
    MAX_STORED_ERROR_CHARS,
    Clock,
    Item,
    cancellation,
    condition_failed,
    epoch_ms,
    reason_failed,
    to_item,
    wire,
)
from agent_jobs.store.conditions import (
    ATTEMPTS_BEFORE_RETRY,
    HALTED_INDEX,
    PARKED_INDEX,
    PENDING_INDEX,
    WORKSPACE_INDEX,
)
from agent_jobs.store.results import (
    AcceptResult,
    ClaimResult,
    HaltedPage,
    JobPage,
    JobsAhead,
    Lease,
    QueuePlace,
    ResumeResult,
)

__all__ = [
    "ATTEMPTS_BEFORE_RETRY",
    "HALTED_INDEX",
    "MAX_STORED_BODY_CHARS",
    "MAX_STORED_ERROR_CHARS",
    "PARKED_INDEX",
    "PENDING_INDEX",
    "WORKSPACE_INDEX",
    "AcceptOutcome",
    "AcceptResult",
    "ClaimOutcome",
    "ClaimResult",
    "Clock",
    "FailOutcome",
    "HaltedPage",
    "Item",
    "JobGuard",
    "JobPage",
    "JobsAhead",
    "Lease",
    "QueuePlace",
    "ResumeOutcome",
    "ResumeResult",
    "cancellation",
    "condition_failed",
    "epoch_ms",
    "reason_failed",
    "to_item",
    "wire",
]
