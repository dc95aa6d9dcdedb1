"""The local AWS emulator: moto's server in its own process, with SQS FIFO ordering as SQS keeps it.

`Emulator` starts `python -m agent_jobs_local.emulator --port N` on a free loopback port and waits until it answers.
That launcher corrects four places where moto 5.2.5 breaks the ordering or atomicity this product relies on,
before serving:

- SequenceNumbers (`patch_fifo_sequence_numbers`). moto draws a FIFO message's SequenceNumber at random
  (`SQSBackend.send_message`), while SQS's numbers increase in the order the queue accepts messages, and this product
  stores and orders jobs by them (the job record's sequenceNumber, parked jobs drained in SequenceNumber order). The
  launcher numbers every message accepted into a FIFO queue from one process-wide counter (20 digits, zero-padded,
  so string order and number order agree), under a lock held while the message joins the queue, so SequenceNumber
  order is acceptance order even with concurrent senders.
- Redelivery order (`patch_fifo_redelivery_order`). When several messages of one group come back together (their
  visibility timeout expired: a crashed or timed-out invocation), moto's ReceiveMessage skips the earlier ones and
  delivers the group's last message first: it still counts the not-yet-examined expired messages as in flight. SQS
  delivers them in order. The launcher makes a message count as in flight only while it is invisible.
- Concurrent receives (`patch_atomic_queue_operations`). moto's threaded server lets two ReceiveMessage calls see a
  group free at once and hand consecutive messages of one group to two consumers. Each SQS call is made atomic.
- Transactions (`patch_atomic_table_operations`). moto's TransactWriteItems rolls a failed transaction back by
  restoring a backup of the whole table, undoing writes other requests made meanwhile. Item operations and
  transactions are made atomic and isolated, and a transaction backs up only the items it writes
  (`transact_write_items_undo_log`): moto's copy of every table a transaction names made each TransactWriteItems
  cost in proportion to the table (250 ms per call at 5,000 items), so the emulator slowed down as a run went on.

Known differences from SQS and DynamoDB that remain (nothing here works around them; tests must not rely on them):

- Deduplication is queue-wide even with `DeduplicationScope: messageGroup`, and FifoThroughputLimit is stored but
  not enforced.
- A deduplication id is remembered only while its message is in the queue: once the message is deleted, the same
  id is accepted again at once (SQS remembers it for 5 minutes after the send).
- Long polling on a FIFO queue whose visible messages all belong to message groups in flight re-scans the queue
  without pausing until the wait ends, so pollers here use short polls (see `poller.EventSourcePoller`).
- No StartMessageMoveTask (DLQ redrive back to the source queue); RedriveAllowPolicy is accepted but not stored.
- DynamoDB TTL never expires items (TTL is garbage collection only in this design, so nothing depends on it).
- CloudFormation ignores the SAM transform (`AWS::Serverless::*` resources are not created), which is why
  `agent_jobs_local.template.provision` creates the queues and table from template.yaml's own properties instead.

Elsewhere in the local tooling an `--endpoint-url` means "use that emulator (or account) instead"; an `Emulator`
is only started when none is given.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Final

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
DEFAULT_HOST: Final = "127.0.0.1"
SEQUENCE_NUMBER_DIGITS: Final = 20
_HEALTH_PATH: Final = "/moto-api/data.json"
_NUMBERED: Final = "_agent_jobs_sequence_numbered"
_PATCHED: Final = "_agent_jobs_sequence_patch"


# --- The SequenceNumber correction (runs inside the emulator's process) -------------------------------------------

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
    if getattr(backend_class.send_message, _PATCHED, False):
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

    setattr(send_message, _PATCHED, True)
    queue_class.add_message = add_message  # type: ignore[method-assign]
    backend_class.send_message = send_message  # type: ignore[method-assign]
    backend_class.send_message_batch = send_message_batch  # type: ignore[method-assign]


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
    if getattr(backend_class.receive_message, _PATCHED, False):
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

    setattr(receive_message, _PATCHED, True)
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
    if getattr(backend_class.delete_message, _PATCHED, False):
        return

    def atomic(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with _queue_operations_lock:
                return method(*args, **kwargs)

        setattr(wrapper, _PATCHED, True)
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

    setattr(receive_message, _PATCHED, True)
    backend_class.receive_message = receive_message  # type: ignore[method-assign]


_TABLE_OPERATIONS: Final = (
    "put_item",
    "update_item",
    "delete_item",
    "get_item",
    "query",
    "scan",
    "batch_write_item",
    "batch_get_item",
    "transact_write_items",
    "transact_get_items",
)
_table_operations_lock = threading.RLock()


def patch_atomic_table_operations() -> None:
    """Make each DynamoDB item operation and transaction atomic and isolated, as in DynamoDB (idempotent).

    moto's TransactWriteItems backs up every table it touches before applying and, when a condition fails, puts the
    backup back: in moto's threaded server a write that another request made meanwhile is silently undone (a job's
    PARKED record reverting to QUEUED, say). Here item reads, writes and transactions of the DynamoDB backend hold
    one lock, so a transaction and its rollback never interleave with another write.
    """
    from moto.dynamodb import models

    backend_class = models.DynamoDBBackend
    missing = [name for name in _TABLE_OPERATIONS if not callable(getattr(backend_class, name, None))]
    if missing:
        raise RuntimeError(
            f"moto's DynamoDBBackend has no {missing}: update patch_atomic_table_operations for this moto version"
        )
    if getattr(backend_class.transact_write_items, _PATCHED, False):
        return
    backend_class.transact_write_items = transact_write_items_undo_log  # type: ignore[method-assign]
    for name in _TABLE_OPERATIONS:
        method = getattr(backend_class, name)

        def atomic(*args: Any, _method: Callable[..., Any] = method, **kwargs: Any) -> Any:
            with _table_operations_lock:
                return _method(*args, **kwargs)

        functools.update_wrapper(atomic, method)
        setattr(atomic, _PATCHED, True)
        setattr(backend_class, name, atomic)


_TRANSACTION_OPERATIONS: Final = frozenset({"ConditionCheck", "Put", "Delete", "Update"})


def transact_write_items_undo_log(self: Any, transact_items: list[dict[str, Any]]) -> None:
    """moto's `DynamoDBBackend.transact_write_items`, with the same checks, writes and errors in the same order, but
    rolled back from copies of the items it is about to write instead of copies of whole tables: the cost of a call
    follows its own items, not the size of the tables. Runs under `_table_operations_lock` once
    `patch_atomic_table_operations` has wrapped it, so nothing else writes between a write and its rollback."""
    from moto.dynamodb.exceptions import (
        ConditionalCheckFailed,
        MockValidationException,
        MultipleTransactionsException,
        TooManyTransactionsException,
        TransactionCanceledException,
        TransactWriteSingleOpException,
    )

    if len(transact_items) > 100:
        raise TooManyTransactionsException()
    undo = _ItemUndoLog()
    targets: set[tuple[str, str]] = set()
    errors: list[tuple[str | None, str | None, dict[str, Any] | None]] = []
    for item in transact_items:
        if len(item) > 1:  # refused before any write in DynamoDB; moto raises it after the earlier items' writes
            undo.roll_back()
            raise TransactWriteSingleOpException
        failed_item: list[dict[str, Any]] = []  # the item whose condition failed, when ALL_OLD asks for it
        try:
            _transaction_write(self, *next(iter(item.items())), targets=targets, undo=undo, failed_item=failed_item)
            errors.append((None, None, None))
        except (MultipleTransactionsException, MockValidationException):
            undo.roll_back()
            raise
        except ConditionalCheckFailed as error:
            errors.append(("ConditionalCheckFailed", str(error.message), failed_item[0] if failed_item else None))
        except Exception as error:  # moto reports any other failure as that item's cancellation reason
            errors.append((type(error).__name__, str(error), None))
    if any(code is not None for code, _, _ in errors):
        undo.roll_back()
        raise TransactionCanceledException(errors)


def _transaction_write(
    backend: Any,
    op_type: str,
    op: dict[str, Any],
    *,
    targets: set[tuple[str, str]],
    undo: _ItemUndoLog,
    failed_item: list[dict[str, Any]],
) -> None:
    """One item of a TransactWriteItems call, as moto runs it: its condition, then its write (saved first)."""
    from moto.dynamodb.comparisons import get_filter_expression
    from moto.dynamodb.exceptions import ConditionalCheckFailed, MultipleTransactionsException

    if op_type not in _TRANSACTION_OPERATIONS:
        raise ValueError("Unsupported transaction operation")
    table_name = op["TableName"]
    if op_type == "Put":
        table = backend.get_table(table_name)
        key_names = [table.hash_key_attr] + ([table.range_key_attr] if table.range_key_attr is not None else [])
        key = {name: op["Item"][name] for name in key_names}
    else:
        key = op["Key"]
    target = (str(table_name), str(dict(sorted(key.items()))))
    if target in targets:
        raise MultipleTransactionsException()
    targets.add(target)
    current = backend.get_item(table_name, key)
    conditions = {
        "condition_expression": op.get("ConditionExpression"),
        "expression_attribute_names": op.get("ExpressionAttributeNames"),
        "expression_attribute_values": op.get("ExpressionAttributeValues"),
    }
    condition = op.get("ConditionExpression")
    names, values = op.get("ExpressionAttributeNames"), op.get("ExpressionAttributeValues")
    if condition is not None and not get_filter_expression(condition, names, values).expr(current):
        if op.get("ReturnValuesOnConditionCheckFailure") == "ALL_OLD" and current:
            failed_item.append(current.to_json()["Attributes"])
        raise ConditionalCheckFailed(item=failed_item[0] if failed_item else None)
    if op_type == "ConditionCheck":
        return
    undo.save(backend.get_table(table_name), key)
    if op_type == "Put":
        backend.put_item(table_name, op["Item"], **conditions)
    elif op_type == "Delete":
        backend.delete_item(table_name, key, **conditions)
    else:
        backend.update_item(table_name, key, update_expression=op["UpdateExpression"], **conditions)


class _ItemUndoLog:
    """Copies of the items a transaction is about to write (None: the item did not exist), put back in reverse."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, Any, Any, Any]] = []  # (table, hash value, range value or None, item or None)

    def save(self, table: Any, key: dict[str, Any]) -> None:
        from moto.dynamodb.models.dynamo_type import DynamoType

        hash_value = DynamoType(key[table.hash_key_attr])
        range_value = DynamoType(key[table.range_key_attr]) if table.range_key_attr is not None else None
        self._saved.append((table, hash_value, range_value, copy.deepcopy(table.get_item(hash_value, range_value))))

    def roll_back(self) -> None:
        for table, hash_value, range_value, item in reversed(self._saved):
            items = table.items if range_value is None else table.items[hash_value]
            key = hash_value if range_value is None else range_value
            if item is None:
                items.pop(key, None)
            else:
                items[key] = item


def apply_fidelity_patches() -> None:
    """Every correction of this module; the launcher calls it before moto serves."""
    patch_fifo_sequence_numbers()
    patch_fifo_redelivery_order()
    patch_atomic_queue_operations()
    patch_atomic_table_operations()


def _exit_when_orphaned(parent_pid: int) -> None:
    """The emulator holds all local state for its parent; once the parent is gone it has no reason to run."""
    while True:
        time.sleep(1)
        if os.getppid() != parent_pid:
            os._exit(0)


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m agent_jobs_local.emulator --port N [--host H] [--parent-pid P]`: moto's server, corrected."""
    parser = argparse.ArgumentParser(prog="python -m agent_jobs_local.emulator", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, default=None, help="exit when this process is no longer our parent")
    args = parser.parse_args(argv)
    if args.parent_pid is not None:
        threading.Thread(target=_exit_when_orphaned, args=(args.parent_pid,), daemon=True).start()
    apply_fidelity_patches()
    from moto.server import main as moto_server_main

    moto_server_main(["-H", args.host, "-p", str(args.port)])


# --- The emulator process, as its parent sees it ------------------------------------------------------------------


class EmulatorError(RuntimeError):
    """The emulator did not start or answer; the message says what to check."""


def free_port(host: str = DEFAULT_HOST) -> int:
    """A TCP port on `host` that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


class Emulator:
    """moto's server (with this module's FIFO corrections) in its own process on a loopback port.

        with Emulator() as emulator:
            boto3.client("sqs", endpoint_url=emulator.url)

    `port=None` picks a free one. The server's output goes to `log_path` (appended), else nowhere. `stop()`
    terminates the process and kills it if it has not exited after `timeout` seconds; the process also exits by
    itself when its parent dies.
    """

    def __init__(
        self,
        *,
        host: str = DEFAULT_HOST,
        port: int | None = None,
        log_path: Path | None = None,
        startup_timeout: float = 30.0,
    ) -> None:
        self.host = host
        self.port = port or None
        self.log_path = log_path
        self.startup_timeout = startup_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        """The endpoint URL clients use (`AWS_ENDPOINT_URL`)."""
        if self.port is None or self._process is None:
            raise EmulatorError("the emulator is not running: call start() first")
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> Emulator:
        """Start the server and wait until it answers; a port taken meanwhile is retried with another."""
        if self.running:
            return self
        attempts = 1 if self.port is not None else 3
        for attempt in range(attempts):
            if attempt or self.port is None:
                self.port = free_port(self.host)
            self._spawn()
            if self._wait_until_answering():
                return self
            self._terminate(timeout=5)
        raise EmulatorError(
            f"the emulator did not answer on {self.host}:{self.port} within {self.startup_timeout:g} s; "
            "pass log_path to see its output, or check that moto[server] is installed"
        )

    def _spawn(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        command = [sys.executable, "-m", "agent_jobs_local.emulator", "--host", self.host, "--port", str(self.port)]
        command += ["--parent-pid", str(os.getpid())]
        if self.log_path is not None and self._log is None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = self.log_path.open("ab")
        output: IO[bytes] | int = self._log if self._log is not None else subprocess.DEVNULL
        self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=output, stderr=output, env=env)

    def _wait_until_answering(self) -> bool:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._process is None or self._process.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"http://{self.host}:{self.port}{_HEALTH_PATH}", timeout=1):
                    return True
            except OSError:
                time.sleep(0.1)
        return False

    def reset(self) -> None:
        """Forget every resource and message (moto's reset), keeping the process."""
        request = urllib.request.Request(f"{self.url}/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=10):
            pass

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate the server; kill it if it is still there after `timeout` seconds."""
        self._terminate(timeout)
        if self._log is not None:
            self._log.close()
            self._log = None

    def _terminate(self, timeout: float) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=timeout)

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()


__all__ = [
    "Emulator",
    "EmulatorError",
    "apply_fidelity_patches",
    "free_port",
    "main",
    "next_sequence_number",
    "patch_fifo_redelivery_order",
    "patch_fifo_sequence_numbers",
]


if __name__ == "__main__":
    main()
