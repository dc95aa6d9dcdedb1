"""Lambda's SQS event source mapping for the worker, run locally: pollers, batches, warm environments, settling.

Faithful to Lambda's event source mapping, with every setting read from the template model and none kept
here: batches of up to the event source's BatchSize from its queue (the queue's own visibility timeout applies); up to
ScalingConfig.MaximumConcurrency concurrent invocations; each invocation gets a context whose remaining time counts
down from the function's Timeout, and is killed at that Timeout; the function's CodeUri and Handler are what runs,
with its layers. Settling follows the event source mapping with ReportBatchItemFailures (required: without it the
poller refuses to start, because Lambda would then delete or retry whole batches and the worker's per-group failure
reports would be ignored):

- a normal response: records not listed in `batchItemFailures` are deleted, listed ones are left to the queue;
- Lambda's success/failure rules for the response: `None`, `{}`, a missing or null or empty `batchItemFailures` are
  complete success; a response that is not an object, a `batchItemFailures` that is not a list, or an entry whose
  `itemIdentifier` is missing, empty or not a message of the batch make the whole batch failed (nothing deleted);
- the handler raised (a function error), the invocation timed out, or the process crashed: nothing is deleted, the
  records come back after their visibility timeout and the queue's redrive policy decides about the DLQ. A timeout or
  a crash ends the environment (the next invocation of that poller is a cold start); after a function error the
  environment stays warm, as Lambda keeps it.

Each poller thread owns at most one warm environment (`execution_environment.ExecutionEnvironment`, a spawned process).
A poller starts its environment and waits for the Init phase before it receives a batch: the Init phase is not part
of the invocation's Timeout, as in Lambda, and it must not eat into the records' visibility timeout either, which
`time_scale` shortens while an import takes as long as ever (twenty environments starting at once on two cores took
longer than a scaled visibility timeout, and their records came back to other pollers before any handler ran). The
first invocation of an environment is its cold start; an Init that failed fails the batch received next (nothing
deleted), as a failed Init fails the invocation it was started for in Lambda.

Polling uses short ReceiveMessage calls with a pause between empty ones that doubles up to a second while a poller
finds nothing (moto's long poll re-scans a FIFO queue without pausing while its visible messages belong to groups in
flight). Not emulated: MaximumBatchingWindowInSeconds (this template sets none; a batch is whatever one receive
returns), Lambda's gradual scaling of pollers (all `concurrency` pollers start at once), and the Init phase limit
(generous here, see `execution_environment.INIT_TIMEOUT_SECONDS`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from agent_jobs_local.event_source import receive_event, settle
from agent_jobs_local.execution_environment import ExecutionEnvironment, InvocationResult, Outcome
from agent_jobs_local.poller_records import InvocationLedger, InvocationRecord, PollerStats, reported_failures
from agent_jobs_local.poller_setup import (
    DEFAULT_CONCURRENCY,
    PROJECT_ROOT,
    REPORT_BATCH_ITEM_FAILURES,
    EventSourceError,
    check_event_source,
    template_concurrency,
    worker_function_spec,
)

if TYPE_CHECKING:
    from mypy_boto3_sqs.client import SQSClient

    from agent_jobs_local.template import TemplateModel

# Time for the event and the answer to cross the pipe, on top of the invocation's Timeout.
INVOCATION_SLACK_SECONDS: Final = 0.5
_FIRST_POLL_PAUSE: Final = 0.05
_LONGEST_POLL_PAUSE: Final = 1.0

logger = logging.getLogger(__name__)


class EventSourcePoller:
    """The worker's SQS event source mapping (see the module docstring), on `queue_url`.

    Keyword arguments:
      model: the template; BatchSize, ScalingConfig.MaximumConcurrency, FunctionResponseTypes, the function's Timeout,
        MemorySize, CodeUri, Handler and Layers and the event source's queue are read from it.
      queue_url, queue_arn, region: the provisioned queue the event source names (checked against the template).
      function_env: the worker's environment variables (the template's, resolved; the runtime computes them).
      endpoint_url: passed to the function as AWS_ENDPOINT_URL, and used by the pollers; None means AWS itself.
      time_scale: multiplies the function Timeout used for invocations (the caller scales the queue's visibility
        timeout to match).
      concurrency: number of pollers (= most concurrent invocations); default ScalingConfig.MaximumConcurrency, at
        most ReservedConcurrentExecutions, else 5.
      worker_bootstrap, bootstrap_config: `"package.module:function"` called in each environment right after the
        handler module is imported, as `function(handler_module, bootstrap_config)`; it may wrap the handler (the
        handler is looked up after it returns). The project root is on the environment's `sys.path`.
      layer_paths: folders that stand for /opt/python; default the ContentUri of each of the function's Layers that
        is a layer of the template (layers/shared).
      poll_wait_seconds: how long one receive waits for messages before the poller loops.
      template_dir: the folder relative CodeUri/ContentUri paths are resolved against; default the project root.

    `start()`, `stop()`, `drain(timeout)`, `stats` (a `PollerStats`) and `invocation_log()` are the interface.
    """

    def __init__(
        self,
        *,
        model: TemplateModel,
        queue_url: str,
        queue_arn: str,
        region: str,
        function_env: Mapping[str, str],
        endpoint_url: str | None = None,
        time_scale: float = 1.0,
        concurrency: int | None = None,
        worker_bootstrap: str | None = None,
        bootstrap_config: Mapping[str, Any] | None = None,
        layer_paths: Sequence[Path] | None = None,
        poll_wait_seconds: float = 1,
        template_dir: Path | None = None,
    ) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be positive, got {time_scale}")
        check_event_source(model, queue_arn)
        worker = model.worker
        source, function = worker.event_source, worker.function
        self.model = model
        self.function_id = function.function_id
        self.queue_url = queue_url
        self.queue_arn = queue_arn
        self.region = region
        self.endpoint_url = endpoint_url
        self.time_scale = time_scale
        self.batch_size = source.batch_size
        self.function_timeout_seconds = function.timeout_seconds
        self.invocation_timeout_seconds = function.timeout_seconds * time_scale
        self.concurrency = concurrency or self.template_concurrency(model)
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {self.concurrency}")
        self.poll_wait_seconds = poll_wait_seconds
        self.spec = worker_function_spec(
            model,
            function_env,
            region=region,
            endpoint_url=endpoint_url,
            timeout_seconds=self.invocation_timeout_seconds,
            worker_bootstrap=worker_bootstrap,
            bootstrap_config=bootstrap_config,
            layer_paths=layer_paths,
            template_dir=template_dir,
        )

        self._ledger = InvocationLedger()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    # --- template ----------------------------------------------------------------------------------------------

    @staticmethod
    def template_concurrency(model: TemplateModel) -> int:
        """The worker's concurrency the template allows: MaximumConcurrency and ReservedConcurrentExecutions."""
        return template_concurrency(model)

    # --- lifecycle ---------------------------------------------------------------------------------------------

    def start(self) -> EventSourcePoller:
        """Start the pollers (environments start with their first batch)."""
        if self._threads:
            return self
        self._stopping.clear()
        for index in range(self.concurrency):
            thread = threading.Thread(target=self._poll, args=(index,), name=f"sqs-poller-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        """Stop polling; in-flight invocations finish (up to their timeout) and are settled; environments end."""
        self._stopping.set()
        deadline = time.monotonic() + self.invocation_timeout_seconds + self.poll_wait_seconds + 30
        for thread in self._threads:
            thread.join(timeout=max(0.1, deadline - time.monotonic()))
        self._threads = []

    def __enter__(self) -> EventSourcePoller:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return any(thread.is_alive() for thread in self._threads)

    # --- observation -------------------------------------------------------------------------------------------

    @property
    def stats(self) -> PollerStats:
        return self._ledger.stats

    def invocation_log(self) -> list[InvocationRecord]:
        """The most recent batches (up to 10 000), oldest first."""
        return self._ledger.invocation_log()

    def queue_depth(self, sqs: SQSClient | None = None) -> int:
        """Messages visible, in flight or delayed on the queue (SQS's approximate counts)."""
        client = sqs or self._client()
        attributes = client.get_queue_attributes(
            QueueUrl=self.queue_url,
            AttributeNames=[
                "ApproximateNumberOfMessages",
                "ApproximateNumberOfMessagesNotVisible",
                "ApproximateNumberOfMessagesDelayed",
            ],
        )["Attributes"]
        return sum(int(value) for value in attributes.values())

    def drain(self, timeout: float, *, interval: float = 0.2, consecutive: int = 2) -> bool:
        """Wait until the queue has no visible, in-flight or delayed message on `consecutive` checks in a row;
        False when `timeout` seconds pass first."""
        sqs = self._client()
        deadline = time.monotonic() + timeout
        empty_checks = 0
        while True:
            empty_checks = empty_checks + 1 if self.queue_depth(sqs) == 0 else 0
            if empty_checks >= consecutive:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(interval)

    # --- the pollers -------------------------------------------------------------------------------------------

    def _client(self) -> SQSClient:
        import boto3
        from botocore.config import Config

        # A client per poller thread; standard retries ride out a busy emulator.
        config = Config(retries={"mode": "standard", "max_attempts": 5}, connect_timeout=5, read_timeout=30)
        return boto3.session.Session(region_name=self.region).client(
            "sqs", endpoint_url=self.endpoint_url, config=config
        )

    def _receive(self, sqs: SQSClient, idle: list[float]) -> dict[str, Any]:
        """One receive of up to BatchSize records, waiting up to poll_wait_seconds. `idle` holds the thread's current
        pause between empty polls: it doubles while the queue has nothing for this poller and resets with records."""
        deadline = time.monotonic() + self.poll_wait_seconds
        while True:
            event = receive_event(
                sqs, self.queue_url, queue_arn=self.queue_arn, region=self.region, batch_size=self.batch_size
            )
            if event["Records"]:
                idle[0] = _FIRST_POLL_PAUSE
                return event
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._stopping.is_set():
                return event
            self._stopping.wait(min(idle[0], remaining))
            idle[0] = min(idle[0] * 2, _LONGEST_POLL_PAUSE)

    def _poll(self, index: int) -> None:
        sqs = self._client()
        idle = [_FIRST_POLL_PAUSE]
        environment: ExecutionEnvironment | None = None
        try:
            while not self._stopping.is_set():
                if environment is None:
                    # Initialise before taking a batch: the records' visibility timeout (scaled with the Timeout)
                    # would otherwise run through an Init phase that time_scale does not shorten.
                    environment = self._start_environment()
                try:
                    event = self._receive(sqs, idle)
                except Exception:  # the emulator restarting or unreachable: poll again, as Lambda's pollers do
                    logger.warning(
                        "poller %d could not receive from %s; retrying", index, self.queue_url, exc_info=True
                    )
                    self._stopping.wait(_LONGEST_POLL_PAUSE)
                    continue
                if not event["Records"]:
                    continue
                try:
                    environment = self._run_batch(index, sqs, event, environment)
                except Exception:  # e.g. no process could be started: the batch is left to the queue, as on a crash
                    logger.exception(
                        "poller %d could not run a batch; its records return after their visibility", index
                    )
                    if environment is not None:
                        environment.kill()
                    environment = None
        finally:
            if environment is not None:
                environment.shutdown()

    def _start_environment(self) -> ExecutionEnvironment:
        """A new environment, through its Init phase (whose outcome it keeps as `init`)."""
        environment = ExecutionEnvironment(self.spec)
        self._ledger.cold_start()
        environment.wait_until_ready()
        return environment

    def _run_batch(
        self, index: int, sqs: SQSClient, event: dict[str, Any], environment: ExecutionEnvironment | None
    ) -> ExecutionEnvironment | None:
        message_ids = tuple(str(record["messageId"]) for record in event["Records"])
        self._ledger.batch_received(len(message_ids))

        if environment is None or (not environment.alive and environment.wait_until_ready().outcome is Outcome.OK):
            environment = self._start_environment()
        cold_start = environment.invocations == 0
        init = environment.wait_until_ready()
        if init.outcome is not Outcome.OK:
            # As in Lambda, a failed Init fails the invocation it was started for: the batch returns to the queue.
            self._ledger.record(index, cold_start, message_ids, init, environment.pid, outcome=str(init.outcome))
            return None

        with self._ledger.invocation():
            result = environment.invoke(
                event, timeout_seconds=self.invocation_timeout_seconds, slack_seconds=INVOCATION_SLACK_SECONDS
            )

        outcome, result, deleted, reported = _settle_batch(sqs, self.queue_url, event, result, message_ids)
        self._ledger.record(
            index, cold_start, message_ids, result, environment.pid, outcome=outcome, deleted=deleted, reported=reported
        )
        return environment if result.outcome in (Outcome.OK, Outcome.FUNCTION_ERROR) else None


def _settle_batch(
    sqs: SQSClient, queue_url: str, event: dict[str, Any], result: InvocationResult, message_ids: Sequence[str]
) -> tuple[str, InvocationResult, list[str], set[str]]:
    """Settle a batch as Lambda does after an invocation: on a well-formed response, delete the records it did not
    report failed. The batch's outcome, the result (with the error of a failed delete), the deleted and the reported
    message ids."""
    deleted: list[str] = []
    reported: set[str] = set()
    outcome = str(result.outcome)
    if result.outcome is Outcome.OK:
        failures = reported_failures(result.response, message_ids)
        if failures is None:
            outcome = "malformed"
        else:
            reported = failures
            try:
                deleted = settle(
                    sqs, queue_url, event, {"batchItemFailures": [{"itemIdentifier": i} for i in failures]}
                )
            except Exception as error:  # the records stay on the queue until their visibility timeout
                outcome = "settle_error"
                result = replace(result, error=f"DeleteMessageBatch failed: {error!r}")
    return outcome, result, deleted, reported


__all__ = [
    "DEFAULT_CONCURRENCY",
    "PROJECT_ROOT",
    "REPORT_BATCH_ITEM_FAILURES",
    "EventSourceError",
    "EventSourcePoller",
    "InvocationRecord",
    "PollerStats",
    "reported_failures",
]
