"""The emulator's SQS corrections, applied inside its process before moto serves (see `emulator` for why each is
needed): FIFO SequenceNumbers in acceptance order, FIFO deduplication by scope and window answered with the original
message, an expired FIFO batch redelivered in group order, each SQS call atomic, and a message's SenderId the
principal of the key that sent it."""

from __future__ import annotations

import functools
import itertools
import re
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from agent_jobs_local.principals import principal_id

SEQUENCE_NUMBER_DIGITS: Final = 20
DEDUPLICATION_WINDOW_SECONDS: Final = 300.0
_DEDUPLICATING: Final = "_agent_jobs_deduplicating"
_NUMBERED: Final = "_agent_jobs_sequence_numbered"
PATCHED: Final = "_agent_jobs_sequence_patch"  # marks a moto method the emulator's corrections replaced


_sequence_lock = threading.RLock()
_last_sequence_number = 0
_accepting = threading.local()


def next_sequence_number() -> str:
    """The next FIFO SequenceNumber of this process: strictly increasing, 20 digits, zero-padded."""
    global _last_sequence_number  # noqa: PLW0603
    with _sequence_lock:
        _last_sequence_number += 1
        return f"{_last_sequence_number:0{SEQUENCE_NUMBER_DIGITS}d}"


def _number(message: Any) -> None:
    message.sequence_number = next_sequence_number()
    setattr(message, _NUMBERED, True)


def _accepting_scope(method: Callable[..., Any]) -> Callable[..., Any]:
    """Marks the calling thread as sending, so messages joining a queue meanwhile are new sends, not DLQ moves."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _accepting.depth = getattr(_accepting, "depth", 0) + 1
        try:
            return method(*args, **kwargs)
        finally:
            _accepting.depth -= 1

    return wrapper


def patch_fifo_sequence_numbers() -> None:
    """Make moto's SQS number FIFO messages in acceptance order (idempotent; call before serving).

    `SQSBackend.send_message` and `send_message_batch` are wrapped to mark the thread as sending; `Queue.add_message`
    (where a sent message joins the queue) assigns the number under a lock held while the message is appended, so no
    receiver can see a message before it has its number, and numbers follow append order. Messages moved to a
    dead-letter queue keep theirs. Should a later moto send without `Queue.add_message`, the send wrappers number
    the returned messages instead (still increasing, no longer atomic with acceptance). Raises RuntimeError when
    moto's SQS no longer has these methods, rather than serving random numbers silently.
    """
    from moto.sqs import models

    backend_class, queue_class = models.SQSBackend, models.Queue
    for owner, name in (
        (backend_class, "send_message"),
        (backend_class, "send_message_batch"),
        (queue_class, "add_message"),
    ):
        if not callable(getattr(owner, name, None)):
            raise RuntimeError(
                f"moto's {owner.__name__}.{name} is gone: agent_jobs_local.emulator cannot number FIFO messages; "
                "update patch_fifo_sequence_numbers for this moto version"
            )
    if getattr(backend_class.send_message, PATCHED, False):
        return

    original_add_message = queue_class.add_message
    original_send_message = backend_class.send_message
    original_send_message_batch = backend_class.send_message_batch

    @functools.wraps(original_add_message)
    def add_message(self: Any, message: Any) -> None:
        if not (self.fifo_queue and getattr(_accepting, "depth", 0) and not getattr(message, _NUMBERED, False)):
            original_add_message(self, message)
            return
        with _sequence_lock:
            _number(message)
            original_add_message(self, message)

    def number_unnumbered(message: Any) -> Any:
        if message.sequence_number is not None and not getattr(message, _NUMBERED, False):
            _number(message)
        return message

    @functools.wraps(original_send_message)
    def send_message(self: Any, *args: Any, **kwargs: Any) -> Any:
        return number_unnumbered(_accepting_scope(original_send_message)(self, *args, **kwargs))

    @functools.wraps(original_send_message_batch)
    def send_message_batch(self: Any, *args: Any, **kwargs: Any) -> Any:
        messages, failures = _accepting_scope(original_send_message_batch)(self, *args, **kwargs)
        return [number_unnumbered(message) for message in messages], failures

    setattr(send_message, PATCHED, True)
    queue_class.add_message = add_message  # type: ignore[method-assign]
    backend_class.send_message = send_message  # type: ignore[method-assign]
    backend_class.send_message_batch = send_message_batch  # type: ignore[method-assign]


@dataclass(frozen=True)
class AcceptedSend:
    """A FIFO send the queue accepted: what a duplicate of it is answered with until `expires_at`."""

    message_id: str
    sequence_number: str
    expires_at: float


# The queue (a number per moto Queue object), the message group ("" when deduplication is queue-wide), the id.
DeduplicationKey = tuple[int, str, str]


class FifoDeduplication:
    """The deduplication ids FIFO queues accepted within the last `window_seconds` of `clock`, each with the
    MessageId and SequenceNumber of the message it was accepted with.

    An id is remembered from its accepted send, whatever happens to the message afterwards (received, deleted,
    moved to a dead-letter queue), and forgotten once the window is over: entries expire in the order they were
    remembered, checked on every lookup, so memory holds at most a window's worth of sends. A queue is known by its
    moto object, so a queue deleted and created again (or an emulator reset) starts with nothing remembered. Not
    thread safe by itself: callers hold the lock that makes acceptance atomic.
    """

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, window_seconds: float = DEDUPLICATION_WINDOW_SECONDS
    ) -> None:
        self._clock = clock
        self._window_seconds = window_seconds
        self._accepted: dict[DeduplicationKey, AcceptedSend] = {}
        self._expiries: deque[tuple[float, DeduplicationKey]] = deque()  # in the order they expire
        self._queue_numbers: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._next_queue_number = itertools.count()

    def __len__(self) -> int:
        return len(self._accepted)

    def key(self, queue: Any, message: Any) -> DeduplicationKey | None:
        """What `message`'s send to `queue` is deduplicated by; None for a message without a deduplication id."""
        if not message.deduplication_id:
            return None
        by_group = queue.attributes.get("DeduplicationScope") == "messageGroup"
        queue_number = self._queue_numbers.get(queue)
        if queue_number is None:
            queue_number = self._queue_numbers[queue] = next(self._next_queue_number)
        return (queue_number, (message.group_id or "") if by_group else "", str(message.deduplication_id))

    def accepted(self, key: DeduplicationKey) -> AcceptedSend | None:
        """The send accepted with `key` within the window, or None."""
        now = self._clock()
        while self._expiries and self._expiries[0][0] <= now:
            _, expired = self._expiries.popleft()
            remembered = self._accepted.get(expired)
            if remembered is not None and remembered.expires_at <= now:
                del self._accepted[expired]
        remembered = self._accepted.get(key)
        return remembered if remembered is not None and remembered.expires_at > now else None

    def remember(self, key: DeduplicationKey, message_id: str, sequence_number: str) -> None:
        """Record the send accepted with `key` now, for the window."""
        expires_at = self._clock() + self._window_seconds
        self._accepted[key] = AcceptedSend(message_id, sequence_number, expires_at)
        self._expiries.append((expires_at, key))


class _UnmatchedDeduplicationId(str):
    """A deduplication id equal to no other: moto's own check (queue-wide, against messages still in the queue) never
    drops a message whose id this is; `FifoDeduplication` has decided already. It reads as the id it wraps."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return False

    def __ne__(self, other: object) -> bool:
        return True

    __hash__ = str.__hash__


def patch_fifo_deduplication(
    clock: Callable[[], float] = time.monotonic, window_seconds: float = DEDUPLICATION_WINDOW_SECONDS
) -> None:
    """Make moto's SQS deduplicate FIFO sends as SQS does (idempotent: the first call's clock and window hold; call
    before serving; applies `patch_fifo_sequence_numbers` first).

    SQS accepts a send whose deduplication id (within the queue, or within the message group when the queue's
    DeduplicationScope is messageGroup) it accepted in the last five minutes, does not enqueue it, and answers with
    the MessageId and SequenceNumber of the message first accepted, whether or not that message was since received
    or deleted. moto deduplicates queue-wide whatever the scope, only against messages still in the queue, and
    answers a duplicate with a new MessageId and SequenceNumber: a producer that records the answer would record a
    message that does not exist. Here `Queue.add_message` consults a `FifoDeduplication` (content-based ids, the
    SHA-256 of the body moto sets, included) under the lock that numbers and appends messages, so deciding,
    numbering and appending are one step; a duplicate is answered with the original's MessageId and SequenceNumber
    (the MD5s stay those of the body and attributes sent) and nothing is appended. Every FIFO message's id is
    wrapped so moto's own check never matches it, also for a move to a dead-letter queue, which is not a send.
    Raises RuntimeError when moto's SQS no longer has what this relies on.
    """
    from moto.sqs import models

    queue_class = models.Queue
    if not callable(getattr(queue_class, "add_message", None)):
        raise RuntimeError(
            "moto's Queue.add_message is gone: agent_jobs_local.emulator cannot deduplicate FIFO messages; update "
            "patch_fifo_deduplication for this moto version"
        )
    patch_fifo_sequence_numbers()
    if getattr(queue_class.add_message, _DEDUPLICATING, False):
        return

    deduplication = FifoDeduplication(clock, window_seconds)
    original_add_message = queue_class.add_message

    @functools.wraps(original_add_message)
    def add_message(self: Any, message: Any) -> None:
        if not self.fifo_queue:
            original_add_message(self, message)
            return
        deduplication_id = message.deduplication_id
        if deduplication_id and not isinstance(deduplication_id, _UnmatchedDeduplicationId):
            message.deduplication_id = _UnmatchedDeduplicationId(deduplication_id)
        if not getattr(_accepting, "depth", 0):
            original_add_message(self, message)
            return
        with _sequence_lock:
            key = deduplication.key(self, message)
            original = deduplication.accepted(key) if key is not None else None
            if original is not None:
                message.id, message.sequence_number = original.message_id, original.sequence_number
                setattr(message, _NUMBERED, True)
                return
            original_add_message(self, message)
            if key is not None:
                deduplication.remember(key, message.id, message.sequence_number)

    setattr(add_message, _DEDUPLICATING, True)
    queue_class.add_message = add_message  # type: ignore[method-assign]


def patch_fifo_redelivery_order() -> None:
    """Make moto's SQS redeliver expired FIFO messages in group order (idempotent; call before serving).

    moto blocks a message group while any of its received, undeleted messages is in `Queue.pending_messages`, and
    removes an expired message from that set only when ReceiveMessage reaches it; so when a whole batch expires,
    the group's first messages are skipped (later expired ones still count) and its last one is delivered. Here a
    receive first forgets every expired message of a FIFO queue (what SQS considers in flight ends with the
    visibility timeout), so the group's messages come back in order and several of them per receive, as from SQS.
    The groups in flight when a receive starts stay in flight for the whole receive: moto re-reads them whenever it
    meets an expired message, and a message expiring meanwhile (its batch-mates expire microseconds apart) would
    otherwise free its group mid-loop, after moto had skipped the group's first messages, and hand out a later one
    ahead of them. Outside a receive, a group counts as in flight only through invisible messages. Raises
    RuntimeError when moto's SQS no longer has what this relies on.
    """
    from moto.sqs import models

    backend_class, queue_class, message_class = models.SQSBackend, models.Queue, models.Message
    groups_property = getattr(queue_class, "pending_message_groups", None)
    if (
        not callable(getattr(backend_class, "receive_message", None))
        or not isinstance(groups_property, property)
        or not isinstance(getattr(queue_class, "pending_messages", None), property)
        or not isinstance(getattr(message_class, "visible", None), property)
    ):
        raise RuntimeError(
            "moto's SQS no longer has SQSBackend.receive_message, Queue.pending_messages/pending_message_groups and "
            "Message.visible as agent_jobs_local.emulator expects; update patch_fifo_redelivery_order for this moto"
        )
    if getattr(backend_class.receive_message, PATCHED, False):
        return

    original_receive_message = backend_class.receive_message
    receiving = threading.local()  # the queue being received from and its groups in flight when the receive began

    @functools.wraps(original_receive_message)
    def receive_message(self: Any, queue_name: str, *args: Any, **kwargs: Any) -> Any:
        queue = self.get_queue(queue_name)
        if not queue.fifo_queue:
            return original_receive_message(self, queue_name, *args, **kwargs)
        for message in [m for m in queue.pending_messages if m.visible]:
            queue.pending_messages.discard(message)
        receiving.frozen = (queue, {m.group_id for m in queue.pending_messages if m.group_id is not None})
        try:
            return original_receive_message(self, queue_name, *args, **kwargs)
        finally:
            receiving.frozen = None

    def pending_message_groups(self: Any) -> set[str]:
        frozen = getattr(receiving, "frozen", None)
        if frozen is not None and frozen[0] is self:
            return set(frozen[1])
        return {m.group_id for m in self.pending_messages if m.group_id is not None and not m.visible}

    setattr(receive_message, PATCHED, True)
    backend_class.receive_message = receive_message  # type: ignore[method-assign]
    queue_class.pending_message_groups = property(pending_message_groups)  # type: ignore[method-assign,assignment]


ATOMIC_QUEUE_OPERATIONS: Final = (
    "send_message",
    "send_message_batch",
    "delete_message",
    "delete_message_batch",
    "change_message_visibility",
    "change_message_visibility_batch",
)
_queue_operations_lock = threading.RLock()


def patch_atomic_queue_operations() -> None:
    """Make each SQS call atomic, as it is in SQS (idempotent; call after the other patches, before serving).

    moto's server is threaded and its ReceiveMessage checks which FIFO groups are in flight from a snapshot taken
    when the call starts: two receives running at once can both see a group free and hand out consecutive messages
    of it to two consumers, which SQS never does (order within a group would be lost). Here every receive, send,
    delete and visibility change holds one lock. A long poll does not hold it while it waits: it receives without
    waiting, under the lock, every 50 ms until a message comes or the wait is over.
    """
    from moto.sqs import models

    backend_class = models.SQSBackend
    if getattr(backend_class.delete_message, PATCHED, False):
        return

    def atomic(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with _queue_operations_lock:
                return method(*args, **kwargs)

        setattr(wrapper, PATCHED, True)
        return wrapper

    for name in ATOMIC_QUEUE_OPERATIONS:
        setattr(backend_class, name, atomic(getattr(backend_class, name)))

    original_receive_message = backend_class.receive_message

    @functools.wraps(original_receive_message)
    def receive_message(
        self: Any, queue_name: str, count: int, wait_seconds_timeout: int, *args: Any, **kwargs: Any
    ) -> Any:
        deadline = time.monotonic() + (wait_seconds_timeout or 0)
        while True:
            with _queue_operations_lock:
                messages = original_receive_message(self, queue_name, count, 0, *args, **kwargs)
            if messages or time.monotonic() >= deadline:
                return messages
            time.sleep(0.05)

    setattr(receive_message, PATCHED, True)
    backend_class.receive_message = receive_message  # type: ignore[method-assign]


_CREDENTIAL: Final = re.compile(r"Credential=([^/\s,]+)/")
_sending_as = threading.local()  # the principal of the SendMessage(Batch) request this thread is serving


def access_key_of(headers: Mapping[str, str]) -> str | None:
    """The access key id a SigV4-signed request was signed with (its Authorization header's Credential)."""
    match = _CREDENTIAL.search(headers.get("Authorization") or headers.get("authorization") or "")
    return match.group(1) if match else None


def caller_principal_id(response: Any) -> str | None:
    """The SenderId SQS would stamp on a message of this request: for a key moto's STS handed out for an assumed role,
    `<role id>:<session name>`; for a key of a user moto's IAM knows, the user's id; for any other key,
    `principals.principal_id` of the key. None for an unsigned request (moto's constant SenderId stays)."""
    key = access_key_of(response.headers)
    if key is None:
        return None
    from moto.iam.models import iam_backends
    from moto.sts.models import sts_backends

    account, partition = response.current_account, response.partition
    assumed = sts_backends[account][partition].get_assumed_role_from_access_key(key)
    if assumed is not None:
        return str(assumed.user_id)
    user = iam_backends[account][partition].get_user_from_access_key_id(key)
    return str(user.id) if user is not None else principal_id(key)


def patch_sender_ids() -> None:
    """Make moto's SQS stamp each message with its sender's principal, as SQS does (idempotent; call before serving).

    moto gives every message one constant SenderId, so every caller looks like one principal, and a worker that trusts
    SenderId alone to tell the stack's enqueue API from a direct producer could not be tried against it. Here
    SendMessage and SendMessageBatch note the caller's principal (`caller_principal_id`) while they run, and each
    message created meanwhile takes it; a message moved to the dead-letter queue keeps it. Raises RuntimeError when
    moto's SQS, STS or IAM no longer have what this relies on.
    """
    from moto.iam.models import IAMBackend
    from moto.sqs import models, responses
    from moto.sts.models import STSBackend

    response_class, message_class = responses.SQSResponse, models.Message
    if not all(callable(getattr(response_class, name, None)) for name in ("send_message", "send_message_batch")) or (
        not callable(getattr(STSBackend, "get_assumed_role_from_access_key", None))
        or not callable(getattr(IAMBackend, "get_user_from_access_key_id", None))
    ):
        raise RuntimeError(
            "moto's SQSResponse.send_message(_batch), STSBackend.get_assumed_role_from_access_key or "
            "IAMBackend.get_user_from_access_key_id is gone: update agent_jobs_local.emulator_sqs.patch_sender_ids"
        )
    if getattr(response_class.send_message, PATCHED, False):
        return

    original_init = message_class.__init__

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        sender = getattr(_sending_as, "sender_id", None)
        if sender is not None:
            self.sender_id = sender

    def as_caller(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            _sending_as.sender_id = caller_principal_id(self)
            try:
                return method(self, *args, **kwargs)
            finally:
                _sending_as.sender_id = None

        setattr(wrapper, PATCHED, True)
        return wrapper

    message_class.__init__ = __init__  # type: ignore[method-assign]
    response_class.send_message = as_caller(response_class.send_message)  # type: ignore[method-assign]
    response_class.send_message_batch = as_caller(response_class.send_message_batch)  # type: ignore[method-assign]
