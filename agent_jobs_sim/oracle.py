"""The invariants, checked from the simulated branches, the job records and the queues, never through the product.

At each commit on a workspace's branch (the effect of a job): it is the job's first; every job its workspace
accepted earlier has taken effect or was skipped by an operator (so the branch's order is the acceptance order and
nothing lands behind a DEAD job); no poison message recorded REJECTED ahead of it is still unresolved. At the end: every
job took effect once or, when its patch could never apply, is SKIPPED with its reason; every poison message is on
record; and all of it settled within the bound once faults stopped (liveness). At each record deferred over its
tenant's share: nothing was written to its job (no claim, attempt, failure or history entry), and the batch's answer
hands it back with every record behind it in its group (the group's order).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from agent_jobs.core.transitions import JOB_TRANSITIONS
from agent_jobs.guard import Lease
from agent_jobs.keys import job_key, workspace_key
from agent_jobs.store.codec import to_item
from agent_jobs_sim.scheduler import Process
from agent_jobs_sim.workload import Workload


class Violation(BaseException):
    """An invariant broke: the seed fails with this message. A BaseException, so the product code on whose stack it is
    raised (at a commit) cannot catch it."""


def allowed_job_moves() -> frozenset[tuple[str | None, str]]:
    """Every (from, to) pair of the job state machine's transition table."""
    return frozenset((None if row.source is None else str(row.source), str(row.target)) for row in JOB_TRANSITIONS)


@dataclass
class Oracle:
    workload: Workload
    table_name: str
    dynamodb: Any  # the simulated table itself: reads here are the world's, not the product's
    max_attempts: int = 3
    max_claims: int = 3
    # Runs of each job whose handler raised, and runs lost with their invocation (alone: nothing else of that
    # invocation was running).
    failed_runs: Counter[str] = field(default_factory=Counter)
    lost_runs: Counter[str] = field(default_factory=Counter)
    lost_alone: Counter[str] = field(default_factory=Counter)
    # Leases a worker that lived on left behind (it claimed, then a call failed before it could run or release the
    # job): to the product they look like a worker that never came back.
    abandoned: Counter[str] = field(default_factory=Counter)
    commits: Counter[str] = field(default_factory=Counter)
    # Poison messages by workspace: (index of the job after which it was sent, its MessageId).
    poisons: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    # The runs of each job under way: (the process running it, its lease owner).
    runs: dict[str, list[tuple[Process, str]]] = field(default_factory=dict)
    # Each lease taken: its owner → the clock of the process that took it, read as it took it (None: not a process of
    # the world's, e.g. a set-up write).
    takeovers: dict[str, float | None] = field(default_factory=dict)
    moves: frozenset[tuple[str | None, str]] = field(default_factory=allowed_job_moves)
    # The share decisions under way: the actor deciding → the job's key and its record's (attempt, failures, history
    # length) as the decision began; and the actors that wrote that job's record meanwhile.
    deciding: dict[Any, tuple[str, tuple[int, int, int]]] = field(default_factory=dict)
    written_while_deciding: set[Any] = field(default_factory=set)

    def fail(self, message: str) -> None:
        self.violations.append(message)
        raise Violation(message)

    def record(self, pk: str) -> dict[str, Any] | None:
        item = self.dynamodb.peek(self.table_name, {"pk": {"S": pk}})
        return to_item(item) if item else None

    def status(self, pk: str) -> str | None:
        item = self.dynamodb.peek(self.table_name, {"pk": {"S": pk}})
        return None if item is None else str(item.get("status", {}).get("S"))

    def job_status(self, tenant_id: str, job_id: str) -> str | None:
        return self.status(job_key(tenant_id, job_id))

    def poison_status(self, message_id: str) -> str | None:
        return self.status(f"msg#{message_id}")

    # ---- at each effect --------------------------------------------------------------------------------------------

    def on_commit(self, workspace_id: str, job_id: str) -> None:
        self.commits[job_id] += 1
        if self.commits[job_id] > 1:
            self.fail(f"{job_id} took effect twice on {workspace_id}")
        plan = self.workload.plan_of(workspace_id)
        position = next((i for i, job in enumerate(plan.jobs) if job.job_id == job_id), None)
        if position is None:
            self.fail(f"{job_id} took effect on {workspace_id}, which never accepted it")
            return
        if self.workload.never_applies(job_id):
            self.fail(f"{job_id} took effect although it never applies")
        for earlier in plan.jobs[:position]:
            if self.commits[earlier.job_id]:
                continue
            status = self.job_status(plan.tenant_id, earlier.job_id)
            if status != "SKIPPED":
                self.fail(
                    f"{job_id} took effect on {workspace_id} while {earlier.job_id}, accepted before it, is "
                    f"{status or 'unrecorded'} and never took effect"
                )
        for after, message_id in self.poisons.get(workspace_id, []):
            if after < position and self.poison_status(message_id) == "REJECTED":
                self.fail(
                    f"{job_id} took effect on {workspace_id} while the poison message {message_id} ahead of it is "
                    "REJECTED and not resolved"
                )

    # ---- at each run of a job and each write of its record ---------------------------------------------------------

    def run_started(self, lease: Lease, process: Process, now: float) -> None:
        """A job's handler is about to run under `lease`: the lease must be the record's, and no other run of the job
        may be under way in a live invocation."""
        record = self.record(job_key(lease.tenant_id, lease.job_id)) or {}
        if record.get("status") != "IN_FLIGHT" or (
            record.get("leaseOwner") != lease.owner and not self._taken_after_expiry(record, lease)
        ):
            self.fail(f"{lease.job_id} ran without holding its lease (its record is {record.get('status')})")
        for other, _ in self.runs.get(lease.job_id, []):
            if other.dead or (other.deadline is not None and now >= other.deadline):
                continue
            # A lease runs out at its invocation's deadline by its own environment's clock: an environment whose clock
            # is ahead sees it run out early, and takes it over while its invocation still runs (clock skew, which
            # no lease survives; the fencing below keeps the records right, the remote's compare-and-swap the effect).
            if other.deadline is not None and now >= other.deadline - (process.skew - other.skew) - 0.01:
                continue
            self.fail(f"{lease.job_id} ran in two invocations at once ({other.name} and {process.name})")
        self.runs.setdefault(lease.job_id, []).append((process, lease.owner))

    def lease_taken(self, pk: str, owner: str, actor: Any, now: float) -> None:
        """A write gave the job `pk` a new lease owner: remember the clock of the process that wrote it."""
        self.takeovers[owner] = None if actor is None else now + actor.process.skew

    def _taken_after_expiry(self, record: dict[str, Any], lease: Lease) -> bool:
        """The job's lease is another's now, taken over by a process whose own clock read past `lease`'s expiry: a
        process whose clock is ahead takes a lease over while its holder, by its own clock, still has time left (clock
        skew, which no lease survives: fencing keeps the records right, the remote's compare-and-swap the effect)."""
        taken_at = self.takeovers.get(str(record.get("leaseOwner")))
        return taken_at is not None and taken_at * 1000 >= lease.expires_at_ms

    def after_failed_claim(self, tenant_id: str, job_id: str, now: float) -> None:
        """The worker's claim-and-run of a job raised (its process alive): a lease left IN_FLIGHT with no run of the
        job under way is abandoned."""
        record = self.record(job_key(tenant_id, job_id)) or {}
        if record.get("status") != "IN_FLIGHT":
            return
        running = any(not p.dead and (p.deadline is None or now < p.deadline) for p, _ in self.runs.get(job_id, []))
        if not running:
            self.abandoned[job_id] += 1

    def on_stale_write(self, pk: str, owner: str, holder: str | None) -> None:
        """A write made as the holder of a lease changed a job whose lease is another's now: no fencing."""
        self.fail(f"{pk[4:]} was written by a worker whose lease was taken over ({owner[:8]}, now {str(holder)[:8]})")

    def on_kill(self, process: Process) -> None:
        lost = [job_id for job_id, runs in self.runs.items() if any(p is process for p, _ in runs)]
        for job_id in lost:
            self.lost_runs[job_id] += 1
            if len(lost) == 1:
                self.lost_alone[job_id] += 1

    def run_ended(self, lease: Lease, process: Process) -> None:
        runs = self.runs.get(lease.job_id, [])
        if (process, lease.owner) in runs:
            runs.remove((process, lease.owner))

    def on_job_write(
        self, pk: str, old: tuple[str | None, int] | None, new: tuple[str | None, int] | None, writer: Any = None
    ) -> None:
        """A write changed a job record, given as (status, history length) before and after: a change of status, or
        a new history entry, must be a row of the state machine's transition table. `writer`: the actor that made
        the write (None: not one of the world's)."""
        deciding = self.deciding.get(writer) if writer is not None else None
        if deciding is not None and deciding[0] == pk:
            self.written_while_deciding.add(writer)
        if new is None:
            return
        before, length = old if old is not None else (None, 0)
        after, grown = new
        if before == after and grown <= length:
            return
        move = (before, str(after))
        if move not in self.moves:
            self.fail(f"{pk[4:]} went from {move[0]} to {move[1]}, which no transition allows")
        if after == "DEAD" and before != "DEAD":
            self._check_blame(pk)

    def _check_blame(self, pk: str) -> None:
        """A job made DEAD must have earned it: it never applies, its own runs failed max_attempts times, a run of it
        died alone (the near-limit rule), or its claims are used up. Runs it lost only by sharing an invocation that
        another job killed never count: such a job halting its workspace is one tenant's fault halting another's.
        (A lease its worker could not give back, in a DynamoDB outage, looks to the product like a worker that never
        came back; a job with no shared loss is not judged here.)"""
        job_id = pk.split("#", 2)[2]
        if self.workload.never_applies(job_id) or self.failed_runs[job_id] >= self.max_attempts:
            return
        if self.lost_alone[job_id] or self.abandoned[job_id] or not self.lost_runs[job_id]:
            return
        record = self.record(pk) or {}
        if int(record.get("attempt", 0)) >= self.max_claims:
            return
        self.fail(
            f"{job_id} was made DEAD for no fault of its own: {self.failed_runs[job_id]} failed runs, "
            f"{self.lost_runs[job_id]} lost with shared invocations, {record.get('attempt')} claims"
        )

    # ---- at each deferral over a tenant's share -----------------------------------------------------------------

    def _counted(self, pk: str) -> tuple[int, int, int]:
        record = self.record(pk) or {}
        return int(record.get("attempt", 0)), int(record.get("failures", 0)), len(record.get("history", []))

    def deciding_share(self, actor: Any, tenant_id: str, job_id: str) -> None:
        """`actor` is about to decide whether its record of the job runs or waits for the tenant's share."""
        pk = job_key(tenant_id, job_id)
        self.deciding[actor] = (pk, self._counted(pk))
        self.written_while_deciding.discard(actor)

    def share_decided(self, actor: Any, *, deferred: bool) -> None:
        """A deferred record writes nothing to its job: no claim, no attempt, no failure, no history entry (its job
        waits as it was, for the record to come back)."""
        pk, before = self.deciding.pop(actor, ("", (0, 0, 0)))
        wrote = actor in self.written_while_deciding
        self.written_while_deciding.discard(actor)
        if deferred and wrote:
            after = self._counted(pk)
            self.fail(
                f"{pk.split('#', 2)[2]} was deferred over its tenant's share, yet its record was written "
                f"(attempt {before[0]}→{after[0]}, failures {before[1]}→{after[1]}, history {before[2]}→{after[2]})"
            )

    def after_deferrals(
        self, records: list[dict[str, Any]], response: dict[str, Any], deferred: list[tuple[str, str]]
    ) -> int:
        """The batch's answer keeps each deferred group's order: the deferred record and every record after it in its
        group are handed back (reported failed, so the queue keeps them, in order). Returns how many were."""
        if not deferred:
            return 0
        failed = {str(item["itemIdentifier"]) for item in response.get("batchItemFailures", [])}
        handed_back = 0
        for message_id, group in deferred:
            in_group = [r["messageId"] for r in records if r.get("attributes", {}).get("MessageGroupId") == group]
            behind = in_group[in_group.index(message_id) :] if message_id in in_group else [message_id]
            kept = [m for m in behind if m not in failed]
            if kept:
                self.fail(
                    f"{message_id} of {group} was deferred over its tenant's share, but the batch's answer lets the "
                    f"queue delete {', '.join(kept)}: its group's order breaks"
                )
            handed_back += len(behind)
        return handed_back

    # ---- at the end ------------------------------------------------------------------------------------------------

    def check_outcomes(self) -> None:
        """Once the world settled or the bound passed: no job that took effect is recorded as never having done so."""
        for plan in self.workload.workspaces:
            for job in plan.jobs:
                if self.commits[job.job_id] and self.job_status(plan.tenant_id, job.job_id) in ("SKIPPED", "DEAD"):
                    status = self.job_status(plan.tenant_id, job.job_id)
                    self.violations.append(f"{job.job_id} took effect but is recorded {status}")
                    raise Violation(self.violations[-1])

    def unsettled(self) -> list[str]:
        """What is not yet where it must end: empty once the world settled."""
        left: list[str] = []
        for plan in self.workload.workspaces:
            for job in plan.jobs:
                status = self.job_status(plan.tenant_id, job.job_id)
                if self.workload.never_applies(job.job_id):
                    if status != "SKIPPED":
                        left.append(f"{job.job_id} (never applies) is {status}")
                elif self.commits[job.job_id] != 1 or status != "SUCCEEDED":
                    left.append(f"{job.job_id} is {status} with {self.commits[job.job_id]} effects")
            for _, message_id in self.poisons.get(plan.workspace_id, []):
                status = self.poison_status(message_id)
                if status != "SKIPPED":
                    left.append(f"poison {message_id} of {plan.workspace_id} is {status or 'unrecorded'}")
            workspace = self.record(workspace_key(plan.workspace_id)) or {}
            if workspace.get("state") not in (None, "ACTIVE"):
                left.append(f"{plan.workspace_id} is {workspace.get('state')}")
        return left
