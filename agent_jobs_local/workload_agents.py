"""The simulated agents of the demo workload: they submit the planned jobs through the HTTP API, with producer
retries, duplicate sends, raw redeliveries straight to the queue and a poison message, and record what they saw."""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agent_jobs.keys import deduplication_id, workspace_group_id
from agent_jobs.models import job_message, job_request_adapter
from agent_jobs_local.auth import mint_token
from agent_jobs_local.workload_api import post
from agent_jobs_local.workload_plan import BATCH_SIZE, DEFAULT_TENANT, POISON_BODY, TOKEN_TTL_SECONDS, Plan, PlannedJob

if TYPE_CHECKING:
    from mypy_boto3_sqs.client import SQSClient


@dataclass
class Submissions:
    """What the agents saw: per workspace, the jobs in the order the API accepted them."""

    accepted: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    repeats_absorbed: int = 0  # 202 with created=false: an idempotent repeat
    batch_accepted: int = 0  # jobs accepted through POST /jobs:batch
    retries_after_errors: int = 0
    raw_sent: int = 0
    poison_sent: int = 0
    errors: list[str] = field(default_factory=list)
    # (when it was sent, seconds until the answer) of every POST /jobs request, answered or not
    enqueue_latencies: list[tuple[float, float]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def enqueue_p99_ms(self) -> tuple[float, float] | None:
        """The 99th percentile of the POST /jobs latency over the first and over the last fifth of the requests (in
        the order they were sent), in milliseconds: whether enqueue slows down as the table grows. None with fewer
        than 20 requests."""
        with self.lock:
            latencies = [seconds for _, seconds in sorted(self.enqueue_latencies)]
        fifth = len(latencies) // 5
        if fifth < 4:
            return None

        def p99(values: list[float]) -> float:
            ordered = sorted(values)
            return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))] * 1000

        return p99(latencies[:fifth]), p99(latencies[-fifth:])

    @property
    def total_accepted(self) -> int:
        return sum(len(v) for v in self.accepted.values())


class Agents:
    """Simulated agents: each owns some workspaces and submits their jobs interleaved, one job of a workspace at a
    time (so the order it saw its 202s is the queue's acceptance order for that workspace). The first
    `config.batch_agents` agents submit through `POST /jobs:batch` instead: up to BATCH_SIZE jobs a request, taken
    round-robin over their workspaces (several of one workspace in a batch keep their order in the queue)."""

    def __init__(
        self, plan: Plan, api_url: str, sqs: SQSClient, queue_url: str, tenant_id: str = DEFAULT_TENANT
    ) -> None:
        self.plan = plan
        self.api_url = api_url.rstrip("/")
        self.sqs = sqs
        self.queue_url = queue_url
        self.tenant_id = tenant_id
        self.token = mint_token(tenant_id, ttl_seconds=TOKEN_TTL_SECONDS)
        self.submissions = Submissions()

    def run(self, on_accepted: Callable[[], None] = lambda: None) -> Submissions:
        workspaces = list(self.plan.by_workspace)
        owners: dict[int, list[str]] = defaultdict(list)
        for i, ws in enumerate(workspaces):
            owners[i % self.plan.config.agents].append(ws)
        threads = [
            threading.Thread(
                target=self._batch_agent if n < self.plan.config.batch_agents else self._agent,
                args=(owned, on_accepted),
                name=f"agent-{n}",
                daemon=True,
            )
            for n, owned in owners.items()
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return self.submissions

    def _agent(self, workspaces: list[str], on_accepted: Callable[[], None]) -> None:
        queues = {ws: list(self.plan.by_workspace[ws]) for ws in workspaces}
        while any(queues.values()):
            for ws in workspaces:
                if queues[ws]:
                    self._submit(queues[ws].pop(0))
                    on_accepted()

    def _submit(self, job: PlannedJob) -> None:
        url = f"{self.api_url}/jobs"
        if job.job_id in self.plan.lost_responses:
            post(url, job.body(), self.token)  # accepted, but the agent never sees the answer: it retries below
        for attempt in range(8):
            started = time.monotonic()
            status, answer = post(url, job.body(), self.token)
            with self.submissions.lock:
                self.submissions.enqueue_latencies.append((started, time.monotonic() - started))
            if status == 202:
                break
            with self.submissions.lock:
                self.submissions.retries_after_errors += 1
            if status < 500 and status != 429:
                with self.submissions.lock:
                    self.submissions.errors.append(f"{job.job_id}: {status} {answer}")
                return
            time.sleep(0.05 * 2**attempt)
        else:
            with self.submissions.lock:
                self.submissions.errors.append(f"{job.job_id}: not accepted after retries")
            return
        with self.submissions.lock:
            self.submissions.accepted[job.workspace_id].append(job.job_id)
            if not answer.get("created", True):
                self.submissions.repeats_absorbed += 1
        if job.job_id in self.plan.duplicate_sends:
            status, again = post(url, job.body(), self.token)
            with self.submissions.lock:
                if status == 202 and not again.get("created", True):
                    self.submissions.repeats_absorbed += 1
                else:
                    self.submissions.errors.append(f"{job.job_id}: duplicate send answered {status} {again}")
        if job.job_id in self.plan.raw_redeliveries:
            self._send_raw_copy(job)
        if job.job_id == self.plan.poison_after:
            self._send_poison(job)

    def _batch_agent(self, workspaces: list[str], on_accepted: Callable[[], None]) -> None:
        queues = {ws: list(self.plan.by_workspace[ws]) for ws in workspaces}
        while any(queues.values()):
            batch: list[PlannedJob] = []
            while len(batch) < BATCH_SIZE and any(queues.values()):
                for ws in workspaces:
                    if queues[ws] and len(batch) < BATCH_SIZE:
                        batch.append(queues[ws].pop(0))
                        if batch[-1].job_id == self.plan.poison_after:
                            break  # the poison message goes right after this job, before the next of its workspace
                if batch and batch[-1].job_id == self.plan.poison_after:
                    break
            for _ in self._submit_batch(batch):
                on_accepted()

    def _submit_batch(self, batch: list[PlannedJob]) -> list[PlannedJob]:
        """Submit the batch until each job is accepted or refused; the accepted jobs, in the order they were."""
        url = f"{self.api_url}/jobs:batch"
        if any(job.job_id in self.plan.lost_responses for job in batch):
            post(url, {"jobs": [job.body() for job in batch]}, self.token)  # the answer is lost: it retries below
        pending = list(batch)
        accepted: list[PlannedJob] = []
        for attempt in range(8):
            status, answer = post(url, {"jobs": [job.body() for job in pending]}, self.token)
            if status == 200:
                retry = []
                for job, result in zip(pending, answer["results"], strict=True):
                    if result["statusCode"] == 202:
                        accepted.append(job)
                        with self.submissions.lock:
                            self.submissions.accepted[job.workspace_id].append(job.job_id)
                            self.submissions.batch_accepted += 1
                            if not result["created"]:
                                self.submissions.repeats_absorbed += 1
                    elif result["statusCode"] >= 500 or result["statusCode"] == 429:  # a quota: wait and resend
                        retry.append(job)
                    else:
                        with self.submissions.lock:
                            self.submissions.errors.append(f"{job.job_id}: {result['statusCode']} {result}")
                pending = retry
                if not pending:
                    break
            elif status < 500 and status != 429:
                with self.submissions.lock:
                    self.submissions.errors.extend(f"{job.job_id}: batch answered {status} {answer}" for job in pending)
                pending = []
                break
            with self.submissions.lock:
                self.submissions.retries_after_errors += 1
            time.sleep(0.05 * 2**attempt)
        with self.submissions.lock:
            self.submissions.errors.extend(f"{job.job_id}: not accepted after retries" for job in pending)
        duplicates = [job for job in accepted if job.job_id in self.plan.duplicate_sends]
        if duplicates:
            status, again = post(url, {"jobs": [job.body() for job in duplicates]}, self.token)
            results = again.get("results", []) if status == 200 else []
            with self.submissions.lock:
                for job, result in zip(duplicates, results, strict=False):
                    if result["statusCode"] == 202 and not result["created"]:
                        self.submissions.repeats_absorbed += 1
                    else:
                        self.submissions.errors.append(f"{job.job_id}: duplicate send answered {result}")
                if len(results) != len(duplicates):
                    self.submissions.errors.append(f"duplicate batch answered {status} {again}")
        for job in accepted:
            if job.job_id in self.plan.raw_redeliveries:
                self._send_raw_copy(job)
            if job.job_id == self.plan.poison_after:
                self._send_poison(job)
        return accepted

    def _send_poison(self, job: PlannedJob) -> None:
        self.sqs.send_message(
            QueueUrl=self.queue_url,
            MessageBody=POISON_BODY,
            MessageGroupId=workspace_group_id(job.workspace_id),
            MessageDeduplicationId=uuid.uuid4().hex,
        )
        with self.submissions.lock:
            self.submissions.poison_sent += 1

    def _send_raw_copy(self, job: PlannedJob) -> None:
        """The same job message again, as a producer that resent it after SQS's deduplication window would."""
        message = job_message(job_request_adapter.validate_python(job.body()), self.tenant_id)
        self.sqs.send_message(
            QueueUrl=self.queue_url,
            MessageBody=message.model_dump_json(by_alias=True),
            MessageGroupId=workspace_group_id(job.workspace_id),
            MessageDeduplicationId=deduplication_id(self.tenant_id, job.job_id, job.type) + "-resent",
        )
        with self.submissions.lock:
            self.submissions.raw_sent += 1
