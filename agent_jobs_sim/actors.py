"""The actors of a world: agents submitting through the product's producer, Lambda's event source mapping invoking the
product's worker in execution environments that may die, and an operator redriving the DLQ and resuming halted
workspaces with the product's own tools."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from agent_jobs.keys import workspace_group_id
from agent_jobs.models import ResumeDecision
from agent_jobs.producer.single import enqueue_job
from agent_jobs.resume import resume_workspace
from agent_jobs_cli.deadletters import DeadLetterQueue, registered_owners
from agent_jobs_local.event_source import lambda_sqs_record
from agent_jobs_sim.scheduler import Actor, Process

if TYPE_CHECKING:
    from agent_jobs_sim.workload import WorkspacePlan
    from agent_jobs_sim.world import World


@dataclass
class SimLambdaContext:
    """The Lambda context the worker reads: the time left comes from the virtual clock, and each invocation has its
    own request id (the worker counts a tenant's invocations by it, for the tenant's share)."""

    clock: Callable[[], float]
    deadline: float
    aws_request_id: str
    function_name: str = "sim-JobWorkerFunction"
    function_version: str = "$LATEST"
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:sim-JobWorkerFunction"
    memory_limit_in_mb: int = 1024
    log_group_name: str = "/aws/lambda/sim"
    log_stream_name: str = "sim"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.deadline - self.clock()) * 1000))


# ---- agents --------------------------------------------------------------------------------------------------------


# How long a careless agent puts a failed job off: "soon" is within SQS's 5-minute deduplication window (a send then
# is answered with the first message, if there was one), "late" after it (a send then is a second message).
PUT_OFF_SECONDS = {"soon": (5.0, 240.0), "late": (330.0, 1200.0)}


@dataclass
class AgentState:
    """What an agent keeps across its own crashes: the next job to submit (it submits one at a time, in order, and
    repeats a job until it has the answer, unless it is careless: then it may put a failed job off and move on, or
    give it up), the jobs it put off (when each is due, its index), the jobs it gave up and those it has answers
    for."""

    plan: WorkspacePlan
    next_job: int = 0
    poisons_sent: set[int] = field(default_factory=set)
    restarts: int = 0
    put_off: list[tuple[float, int]] = field(default_factory=list)
    given_up: set[int] = field(default_factory=set)
    answered: set[int] = field(default_factory=set)

    @property
    def done(self) -> bool:
        return self.next_job >= len(self.plan.jobs) and not self.put_off

    def due(self, now: float) -> tuple[float, int] | None:
        """The job put off that is due first, if it is due now (or the plan has no job left to submit first)."""
        if not self.put_off:
            return None
        first = min(self.put_off)
        return first if first[0] <= now or self.next_job >= len(self.plan.jobs) else None


def run_agent(world: World, state: AgentState) -> None:
    services, scheduler, rng = world.services, world.scheduler, world.rngs.agents
    plan = state.plan
    while not state.done:
        retry = state.due(scheduler.now)
        if retry is not None and retry[0] > scheduler.now:
            scheduler.sleep(retry[0] - scheduler.now)
            continue
        index = state.next_job if retry is None else retry[1]
        job = plan.jobs[index]
        world.oracle.submitted(job.job_id)
        try:
            result = enqueue_job(
                job, plan.tenant_id, guard=services.guard, sqs=services.sqs, queue_url=services.settings.queue_url
            )
        except (ClientError, BotoCoreError):  # throttled, a 5xx, a lost answer: the same job again, after a pause
            world.counts["agent_retries"] += 1
            if _moved_on(world, state, index, retry):
                continue
            scheduler.sleep(rng.uniform(0.1, 3.0))
            continue
        world.oracle.answered(plan.workspace_id, job.job_id, result.sequence_number)
        world.accepted(created=result.created)
        state.answered.add(index)
        if retry is not None:
            state.put_off.remove(retry)
        if index in plan.poison_after and index not in state.poisons_sent:
            _send_poison(world, plan, index)
            state.poisons_sent.add(index)
        if state.next_job > 0 and world.faults.happens("duplicate_send", world.faults.plan.duplicate_send):
            _repeat_a_job(world, state, rng.randrange(state.next_job + 1))
        if retry is None:
            state.next_job += 1
        scheduler.sleep(rng.uniform(0.0, 2.0))


def _moved_on(world: World, state: AgentState, index: int, retry: tuple[float, int] | None) -> bool:
    """A careless agent, after a failed submission, may put the job off or give it up, and go on with its next job;
    it keeps what it decided across its crashes (it may still retry a job whose retry a crash interrupted)."""
    choice = world.faults.put_off()
    if choice is None:
        return False
    world.put_off_jobs.add(state.plan.jobs[index].job_id)
    if retry is not None:
        state.put_off.remove(retry)
    else:
        state.next_job += 1
    if choice == "never":
        state.given_up.add(index)
        world.oracle.given_up.add(state.plan.jobs[index].job_id)
        return True
    low, high = PUT_OFF_SECONDS[choice]
    state.put_off.append((world.scheduler.now + world.faults.careless_rng.uniform(low, high), index))
    return True


def _send_poison(world: World, plan: WorkspacePlan, after: int) -> None:
    """A message no job model accepts, in the workspace's own group (a broken sender writing to the queue)."""
    world.faults.counts["poison"] += 1
    answer = world.sqs.send_message(
        QueueUrl=world.services.settings.queue_url,
        MessageBody=f"not a job {after} of {plan.workspace_id}",
        MessageGroupId=workspace_group_id(plan.workspace_id),
        MessageDeduplicationId=f"poison-{plan.workspace_id}-{after}",
    )
    world.oracle.poison_sent(plan.workspace_id, answer["MessageId"])
    world.wake_pollers()


def _repeat_a_job(world: World, state: AgentState, index: int) -> None:
    """An agent that lost track submits a job it already had the answer for: the product must answer it as a repeat
    (a job accepted twice would run twice), at the place it answered the first time."""
    if index not in state.answered:  # put off or given up: not a repeat
        return
    plan = state.plan
    job = plan.jobs[index]
    try:
        result = enqueue_job(
            job, plan.tenant_id, guard=world.services.guard, sqs=world.services.sqs, queue_url=world.queue_url
        )
    except (ClientError, BotoCoreError):  # throttled, a 5xx, a lost answer: the agent lets it be
        return
    if result.created:
        world.oracle.fail(f"{job.job_id} was accepted again when its agent submitted it a second time")
    world.oracle.answered(plan.workspace_id, job.job_id, result.sequence_number)
    world.accepted(created=False)


# ---- the event source mapping --------------------------------------------------------------------------------------


@dataclass(eq=False)
class Environment:
    process: Process
    worker: Any


def run_poller(world: World, index: int) -> None:
    """One of the mapping's concurrent pollers: receive a batch, invoke the worker in an environment, delete what the
    response does not report failed. A dead invocation deletes nothing."""
    scheduler, sqs, blueprint = world.scheduler, world.sqs, world.blueprint
    while True:
        scheduler.pause()
        messages = sqs.receive_message(
            QueueUrl=world.queue_url,
            MaxNumberOfMessages=blueprint.batch_size,
            MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"],
        ).get("Messages", [])
        if world.holds_messages(world.dlq_url):  # the receive may have moved messages there: the DLQ alarm
            world.alarm()
            world.count_dead_lettered_put_off()
        for message in messages:
            early = world.faults.visible_early()
            if early is None:
                early = world.faults.visibility_cut_short()
            if early is not None:  # it comes back while this invocation may still run it
                sqs.change_message_visibility(
                    QueueUrl=world.queue_url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=int(early)
                )
        if not messages:
            world.idle_pollers.add(scheduler.current)
            wake = sqs.next_timer()
            # A long poll that a send ends at once (`World.wake_pollers`), or a message becoming visible.
            scheduler.sleep(max(0.05, wake - scheduler.now) if wake is not None else 3600.0)
            world.idle_pollers.discard(scheduler.current)
            continue
        _invoke(world, index, messages)


def _invoke(world: World, index: int, messages: list[dict[str, Any]]) -> None:
    scheduler = world.scheduler
    environment = world.environments.pop() if world.environments else world.new_environment()
    deadline = scheduler.now + world.blueprint.timeout_seconds
    environment.process.deadline = deadline
    event = {
        "Records": [lambda_sqs_record(m, queue_arn=world.blueprint.queue_arn, region="us-east-1") for m in messages]  # type: ignore[arg-type]
    }
    outcome: dict[str, Any] = {}
    world.request_count += 1  # in the seed's order of invocations, so a replay names them alike
    context = SimLambdaContext(scheduler.clock, deadline, aws_request_id=f"sim-request-{world.request_count:06d}")

    def invocation() -> None:
        try:
            if world.faults.failing_invocation():
                raise RuntimeError("Runtime.ImportModuleError: the deployment cannot start")
            outcome["response"] = environment.worker.handle(event, context)
        except Exception as error:  # a function error: Lambda deletes nothing
            outcome["error"] = error
            world.counts["function_errors"] += 1
        scheduler.pause()  # the process may still die before Lambda has its answer

    actor = scheduler.spawn(f"invocation-{index}", invocation, environment.process)
    world.invocations += 1
    scheduler.join(actor)
    world.invocations -= 1
    environment.worker.metrics.clear_metrics()  # the worker's shared metric set, flushed by Lambda's wrapper
    if environment.process.dead:
        return  # its records come back when their visibility ends
    environment.process.deadline = None
    world.environments.append(environment)
    response = outcome.get("response")
    if response is None:
        return
    failed = {item["itemIdentifier"] for item in response.get("batchItemFailures", [])}
    for record in event["Records"]:
        if record["messageId"] in failed:
            continue
        if world.faults.happens("lost_delete", world.faults.plan.lost_delete):
            continue  # the delete never reached the queue: the message is delivered again
        try:
            world.sqs.delete_message(QueueUrl=world.queue_url, ReceiptHandle=record["receiptHandle"])
        except ClientError:  # its receipt handle expired (the batch outlived its visibility): delivered again
            world.counts["deletes_refused"] += 1
    world.wake_pollers()  # the next message of a group may be deliverable now


# ---- the operator --------------------------------------------------------------------------------------------------


def run_operator(world: World) -> None:
    """When an alarm fires (a workspace halted, the DLQ holds messages; `World.alarm`), and every quarter hour anyway,
    as an operator would from the CLI: redrive the DLQ when it holds messages (park its jobs, halting their
    workspaces), and resume each workspace the halted list shows (and any resume whose call failed), skipping what can
    never apply (a refused patch, a poison message) and retrying everything else. While work is left it looks again
    within two minutes."""
    scheduler, rng = world.scheduler, world.rngs.operator
    tenants = sorted({plan.tenant_id for plan in world.workload.workspaces})
    busy = False
    while True:
        scheduler.sleep(rng.uniform(30.0, 120.0) if busy else rng.uniform(600.0, 900.0))
        try:
            _redrive(world)
            halted = {
                str(item["workspaceId"])
                for tenant in tenants
                for item in world.services.guard.list_halted(tenant).workspaces
            }
            for plan in world.workload.workspaces:
                if plan.workspace_id in halted or plan.workspace_id in world.unfinished_resumes:
                    _resume(world, plan)
        except (
            ClientError,
            BotoCoreError,
        ):  # its tools failed this round (throttled, a 5xx): the next round tries again
            world.counts["operator_retries"] += 1


def _redrive(world: World) -> None:
    queue = DeadLetterQueue(world.services.sqs, world.dlq_url, hold_seconds=60, final_wait_seconds=0)
    if not queue.approximate_depth():
        return
    results = queue.redrive(
        world.services.guard,
        select_workspace=lambda workspace_id: True,
        owner_of=registered_owners(world.services.dynamodb, world.blueprint.table_name),
        max_receive_count=world.blueprint.max_receive_count,
    )
    world.counts["redriven"] += len(results)


def _resume(world: World, plan: WorkspacePlan) -> None:
    """Resume a HALTED workspace; and repeat a resume whose call failed (its workspace may be RESUMING without a drain
    marker sent), as the product asks of an operator whose command failed."""
    guard = world.services.guard
    workspace = guard.get_workspace(plan.workspace_id)
    state = None if workspace is None else workspace.get("state")
    unfinished = world.unfinished_resumes.get(plan.workspace_id)
    if state == "HALTED" and (unfinished is None or workspace.get("haltingJobId") != unfinished[0]):  # type: ignore[union-attr]
        halting = str(workspace.get("haltingJobId") or "") if workspace else ""
        never_applies = world.workload.never_applies(halting) or halting not in {job.job_id for job in plan.jobs}
        unfinished = (halting, ResumeDecision.SKIP if never_applies else ResumeDecision.RETRY)
    elif unfinished is None or state not in ("HALTED", "RESUMING"):
        world.unfinished_resumes.pop(plan.workspace_id, None)
        return
    world.unfinished_resumes[plan.workspace_id] = unfinished
    halting, decision = unfinished
    result = resume_workspace(
        plan.workspace_id,
        tenant_id=plan.tenant_id,
        halting_job_id=halting,
        decision=decision,
        operator="sim-operator",
        guard=guard,
        sqs=world.services.sqs,
        queue_url=world.queue_url,
    )
    del world.unfinished_resumes[plan.workspace_id]
    world.counts[f"resume_{result.outcome.name.lower()}"] += 1
    if result.outcome.name == "RETRY_REFUSED":
        # As the refusal says: a job not settled yet is left to the queue, or redriven from the DLQ (next round), and
        # retried after; only one that cannot run again (a rejected message, a DEAD job without its stored message)
        # is skipped. Read again now: the job may have settled since the refusal (a worker made it DEAD meanwhile).
        # A job whose send was never confirmed is retried once its client sent it again (it is parked then), or
        # skipped when its client gave it up (as the runbook says: the operator asks its owner).
        job = guard.get_job(plan.tenant_id, halting) if not halting.startswith("msg#") else None
        status = None if job is None else job.get("status")
        cannot_run = status in (None, "REJECTED") or (status == "DEAD" and not job.get("body"))  # type: ignore[union-attr]
        unplaced = status == "QUEUED" and not job.get("sequenceNumber")  # type: ignore[union-attr]
        cannot_run = cannot_run or (unplaced and halting in world.oracle.given_up)
        world.unfinished_resumes[plan.workspace_id] = (
            halting,
            ResumeDecision.SKIP if cannot_run else ResumeDecision.RETRY,
        )


def spawn_agent(world: World, state: AgentState) -> Actor:
    process = Process(f"agent-{state.plan.workspace_id}-{state.restarts}")
    world.agent_processes[process] = state
    return world.scheduler.spawn(process.name, lambda: run_agent(world, state), process)


def restart_agent(world: World, process: Process, rng: random.Random) -> None:
    """An agent whose process died starts again a little later, from the job it had no answer for."""
    state = world.agent_processes.pop(process, None)
    if state is None or state.done:
        return
    state.restarts += 1
    actor = spawn_agent(world, state)
    actor.wake_at = world.scheduler.now + rng.uniform(1.0, 10.0)
