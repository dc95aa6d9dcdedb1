"""The demo workload: simulated agents submitting interleaved jobs over many workspaces through the HTTP API, with
producer retries, duplicate sends, raw redeliveries, a poison message and worker faults; then a verification of
every invariant against the table and the workspaces themselves.

Each workspace is a real git repository: `create_remote` makes a bare remote with a first commit on `main`, and
`register_workspaces` registers it through the API (`PUT /workspaces/{workspaceId}`) with its branch, its test
command and the GitHub repository its pull request goes to. Every API call carries a bearer token of the tenant,
minted with the local development key (`auth.mint_token`)."""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dulwich.objects import Blob, Commit, Tree
from dulwich.refs import Ref
from dulwich.repo import Repo

from agent_jobs.guard import to_item
from agent_jobs.keys import deduplication_id, workspace_group_id
from agent_jobs.models import JobStatus, job_message, job_request_adapter
from agent_jobs_local.auth import mint_token
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
BASE_BRANCH = "main"
GITHUB_OWNER = "agents"
TEST_SUITE = "unit"
# Run in the test sandbox, which has the interpreter's python3 and /usr, never this process's virtual environment.
PASSING_TEST_COMMAND = ("python3", "-c", "print('tests pass')")
DEFAULT_TENANT = "default"
# Long enough for the longest demo run: the agents mint their token once.
TOKEN_TTL_SECONDS = 6 * 3600


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
    batch_agents: int = 0  # of the agents, how many submit through POST /jobs:batch (up to BATCH_SIZE jobs a request)


BATCH_SIZE = 10
NO_ANSWER = 599  # the status `_send` reports when no HTTP answer came back; retried like a 5xx


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
            job = PlannedJob(job_id, ws, "run_tests", {"suite": TEST_SUITE})
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


def _send(method: str, url: str, body: dict[str, Any], token: str) -> tuple[int, dict[str, Any]]:
    """The answer's status and JSON body. As an SDK client sees it, no answer at all (connection refused or reset,
    timed out, cut off mid-answer) is NO_ANSWER, which callers retry as they retry a 5xx: with the same jobId, a
    request that did reach the API is answered as a repeat."""
    headers = {"content-type": "application/json", "authorization": f"Bearer {token}"}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, _answer_body(response.read())
    except urllib.error.HTTPError as error:
        return error.code, _answer_body(error.read())
    except (OSError, http.client.HTTPException) as error:  # URLError, resets, timeouts, RemoteDisconnected
        return NO_ANSWER, {"error": f"no answer: {error!r}"}


def _answer_body(raw: bytes) -> dict[str, Any]:
    try:
        answer = json.loads(raw or b"{}")
    except ValueError:
        return {"body": raw[:500].decode(errors="replace")}
    return answer if isinstance(answer, dict) else {"body": answer}


def _post(url: str, body: dict[str, Any], token: str) -> tuple[int, dict[str, Any]]:
    return _send("POST", url, body, token)


# ---- git remotes and their registration -------------------------------------------------------------------------


def branch_of_workspace(workspace_id: str) -> str:
    return f"agent/{workspace_id}"


def github_repository_of(workspace_id: str) -> str:
    return f"{GITHUB_OWNER}/{workspace_id}"


def remote_path(remotes_root: Path, workspace_id: str, tenant_id: str = DEFAULT_TENANT) -> Path:
    """Where a workspace's bare remote lives: in its tenant's folder of the remotes root (WORKSPACES_REMOTE_ROOT),
    the only place a file-system remote of that tenant may be registered."""
    return remotes_root / tenant_id / f"{workspace_id}.git"


def create_remote(path: Path, workspace_id: str, files: Mapping[str, bytes] | None = None) -> Path:
    """A bare git repository at `path` (absolute) whose `main` has one commit with a README.md (and `files`, top-level
    names to contents), as a person who created the repository would leave it. Returns the path."""
    path = path.resolve()
    path.mkdir(parents=True, exist_ok=False)
    with Repo.init_bare(str(path)) as repo:
        readme = Blob.from_string(f"# {workspace_id}\n\nA workspace of the Agent Jobs demo.\n".encode())
        blobs = {"README.md": readme, **{name: Blob.from_string(content) for name, content in (files or {}).items()}}
        tree = Tree()
        for name, blob in blobs.items():
            tree.add(name.encode(), 0o100644, blob.id)
        commit = Commit()
        commit.tree = tree.id
        commit.parents = []
        commit.author = commit.committer = b"Demo Maintainer <maintainer@example.com>"
        commit.author_time = commit.commit_time = int(time.time())
        commit.author_timezone = commit.commit_timezone = 0
        commit.message = b"Initial commit\n"
        for obj in (*blobs.values(), tree, commit):
            repo.object_store.add_object(obj)
        main = Ref(f"refs/heads/{BASE_BRANCH}".encode())
        repo.refs[main] = commit.id
        repo.refs.set_symbolic_ref(Ref(b"HEAD"), main)
    return path


def registration_body(
    remote: Path, workspace_id: str, github_api_url: str, test_command: Sequence[str] = PASSING_TEST_COMMAND
) -> dict[str, Any]:
    """The `PUT /workspaces/{workspaceId}` body of a demo workspace (no token: the local fake GitHub needs none); its
    `TEST_SUITE` runs `test_command`."""
    return {
        "remoteUrl": str(remote),
        "branch": branch_of_workspace(workspace_id),
        "baseBranch": BASE_BRANCH,
        "testCommands": {TEST_SUITE: list(test_command)},
        "githubRepository": github_repository_of(workspace_id),
        "githubApiUrl": github_api_url,
    }


def register_workspaces(
    api_url: str,
    remotes: Mapping[str, Path],
    github_api_url: str,
    *,
    tenant_id: str = DEFAULT_TENANT,
    test_command: Sequence[str] = PASSING_TEST_COMMAND,
) -> dict[str, int]:
    """Register each workspace's remote through the API for `tenant_id`, its test suite running `test_command`;
    returns workspace -> status (201 created, 200 updated). Retries 5xx and 429 a few times; raises RuntimeError with
    the API's answer on anything else."""
    statuses: dict[str, int] = {}
    token = mint_token(tenant_id, ttl_seconds=TOKEN_TTL_SECONDS)
    for ws, remote in remotes.items():
        url = f"{api_url.rstrip('/')}/workspaces/{ws}"
        body = registration_body(remote, ws, github_api_url, test_command)
        for attempt in range(6):
            status, answer = _send("PUT", url, body, token)
            if status in (200, 201):
                statuses[ws] = status
                break
            if status < 500 and status != 429:
                raise RuntimeError(f"PUT /workspaces/{ws} answered {status}: {answer}")
            time.sleep(0.1 * 2**attempt)
        else:
            raise RuntimeError(f"PUT /workspaces/{ws} kept failing: {status} {answer}")
    return statuses


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
            _post(url, job.body(), self.token)  # accepted, but the agent never sees the answer: it retries below
        for attempt in range(8):
            started = time.monotonic()
            status, answer = _post(url, job.body(), self.token)
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
            status, again = _post(url, job.body(), self.token)
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
            _post(url, {"jobs": [job.body() for job in batch]}, self.token)  # the answer is lost: it retries below
        pending = list(batch)
        accepted: list[PlannedJob] = []
        for attempt in range(8):
            status, answer = _post(url, {"jobs": [job.body() for job in pending]}, self.token)
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
            status, again = _post(url, {"jobs": [job.body() for job in duplicates]}, self.token)
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


# ---- verification -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PullRequestSeen:
    """A pull request as GitHub (the demo's fake) holds it."""

    repository: str  # owner/repo
    head: str
    base: str
    number: int
    state: str = "open"


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
    batch_accepted: int = 0  # of the accepted jobs, those accepted through POST /jobs:batch
    pull_requests: int = 0  # held by GitHub, open, all repositories
    pull_requests_expected: int = 0  # one per workspace that completed (not halted)
    workspaces_without_pull_request: list[str] = field(default_factory=list)
    duplicate_pull_requests: list[str] = field(default_factory=list)  # heads with more than one pull request
    unexpected_pull_requests: list[str] = field(default_factory=list)  # of halted or unknown workspaces
    tests_passed: int = 0  # succeeded run_tests jobs whose result outcome is "passed"
    tests_succeeded: int = 0  # succeeded run_tests jobs
    tests_without_passed_result: list[str] = field(default_factory=list)
    # POST /jobs p99 in ms over the first and the last fifth of the requests (None: too few, or batch agents only)
    enqueue_p99_ms: tuple[float, float] | None = None

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
            unexpected = "; ".join(f"{ws}: {self.halted[ws]}" for ws in sorted(set(self.halted) - self.expected_halted))
            problems.append(
                f"halted workspaces {sorted(self.halted)} != expected {sorted(self.expected_halted)}"
                + (f" (unexpected: {unexpected})" if unexpected else "")
            )
        if self.incomplete_workspaces:
            problems.append(f"workspaces not complete: {self.incomplete_workspaces[:5]}")
        if self.submission_errors:
            problems.append(f"{len(self.submission_errors)} submissions failed: {self.submission_errors[:3]}")
        missing = [kind for kind, count in self.faults_injected.items() if count == 0]
        if missing:
            problems.append(f"fault kinds never injected: {missing}")
        if self.workspaces_without_pull_request:
            problems.append(f"completed workspaces without a pull request: {self.workspaces_without_pull_request[:5]}")
        if self.duplicate_pull_requests:
            problems.append(f"more than one pull request for a head: {self.duplicate_pull_requests[:5]}")
        if self.unexpected_pull_requests:
            problems.append(f"pull requests of halted or unknown workspaces: {self.unexpected_pull_requests[:5]}")
        if self.tests_without_passed_result:
            problems.append(f"run_tests jobs without a passed result: {self.tests_without_passed_result[:5]}")
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
            ("jobs accepted through POST /jobs:batch", str(self.batch_accepted), True),
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
            (
                "enqueue p99, first / last fifth of the requests",
                "-"
                if self.enqueue_p99_ms is None
                else f"{self.enqueue_p99_ms[0]:.0f} ms / {self.enqueue_p99_ms[1]:.0f} ms"
                f" ({self.enqueue_p99_ms[1] / max(self.enqueue_p99_ms[0], 1e-9):.2f}x)",
                True,
            ),
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
            (
                "pull requests opened / completed workspaces",
                f"{self.pull_requests} / {self.pull_requests_expected}",
                not self.workspaces_without_pull_request and not self.unexpected_pull_requests,
            ),
            (
                "duplicate pull requests per head",
                str(len(self.duplicate_pull_requests)),
                not self.duplicate_pull_requests,
            ),
            (
                "run_tests results passed / run_tests succeeded",
                f"{self.tests_passed} / {self.tests_succeeded}",
                not self.tests_without_passed_result,
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
    pull_requests: Iterable[PullRequestSeen] = (),
) -> Report:
    """Check order, exactly-once, one job at a time and halting from the table (`items`), what the agents saw
    (`submissions`) and the workspaces themselves: `branch_of(ws)` is the jobIds of the `Agent-Job-Id` trailers on
    the workspace's branch, oldest first; `pull_requests` what GitHub holds."""
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
    pulls = check_pull_requests(plan, halted, pull_requests)
    tests = check_test_results(jobs)
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
        batch_accepted=submissions.batch_accepted,
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
        enqueue_p99_ms=submissions.enqueue_p99_ms(),
        **pulls,
        **tests,
    )


def check_pull_requests(
    plan: Plan, halted: Mapping[str, str], pull_requests: Iterable[PullRequestSeen]
) -> dict[str, Any]:
    """One open pull request per completed workspace (head `agent/<ws>` into `main` of `agents/<ws>`), none for a
    halted one, never two for one head."""
    open_pulls = [pull for pull in pull_requests if pull.state == "open"]
    per_head = Counter((pull.repository, pull.head, pull.base) for pull in open_pulls)
    completed = [ws for ws in plan.by_workspace if ws not in halted]
    expected = {(github_repository_of(ws), branch_of_workspace(ws), BASE_BRANCH): ws for ws in completed}
    return {
        "pull_requests": len(open_pulls),
        "pull_requests_expected": len(completed),
        "workspaces_without_pull_request": [ws for key, ws in expected.items() if per_head[key] == 0],
        "duplicate_pull_requests": [f"{repo}:{head} x{n}" for (repo, head, _), n in per_head.items() if n > 1],
        "unexpected_pull_requests": sorted(
            f"{repo}:{head}" for repo, head, base in per_head if (repo, head, base) not in expected
        ),
    }


def check_test_results(jobs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Every run_tests job that succeeded carries the result of the workspace's test command, and it passed."""
    succeeded = [
        job for job in jobs.values() if job.get("type") == "run_tests" and job.get("status") == JobStatus.SUCCEEDED
    ]
    missing = [
        f"{job['jobId']}={(job.get('result') or {}).get('outcome')}"
        for job in succeeded
        if (job.get("result") or {}).get("outcome") != "passed"
    ]
    return {
        "tests_passed": len(succeeded) - len(missing),
        "tests_succeeded": len(succeeded),
        "tests_without_passed_result": missing,
    }
