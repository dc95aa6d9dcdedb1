"""Typed views of the table's records: what the core decides on, read from a stored item (plain Python values)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent_jobs.keys import parked_sequence
from agent_jobs.models import JobStatus, WorkspaceState


def _int(value: Any) -> int:
    return int(value) if value is not None else 0


def _str(value: Any) -> str | None:
    return str(value) if value is not None and value != "" else None


@dataclass(frozen=True)
class JobRecord:
    """A job's record (`job#<tenantId>#<jobId>`, or `msg#<messageId>` for a message that named no usable job)."""

    job_id: str | None
    status: JobStatus | None
    tenant_id: str | None = None
    workspace_id: str | None = None
    payload_hash: str | None = None
    message_id: str | None = None
    sequence_number: str | None = None
    lease_owner: str | None = None
    lease_expires_at: int = 0
    lease_shared: bool = False
    attempt: int = 0
    failures: int = 0
    accepted_at: int = 0
    has_body: bool = False
    error: str | None = None
    parked_reason: str | None = None

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> JobRecord:
        status = item.get("status")
        return cls(
            job_id=_str(item.get("jobId")),
            status=JobStatus(str(status)) if status in JobStatus.__members__ else None,
            tenant_id=_str(item.get("tenantId")),
            workspace_id=_str(item.get("workspaceId")),
            payload_hash=_str(item.get("payloadHash")),
            message_id=_str(item.get("messageId")),
            sequence_number=_str(item.get("sequenceNumber")),
            lease_owner=_str(item.get("leaseOwner")),
            lease_expires_at=_int(item.get("leaseExpiresAt")),
            lease_shared=bool(item.get("leaseShared")),
            attempt=_int(item.get("attempt")),
            failures=_int(item.get("failures")),
            accepted_at=_int(item.get("acceptedAt")),
            has_body=bool(item.get("body")),
            error=_str(item.get("error")),
            parked_reason=_str(item.get("parkedReason")),
        )

    def lease_live(self, now: int) -> bool:
        """IN_FLIGHT under a lease that has not expired: its worker may still be running it."""
        return self.status is JobStatus.IN_FLIGHT and self.lease_expires_at >= now

    def queue_position(self) -> str:
        """Its place in its workspace's queue order: the SequenceNumber (zero-padded), else when it was accepted."""
        return parked_sequence(self.sequence_number, self.accepted_at)


@dataclass(frozen=True)
class LastResume:
    halting_job_id: str | None = None
    decision: str | None = None


@dataclass(frozen=True)
class WorkspaceRecord:
    """A workspace's record (`ws#<workspaceId>`): its owner, and the halt and resume fields the core decides on."""

    workspace_id: str
    state: WorkspaceState
    tenant_id: str | None = None
    halting_job_id: str | None = None
    parked_count: int = 0
    draining_job_id: str | None = None
    last_resume: LastResume = field(default_factory=LastResume)
    undecided_job_ids: frozenset[str] = frozenset()

    @classmethod
    def from_item(cls, item: Mapping[str, Any], workspace_id: str = "") -> WorkspaceRecord:
        state = item.get("state")
        last = item.get("lastResume") or {}
        return cls(
            workspace_id=str(item.get("workspaceId") or workspace_id or str(item.get("pk", ""))[3:]),
            state=WorkspaceState(str(state)) if state in WorkspaceState.__members__ else WorkspaceState.ACTIVE,
            tenant_id=_str(item.get("tenantId")),
            halting_job_id=_str(item.get("haltingJobId")),
            parked_count=_int(item.get("parkedCount")),
            draining_job_id=_str(item.get("drainingJobId")),
            last_resume=LastResume(_str(last.get("haltingJobId")), _str(last.get("decision"))),
            undecided_job_ids=frozenset(str(job_id) for job_id in item.get("undecidedJobIds") or ()),
        )

    @property
    def halted(self) -> bool:
        """HALTED or RESUMING: jobs that reach the workspace are parked behind the halt, not run."""
        return self.state in (WorkspaceState.HALTED, WorkspaceState.RESUMING)


def registration_owner(item: Mapping[str, Any]) -> str | None:
    """The tenant a workspace item is registered to: its tenantId when it carries a registration (a remoteUrl); None
    for an item with halt state only (its tenantId, if any, is the tenant a halt recorded), or no item at all."""
    tenant_id = _str(item.get("tenantId"))
    return tenant_id if tenant_id and "remoteUrl" in item else None
