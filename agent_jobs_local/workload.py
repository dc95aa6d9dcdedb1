"""The demo workload: simulated agents submitting interleaved jobs over many workspaces through the HTTP API, with
producer retries, duplicate sends, raw redeliveries, a poison message and worker faults; then a verification of
every invariant against the table and the workspaces themselves."""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_jobs.guard import to_item
from agent_jobs.keys import deduplication_id, workspace_group_id
from agent_jobs.models import JobStatus, job_message, job_request_adapter
from agent_jobs_local.faults import Fault, fired

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient
    from mypy_boto3_sqs.client import SQSClient

CRASH_FAULTS = (
    Fault.CRASH_BEFORE_CLAIM,
    Fault.CRASH_AFTER_CLAIM,
    Fault.CRASH_AFTER_SIDE_EFFECT,
    Fault.CRASH_AFTER_COMPLETE,
)
POISON_BODY = '{"jobId": "poison", "workspaceId": '  # truncated JSON: no worker can parse it


@dataclass(frozen=True)
class WorkloadConfig:
    jobs: int = 500
    workspaces: int = 20
    agents: int = 6
    seed: int = 7
    crashes_per_kind: int = 3
    slow_jobs: int = 2
    duplicate_send_ratio: float = 0.08  # an agent sends a job again after its 202
    lost_response_ratio: float = 0.08  # an agent never sees the 202 and retries
    raw_redeliveries: int = (
        6  # copies of accepted messages sent straight to the queue (a resend after the dedup window)
    )
    poison: bool = True


@dataclass(frozen=True)
class PlannedJob:
    job_id: str
    workspace_id: str
    type: str
    payload: dict[str, Any]

    def body(self) -> dict[str, Any]:
        return {"jobId": self.job_id, "workspaceId": self.workspace_id, "type": self.type, "payload": self.payload}


@dataclass
class Plan:
    config: WorkloadConfig
    by_workspace: dict[str, list[PlannedJob]]
    faults: dict[str, Fault]
    duplicate_sends: set[str]
    lost_responses: set[str]
    raw_redeliveries: set[str]
    poison_workspace: str | None
    poison_after: str | None  # the poison message is sent right after this job is accepted

    @property
    def total(self) -> int:
        return sum(len(jobs) for jobs in self.by_workspace.values())


def make_plan(config: WorkloadConfig) -> Plan:
    rng = random.Random(config.seed)
    workspace_ids = [f"ws-{i:02d}" for i in range(config.workspaces)]
    by_workspace: dict[str, list[PlannedJob]] = {ws: [] for ws in workspace_ids}
    for n in range(config.jobs):
        ws = workspace_ids[n % config.workspaces]
        index = len(by_workspace[ws])
        job_id = f"{ws}-j{index:03d}"
        if index % 6 == 5:
            job = PlannedJob(job_id, ws, "run_tests", {"suite": "unit"})
        else:
            patch = f"--- a/src/{ws}.txt\n+++ b/src/{ws}.txt\n@@ -0,0 +1 @@\n+change {index} by agent\n"
            job = PlannedJob(job_id, ws, "apply_patch", {"patch": patch, "commitMessage": f"change {index}"})
        by_workspace[ws].append(job)
    for ws, jobs in by_workspace.items():  # every workspace ends with a pull request
        jobs.append(PlannedJob(f"{ws}-pr", ws, "open_pr", {"title": f"Agent changes for {ws}"}))

    poison_workspace = workspace_ids[-1] if config.poison else None
    healthy = [j for ws, jobs in by_workspace.items() if ws != poison_workspace for j in jobs[1:]]
    rng.shuffle(healthy)
    faults: dict[str, Fault] = {}
    for fault in (*CRASH_FAULTS, Fault.SLOW):
        count = config.slow_jobs if fault is Fault.SLOW else config.crashes_per_kind
        for _ in range(count):
            # these two strike at the side effect (the commit), which only apply_patch makes
            at_commit = fault in (Fault.SLOW, Fault.CRASH_AFTER_SIDE_EFFECT)
            job = next(j for j in reversed(healthy) if not at_commit or j.type == "apply_patch")
            healthy.remove(job)
            faults[job.job_id] = fault
    ids = [j.job_id for jobs in by_workspace.values() for j in jobs]
    poison_jobs = by_workspace[poison_workspace] if poison_workspace else []
    return Plan(
        config=config,
        by_workspace=by_workspace,
        faults=faults,
        duplicate_sends={i for i in ids if rng.random() < config.duplicate_send_ratio},
        lost_responses={i for i in ids if rng.random() < config.lost_response_ratio},
        raw_redeliveries={healthy.pop().job_id for _ in range(config.raw_redeliveries)},
        poison_workspace=poison_workspace,
        poison_after=poison_jobs[len(poison_jobs) // 2].job_id if poison_jobs else None,
    )


@dataclass
class Submissions:
    """What the agents saw: per workspace, the jobs in the order the API accepted them."""

    accepted: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    repeats_absorbed: int = 0  # 202 with created=false: an idempotent repeat
    retries_after_errors: int = 0
    raw_sent: int = 0
    poison_sent: int = 0
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def total_accepted(self) -> int:
        return sum(len(v) for v in self.accepted.values())


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


class Agents:
    """Simulated agents: each owns some workspaces and submits their jobs interleaved, one job of a workspace at a
    time (so the order it saw its 202s is the queue's acceptance order for that workspace)."""

    def __init__(self, plan: Plan, api_url: str, sqs: SQSClient, queue_url: str, tenant_id: str = "default") -> None:
        self.plan = plan
        self.api_url = api_url.rstrip("/")
        self.sqs = sqs
        self.queue_url = queue_url
        self.tenant_id = tenant_id
        self.submissions = Submissions()

    def run(self, on_accepted: Callable[[], None] = lambda: None) -> Submissions:
        workspaces = list(self.plan.by_workspace)
        owners: dict[int, list[str]] = defaultdict(list)
        for i, ws in enumerate(workspaces):
            owners[i % self.plan.config.agents].append(ws)
        threads = [
            threading.Thread(target=self._agent, args=(owned, on_accepted), name=f"agent-{n}", daemon=True)
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
            _post(url, job.body())  # accepted, but the agent never sees the answer: it retries below
        for attempt in range(8):
            status, answer = _post(url, job.body())
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
            status, again = _post(url, job.body())
            with self.submissions.lock:
                if status == 202 and not again.get("created", True):
                    self.submissions.repeats_absorbed += 1
                else:
                    self.submissions.errors.append(f"{job.job_id}: duplicate send answered {status} {again}")
        if job.job_id in self.plan.raw_redeliveries:
            self._send_raw_copy(job)
        if job.job_id == self.plan.poison_after:
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
            MessageDeduplicationId=deduplication_id(job.job_id, job.type) + "-resent",
        )
        with self.submissions.lock:
            self.submissions.raw_sent += 1


# ---- verification -----------------------------------------------------------------------------------------------


@dataclass
class Report:
    accepted: int
    applied: int
    parked: int
    rejected: int
    dead: int
    lost: list[str]
    double_applies: list[str]
    order_violations: list[str]
    halted: dict[str, str]
    expected_halted: set[str]
    incomplete_workspaces: list[str]
    api_repeats_absorbed: int
    worker_duplicates_absorbed: int
    raw_redeliveries_sent: int
    poison_sent: int
    faults_injected: dict[str, int]
    invocation_crashes: int
    invocation_timeouts: int
    cold_starts: int
    invocations: int
    submission_errors: list[str]
    workspaces: int
    seconds: float

    @property
    def failures(self) -> list[str]:
        problems = []
        if self.lost:
            problems.append(f"{len(self.lost)} lost jobs: {self.lost[:5]}")
        if self.double_applies:
            problems.append(f"{len(self.double_applies)} double applies: {self.double_applies[:5]}")
        if self.order_violations:
            problems.append(f"{len(self.order_violations)} order violations: {self.order_violations[:3]}")
        if set(self.halted) != self.expected_halted:
            problems.append(f"halted workspaces {sorted(self.halted)} != expected {sorted(self.expected_halted)}")
        if self.incomplete_workspaces:
            problems.append(f"workspaces not complete: {self.incomplete_workspaces[:5]}")
        if self.submission_errors:
            problems.append(f"{len(self.submission_errors)} submissions failed: {self.submission_errors[:3]}")
        missing = [kind for kind, count in self.faults_injected.items() if count == 0]
        if missing:
            problems.append(f"fault kinds never injected: {missing}")
        return problems

    @property
    def ok(self) -> bool:
        return not self.failures

    def rows(self) -> list[tuple[str, str, bool]]:
        """(what, figure, holds) for display."""
        return [
            ("jobs accepted (202, unique jobIds)", str(self.accepted), self.accepted > 0),
            ("workspaces", str(self.workspaces), True),
            ("jobs applied (SUCCEEDED)", str(self.applied), True),
            ("parked behind a halt / rejected / dead", f"{self.parked} / {self.rejected} / {self.dead}", True),
            ("duplicates absorbed by the API (idempotent 202)", str(self.api_repeats_absorbed), True),
            ("duplicates absorbed by the worker (no effect)", str(self.worker_duplicates_absorbed), True),
            (
                "raw redeliveries sent / poison messages sent",
                f"{self.raw_redeliveries_sent} / {self.poison_sent}",
                True,
            ),
            *[(f"fault injected: {kind}", str(count), count > 0) for kind, count in self.faults_injected.items()],
            (
                "worker crashes survived / timeouts survived",
                f"{self.invocation_crashes} / {self.invocation_timeouts}",
                True,
            ),
            ("invocations / cold starts", f"{self.invocations} / {self.cold_starts}", True),
            ("double applies", str(len(self.double_applies)), not self.double_applies),
            ("lost jobs", str(len(self.lost)), not self.lost),
            ("per-workspace order violations", str(len(self.order_violations)), not self.order_violations),
            (
                "halted workspaces",
                ", ".join(f"{ws} ({reason[:60]})" for ws, reason in sorted(self.halted.items())) or "none",
                set(self.halted) == self.expected_halted,
            ),
            (
                "other workspaces complete",
                "yes" if not self.incomplete_workspaces else "no",
                not self.incomplete_workspaces,
            ),
            ("seconds", f"{self.seconds:.1f}", True),
        ]


def scan_items(dynamodb: DynamoDBClient, table_name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"TableName": table_name, "ConsistentRead": True}
    while True:
        page = dynamodb.scan(**kwargs)
        items.extend(to_item(raw) for raw in page.get("Items", []))
        if "LastEvaluatedKey" not in page:
            return items
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def count_worker_metric(log_dir: Path, name: str) -> int:
    """Sum of an EMF metric in the worker processes' logs."""
    total = 0
    for log in log_dir.glob("worker-*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if f'"{name}"' not in line or not line.startswith("{"):
                continue
            try:
                value = json.loads(line).get(name)
            except ValueError:
                continue
            if isinstance(value, list):
                total += int(sum(value))
            elif isinstance(value, int | float):
                total += int(value)
    return total


def verify(
    plan: Plan,
    submissions: Submissions,
    items: list[dict[str, Any]],
    branch_of: Callable[[str], list[str]],
    *,
    marker_dir: Path,
    log_dir: Path,
    poller_stats: Any,
    seconds: float,
) -> Report:
    jobs = {item["jobId"]: item for item in items if str(item["pk"]).startswith("job#")}
    halted = {
        str(item["workspaceId"]): str(item.get("haltReason", ""))
        for item in items
        if str(item["pk"]).startswith("ws#") and item.get("state") == "HALTED"
    }
    statuses = Counter(str(job.get("status")) for job in jobs.values())
    lost, double_applies, order_violations, incomplete = [], [], [], []
    for ws, accepted in submissions.accepted.items():
        branch = branch_of(ws)
        for job_id, times in Counter(branch).items():
            if times > 1:
                double_applies.append(f"{ws}:{job_id} x{times}")
        accepted_patches = [j for j in accepted if jobs.get(j, {}).get("type") == "apply_patch"]
        applied_patches = [j for j in accepted_patches if jobs[j].get("status") == JobStatus.SUCCEEDED]
        if [j for j in branch if j in set(accepted_patches)] != applied_patches:
            order_violations.append(f"{ws}: branch {branch} != accepted order {applied_patches}")
        if applied_patches != accepted_patches[: len(applied_patches)]:
            order_violations.append(f"{ws}: applied {applied_patches} skips part of {accepted_patches}")
        finished = [jobs[j]["finishedAt"] for j in accepted if jobs.get(j, {}).get("status") == JobStatus.SUCCEEDED]
        if finished != sorted(finished):
            order_violations.append(f"{ws}: jobs finished out of acceptance order")
        for job_id in accepted:
            status = jobs.get(job_id, {}).get("status")
            if status == JobStatus.SUCCEEDED:
                continue
            if ws in halted and status in (JobStatus.PARKED, JobStatus.DEAD, JobStatus.REJECTED):
                continue  # held, with its body, for an operator: not lost
            lost.append(f"{job_id}={status}")
        if ws not in halted and any(jobs.get(j, {}).get("status") != JobStatus.SUCCEEDED for j in accepted):
            incomplete.append(ws)
    injected = fired(marker_dir)
    return Report(
        accepted=submissions.total_accepted,
        applied=statuses[JobStatus.SUCCEEDED],
        parked=statuses[JobStatus.PARKED],
        rejected=statuses[JobStatus.REJECTED] + sum(1 for i in items if str(i["pk"]).startswith("msg#")),
        dead=statuses[JobStatus.DEAD],
        lost=lost,
        double_applies=double_applies,
        order_violations=order_violations,
        halted=halted,
        expected_halted={plan.poison_workspace} if plan.poison_workspace else set(),
        incomplete_workspaces=incomplete,
        api_repeats_absorbed=submissions.repeats_absorbed,
        worker_duplicates_absorbed=count_worker_metric(log_dir, "JobsDuplicate"),
        raw_redeliveries_sent=submissions.raw_sent,
        poison_sent=submissions.poison_sent,
        faults_injected={str(kind): len(ids) for kind, ids in injected.items()},
        invocation_crashes=int(getattr(poller_stats, "crashes", 0)),
        invocation_timeouts=int(getattr(poller_stats, "timeouts", 0)),
        cold_starts=int(getattr(poller_stats, "cold_starts", 0)),
        invocations=int(getattr(poller_stats, "invocations", 0)),
        submission_errors=submissions.errors,
        workspaces=len(plan.by_workspace),
        seconds=seconds,
    )
