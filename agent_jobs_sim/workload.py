"""What the agents of one seed submit: workspaces of two tenants, each an ordered list of apply_patch jobs, some whose
patch the remote never accepts, and poison messages sent straight into a workspace's group."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from agent_jobs.models import ApplyPatchJob


@dataclass
class WorkspacePlan:
    workspace_id: str
    tenant_id: str
    jobs: list[ApplyPatchJob] = field(default_factory=list)
    # Jobs whose patch the remote refuses (a permanent failure: DEAD, the workspace halted, the operator skips it).
    bad: set[str] = field(default_factory=set)
    # Jobs that kill every invocation that runs them (they exhaust its memory): made DEAD, then skipped.
    killers: set[str] = field(default_factory=set)
    # Positions (job indexes) after whose acceptance the agent sends a poison message into the group.
    poison_after: set[int] = field(default_factory=set)


@dataclass
class Workload:
    workspaces: list[WorkspacePlan]

    @property
    def jobs(self) -> int:
        return sum(len(plan.jobs) for plan in self.workspaces)

    def plan_of(self, workspace_id: str) -> WorkspacePlan:
        return next(plan for plan in self.workspaces if plan.workspace_id == workspace_id)

    def is_bad(self, job_id: str) -> bool:
        return any(job_id in plan.bad for plan in self.workspaces)

    def is_killer(self, job_id: str) -> bool:
        return any(job_id in plan.killers for plan in self.workspaces)

    def never_applies(self, job_id: str) -> bool:
        return self.is_bad(job_id) or self.is_killer(job_id)


def _patch(workspace_id: str, index: int) -> str:
    path = f"src/{workspace_id}/step_{index}.txt"
    return f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+step {index}\n"


def draw_workload(
    rng: random.Random, *, jobs: int, workspaces: int, bad_rate: float, poison_rate: float, killer_rate: float
) -> Workload:
    plans = [WorkspacePlan(workspace_id=f"ws-{index}", tenant_id=f"tenant-{index % 2}") for index in range(workspaces)]
    for number in range(jobs):
        plan = plans[number % workspaces] if number < workspaces else rng.choice(plans)
        index = len(plan.jobs)
        job_id = f"{plan.workspace_id}-job-{index:03d}"
        plan.jobs.append(
            ApplyPatchJob.model_validate(
                {
                    "jobId": job_id,
                    "workspaceId": plan.workspace_id,
                    "type": "apply_patch",
                    "payload": {"patch": _patch(plan.workspace_id, index), "commitMessage": f"step {index}"},
                }
            )
        )
        if rng.random() < bad_rate:
            plan.bad.add(job_id)
        elif rng.random() < killer_rate:
            plan.killers.add(job_id)
        if rng.random() < poison_rate:
            plan.poison_after.add(index)
    return Workload(plans)
