"""Record parsing: a queue record's body as a JobMessage bound to its workspace's owner, a large payload's pointer
resolved, a drain marker recognised. A record that is not the owner's (a sender the owner did not bind, another tenant
named) is refused, halting nothing; one of the owner's that cannot be run is REJECTED (its workspace halted); both are
acknowledged."""

from __future__ import annotations

from collections.abc import Callable

from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError

from agent_jobs.direct_producers import other_tenant_reason, sender_admitted, unbound_sender_reason
from agent_jobs.keys import workspace_group_id, workspace_id_from_group
from agent_jobs.models import (
    DRAIN_MESSAGE_TYPE,
    DrainMarker,
    JobMessage,
    PayloadUnavailableError,
    parse_queue_message,
)
from agent_jobs.payloads import resolve_payload, storable_body
from job_worker.worker.redelivery import Redelivery, RetryLaterError, RunFailedError
from job_worker.worker.telemetry import job_id_if_any, job_type_if_any, tenant_if_any


def parse_job_message(body: str, group: str) -> JobMessage:
    """The one parse of a job message body, for a queue record and for a body a resume drains from the table alike.

    Raises (pydantic's ValidationError, ValueError) when the body is not a valid job of the workspace of `group`.
    A large job's payload stays a pointer here; `RecordParsing._resolve_payload` fetches it before the job runs.
    """
    # payloadHash is derived when a direct producer left it out (`parse_queue_message`); a pointer message
    # (payloadRef) is checked against its object when resolved (`RecordParsing._resolve_payload`).
    message = parse_queue_message(body)
    if group != workspace_group_id(message.workspace_id):
        # Two groups feeding one workspace would let two of its jobs run at once.
        raise ValueError(f"message group {group!r} is not workspace {message.workspace_id!r}'s group")
    return message


class RecordParsing(Redelivery):
    """A record's job message, or None when the record was rejected or refused (and acknowledged)."""

    def _parse_or_reject(self, record: SQSRecord, *, resolve_payload_ref: bool = True) -> JobMessage | None:
        group = record.attributes.message_group_id or ""
        group_workspace = workspace_id_from_group(group)
        if group_workspace is None:
            self._reject_without_workspace(record, group)
            return None
        # The registration is cached and its owner never changes: this costs no read on the happy path.
        owner = self.workspaces.owner(group_workspace) if self.workspaces.binds_tenants else None
        if owner is not None and not self._sent_for_the_owner(record, group_workspace):
            named = tenants_named(record)
            reason = unbound_sender_reason(sender_id_of(record), group_workspace)
            self._refuse(record, reason, named[0] if named else None)
            return None
        try:
            message = parse_job_message(record.body, group)
        except Exception as error:  # anything that cannot be parsed is rejected, never retried until dead-lettered
            reason = describe_invalid(error)
            job_id = job_id_if_any(record.body)
            named = tenants_named(record)
            tenant = named[0] if named else None
            if self.workspaces.binds_tenants:
                other = next((name for name in named if name != owner), None)
                if owner is not None and other is not None:
                    # Not the owner's broken job: it is refused, and never halts the owner's workspace.
                    self._refuse(record, f"{other_tenant_reason(other, group_workspace)} ({reason})", other)
                    return None
                # The record is the owner's, and it takes the message's jobId only when the sender named the owner,
                # so that no sender can take a jobId of the owner's.
                job_id, tenant = (job_id if named == [owner] else None), owner
            rejected = self.services.guard.reject(
                message_id=record.message_id,
                job_id=job_id,
                workspace_id=group_workspace,
                tenant_id=tenant,
                reason=reason,
                body=record.body,
            )
            self.logger.error(
                "message rejected: workspace halted",
                extra={
                    "reason": reason,
                    "jobId": job_id,
                    "workspaceId": group_workspace,
                    "messageId": record.message_id,
                },
            )
            self._count("JobsRejected", job_type_if_any(record))
            if rejected:  # False: this message was rejected (and its workspace halted) before
                self._count_halt()
            return None
        bound = self._bind_tenant(record, message, owner)
        if bound is None:
            return None
        if resolve_payload_ref:  # parking needs only the pointer; running needs the payload
            bound = self._resolve_payload(bound, lambda: self._backoff_seconds(record))
        return bound

    def _sent_for_the_owner(self, record: SQSRecord, workspace_id: str) -> bool:
        """The record's sender may send the owner's jobs (`agent_jobs.direct_producers.sender_admitted`): the stack's
        enqueue API, a sender the owner bound, or anyone allowed to send when the owner bound none. Decided by the
        SenderId SQS stamped on the message, never by anything the sender wrote in it."""
        return sender_admitted(
            sender_id_of(record),
            self.workspaces.direct_producers(workspace_id),
            api_sender_id=self.services.settings.api_sender_id,
        )

    def _refuse(self, record: SQSRecord, reason: str, named_tenant: str | None) -> None:
        """A record that is not its workspace owner's: recorded for the operator under `msg#<messageId>`
        (`JobGuard.refuse`), logged, counted (MessagesRefused) and acknowledged. It halts nothing and takes no jobId,
        so a sender cannot stop the owner's workspace or take the owner's jobIds."""
        sender = sender_id_of(record)
        recorded = self.services.guard.refuse(
            message_id=record.message_id,
            group_id=record.attributes.message_group_id or "",
            reason=reason,
            body=record.body,
            sender_id=sender,
            named_tenant=named_tenant,
        )
        self.logger.warning(
            "message refused: not its workspace owner's; nothing halted",
            extra={
                "reason": reason,
                "workspaceId": workspace_id_from_group(record.attributes.message_group_id),
                "messageId": record.message_id,
                "senderId": sender,
            },
        )
        if recorded:  # False: this message was refused before
            self._count_refused()

    def _reject_without_workspace(self, record: SQSRecord, group: str) -> None:
        """A record whose group names no workspace (empty, `ws#` alone, another scheme): nothing can run it and there
        is no workspace to halt. It is recorded REJECTED under `msg#<messageId>` (`JobGuard.reject_unrouted`), logged,
        counted (`MessagesWithoutWorkspace`) and acknowledged; whatever its body says, it is never run."""
        reason = (
            f"message group {group!r} names no workspace: send each job with MessageGroupId ws#<workspaceId> of a "
            "registered workspace; nothing was applied"
        )
        self.services.guard.reject_unrouted(
            message_id=record.message_id, group_id=group, reason=reason, body=record.body
        )
        self.logger.error(
            "message rejected: its group names no workspace",
            extra={
                "reason": reason,
                "jobId": job_id_if_any(record.body),
                "groupId": group[:128],
                "messageId": record.message_id,
            },
        )
        self._count("JobsRejected", job_type_if_any(record))
        self._count("MessagesWithoutWorkspace")

    def _bind_tenant(self, record: SQSRecord, message: JobMessage, owner: str | None) -> JobMessage | None:
        """The message with its job's tenant: the workspace owner's (`owner`). A message naming another tenant (in its
        body or its tenantId attribute) is not the owner's: it is refused (recorded for the operator, nothing halted,
        no jobId taken) and None returned; one naming none takes the owner's.

        A workspace nobody registered keeps the message's tenant: its job ends DEAD saying to register the workspace
        (`_job_context`); without a tenant either, the message is REJECTED with that advice. A store without
        registrations (folder workspaces) names no owner: there the message's tenant stands.
        """
        other = next((name for name in tenants_named(record) if name != owner), None)
        if owner is not None and other is not None:
            self._refuse(record, other_tenant_reason(other, message.workspace_id), other)
            return None
        if owner is not None or message.tenant_id is not None:
            tenant = owner or message.tenant_id
            return message if tenant == message.tenant_id else message.model_copy(update={"tenant_id": tenant})
        reason = (
            f"message names no tenant and workspace {message.workspace_id} is not registered: register it with "
            f"PUT /workspaces/{message.workspace_id}, then resume the workspace"
        )
        rejected = self.services.guard.reject(
            message_id=record.message_id,
            job_id=message.job_id,
            workspace_id=message.workspace_id,
            tenant_id=None,
            reason=reason,
            body=record.body,
        )
        self.logger.error("message rejected: workspace halted", extra={"reason": reason, "jobId": message.job_id})
        self._count("JobsRejected", str(message.type))
        if rejected:
            self._count_halt()
        return None

    def _resolve_payload(self, message: JobMessage, backoff_seconds: Callable[[], int]) -> JobMessage:
        """The message with a large job's payload fetched from the payload bucket (the one place pointers are resolved,
        for a queue record and for a body a drain runs). A missing or changed object is not a bad message: the job is
        claimed as usual (a duplicate stays a duplicate, a halted workspace parks it) and then ends DEAD without
        running, its reason saying what to do. S3 unreachable, throttled or denying: nothing decided, RunFailedError (a
        failure of the record's own, so near the delivery limit it is parked rather than dead-lettered)."""
        try:
            return resolve_payload(message, self.services.payloads)
        except PayloadUnavailableError as unavailable:
            self.logger.error("payload object unavailable", extra={"reason": str(unavailable)})
            return message
        except (BotoCoreError, ClientError) as error:
            raise RunFailedError(f"payload object not readable: {error}", backoff_seconds()) from error

    def _storable_body(self, record: SQSRecord, message: JobMessage) -> str:
        """The record's body as a PARKED or DEAD job keeps it (`agent_jobs.payloads.storable_body`): a body too large
        for a record is replaced by the job's pointer message. The bucket unreachable: nothing decided, retried."""
        try:
            return storable_body(record.body, message, self.services.payloads)
        except (BotoCoreError, ClientError) as error:
            raise RetryLaterError(f"payload bucket not writable: {error}", self._backoff_seconds(record)) from error

    # ---- resume: drain markers ------------------------------------------------------------------------------------

    def _drain_marker(self, record: SQSRecord) -> DrainMarker | None:
        """The marker of a record whose type attribute says drain; None (logged, to be acknowledged) if it is not a
        valid marker of its own group's workspace: a marker is never rejected, so it never halts a workspace."""
        try:
            marker = DrainMarker.model_validate_json(record.body)
        except Exception as error:  # a malformed marker can do nothing: acknowledge it
            self.logger.error("invalid drain marker: acknowledged", extra={"error": describe_invalid(error)})
            return None
        if record.attributes.message_group_id != workspace_group_id(marker.workspace_id):
            self.logger.error("drain marker in another workspace's group: acknowledged")
            return None
        return marker


def sender_id_of(record: SQSRecord) -> str | None:
    """The SenderId SQS stamped on the record (the principal that sent it); None when the event carries none."""
    sender = record.attributes.get("SenderId")
    return str(sender) if sender else None


def tenants_named(record: SQSRecord) -> list[str]:
    """The tenants a record names, in its `tenantId` attribute and in its body (the sender's word, both): one other
    than the workspace owner's makes the record not the owner's."""
    attributes = record.message_attributes
    # SQSMessageAttributes.get returns the raw dict; indexing gives the typed attribute
    attribute = attributes["tenantId"] if "tenantId" in attributes else None  # noqa: SIM401
    named = [attribute.string_value if attribute else None, tenant_if_any(record.body)]
    return list(dict.fromkeys(str(tenant) for tenant in named if tenant))


def is_drain_marker(record: SQSRecord) -> bool:
    attributes = record.message_attributes
    # SQSMessageAttributes.get returns the raw dict; indexing gives the typed attribute
    kind = attributes["type"] if "type" in attributes else None  # noqa: SIM401
    return kind is not None and kind.string_value == DRAIN_MESSAGE_TYPE


def describe_invalid(error: Exception) -> str:
    if isinstance(error, ValidationError):
        parts = [f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in error.errors()[:5]]
        return "invalid job message: " + "; ".join(parts)
    return f"invalid job message: {error}"
