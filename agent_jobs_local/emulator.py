"""The local AWS emulator: moto's server in its own process, with SQS FIFO ordering as SQS keeps it.

`Emulator` starts `python -m agent_jobs_local.emulator --port N` on a free loopback port and waits until it answers.
That launcher corrects six places where moto 5.2.5 breaks the ordering, deduplication, atomicity or sender
identity this product relies on, before serving:

- SequenceNumbers (`patch_fifo_sequence_numbers`). moto draws a FIFO message's SequenceNumber at random
  (`SQSBackend.send_message`), while SQS's numbers increase in the order the queue accepts messages, and this product
  stores and orders jobs by them (the job record's sequenceNumber, parked jobs drained in SequenceNumber order). The
  launcher numbers every message accepted into a FIFO queue from one process-wide counter (20 digits, zero-padded,
  so string order and number order agree), under a lock held while the message joins the queue, so SequenceNumber
  order is acceptance order even with concurrent senders.
- Deduplication (`patch_fifo_deduplication`). moto deduplicates a FIFO send queue-wide even with
  `DeduplicationScope: messageGroup`, only against messages still in the queue (a deleted message's id is taken
  again at once), and answers a duplicate with a new MessageId and SequenceNumber for a message it never enqueues,
  while the product records a send's answer as the job's place. The launcher keeps every deduplication id a FIFO
  queue accepted (per message group when the scope says so) for 5 minutes from its send, received or deleted
  since or not, and answers a duplicate as SQS does: accepted, not enqueued, with the original's MessageId and
  SequenceNumber. Content-based ids (SHA-256 of the body) go the same way.
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
- SenderId (`patch_sender_ids`). moto stamps every message with one constant SenderId, while SQS stamps the
  principal that sent it, and the worker tells the stack's enqueue API and a workspace's bound direct producers from
  any other sender by SenderId alone. The launcher gives each message the principal of the access key its
  SendMessage was signed with: a role session moto's STS handed out is `<role id>:<session name>`, a user moto's IAM
  knows is its user id, and any other key an id of an IAM user's form derived from the key
  (`principals.principal_id`), so two keys send as two principals over a real HTTP connection. The local runtime
  signs each function's calls with a key of its own (`principals.function_access_key`).

Known differences from SQS and DynamoDB that remain (nothing here works around them; tests must not rely on them):

- FifoThroughputLimit is stored but not enforced.
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
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Final

from agent_jobs_local.emulator_dynamodb import patch_atomic_table_operations, transact_write_items_undo_log
from agent_jobs_local.emulator_sqs import (
    ATOMIC_QUEUE_OPERATIONS,
    DEDUPLICATION_WINDOW_SECONDS,
    SEQUENCE_NUMBER_DIGITS,
    next_sequence_number,
    patch_atomic_queue_operations,
    patch_fifo_deduplication,
    patch_fifo_redelivery_order,
    patch_fifo_sequence_numbers,
    patch_sender_ids,
)

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
DEFAULT_HOST: Final = "127.0.0.1"
_HEALTH_PATH: Final = "/moto-api/data.json"


def apply_fidelity_patches() -> None:
    """Every correction (`emulator_sqs`, `emulator_dynamodb`); the launcher calls it before moto serves."""
    patch_fifo_sequence_numbers()
    patch_fifo_deduplication()
    patch_fifo_redelivery_order()
    patch_sender_ids()
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
    "ATOMIC_QUEUE_OPERATIONS",
    "DEDUPLICATION_WINDOW_SECONDS",
    "SEQUENCE_NUMBER_DIGITS",
    "Emulator",
    "EmulatorError",
    "apply_fidelity_patches",
    "free_port",
    "main",
    "next_sequence_number",
    "patch_atomic_queue_operations",
    "patch_atomic_table_operations",
    "patch_fifo_deduplication",
    "patch_fifo_redelivery_order",
    "patch_fifo_sequence_numbers",
    "patch_sender_ids",
    "transact_write_items_undo_log",
]


if __name__ == "__main__":
    main()
