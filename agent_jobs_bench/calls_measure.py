"""Calls and capacity per job, measured: both sides (Agent Jobs and the naive pattern) run the three paths on the
template's resources in the local emulator, with every DynamoDB and SQS call they make recorded (`calls` turns the
counts into figures)."""

from __future__ import annotations

import contextlib
import io
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_jobs.keys import job_key
from agent_jobs_bench.capacity import Call, CallRecorder
from agent_jobs_bench.naive import NaiveWorker, commit_to_folder, naive_enqueue
from agent_jobs_bench.stack import REGION, BenchStack, emulated_stack
from agent_jobs_local.unregistered_workspaces import UnregisteredWorkspaces

TENANT = "tenant-bench"


class SideEffectFailed(RuntimeError):
    """The injected failure of a job's side effect (a retryable error to both workers)."""


@dataclass
class FailOnce:
    """The jobIds whose next side effect fails, once each."""

    job_ids: set[str] = field(default_factory=set)

    def check(self, job_id: str) -> None:
        if job_id in self.job_ids:
            self.job_ids.discard(job_id)
            raise SideEffectFailed(f"side effect of job {job_id} failed (injected, once)")


class FailingOnceStore(UnregisteredWorkspaces):
    """The worker's local folder workspace store, whose commit fails once for the jobs in `fail_once`."""

    def __init__(self, root: Path, fail_once: FailOnce) -> None:
        from agent_jobs_local.folder_workspaces import LocalWorkspaceStore

        self._inner = LocalWorkspaceStore(root)
        self._fail_once = fail_once

    def open(self, workspace_id: str) -> Any:
        workspace = self._inner.open(workspace_id)
        original_commit = workspace.commit
        fail_once = self._fail_once

        def commit(**kwargs: Any) -> Any:
            fail_once.check(kwargs["job_id"])
            return original_commit(**kwargs)

        workspace.commit = commit  # type: ignore[method-assign]
        return workspace


@dataclass
class PathCounts:
    """Per-job averages of one path for one side (Agent Jobs or naive), split by where the calls were made."""

    jobs: int
    producer: list[Call]
    worker: list[Call]

    def _per_job(self, calls: list[Call], value: Callable[[Call], float]) -> float:
        return sum(value(c) for c in calls) / self.jobs

    def dynamodb_calls(self, part: str = "all") -> float:
        return self._per_job([c for c in self._calls(part) if c.service == "dynamodb"], lambda _: 1.0)

    def sqs_calls(self, part: str = "all") -> float:
        return self._per_job([c for c in self._calls(part) if c.service == "sqs"], lambda _: 1.0)

    def wcu(self, part: str = "all") -> float:
        return self._per_job(self._calls(part), lambda c: c.computed_wcu)

    def rcu(self, part: str = "all") -> float:
        return self._per_job(self._calls(part), lambda c: c.computed_rcu)

    def reported(self, part: str = "all") -> float:
        """What moto's server answered in ConsumedCapacity for the same calls, per job."""
        return self._per_job(self._calls(part), lambda c: c.reported_total or 0.0)

    def operations(self, part: str = "all", service: str = "dynamodb") -> str:
        names: dict[str, int] = {}
        for call in (c for c in self._calls(part) if c.service == service):
            label = call.operation + (f" ({call.error})" if call.error else "")
            names[label] = names.get(label, 0) + 1
        return ", ".join(f"{n / self.jobs:g} {name}" for name, n in names.items())

    def _calls(self, part: str) -> list[Call]:
        return {"producer": self.producer, "worker": self.worker, "all": self.producer + self.worker}[part]


@dataclass
class Measurement:
    happy: PathCounts
    duplicate: PathCounts
    retry: PathCounts
    # step -> job item size in bytes (the largest over the jobs of the happy and retry paths)
    item_sizes: dict[str, int]


@dataclass
class Sides:
    product: Measurement
    naive: Measurement
    # operation -> the distinct ConsumedCapacity totals moto's server answered (None: nothing)
    moto_reported: dict[str, list[float | None]]


# ---- running the two sides ---------------------------------------------------------------------------------------


class _EventSource:
    """Lambda's SQS event source, on its own (uncounted) client."""

    def __init__(self, stack: BenchStack) -> None:
        from agent_jobs_local.event_source import LambdaContextStub, receive_event, settle

        self._stack = stack
        self._sqs = stack.session.client("sqs", endpoint_url=stack.endpoint_url)
        self._receive, self._settle, self._context = receive_event, settle, LambdaContextStub

    def receive(self, batch_size: int = 10) -> dict[str, Any]:
        return self._receive(
            self._sqs, self._stack.queue_url, queue_arn=self._stack.queue_arn, region=REGION, batch_size=batch_size
        )

    def invoke(self, handle: Callable[[dict[str, Any], Any], Any], event: dict[str, Any]) -> dict[str, Any]:
        response: dict[str, Any] = handle(event, self._context(timeout_seconds=120))
        self._settle(self._sqs, self._stack.queue_url, event, response)
        return response

    def make_visible(self, event: dict[str, Any]) -> None:
        """What waiting out the queue's visibility timeout does, without the wait."""
        for record in event["Records"]:
            self._sqs.change_message_visibility(
                QueueUrl=self._stack.queue_url, ReceiptHandle=record["receiptHandle"], VisibilityTimeout=0
            )


def _job(job_id: str, workspace_id: str) -> dict[str, Any]:
    return {
        "jobId": job_id,
        "workspaceId": workspace_id,
        "type": "apply_patch",
        "payload": {
            "patch": f"--- a/f.txt\n+++ b/f.txt\n@@ -0,0 +1 @@\n+{job_id}\n",
            "commitMessage": f"change for {job_id}",
        },
    }


class _Side:
    """One side of the comparison: how it enqueues and how its worker handles a batch."""

    def __init__(self, stack: BenchStack, recorder: CallRecorder, root: Path, *, naive: bool) -> None:
        self.stack, self.recorder, self.naive = stack, recorder, naive
        self.fail_once = FailOnce()
        self.registered: set[str] = set()
        session, endpoint = stack.session, stack.endpoint_url
        # Each side gets clients of its own, hooked, so only its calls are counted.
        self.dynamodb = session.client("dynamodb", endpoint_url=endpoint)
        self.sqs = session.client("sqs", endpoint_url=endpoint)
        recorder.attach(self.dynamodb)
        recorder.attach(self.sqs)
        if naive:
            commit = commit_to_folder(root)
            fail_once = self.fail_once

            def side_effect(message: dict[str, Any]) -> None:
                fail_once.check(message["jobId"])
                commit(message)

            worker = NaiveWorker(self.dynamodb, stack.table_name, side_effect)
            self.handle: Callable[[dict[str, Any], Any], Any] = worker.handle
        else:
            from dataclasses import replace

            from aws_lambda_powertools import Logger, Metrics, Tracer

            from agent_jobs.guard import JobGuard
            from agent_jobs.tenant_shares import TenantShares
            from job_worker.processing import BatchWorker

            settings = stack.settings
            self.guard = JobGuard(
                self.dynamodb, stack.table_name, max_attempts=settings.max_attempts, ttl_days=settings.job_ttl_days
            )
            # The tenant's share (the template's WorkerTenantShare) read and counted on the same hooked client.
            shares = TenantShares(self.dynamodb, stack.table_name, settings.tenant_share)
            self.services = replace(
                stack.services, dynamodb=self.dynamodb, sqs=self.sqs, guard=self.guard, tenant_shares=shares
            )
            self.metrics = Metrics(namespace="AgentJobsBench")
            self.worker = BatchWorker(
                services=self.services,
                workspaces=FailingOnceStore(root, self.fail_once),
                logger=Logger(service="agent-jobs-bench", level="CRITICAL"),
                metrics=self.metrics,
                tracer=Tracer(disabled=True),
            )
            self.handle = self._handle_product

    def _handle_product(self, event: dict[str, Any], context: Any) -> Any:
        # The benchmark publishes no metrics: the EMF documents the worker prints go nowhere.
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                return self.worker.handle(event, context)
            finally:
                self.metrics.clear_metrics()

    def enqueue(self, job: dict[str, Any]) -> None:
        if self.naive:
            naive_enqueue(
                job,
                TENANT,
                dynamodb=self.dynamodb,
                sqs=self.sqs,
                table_name=self.stack.table_name,
                queue_url=self.stack.queue_url,
            )
            return
        from agent_jobs.models import job_request_adapter
        from agent_jobs.producer import enqueue_job

        if job["workspaceId"] not in self.registered:  # before the counted calls: registering is not a job's cost
            self.stack.register_workspaces([job["workspaceId"]], TENANT)
            self.registered.add(job["workspaceId"])
        enqueue_job(
            job_request_adapter.validate_python(job),
            TENANT,
            guard=self.guard,
            sqs=self.sqs,
            queue_url=self.stack.queue_url,
            payloads=self.services.payloads,
            inline_limit_bytes=self.stack.settings.inline_message_limit_bytes,
        )


# The writes of one job, in order: what its item holds after each (Agent Jobs appends a history entry at each status).
PRODUCT_HAPPY_STEPS = ("accepted (QUEUED)", "sent (message id)", "claimed (IN_FLIGHT)", "succeeded (SUCCEEDED)")
NAIVE_HAPPY_STEPS = ("accepted (QUEUED)", "claimed (IN_FLIGHT)", "succeeded (SUCCEEDED)")
PRODUCT_RETRY_STEPS = (
    "accepted (QUEUED)",
    "sent (message id)",
    "claimed (IN_FLIGHT)",
    "failed (FAILED)",
    "claimed again (IN_FLIGHT)",
    "succeeded after the retry (SUCCEEDED)",
)
NAIVE_RETRY_STEPS = (
    "accepted (QUEUED)",
    "claimed (IN_FLIGHT)",
    "claimed again (IN_FLIGHT)",
    "succeeded after the retry (SUCCEEDED)",
)


def _measure(side: _Side, source: _EventSource, jobs: int) -> Measurement:
    recorder = side.recorder
    start = len(recorder.calls)
    label = "naive" if side.naive else "product"

    def phase(name: str) -> str:
        recorder.phase = f"{label}:{name}"
        return recorder.phase

    def sizes_of(job_id: str, steps: tuple[str, ...]) -> dict[str, int]:
        """The job item's size after each successful write of it, named by `steps` (the writes expected in order)."""
        pk = f"job#{job_id}" if side.naive else job_key(TENANT, job_id)
        writes = [
            c for c in recorder.calls[start:] if pk in c.sizes_after and c.error is None and c.operation != "GetItem"
        ]
        if len(writes) != len(steps):
            raise RuntimeError(f"expected {len(steps)} writes of {pk} ({steps}), saw {[c.operation for c in writes]}")
        return {step: call.sizes_after[pk] for step, call in zip(steps, writes, strict=True)}

    # Happy path: `jobs` jobs of one workspace, enqueued, then delivered in one batch (one message group).
    workspace = f"ws-{label}-{uuid.uuid4().hex[:6]}"
    happy_producer = phase("happy-producer")
    happy_ids = [uuid.uuid4().hex for _ in range(jobs)]
    for job_id in happy_ids:
        side.enqueue(_job(job_id, workspace))
    happy_worker = phase("happy-worker")
    event = source.receive()
    if len(event["Records"]) != jobs:
        raise RuntimeError(f"expected {jobs} messages in the queue, received {len(event['Records'])}")
    response = source.invoke(side.handle, event)
    if response["batchItemFailures"]:
        raise RuntimeError(f"the happy path failed: {response}")

    # Duplicate delivery: the same records again, after they took effect.
    duplicate_worker = phase("duplicate-worker")
    response = side.handle(event, source._context(timeout_seconds=120))
    if response["batchItemFailures"]:
        raise RuntimeError(f"a duplicate delivery was not acknowledged: {response}")

    # Retry: each job alone in its batch (a failure's cost per job, not shared with a batch), the first delivery's
    # side effect fails, the next one succeeds.
    retry_producer, retry_worker = f"{label}:retry-producer", f"{label}:retry-worker"
    for _ in range(jobs):
        job_id = uuid.uuid4().hex
        side.fail_once.job_ids.add(job_id)
        phase("retry-producer")
        side.enqueue(_job(job_id, f"ws-{label}-retry-{job_id[:8]}"))
        phase("retry-worker")
        failing = source.receive(batch_size=1)
        response = source.invoke(side.handle, failing)
        if [r["itemIdentifier"] for r in response["batchItemFailures"]] != [failing["Records"][0]["messageId"]]:
            raise RuntimeError(f"the injected failure was not reported for a retry: {response}")
        if side.naive:
            source.make_visible(failing)
        retried = source.receive(batch_size=1)
        response = source.invoke(side.handle, retried)
        if response["batchItemFailures"] or retried["Records"][0]["messageId"] != failing["Records"][0]["messageId"]:
            raise RuntimeError(f"a retried job did not succeed on its second delivery: {response}")
    calls = recorder.calls[start:]
    happy_steps = NAIVE_HAPPY_STEPS if side.naive else PRODUCT_HAPPY_STEPS
    sizes = {
        **sizes_of(job_id, NAIVE_RETRY_STEPS if side.naive else PRODUCT_RETRY_STEPS),
        **sizes_of(happy_ids[-1], happy_steps),
    }

    def pick(*names: str) -> list[Call]:
        return [c for c in calls if c.phase in names]

    return Measurement(
        happy=PathCounts(jobs, pick(happy_producer), pick(happy_worker)),
        duplicate=PathCounts(jobs, [], pick(duplicate_worker)),
        retry=PathCounts(jobs, pick(retry_producer), pick(retry_worker)),
        item_sizes=sizes,
    )


@contextmanager
def both_sides(jobs: int) -> Iterator[Sides]:
    with emulated_stack() as stack, tempfile.TemporaryDirectory(prefix="agent-jobs-bench-") as folder:
        reader = stack.session.client("dynamodb", endpoint_url=stack.endpoint_url)
        recorder = CallRecorder(reader, stack.table_name)
        source = _EventSource(stack)
        product = _measure(_Side(stack, recorder, Path(folder) / "product", naive=False), source, jobs)
        naive = _measure(_Side(stack, recorder, Path(folder) / "naive", naive=True), source, jobs)
        yield Sides(product=product, naive=naive, moto_reported=recorder.reported_by_operation())


def measure(quick: bool = False) -> Sides:
    """Both sides measured in one run (quick: 2 jobs per path, else 10)."""
    with both_sides(2 if quick else 10) as measured:
        return measured
