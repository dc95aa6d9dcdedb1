"""The verification of a demo run: every invariant (order, exactly-once, halting, pull requests, test results)
checked against the table, what the agents saw and the workspaces themselves."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_jobs.guard import to_item
from agent_jobs.models import JobStatus
from agent_jobs_local.faults import fired
from agent_jobs_local.workload_agents import Submissions
from agent_jobs_local.workload_plan import BASE_BRANCH, Plan, branch_of_workspace, github_repository_of

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient


@dataclass(frozen=True)
class PullRequestSeen:
    """A pull request as GitHub (the demo's fake) holds it."""

    repository: str  # owner/repo
    head: str
    base: str
    number: int
    state: str = "open"


@dataclass(frozen=True)
class ReportLine:
    """One line of the report. `holds` is the verdict of a check (True: it held; False: it broke and the run fails);
    None for a figure that only describes the run (how many jobs, invocations, seconds), which verifies nothing and so
    is neither "ok" nor "FAIL"."""

    what: str
    figure: str
    holds: bool | None = None


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

    def rows(self) -> list[ReportLine]:
        """The report's lines, in display order: the checks (each the figure of one of `failures`) and, between them,
        figures that only describe the run."""
        return [
            ReportLine("jobs accepted (202, unique jobIds)", str(self.accepted)),
            ReportLine("workspaces", str(self.workspaces)),
            ReportLine("jobs applied (SUCCEEDED)", str(self.applied)),
            ReportLine("parked behind a halt / rejected / dead", f"{self.parked} / {self.rejected} / {self.dead}"),
            ReportLine("duplicates absorbed by the API (idempotent 202)", str(self.api_repeats_absorbed)),
            ReportLine("jobs accepted through POST /jobs:batch", str(self.batch_accepted)),
            ReportLine("duplicates absorbed by the worker (no effect)", str(self.worker_duplicates_absorbed)),
            ReportLine(
                "raw redeliveries sent / poison messages sent", f"{self.raw_redeliveries_sent} / {self.poison_sent}"
            ),
            ReportLine("submissions failed", str(len(self.submission_errors)), not self.submission_errors),
            *[
                ReportLine(f"fault injected: {kind}", str(count), count > 0)
                for kind, count in self.faults_injected.items()
            ],
            ReportLine(
                "worker crashes survived / timeouts survived", f"{self.invocation_crashes} / {self.invocation_timeouts}"
            ),
            ReportLine("invocations / cold starts", f"{self.invocations} / {self.cold_starts}"),
            ReportLine(
                "enqueue p99, first / last fifth of the requests",
                "-"
                if self.enqueue_p99_ms is None
                else f"{self.enqueue_p99_ms[0]:.0f} ms / {self.enqueue_p99_ms[1]:.0f} ms"
                f" ({self.enqueue_p99_ms[1] / max(self.enqueue_p99_ms[0], 1e-9):.2f}x)",
            ),
            ReportLine("double applies", str(len(self.double_applies)), not self.double_applies),
            ReportLine("lost jobs", str(len(self.lost)), not self.lost),
            ReportLine("per-workspace order violations", str(len(self.order_violations)), not self.order_violations),
            ReportLine(
                "halted workspaces (expected: " + (", ".join(sorted(self.expected_halted)) or "none") + ")",
                ", ".join(sorted(self.halted)) or "none",
                set(self.halted) == self.expected_halted,
            ),
            ReportLine(
                "other workspaces complete",
                "yes" if not self.incomplete_workspaces else "no",
                not self.incomplete_workspaces,
            ),
            ReportLine(
                "pull requests opened / completed workspaces",
                f"{self.pull_requests} / {self.pull_requests_expected}",
                not self.workspaces_without_pull_request and not self.unexpected_pull_requests,
            ),
            ReportLine(
                "duplicate pull requests per head",
                str(len(self.duplicate_pull_requests)),
                not self.duplicate_pull_requests,
            ),
            ReportLine(
                "run_tests results passed / run_tests succeeded",
                f"{self.tests_passed} / {self.tests_succeeded}",
                not self.tests_without_passed_result,
            ),
            ReportLine("seconds", f"{self.seconds:.1f}"),
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
