"""The demo workload's plan: which jobs of which workspaces the simulated agents submit, and which of them are
sent twice, lose their answer, are redelivered raw or meet an injected worker fault."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent_jobs_local.faults import Fault

if TYPE_CHECKING:
    pass


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


def branch_of_workspace(workspace_id: str) -> str:
    return f"agent/{workspace_id}"


def github_repository_of(workspace_id: str) -> str:
    return f"{GITHUB_OWNER}/{workspace_id}"
