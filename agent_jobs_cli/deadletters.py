"""Dead-letter queue operations: list, show and redrive the messages the jobs queue moved to its FIFO DLQ.

These act with operator AWS credentials on the queue and the table directly, not through the API.

Reading without deleting. A FIFO queue hands out a message group's later messages only while none of its earlier
ones is in flight. So `DeadLetterQueue.read` receives with a visibility timeout (`hold_seconds`), keeps every receipt
handle, receives again until nothing new comes, and then sets the visibility of everything it held back to 0, so
nothing stays hidden from the next reader. A group can show only the messages SQS hands out in one receive before
its earlier messages are deleted (up to 10); the queue's approximate count tells how many were not seen.
Receiving counts as a receive (ApproximateReceiveCount rises); the DLQ has no redrive policy, so that moves nothing.

Redrive, without StartMessageMoveTask (emulators lack it) and without resending. Resending a dead-lettered message
to the jobs queue would give it a new SequenceNumber, after the jobs the queue accepted later, and the worker would
run it after them: order broken. Instead each selected message, in its group's order, is parked through
`JobGuard.park(..., halt_workspace=True)` with the job's original SequenceNumber (the job record's stored
`sequenceNumber`, else the message's own), which halts its workspace in the same transaction. The worker parks every
later job of a halted workspace, and a resume (`agent-jobs resume W --retry`) drains the parked jobs in
SequenceNumber order, this one first. A body that is not a valid job message is rejected through `JobGuard.reject`
(which halts too), unless a delivery of the same message was rejected before and an operator decided it since: then
it is only deleted (`JobGuard.rejection_of` finds its record). A message that is not its workspace owner's by the
worker's rule (`agent_jobs.direct_producers`: a SenderId, which a DLQ message keeps, that is neither the stack's API
nor one of the direct producers the owner bound; or another tenant named) is refused as the worker refuses it
(`JobGuard.refuse`): recorded under its message id and deleted, never parked as the owner's job, nothing halted. A
job that already took effect (SUCCEEDED or SKIPPED) is only deleted, and so is a drain marker of no current resume
(the worker would acknowledge it without effect). A DLQ message is deleted only after its park, reject or refusal
write succeeded; a message that could not be settled stops its
group (its later messages stay in the DLQ, in order) and is left visible for the next run.

No job behind a dead-lettered one runs before the redrive: the job the queue hands out next finds the dead-lettered
job still unsettled in the table's pending index, is parked behind it and halts the workspace naming it
(`JobGuard.jobs_ahead`). Each such missing job is one the operator decides: after the redrive parked it,
a resume with retry runs it in its original place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from agent_jobs.direct_producers import other_tenant_reason, sender_admitted, unbound_sender_reason
from agent_jobs.guard import JobGuard
from agent_jobs.models import DRAIN_MESSAGE_TYPE, JobStatus
from agent_jobs.registration import RegisteredWorkspace
from agent_jobs_cli.deadletter_checks import is_current_marker, parse_job_message, registered_owners
from agent_jobs_cli.deadletter_messages import (
    DeadLetter,
    Listing,
    RedriveOutcome,
    RedriveResult,
    in_group_order,
    redrive_result,
    sequence_key,
)

if TYPE_CHECKING:
    from mypy_boto3_sqs.client import SQSClient

DEFAULT_HOLD_SECONDS: Final = 60
MAX_RECEIVES: Final = 1000  # a bound on one read, far beyond any DLQ an operator reads by hand
_BATCH: Final = 10


@dataclass
class _Held:
    """Messages received and not deleted during one operation: their latest receipt handles, in arrival order."""

    messages: dict[str, DeadLetter] = field(default_factory=dict)

    def keep(self, message: DeadLetter) -> bool:
        """True if the message is new to this operation."""
        new = message.message_id not in self.messages
        self.messages[message.message_id] = message  # the newest receipt handle is the one SQS honours
        return new

    def forget(self, message_id: str) -> None:
        self.messages.pop(message_id, None)


class DeadLetterQueue:
    """The jobs queue's FIFO dead-letter queue (`dlq_url`)."""

    def __init__(
        self,
        sqs: SQSClient,
        dlq_url: str,
        *,
        hold_seconds: int = DEFAULT_HOLD_SECONDS,
        final_wait_seconds: int = 1,
        api_sender_id: str | None = None,
    ) -> None:
        self._sqs = sqs
        self._url = dlq_url
        # The SenderId of the stack's enqueue API (its role's unique id): its messages are always their workspace
        # owner's. Unknown (None), a message of a workspace that binds its direct producers is left in the DLQ.
        self._api_sender_id = api_sender_id
        self._hold = hold_seconds
        # A short poll can miss messages on SQS; an empty short poll is confirmed by one long poll this long.
        self._final_wait = final_wait_seconds

    # ---- reading -------------------------------------------------------------------------------------------------

    def read(self, select: Callable[[DeadLetter], bool] = lambda _: True) -> Listing:
        """Every message the queue hands out (those `select` keeps), each group in order, nothing deleted."""
        with self._holding() as held:
            for _ in self._receive_until_quiet(held):
                pass
            messages = [m for m in held.messages.values() if select(m)]
        return Listing(messages=in_group_order(messages), approximate_total=self.approximate_depth())

    def find(self, message_id: str) -> DeadLetter | None:
        """One message by its MessageId (read like `read`, nothing deleted)."""
        matches = self.read(lambda message: message.message_id == message_id).messages
        return matches[0] if matches else None

    def approximate_depth(self) -> int:
        attributes = self._sqs.get_queue_attributes(
            QueueUrl=self._url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return sum(int(value) for value in attributes.values())

    @contextmanager
    def _holding(self) -> Iterator[_Held]:
        held = _Held()
        try:
            yield held
        finally:
            self._release(list(held.messages.values()))

    def _receive_until_quiet(self, held: _Held) -> Iterator[list[DeadLetter]]:
        """Receive batches (kept in `held`) until a receive brings nothing new; yields each batch's new messages."""
        for _ in range(MAX_RECEIVES):
            fresh = [m for m in self._receive(wait_seconds=0) if held.keep(m)]
            if not fresh and self._final_wait:
                fresh = [m for m in self._receive(wait_seconds=self._final_wait) if held.keep(m)]
            if not fresh:
                return
            yield fresh

    def _receive(self, *, wait_seconds: int) -> list[DeadLetter]:
        response = self._sqs.receive_message(
            QueueUrl=self._url,
            MaxNumberOfMessages=_BATCH,
            VisibilityTimeout=self._hold,
            WaitTimeSeconds=wait_seconds,
            MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        return [
            DeadLetter(
                message_id=raw["MessageId"],
                receipt_handle=raw["ReceiptHandle"],
                body=raw.get("Body", ""),
                attributes={str(name): value for name, value in (raw.get("Attributes") or {}).items()},
                message_attributes={
                    name: str(value.get("StringValue", value.get("BinaryValue", "")))
                    for name, value in (raw.get("MessageAttributes") or {}).items()
                },
            )
            for raw in response.get("Messages", [])
        ]

    def _release(self, messages: list[DeadLetter]) -> None:
        """Visible again at once, so nothing stays hidden from the next reader (or the worker of a redrive)."""
        for start in range(0, len(messages), _BATCH):
            chunk = messages[start : start + _BATCH]
            self._sqs.change_message_visibility_batch(
                QueueUrl=self._url,
                Entries=[
                    {"Id": str(index), "ReceiptHandle": message.receipt_handle, "VisibilityTimeout": 0}
                    for index, message in enumerate(chunk)
                ],
            )

    def _delete(self, message: DeadLetter) -> None:
        self._sqs.delete_message(QueueUrl=self._url, ReceiptHandle=message.receipt_handle)

    # ---- redrive -------------------------------------------------------------------------------------------------

    def redrive(
        self,
        guard: JobGuard,
        *,
        select_workspace: Callable[[str | None], bool],
        owner_of: Callable[[str], RegisteredWorkspace | None],
        max_receive_count: int | None = None,
        on_result: Callable[[RedriveResult], None] = lambda _: None,
    ) -> list[RedriveResult]:
        """Park (or reject) every message of the selected workspaces, each group in order, and delete it from the DLQ
        once that write succeeded (see the module docstring). `owner_of` gives a workspace's registration (None when
        nobody registered it): a job's tenant is the owner's, whatever its message says, as in the worker. A message
        that is not the owner's (a sender the owner did not bind, another tenant named) is refused as the worker
        refuses it: recorded under its message id, deleted, nothing parked or halted. `max_receive_count` (the jobs
        queue's redrive maxReceiveCount) goes into the parked reason; each result is also passed to `on_result` as
        it happens."""
        results: list[RedriveResult] = []
        stopped_groups: set[str | None] = set()
        with self._holding() as held:
            for batch in self._receive_until_quiet(held):
                for message in in_group_order(batch):
                    if not select_workspace(message.workspace_id):
                        continue  # held until the end, then made visible again
                    if message.group_id in stopped_groups:
                        result = redrive_result(
                            message, RedriveOutcome.STOPPED, "behind a message of its group that was left"
                        )
                    else:
                        result = self._redrive_one(guard, message, owner_of, max_receive_count)
                        if result.deleted:
                            held.forget(message.message_id)
                        elif result.outcome is RedriveOutcome.LEFT:
                            stopped_groups.add(message.group_id)
                    results.append(result)
                    on_result(result)
        return results

    def _redrive_one(
        self,
        guard: JobGuard,
        message: DeadLetter,
        owner_of: Callable[[str], RegisteredWorkspace | None],
        max_receive_count: int | None,
    ) -> RedriveResult:
        if message.message_attributes.get("type") == DRAIN_MESSAGE_TYPE and not is_current_marker(guard, message):
            # The worker acknowledges such a marker without effect; rejecting it would halt a workspace for nothing.
            return self._deleted(message, RedriveOutcome.STALE_MARKER, "a drain marker of no current resume; no effect")
        if message.workspace_id is None:
            return self.drop(guard, message, reason="dead-lettered by the queue")
        workspace_id = message.workspace_id
        registered = owner_of(workspace_id)
        owner = registered.tenant_id if registered else None
        refused = self._refused_if_not_the_owners(guard, message, registered) if registered else None
        if refused is not None:
            return refused
        job, problem = parse_job_message(message)
        claimed = (job.tenant_id if job else None) or message.message_attributes.get("tenantId")
        if job is None:
            # Recorded as the owner's, under the message's jobId only when the message named the owner: a sender must
            # not take a jobId of the owner's (as in the worker).
            rejected = guard.reject(
                message_id=message.message_id,
                job_id=message.job_id if owner is None or claimed == owner else None,
                workspace_id=workspace_id,
                tenant_id=owner or message.message_attributes.get("tenantId"),
                reason=f"dead-lettered by the queue and not a valid job message: {problem}",
                body=message.body,
            )
            if not rejected:
                # A delivery of this same message was rejected before and an operator has decided it since (its
                # record is SKIPPED, not REJECTED, so it is not written again): nothing is left to do but delete it.
                recorded = guard.rejection_of(
                    message_id=message.message_id,
                    job_id=message.job_id if owner is None or claimed == owner else None,
                    tenant_id=owner or message.message_attributes.get("tenantId"),
                )
                if recorded is not None:
                    return self._deleted(
                        message,
                        RedriveOutcome.ALREADY_SETTLED,
                        f"its rejection is on record ({recorded.get('status')}); no effect",
                    )
                return redrive_result(message, RedriveOutcome.LEFT, "the rejection could not be recorded")
            return self._deleted(message, RedriveOutcome.REJECTED, f"not a valid job message ({problem}); halted")

        tenant_id = owner or claimed
        if tenant_id is None:
            return redrive_result(
                message, RedriveOutcome.LEFT, "the message names no tenant; send it again through the API"
            )
        job = job if job.tenant_id else job.model_copy(update={"tenant_id": tenant_id})
        record = guard.get_job(tenant_id, job.job_id) or {}
        status = record.get("status")
        if record and record.get("payloadHash") not in (None, job.payload_hash):
            return self._deleted(
                message, RedriveOutcome.CONFLICT, "the jobId belongs to a job with another payload; no effect"
            )
        if status in (JobStatus.SUCCEEDED, JobStatus.SKIPPED):
            return self._deleted(message, RedriveOutcome.ALREADY_DONE, f"job is {status}: it took effect")
        if status in (JobStatus.PARKED, JobStatus.DEAD, JobStatus.REJECTED):
            return self._deleted(message, RedriveOutcome.ALREADY_SETTLED, f"job is {status}: its halt is on record")
        if status == JobStatus.IN_FLIGHT and int(record.get("leaseExpiresAt", 0)) >= guard.now():
            return redrive_result(
                message, RedriveOutcome.LEFT, "a worker holds the job's lease; redrive again after it ends"
            )

        sequence_number = record.get("sequenceNumber") or message.sequence_number
        receives = max_receive_count or message.receive_count
        parked = guard.park(
            job,
            message_id=message.message_id,  # SQS keeps a message's MessageId when it moves it to the DLQ
            sequence_number=str(sequence_number) if sequence_number else None,
            body=message.body,
            reason=f"dead-lettered by the queue after {receives} receives; redriven",
            halt_workspace=True,
        )
        if not parked:
            now = (guard.get_job(tenant_id, job.job_id) or {}).get("status")
            return redrive_result(message, RedriveOutcome.LEFT, f"could not park the job (now {now}); redrive again")
        return self._deleted(message, RedriveOutcome.PARKED, f"parked at SequenceNumber {sequence_number}; halted")

    def _refused_if_not_the_owners(
        self, guard: JobGuard, message: DeadLetter, registered: RegisteredWorkspace
    ) -> RedriveResult | None:
        """A message of a registered workspace that is not its owner's by the worker's rule (a sender the owner did not
        bind, another tenant named: `agent_jobs.direct_producers`) refused as the worker refuses it; None when it is
        the owner's. LEFT when the owner bound direct producers and the stack's API sender id is unknown: the message
        may be the API's."""
        workspace_id = registered.workspace_id
        sender = message.sender_id
        if not sender_admitted(sender, registered.registration.direct_producers, api_sender_id=self._api_sender_id):
            if self._api_sender_id is None:
                return redrive_result(
                    message,
                    RedriveOutcome.LEFT,
                    f"workspace {workspace_id} binds its direct producers and the stack's API sender id is unknown: "
                    "redrive with a target that names it (the stack's ApiSenderId output, or a restarted local "
                    "runtime)",
                )
            return self._refuse(guard, message, unbound_sender_reason(sender, workspace_id))
        other = next((tenant for tenant in message.tenants_named if tenant != registered.tenant_id), None)
        return None if other is None else self._refuse(guard, message, other_tenant_reason(other, workspace_id))

    def _refuse(self, guard: JobGuard, message: DeadLetter, reason: str) -> RedriveResult:
        """Record a message that is not its workspace owner's as the worker does (`JobGuard.refuse`), then delete it:
        it never becomes the owner's job, takes none of its jobIds and halts nothing."""
        named = message.tenants_named
        guard.refuse(
            message_id=message.message_id,
            group_id=str(message.group_id),
            reason=f"dead-lettered by the queue; {reason}",
            body=message.body,
            sender_id=message.sender_id,
            named_tenant=named[0] if named else None,
        )
        return self._deleted(message, RedriveOutcome.REFUSED, f"{reason}; recorded as msg#{message.message_id}")

    def drop(self, guard: JobGuard, message: DeadLetter, *, reason: str) -> RedriveResult:
        """Delete a message whose group names no workspace, once it is recorded REJECTED under `msg#<messageId>`
        (`JobGuard.reject_unrouted`): nothing can run it, there is no workspace to halt, and nothing is lost unseen.
        A message of a workspace is never dropped (ValueError): its job has a place in its workspace's order, and a
        redrive and a resume decide it."""
        if message.workspace_id is not None:
            raise ValueError(
                f"message {message.message_id} is a job of workspace {message.workspace_id}: redrive it "
                f"(agent-jobs dlq redrive --workspace {message.workspace_id}), then resume the workspace with --retry "
                "or --skip"
            )
        guard.reject_unrouted(
            message_id=message.message_id,
            group_id=message.group_id,
            reason=f"{reason}; its message group {message.group_id!r} names no workspace; nothing was applied",
            body=message.body,
        )
        return self._deleted(
            message,
            RedriveOutcome.NO_WORKSPACE,
            f"its group names no workspace: recorded REJECTED as msg#{message.message_id}",
        )

    def _deleted(self, message: DeadLetter, outcome: RedriveOutcome, detail: str) -> RedriveResult:
        self._delete(message)
        return redrive_result(message, outcome, detail, deleted=True)


__all__ = [
    "DEFAULT_HOLD_SECONDS",
    "MAX_RECEIVES",
    "DeadLetter",
    "DeadLetterQueue",
    "Listing",
    "RedriveOutcome",
    "RedriveResult",
    "registered_owners",
    "sequence_key",
]
