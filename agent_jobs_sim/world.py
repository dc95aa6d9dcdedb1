"""One seed's world: simulated SQS, DynamoDB and git remote, the product's own producer, worker, guard, resume and DLQ
tools on them, the actors, the faults, and the oracle. `simulate(seed)` runs it and says what broke, if anything."""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import random
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer

from agent_jobs.guard import JobGuard, Lease
from agent_jobs.keys import job_key
from agent_jobs.payloads import PayloadStore
from agent_jobs.registration import WorkspaceRegistration
from agent_jobs.services import Services
from agent_jobs.tenant_shares import TenantShares
from agent_jobs.workspaces import WorkspaceRegistry
from agent_jobs_sim import actors
from agent_jobs_sim.blueprint import Blueprint, blueprint
from agent_jobs_sim.dynamodb import SimDynamoDB
from agent_jobs_sim.faults import FaultLog, FaultPlan, FaultyClient, RemoteCallFaults
from agent_jobs_sim.oracle import Oracle, Violation
from agent_jobs_sim.planted import PLANTS, swapped
from agent_jobs_sim.remote import BASE, RefStore, SimWorkspaceStore, branch_ref
from agent_jobs_sim.scheduler import Process, Scheduler, SimulationError
from agent_jobs_sim.sqs import SimSQS
from agent_jobs_sim.threads import SimExecutor, SimLock
from agent_jobs_sim.watch import WatchedTable
from agent_jobs_sim.workload import draw_workload
from job_worker.processing import WORKSPACES_HALTED, BatchWorker
from job_worker.worker import batch as worker_batch
from job_worker.worker import running as worker_running
from job_worker.worker.shares import ShareDeferral

START = 1_800_000_000.0  # virtual epoch seconds
FAULT_PHASE_SECONDS = 900.0
LIVENESS_BOUND_SECONDS = 6 * 3600.0
MAX_STEPS = 100_000  # a settled seed takes about 2,000 steps; a world still busy after 50x that is stuck
# Calls after which a message may be deliverable at once.
_SENDS = frozenset(
    {"send_message", "send_message_batch", "change_message_visibility", "change_message_visibility_batch"}
)
REMOTE_URL = "https://git.example.com/agents/repository.git"

# A folder in memory for the git caches where the system has one: the trailer index is a file of each cache.
CACHE_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None

_LOGGER = Logger(service="agent-jobs-sim", level="CRITICAL")
_TRACER = Tracer(disabled=True)


@dataclass(frozen=True)
class SimConfig:
    jobs: int = 50
    workspaces: int = 5
    pollers: int = 3
    # Each tenant's share of the worker's invocations (the template's WorkerTenantShare is 10, more than the pollers:
    # with 1, a tenant whose jobs run in one invocation has its records in the others deferred).
    tenant_share: int = 1
    faults: bool = True
    plant: str | None = None


@dataclass
class SimResult:
    seed: int
    violation: str | None
    steps: int
    virtual_seconds: float
    faults: dict[str, int]
    counts: dict[str, int]
    trace: str

    @property
    def passed(self) -> bool:
        return self.violation is None


class Rngs:
    """One stream per concern, all from the seed: a change in how one concern draws leaves the others' draws alone."""

    def __init__(self, seed: int) -> None:
        root = random.Random(seed)
        self.scheduler, self.faults, self.sqs, self.workload, self.agents, self.operator, self.product = (
            random.Random(root.getrandbits(64)) for _ in range(7)
        )
        self.incidents = random.Random(root.getrandbits(64))
        self.clocks = random.Random(root.getrandbits(64))
        self.visibility = random.Random(root.getrandbits(64))
        self.configuration = random.Random(root.getrandbits(64))
        self.careless = random.Random(root.getrandbits(64))
        self.git = random.Random(root.getrandbits(64))


class SimBatchWorker(BatchWorker):
    """The product's worker; its metric output goes to the world's counters instead of stdout, and the oracle sees
    each run of a job begin and end."""

    counts: collections.Counter[str] | None = None
    world: World | None = None
    # This invocation's records deferred over their tenant's share: (message id, group).
    _sim_deferred: list[tuple[str, str]]

    def handle(self, event: dict[str, Any], context: Any) -> Any:
        self._sim_deferred = []
        response = super().handle(event, context)
        assert self.world is not None
        handed_back = self.world.oracle.after_deferrals(event.get("Records") or [], dict(response), self._sim_deferred)
        if handed_back:
            self.world.counts["deferred_records"] += handed_back
        return response

    def _new_share_gate(self, context: Any) -> Any:
        gate = super()._new_share_gate(context)
        if gate is not None:  # its locks are held across the Query of the running index: a yield point here
            gate = replace(gate, lock_factory=SimLock)
        return gate

    def _defer_over_share(self, record: Any, message: Any) -> None:
        world = self.world
        assert world is not None
        actor = world.scheduler.current
        world.oracle.deciding_share(actor, str(message.tenant_id), message.job_id)
        deferred = False
        try:
            super()._defer_over_share(record, message)
        except ShareDeferral:
            deferred = True
            self._sim_deferred.append((record.message_id, record.attributes.message_group_id or ""))
            raise
        finally:
            world.oracle.share_decided(actor, deferred=deferred)

    def _claim_and_run(self, record: Any, message: Any, context: Any) -> None:
        world = self.world
        assert world is not None
        assert world.scheduler.current is not None
        process, pk = world.scheduler.current.process, job_key(str(message.tenant_id), message.job_id)
        world.oracle.claim_began(process, pk)
        try:
            super()._claim_and_run(record, message, context)
        except Exception:
            world.oracle.after_failed_claim(str(message.tenant_id), message.job_id, world.scheduler.now)
            raise
        finally:
            world.oracle.claim_ended(process, pk)

    def _run_leased(self, lease: Lease, message: Any, context: Any, **kwargs: Any) -> bool:
        world = self.world
        assert world is not None
        assert world.scheduler.current is not None
        process = world.scheduler.current.process
        world.oracle.run_started(lease, process, world.scheduler.now)
        if world.workload.is_killer(lease.job_id):
            world.scheduler.kill_current("killer job")
        try:
            return super()._run_leased(lease, message, context, **kwargs)
        finally:
            world.oracle.run_ended(lease, process)

    def _emit(self, name: str, unit: Any, value: float, *, job_type: str | None = None, **_: Any) -> None:
        if self.counts is not None:
            self.counts[f"metric.{name}"] += 1
        if name == WORKSPACES_HALTED and self.world is not None:
            self.world.alarm()


@dataclass
class World:
    seed: int
    config: SimConfig
    blueprint: Blueprint
    rngs: Rngs
    scheduler: Scheduler
    faults: FaultLog
    sqs: SimSQS
    dynamodb: SimDynamoDB
    services: Services
    refs: RefStore
    oracle: Oracle
    workload: Any
    queue_url: str
    dlq_url: str
    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    calls: collections.Counter[str] = field(default_factory=collections.Counter)
    environments: list[actors.Environment] = field(default_factory=list)
    idle_pollers: set[Any] = field(default_factory=set)
    agent_processes: dict[Process, actors.AgentState] = field(default_factory=dict)
    # Resumes the operator began and must repeat: workspace → (halting job, decision).
    unfinished_resumes: dict[str, tuple[str, Any]] = field(default_factory=dict)
    invocations: int = 0
    request_count: int = 0  # the invocations begun: each one's request id
    operator: Any = None
    # Jobs a careless agent put off or gave up after a failed submission, and those of them whose message the queue
    # dead-lettered (the combination the world must reach in some seeds).
    put_off_jobs: set[str] = field(default_factory=set)
    dead_lettered_put_off: set[str] = field(default_factory=set)
    # Where the environments' git caches live (each its own folder, as each has its own /tmp); removed with the world.
    cache_root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="agent-jobs-sim-", dir=CACHE_DIR)))
    # The other writers of the git remote (`after_job_commit`): never killed.
    other_writers: Process = field(default_factory=lambda: Process("other-writers"))
    _environment_count: int = 0
    _other_pushes: int = 0

    def new_environment(self) -> actors.Environment:
        self._environment_count += 1
        worker = SimBatchWorker(
            services=self.services,
            workspaces=SimWorkspaceStore(
                self.refs,
                {plan.workspace_id: plan.tenant_id for plan in self.workload.workspaces},
                cache_root=self.cache_root / f"env-{self._environment_count}",
                clock=self.scheduler.local_clock,
            ),
            logger=_LOGGER,
            metrics=Metrics(namespace="AgentJobsSim"),
            tracer=_TRACER,
            jitter=lambda bound: self.rngs.product.uniform(bound / 2, bound),
        )
        worker.counts = self.counts
        worker.world = self
        self.counts["cold_starts"] += 1
        skew = self.rngs.clocks.uniform(-1.0, 1.0) * self.faults.plan.clock_skew
        return actors.Environment(Process(f"env-{self._environment_count}", skew=skew), worker)

    def accepted(self, *, created: bool) -> None:
        self.counts["accepted" if created else "repeats_answered"] += 1

    def after_job_commit(self, workspace_id: str) -> None:
        """Another writer may answer a job's push a few seconds later with commits of its own: on the branch (a bot),
        or on the base (someone merging into it)."""
        faults = self.faults
        if not faults.git_happens("other_writers", faults.plan.other_writers):
            return
        rng = faults.git_rng
        ref = BASE if rng.random() < 0.25 else branch_ref(workspace_id)
        count = rng.choice((1, 1, 2, 3, 9))
        self._other_pushes += 1
        self.scheduler.spawn(
            f"other-writer-{self._other_pushes}",
            lambda: self.refs.push_others(ref, count, self.scheduler.now),
            self.other_writers,
            delay=rng.uniform(0.5, 30.0),
        )

    def wake_pollers(self) -> None:
        """A message may be deliverable now: one idle poller's long poll answers (the first by name)."""
        if self.idle_pollers:
            poller = min(self.idle_pollers, key=lambda actor: actor.name)
            poller.wake_at = min(poller.wake_at, self.scheduler.now)

    def alarm(self) -> None:
        """An alarm the operator watches fired (a workspace halted, the DLQ holds messages): it looks within a
        minute, as an alarm's evaluation period allows."""
        if self.operator is not None and not self.operator.done:
            self.operator.wake_at = min(self.operator.wake_at, self.scheduler.now + 60.0)

    def count_dead_lettered_put_off(self) -> None:
        """Count each job put off or given up whose message reached the DLQ (`careless_dead_lettered`)."""
        waiting = self.put_off_jobs - self.dead_lettered_put_off
        if not waiting:
            return
        for message in self.sqs.messages(self.dlq_url):
            body = str(message.get("Body", ""))
            for job_id in sorted(waiting):
                if f'"{job_id}"' in body and job_id not in self.dead_lettered_put_off:
                    self.dead_lettered_put_off.add(job_id)
                    self.faults.counts["careless_dead_lettered"] += 1

    def holds_messages(self, url: str) -> bool:
        names = [
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ]
        counts = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
        return any(int(value) for value in counts.values())

    def finished(self) -> bool:
        if any(not state.done for state in self.agent_processes.values()) or self.invocations:
            return False
        if self.holds_messages(self.queue_url) or self.holds_messages(self.dlq_url):
            return False
        return not self.oracle.unsettled()

    def unfinished(self) -> list[str]:
        """Why the world is not finished: the oracle's unsettled jobs, agents still submitting, invocations under way
        and messages left on the queues."""
        left = self.oracle.unsettled()
        agents = sorted(process.name for process, state in self.agent_processes.items() if not state.done)
        if agents:
            left.append(f"agents still submitting: {', '.join(agents)}")
        if self.invocations:
            left.append(f"{self.invocations} invocations under way")
        for name, url in (("queue", self.queue_url), ("DLQ", self.dlq_url)):
            if self.holds_messages(url):
                kept = [str(m.get("Body", ""))[:80] for m in self.sqs.messages(url)]
                left.append(f"the {name} holds {len(kept)} messages: {'; '.join(kept[:3])}")
        return left


def build_world(seed: int, config: SimConfig) -> World:
    plan_of = blueprint()
    rngs = Rngs(seed)
    scheduler = Scheduler(rngs.scheduler, start=START)
    plan = (
        FaultPlan.draw(rngs.faults, start=START, quiet_after=START + FAULT_PHASE_SECONDS)
        if config.faults
        else FaultPlan.calm()
    )
    if config.faults:
        plan.draw_failing_deployment(
            rngs.incidents, start=START, dead_letter_seconds=plan_of.max_receive_count * _visibility_seconds(plan_of)
        )
        plan.draw_clock_faults(rngs.clocks)
        plan.draw_short_visibility(rngs.configuration, timeout_seconds=plan_of.timeout_seconds)
        plan.draw_careless_agents(rngs.careless)
        plan.draw_git_faults(rngs.git)
    faults = FaultLog(
        plan, rngs.faults, scheduler, incident_rng=rngs.visibility, careless_rng=rngs.careless, git_rng=rngs.git
    )
    sqs = SimSQS(scheduler.clock, rngs.sqs)
    # botocore checks each request against its model, as a real client does; the differential tests keep that on.
    dynamodb = SimDynamoDB(scheduler.clock, index_lag=faults.index_lag, check_parameters=False)
    dlq_url = sqs.create_queue(QueueName=plan_of.dlq_name, Attributes=plan_of.dlq_attributes)["QueueUrl"]
    queue_url = sqs.create_queue(QueueName=plan_of.queue_name, Attributes=plan_of.queue_attributes)["QueueUrl"]
    dynamodb.create_table(**plan_of.table_kwargs)
    workload = draw_workload(
        rngs.workload,
        jobs=config.jobs,
        workspaces=config.workspaces,
        bad_rate=plan.bad_patch,
        poison_rate=plan.poison,
        killer_rate=plan.killer,
    )
    oracle = Oracle(
        workload,
        plan_of.table_name,
        dynamodb,
        max_attempts=plan_of.settings.max_attempts,
        max_claims=plan_of.settings.max_claims,
    )
    registry = WorkspaceRegistry(dynamodb, plan_of.table_name, clock=lambda: int(scheduler.now * 1000))  # type: ignore[arg-type]
    for workspace in workload.workspaces:
        registration = WorkspaceRegistration(remote_url=REMOTE_URL, branch=f"agent/{workspace.workspace_id}")
        registry.register(workspace.workspace_id, registration, workspace.tenant_id)
    calls: collections.Counter[str] = collections.Counter()
    plant = PLANTS[config.plant] if config.plant else None
    watched = WatchedTable(
        dynamodb,
        plan_of.table_name,
        on_job_write=lambda pk, old, new: oracle.on_job_write(pk, old, new, writer=scheduler.current),
        rewrite=plant.rewrite if plant is not None else None,
        on_stale_write=oracle.on_stale_write,
        on_lease_taken=lambda pk, owner: oracle.lease_taken(pk, owner, scheduler.current, scheduler.now),
        on_place_write=oracle.on_place_write,
    )
    product_dynamodb: Any = FaultyClient(watched, "dynamodb", faults, calls=calls)
    woken: list[World] = []  # the world, once built: a send wakes its idle pollers (a long poll answers at once), a
    # job's commit may draw other writers' commits
    product_sqs: Any = FaultyClient(
        sqs,
        "sqs",
        faults,
        calls=calls,
        after=lambda name: woken[0].wake_pollers() if woken and name in _SENDS else None,
    )
    settings = plan_of.settings.model_copy(
        update={"queue_url": queue_url, "table_name": plan_of.table_name, "tenant_share": config.tenant_share}
    )
    guard = JobGuard(
        product_dynamodb,
        settings.table_name,
        max_attempts=settings.max_attempts,
        max_claims=settings.max_claims,
        ttl_days=settings.job_ttl_days,
        clock=lambda: int(scheduler.local_clock() * 1000),  # each environment's own clock, skewed
    )
    services = Services(
        settings=settings,
        dynamodb=product_dynamodb,
        sqs=product_sqs,
        guard=guard,
        payloads=PayloadStore(None, lambda: None),  # type: ignore[arg-type, return-value]
        sandbox_lambda=lambda: None,  # type: ignore[arg-type, return-value]
        # Its overrides cached by the virtual clock (no tenant of the workload has one: each has the default). With the
        # share off the worker has none at all, and makes no call for it: the world of the seeds found before shares.
        tenant_shares=(
            TenantShares(product_dynamodb, settings.table_name, settings.tenant_share, clock=scheduler.clock)
            if config.tenant_share
            else None
        ),
    )
    counts: collections.Counter[str] = collections.Counter()

    def on_commit(workspace_id: str, job_id: str) -> None:
        oracle.on_commit(workspace_id, job_id)
        woken[0].after_job_commit(workspace_id)

    refs = RefStore(
        RemoteCallFaults(faults),
        on_commit=on_commit,
        refuses=workload.is_bad,
        on_broken_lookup=oracle.broken_lookup,
        counts=counts,
        start=START,
    )
    world = World(
        seed=seed,
        config=config,
        blueprint=plan_of,
        rngs=rngs,
        scheduler=scheduler,
        faults=faults,
        sqs=sqs,
        dynamodb=dynamodb,
        services=services,
        refs=refs,
        oracle=oracle,
        workload=workload,
        queue_url=queue_url,
        dlq_url=dlq_url,
        calls=calls,
        counts=counts,
    )
    woken.append(world)
    scheduler.timers += [sqs.next_timer, dynamodb.next_index_update]
    faults.mortal = lambda actor: actor.process.name.startswith(("env-", "agent-"))
    scheduler.choose_kill = faults.choose_kill
    scheduler.on_kill = lambda process, cause: _on_kill(world, process, cause)
    platform = Process("platform")
    for plan_ in workload.workspaces:
        actors.spawn_agent(world, actors.AgentState(plan_))
    for index in range(config.pollers):
        scheduler.spawn(f"poller-{index}", functools.partial(actors.run_poller, world, index), platform)
    world.operator = scheduler.spawn("operator", lambda: actors.run_operator(world), platform)
    return world


def _on_kill(world: World, process: Process, cause: str) -> None:
    world.counts[f"killed_{cause.replace(' ', '_')}"] += 1
    world.oracle.on_kill(process)
    if process.name.startswith("agent-"):
        actors.restart_agent(world, process, world.rngs.agents)


@contextlib.contextmanager
def _product_patched(world: World) -> Iterator[None]:
    """What the product takes from the OS, taken from the seed (its random tokens: lease owners, resume ids; its group
    threads), the oracle's count of failed runs, and the planted bug of the run, if any."""
    original_run_job = getattr(worker_running, "run_job")  # noqa: B009 - the name the worker calls, swapped below

    def run_job(job: Any, context: Any) -> Any:
        duration = world.faults.slow_job(world.blueprint.timeout_seconds)
        if duration:  # a large repository, a slow remote: the job takes a good part of the invocation's time
            world.scheduler.sleep(duration)
        try:
            return original_run_job(job, context)
        except Exception:
            world.oracle.failed_runs[job.job_id] += 1
            raise

    def token_hex(nbytes: int | None = None) -> str:
        size = nbytes or 32
        return world.rngs.product.getrandbits(8 * size).to_bytes(size, "big").hex()

    plant = PLANTS[world.config.plant] if world.config.plant else None
    SimExecutor.scheduler = world.scheduler
    try:
        with contextlib.ExitStack() as patches:
            patches.enter_context(swapped(secrets, "token_hex", token_hex))
            patches.enter_context(swapped(worker_batch, "ThreadPoolExecutor", SimExecutor))
            patches.enter_context(swapped(worker_running, "run_job", run_job))
            if plant is not None:
                patches.enter_context(plant.patch())
            yield
    finally:
        SimExecutor.scheduler = None


def _visibility_seconds(blueprint: Blueprint) -> float:
    return float(blueprint.queue_attributes.get("VisibilityTimeout", blueprint.timeout_seconds))


def liveness_bound(world: World) -> float:
    """How long after faults stop the world has to settle: LIVENESS_BOUND_SECONDS, plus, for the workspace with the
    most jobs that kill every invocation running them, the time the product takes to give each up: a killer is
    claimed up to max_claims times, one visibility timeout apart, before it is DEAD (its workspace's jobs wait
    behind it, one killer after another)."""
    blueprint = world.blueprint
    visibility = _visibility_seconds(blueprint)
    killers = max((len(plan.killers) for plan in world.workload.workspaces), default=0)
    return LIVENESS_BOUND_SECONDS + killers * (blueprint.settings.max_claims + 1) * visibility


def simulate(seed: int, config: SimConfig | None = None) -> SimResult:
    config = config or SimConfig()
    world = build_world(seed, config)
    violation: str | None = None
    bound = liveness_bound(world)
    with _product_patched(world):
        try:
            settled = world.scheduler.run(
                finished=world.finished, until=world.faults.plan.quiet_after + bound, max_steps=MAX_STEPS
            )
            world.oracle.check_outcomes()
            if not settled:
                left = world.unfinished()
                violation = f"not settled {bound:.0f} s after faults stopped: {'; '.join(left[:5])}"
        except Violation as error:
            violation = str(error)
        except SimulationError as error:
            cause = error.__cause__
            violation = str(cause) if isinstance(cause, Violation) else f"the world broke: {error}"
        finally:
            world.scheduler.close()
            shutil.rmtree(world.cache_root, ignore_errors=True)
    if world.oracle.answered_out_of_order:
        world.counts["answered_out_of_order"] = world.oracle.answered_out_of_order
    trace = world.scheduler.trace
    trace.update(repr((sorted(world.calls.items()), violation)).encode())
    return SimResult(
        seed=seed,
        violation=violation,
        steps=world.scheduler.steps,
        virtual_seconds=world.scheduler.now - START,
        faults=dict(world.faults.counts),
        counts=dict(world.counts),
        trace=trace.hexdigest(),
    )
