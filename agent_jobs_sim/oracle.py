"""The invariants, checked from the simulated branches, the job records and the queues, never through the product.

At each commit on a workspace's branch (the effect of a job): it is the job's first; every job its workspace
accepted earlier has taken effect or was skipped by an operator (so the branch's order is the acceptance order and
nothing lands behind a DEAD job); no poison message recorded REJECTED ahead of it is still unresolved. At the end: every
job took effect once or, when its patch could never apply, is SKIPPED with its reason; every poison message is on
record; and all of it settled within the bound once faults stopped (liveness). At each record deferred over its
tenant's share: nothing was written to its job (no claim, attempt, failure or history entry), and the batch's answer
hands it back with every record behind it in its group (the group's order). At each lookup of a job's commit on a
worker's git cache: it answers (the commit, or none) or asks for a retry, and never fails on a gap in the cache's
history.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from agent_jobs.core.transitions import JOB_TRANSITIONS
from agent_jobs.guard import Lease
from agent_jobs.keys import job_key, workspace_key
from agent_jobs.store.codec import to_item
from agent_jobs_sim.scheduler import Process
from agent_jobs_sim.workload import Workload, WorkspacePlan


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
    # Poison messages by workspace: (the moment it was sent, its MessageId).
    poisons: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    # The world's order of submissions, answers, poison sends and effects (`_tick`): each job's first submission, its
    # first answer (the moment, its place), the jobs of each workspace in the order they took effect, and the jobs
    # their agents gave up after a failed submission.
    ticks: int = 0
    first_submitted: dict[str, int] = field(default_factory=dict)
    answers: dict[str, tuple[int, str]] = field(default_factory=dict)
    effects: dict[str, list[str]] = field(default_factory=dict)
    given_up: set[str] = field(default_factory=set)
    # Jobs answered with a place earlier than one answered before them in their workspace (a retry within the
    # deduplication window of a send that went through): the order of answers is not the order of places.
    answered_out_of_order: int = 0
    violations: list[str] = field(default_factory=list)
    # The runs of each job under way: (the process running it, its lease owner).
    runs: dict[str, list[tuple[Process, str]]] = field(default_factory=dict)
    # Each lease taken: its owner → the clock of the process that took it, read as it took it (None: not a process of
    # the world's, e.g. a set-up write).
    takeovers: dict[str, float | None] = field(default_factory=dict)
    # Each lease a process of the world took: its owner → that process; and the claims each process has under way
    # (claimed, or about to be: the job's key), until its claim-and-run returns.
    lease_takers: dict[str, Process] = field(default_factory=dict)
    claiming: dict[Process, list[str]] = field(default_factory=dict)
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

    # ---- what the agents were told ------------------------------------------------------------------------------

    def _tick(self) -> int:
        """The next moment in the world's order of submissions, answers, poison sends and effects."""
        self.ticks += 1
        return self.ticks

    def submitted(self, job_id: str) -> None:
        """An agent is about to submit the job (again, or for the first time)."""
        self.first_submitted.setdefault(job_id, self._tick())

    def answered(self, workspace_id: str, job_id: str, sequence_number: str | None) -> None:
        """The producer answered the job's submission (a 202, or the answer to a repeat) with this place: it never
        changes once answered, and it orders the job among the other answered jobs of its workspace."""
        if not sequence_number or not sequence_number.isdigit():
            self.fail(f"{job_id} was answered without a place in its workspace's order ({sequence_number!r})")
        first = self.answers.get(job_id)
        if first is None:
            if any(self._later_answered(workspace_id, str(sequence_number))):
                self.answered_out_of_order += 1
            self.answers[job_id] = (self._tick(), str(sequence_number))
            self._check_effect_order(workspace_id)
        elif first[1] != sequence_number:
            self.fail(f"{job_id} was answered with place {first[1]}, then with {sequence_number}")

    def _later_answered(self, workspace_id: str, sequence_number: str) -> Iterator[str]:
        """The jobs of the workspace answered before with a place later than `sequence_number`."""
        for job in self.workload.plan_of(workspace_id).jobs:
            answer = self.answers.get(job.job_id)
            if answer is not None and int(answer[1]) > int(sequence_number):
                yield job.job_id

    def poison_sent(self, workspace_id: str, message_id: str) -> None:
        self.poisons.setdefault(workspace_id, []).append((self._tick(), message_id))

    # ---- at each effect --------------------------------------------------------------------------------------------

    def on_commit(self, workspace_id: str, job_id: str) -> None:
        self.commits[job_id] += 1
        if self.commits[job_id] > 1:
            self.fail(f"{job_id} took effect twice on {workspace_id}")
        plan = self.workload.plan_of(workspace_id)
        if not any(job.job_id == job_id for job in plan.jobs):
            self.fail(f"{job_id} took effect on {workspace_id}, which never accepted it")
            return
        self.effects.setdefault(workspace_id, []).append(job_id)
        if self.workload.never_applies(job_id):
            self.fail(f"{job_id} took effect although it never applies")
        # Its agent submitted it first after these were answered: each of them takes effect before it, or was skipped
        # (an operator's decision, for a job that never applies; nothing lands behind a DEAD or REJECTED job).
        submitted = self.first_submitted.get(job_id, self.ticks)
        for earlier in plan.jobs:
            answer = self.answers.get(earlier.job_id)
            if earlier.job_id == job_id or answer is None or answer[0] > submitted or self.commits[earlier.job_id]:
                continue
            status = self.job_status(plan.tenant_id, earlier.job_id)
            if status != "SKIPPED":
                self.fail(
                    f"{job_id} took effect on {workspace_id} while {earlier.job_id}, accepted before it, is "
                    f"{status or 'unrecorded'} and never took effect"
                )
        for sent, message_id in self.poisons.get(workspace_id, []):
            if sent < submitted and self.poison_status(message_id) == "REJECTED":
                self.fail(
                    f"{job_id} took effect on {workspace_id} while the poison message {message_id} ahead of it is "
                    "REJECTED and not resolved"
                )
        self._check_effect_order(workspace_id)

    def _check_effect_order(self, workspace_id: str) -> None:
        """The answered jobs of the workspace that took effect did so in the order of their answers' places."""
        effects = self.effects.get(workspace_id, [])
        placed = [(job_id, self.answers[job_id][1]) for job_id in effects if job_id in self.answers]
        for (before, place), (after, later) in itertools.pairwise(placed):
            if int(place) >= int(later):
                self.fail(
                    f"{after} took effect on {workspace_id} after {before}, but was answered with an earlier place "
                    f"({later} < {place})"
                )

    def broken_lookup(self, workspace_id: str, job_id: str, error: Exception) -> None:
        """A lookup of a job's commit answers it, answers none, or asks for a retry (the branch was rewritten): an
        error of its own is a cache whose history has a gap, where every job of the workspace would fail alike."""
        self.fail(f"the lookup of {job_id} on {workspace_id} failed: {error!r}")

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
        if actor is not None:
            self.lease_takers[owner] = actor.process

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

    def claim_began(self, process: Process, pk: str) -> None:
        self.claiming.setdefault(process, []).append(pk)

    def claim_ended(self, process: Process, pk: str) -> None:
        under_way = self.claiming.get(process, [])
        if pk in under_way:
            under_way.remove(pk)

    def on_kill(self, process: Process) -> None:
        """The jobs the process was running die with it, and so do those it had claimed and not run yet (a timeout
        between a claim and its run): to the product each is a claim that never came back, alone or not."""
        lost = [job_id for job_id, runs in self.runs.items() if any(p is process for p, _ in runs)]
        for pk in self.claiming.pop(process, []):
            record = self.record(pk) or {}
            job_id = pk.split("#", 2)[2]
            taker = self.lease_takers.get(str(record.get("leaseOwner")))
            if record.get("status") == "IN_FLIGHT" and taker is process and job_id not in lost:
                lost.append(job_id)
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

    def on_place_write(self, pk: str, old: str | None, new: str | None) -> None:
        """A write left a job record's place (`sequenceNumber`) `new`, where it was `old`: a place once recorded never
        moves (the producer's answer names it, and the job takes effect there)."""
        if old is not None and new != old:
            self.fail(f"{pk.split('#', 2)[2]} was placed at {old} in its queue, then moved to {new}")

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
        """Once the world settled or the bound passed: no job that took effect is recorded as never having done so,
        and each answered job's record holds the place its answers named."""
        for plan in self.workload.workspaces:
            for job in plan.jobs:
                status = self.job_status(plan.tenant_id, job.job_id)
                if self.commits[job.job_id] and status in ("SKIPPED", "DEAD"):
                    self.violations.append(f"{job.job_id} took effect but is recorded {status}")
                    raise Violation(self.violations[-1])
                answer = self.answers.get(job.job_id)
                place = (self.record(job_key(plan.tenant_id, job.job_id)) or {}).get("sequenceNumber")
                if answer is not None and place != answer[1]:
                    self.violations.append(
                        f"{job.job_id} was answered with place {answer[1]} but is recorded at {place}"
                    )
                    raise Violation(self.violations[-1])

    def unsettled(self) -> list[str]:
        """What is not yet where it must end: empty once the world settled. A job its agent gave up (never answered)
        may end without a record, or with one its send never reached the queue for (QUEUED, unplaced), or skipped by
        an operator: its workspace's later jobs halted on it, and the operator dropped it."""
        left: list[str] = []
        for plan in self.workload.workspaces:
            for job in plan.jobs:
                status = self.job_status(plan.tenant_id, job.job_id)
                if job.job_id in self.given_up and job.job_id not in self.answers and self._dropped(plan, job.job_id):
                    continue
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

    def _dropped(self, plan: WorkspacePlan, job_id: str) -> bool:
        """A job given up by its agent ended as one may: never recorded, recorded but never placed (no message of it
        reached the queue), or skipped, with no effect."""
        if self.commits[job_id]:
            return False
        record = self.record(job_key(plan.tenant_id, job_id))
        if record is None or record.get("status") == "SKIPPED":
            return True
        return record.get("status") == "QUEUED" and not record.get("sequenceNumber")
