"""What the worker's event source mapping has done: the counts (`PollerStats`), the log of recent batches
(`InvocationRecord`) and the ledger the pollers write both into; and Lambda's reading of a batch response's
batchItemFailures (`reported_failures`)."""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Final

from agent_jobs_local.execution_environment import InvocationResult, Outcome

_LOG_LENGTH: Final = 10_000


@dataclass
class PollerStats:
    """What the event source mapping has done so far. The poller counts into one instance under its lock;
    `EventSourcePoller.stats` hands out a consistent copy.

    `batches` counts non-empty receives; `invocations` counts handler invocations started (a batch whose environment
    failed to initialise is an `init_errors`, not an invocation). Every received record ends up in exactly one of
    `records_deleted`, `records_reported_failed` (listed in a normal response's batchItemFailures) or
    `records_in_failed_invocations` (a function error, timeout, crash, malformed response or init error, or a
    DeleteMessageBatch call that failed: all of them are left to the queue).
    `batch_sizes` maps a batch size to how many invocations received a batch of that size.
    """

    invocations: int = 0
    cold_starts: int = 0
    init_errors: int = 0
    timeouts: int = 0
    crashes: int = 0
    handler_errors: int = 0
    malformed_responses: int = 0
    batches: int = 0
    records_received: int = 0
    records_deleted: int = 0
    records_reported_failed: int = 0
    records_in_failed_invocations: int = 0
    max_concurrent_invocations: int = 0
    batch_sizes: dict[int, int] = field(default_factory=dict)

    @property
    def largest_batch(self) -> int:
        return max(self.batch_sizes, default=0)

    @property
    def failed_invocations(self) -> int:
        return self.timeouts + self.crashes + self.handler_errors + self.malformed_responses


@dataclass(frozen=True)
class InvocationRecord:
    """One batch's fate, in the order batches were received. `outcome` is an `Outcome` value ("ok", "function_error",
    "timeout", "crash", "init_error"), "malformed" (a response Lambda counts as a failed batch) or "settle_error"."""

    poller: int
    cold_start: bool
    message_ids: tuple[str, ...]
    outcome: str
    error: str | None
    deleted: int
    reported_failed: int
    duration_seconds: float
    environment_pid: int | None


def reported_failures(response: Any, message_ids: Sequence[str]) -> set[str] | None:
    """The message ids a response reports failed, by Lambda's rules; None when the whole batch counts as failed."""
    if response is None:
        return set()
    if not isinstance(response, dict):
        return None
    failures = response.get("batchItemFailures")
    if failures is None:
        return set()
    if not isinstance(failures, list):
        return None
    known = set(message_ids)
    reported: set[str] = set()
    for failure in failures:
        identifier = failure.get("itemIdentifier") if isinstance(failure, dict) else None
        if not isinstance(identifier, str) or identifier not in known:
            return None
        reported.add(identifier)
    return reported


class InvocationLedger:
    """The counts and the log of one poller set, under one lock: the pollers' threads write, callers read copies."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters = PollerStats()
        self._active = 0
        self._log: collections.deque[InvocationRecord] = collections.deque(maxlen=_LOG_LENGTH)

    @property
    def stats(self) -> PollerStats:
        with self._lock:
            counters = self._counters
            return replace(counters, batch_sizes=dict(sorted(counters.batch_sizes.items())))

    def invocation_log(self) -> list[InvocationRecord]:
        """The most recent batches (up to 10 000), oldest first."""
        with self._lock:
            return list(self._log)

    def cold_start(self) -> None:
        with self._lock:
            self._counters.cold_starts += 1

    def batch_received(self, records: int) -> None:
        with self._lock:
            self._counters.batches += 1
            self._counters.records_received += records

    @contextmanager
    def invocation(self) -> Iterator[None]:
        """Counts an invocation as running while the block runs (for `max_concurrent_invocations`)."""
        with self._lock:
            self._active += 1
            self._counters.max_concurrent_invocations = max(self._counters.max_concurrent_invocations, self._active)
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1

    def record(
        self,
        index: int,
        cold_start: bool,
        message_ids: tuple[str, ...],
        result: InvocationResult,
        pid: int | None,
        *,
        outcome: str,
        deleted: Sequence[str] = (),
        reported: set[str] | None = None,
    ) -> None:
        reported = reported or set()
        with self._lock:
            counters = self._counters
            if outcome == str(Outcome.INIT_ERROR):
                counters.init_errors += 1
            else:
                counters.invocations += 1
                counters.batch_sizes[len(message_ids)] = counters.batch_sizes.get(len(message_ids), 0) + 1
            match outcome:
                case Outcome.TIMEOUT:
                    counters.timeouts += 1
                case Outcome.CRASH:
                    counters.crashes += 1
                case Outcome.FUNCTION_ERROR:
                    counters.handler_errors += 1
                case "malformed":
                    counters.malformed_responses += 1
            if outcome == str(Outcome.OK):
                counters.records_deleted += len(deleted)
                counters.records_reported_failed += len(reported)
            else:
                counters.records_in_failed_invocations += len(message_ids)
            self._log.append(
                InvocationRecord(
                    poller=index,
                    cold_start=cold_start,
                    message_ids=message_ids,
                    outcome=outcome,
                    error=result.error,
                    deleted=len(deleted),
                    reported_failed=len(reported),
                    duration_seconds=result.duration_seconds,
                    environment_pid=pid,
                )
            )
