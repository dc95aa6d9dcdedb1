"""The dead-letter queue's records: a message as received (`DeadLetter`), a listing of them in group order, and what a
redrive did with each (`RedriveOutcome`, `RedriveResult`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from agent_jobs.keys import workspace_id_from_group


@dataclass(frozen=True)
class DeadLetter:
    """One message of the DLQ as received: its body, SQS attributes and message attributes."""

    message_id: str
    receipt_handle: str
    body: str
    attributes: dict[str, str]
    message_attributes: dict[str, str]

    @property
    def group_id(self) -> str | None:
        return self.attributes.get("MessageGroupId")

    @property
    def workspace_id(self) -> str | None:
        """The workspace of the message's group; None when the group names none (the worker records such a message
        REJECTED under its message id, without a workspace to halt)."""
        return workspace_id_from_group(self.group_id)

    @property
    def sequence_number(self) -> str | None:
        return self.attributes.get("SequenceNumber")

    @property
    def receive_count(self) -> int:
        return int(self.attributes.get("ApproximateReceiveCount", "0") or 0)

    @property
    def sent_at_ms(self) -> int | None:
        raw = self.attributes.get("SentTimestamp")
        return int(raw) if raw and raw.isdigit() else None

    @property
    def job_id(self) -> str | None:
        """The body's jobId when the body is a JSON object that has one (the body need not be a valid job)."""
        try:
            document = json.loads(self.body)
        except ValueError:
            return None
        job_id = document.get("jobId") if isinstance(document, dict) else None
        return job_id if isinstance(job_id, str) and job_id else None

    @property
    def sender_id(self) -> str | None:
        """The principal that sent the message (SQS's SenderId; a message moved to the DLQ keeps it)."""
        return self.attributes.get("SenderId") or None

    @property
    def tenants_named(self) -> list[str]:
        """The tenants the message names, in its `tenantId` attribute and in its body (the sender's word, both)."""
        try:
            document = json.loads(self.body)
        except ValueError:
            document = None
        in_body = document.get("tenantId") if isinstance(document, dict) else None
        named = [self.message_attributes.get("tenantId"), in_body if isinstance(in_body, str) else None]
        return list(dict.fromkeys(str(tenant) for tenant in named if tenant))

    def summary(self) -> dict[str, Any]:
        return {
            "messageId": self.message_id,
            "groupId": self.group_id,
            "workspaceId": self.workspace_id,
            "jobId": self.job_id,
            "sequenceNumber": self.sequence_number,
            "receiveCount": self.receive_count,
            "sentAt": self.sent_at_ms,
        }


@dataclass(frozen=True)
class Listing:
    """What one read saw: the messages in each group's order, and how many the queue says it holds."""

    messages: list[DeadLetter]
    approximate_total: int

    @property
    def unseen(self) -> int:
        """Messages the queue counts but the read could not see (behind earlier messages of their group)."""
        return max(0, self.approximate_total - len(self.messages))


class RedriveOutcome(StrEnum):
    PARKED = "PARKED"  # parked with its original SequenceNumber, workspace halted; deleted from the DLQ
    REJECTED = "REJECTED"  # not a valid job message: recorded REJECTED, workspace halted; deleted from the DLQ
    NO_WORKSPACE = "NO_WORKSPACE"  # its group names no workspace: recorded REJECTED under msg#<id>; deleted
    REFUSED = (
        "REFUSED"  # not the workspace owner's (an unbound sender, another tenant): recorded, nothing halted; deleted
    )
    ALREADY_DONE = "ALREADY_DONE"  # the job took effect (SUCCEEDED or SKIPPED): deleted only
    ALREADY_SETTLED = "ALREADY_SETTLED"  # the job is PARKED, DEAD or REJECTED already, its halt on record: deleted
    CONFLICT = "CONFLICT"  # the jobId belongs to a job with another payload: deleted without effect, as the worker does
    STALE_MARKER = "STALE_MARKER"  # a drain marker of no current resume (or malformed): deleted without effect
    LEFT = "LEFT"  # could not be settled now (see detail); left in the DLQ, and its group stopped
    STOPPED = "STOPPED"  # behind a message of its group that was left; left in the DLQ


@dataclass(frozen=True)
class RedriveResult:
    message_id: str
    workspace_id: str | None
    job_id: str | None
    sequence_number: str | None
    outcome: RedriveOutcome
    detail: str
    deleted: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "messageId": self.message_id,
            "workspaceId": self.workspace_id,
            "jobId": self.job_id,
            "sequenceNumber": self.sequence_number,
            "outcome": str(self.outcome),
            "detail": self.detail,
            "deleted": self.deleted,
        }


def sequence_key(sequence_number: str | None) -> tuple[int, int]:
    """Order by SequenceNumber as a number (SQS's are decimal strings); missing ones last."""
    if sequence_number and sequence_number.isdigit():
        return (0, int(sequence_number))
    return (1, 0)


def redrive_result(
    message: DeadLetter, outcome: RedriveOutcome, detail: str, *, deleted: bool = False
) -> RedriveResult:
    return RedriveResult(
        message_id=message.message_id,
        workspace_id=message.workspace_id,
        job_id=message.job_id,
        sequence_number=message.sequence_number,
        outcome=outcome,
        detail=detail,
        deleted=deleted,
    )


def in_group_order(messages: list[DeadLetter]) -> list[DeadLetter]:
    """Groups in order of first appearance, each group's messages by SequenceNumber (the queue's own order)."""
    first_seen: dict[str | None, int] = {}
    for index, message in enumerate(messages):
        first_seen.setdefault(message.group_id, index)
    return sorted(messages, key=lambda m: (first_seen[m.group_id], sequence_key(m.sequence_number)))
