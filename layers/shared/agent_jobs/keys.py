"""Message and item keys. One place derives them, so the producer, the worker and the tools always agree."""

from __future__ import annotations

import hashlib
import re

WORKSPACE_GROUP_PREFIX = "ws#"
MAX_GROUP_ID_LENGTH = 128


def workspace_group_id(workspace_id: str) -> str:
    """The SQS MessageGroupId of a workspace: every job of one workspace shares one FIFO group."""
    group_id = f"{WORKSPACE_GROUP_PREFIX}{workspace_id}"
    if len(group_id) > MAX_GROUP_ID_LENGTH:
        raise ValueError(f"workspaceId is too long for an SQS message group id ({len(group_id)} > 128 characters)")
    return group_id


# The workspaceId rule of `agent_jobs.models` (ID_PATTERN, at most 100 characters), spelled out so that reading a
# group id never imports the job model.
_WORKSPACE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def workspace_id_from_group(group_id: str | None) -> str | None:
    """Inverse of `workspace_group_id`: the workspace of a group `ws#<workspaceId>`, or None for a group that names
    none (empty, `ws#` alone, another scheme, or not a valid workspaceId). A message of such a group has no
    workspace to run in or to halt."""
    if not group_id or not group_id.startswith(WORKSPACE_GROUP_PREFIX):
        return None
    workspace_id = group_id.removeprefix(WORKSPACE_GROUP_PREFIX)
    return workspace_id if _WORKSPACE_ID.fullmatch(workspace_id) else None


def deduplication_id(tenant_id: str, job_id: str, job_type: str) -> str:
    """sha256(`<tenantId>:<jobId>:<type>`) hex: 64 characters, within SQS's 128-character limit. The tenant is part
    of it because jobIds are the tenant's own names: two tenants' jobs of the same jobId are two jobs."""
    return hashlib.sha256(f"{tenant_id}:{job_id}:{job_type}".encode()).hexdigest()


def drain_deduplication_id(workspace_id: str, resume_id: str, round_number: int) -> str:
    """sha256(`drain:<workspaceId>:<resumeId>:<round>`) hex: one drain marker per round of a resume."""
    return hashlib.sha256(f"drain:{workspace_id}:{resume_id}:{round_number}".encode()).hexdigest()


PARKED_SEQUENCE_WIDTH = 40


def parked_sequence(sequence_number: str | None, fallback_ms: int) -> str:
    """A SequenceNumber zero-padded to a fixed width, so the string order of the parked index is the numeric order.
    A job parked without a SequenceNumber sorts after every numbered one, by the time it was parked."""
    if sequence_number and sequence_number.isdigit():
        return sequence_number.rjust(PARKED_SEQUENCE_WIDTH, "0")
    return "~" + str(fallback_ms).rjust(PARKED_SEQUENCE_WIDTH, "0")


# The pending index's key (`queueSeq`) of a job accepted but not yet placed in its queue: its send is not confirmed,
# and no worker has seen a copy of it. It sorts before every SequenceNumber (b"!" < b"0"), by when it was accepted, so
# that every job claimed after it finds it ahead (`agent_jobs.store.queries`).
UNPLACED_PREFIX = "!"


def unplaced_sequence(accepted_at_ms: int) -> str:
    """The `queueSeq` of a job whose place in its queue is not known yet (recorded, its send unconfirmed)."""
    return UNPLACED_PREFIX + str(accepted_at_ms).rjust(PARKED_SEQUENCE_WIDTH, "0")


def is_unplaced(queue_seq: object) -> bool:
    """Whether a `queueSeq` is `unplaced_sequence`'s: the job's place is not known yet."""
    return isinstance(queue_seq, str) and queue_seq.startswith(UNPLACED_PREFIX)


def unplaced_since(queue_seq: str) -> int:
    """When the job of an unplaced `queueSeq` was accepted (epoch ms)."""
    return int(queue_seq.removeprefix(UNPLACED_PREFIX))


def job_key(tenant_id: str, job_id: str) -> str:
    """A job record's key: `job#<tenantId>#<jobId>`. JobIds are named by each tenant, so the key holds the tenant:
    one tenant can neither take nor read another's job by naming its jobId. Neither id may hold `#` (ID_PATTERN)."""
    return f"job#{tenant_id}#{job_id}"


def workspace_key(workspace_id: str) -> str:
    return f"ws#{workspace_id}"


def rate_key(tenant_id: str, second: int) -> str:
    """The item counting a tenant's jobs accepted in one epoch second (`agent_jobs.quotas`)."""
    return f"rate#{tenant_id}#{second}"
