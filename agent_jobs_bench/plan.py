"""The capacity plan's small-scale predictions beside what the local runtime measures in the same run.

A few folder workspaces receive jobs at a fixed rate each (exponential inter-arrival times, stratified so that their
mean is exactly 1 / rate, in a seeded order) through the local HTTP API; a worker bootstrap (`install`) makes every
job take a known time (`JOB_SECONDS` x the runtime's time_scale) and logs when each job's handler starts and ends.
Measured beside the plan (`agent_jobs_cli.plan.estimate`):

- mean concurrency: jobs in their handler, averaged over the arrival window, against the plan's Little's law figure
  (rate x job duration) with the nominal rate and duration; and the poller's most concurrent invocations against the
  plan's cap, min(workspaces, MaximumConcurrency);
- mean queueing delay per workspace: handler start minus the moment the API accepted the job, against the plan's
  M/D/1 wait with the job duration the worker actually took (its mean invocation duration, guard calls included, as
  Lambda's Duration metric would report it). The measured delay also holds what the model leaves out: the API to SQS
  to poller pickup (the local pollers pause up to a second between empty receives) and the guard's claim.

Records of different groups in one batch run one after another in the worker this is measured on, so the run sets
WorkerBatchSize to 1: each invocation then holds one workspace's job, as the plan's group-parallel assumption says.
All durations are reported in the scenario's seconds (measured real seconds / time_scale).
"""

from __future__ import annotations

import functools
import json
import math
import os
import random
import tempfile
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

from agent_jobs_bench.figures import Comparison, Figure, Goal

if TYPE_CHECKING:
    from agent_jobs_cli.plan import Plan

BENCHMARK: Final = "Capacity plan against the local runtime"
COMMAND: Final = ".venv/bin/python -m agent_jobs_bench --only plan"
JOB_SECONDS: Final = 20.0  # scenario seconds of one job
TIME_SCALE: Final = 0.1  # 20 scenario seconds run in 2 real seconds
UTILISATION: Final = 0.6  # of each workspace
TENANT: Final = "tenant-plan"
SEED: Final = 6
PATCH: Final = "--- a/f\n+++ b/f\n@@ -0,0 +1 @@\n+x\n"


# --- the worker side ------------------------------------------------------------------------------------------------


def install(handler_module: ModuleType, config: dict[str, Any]) -> None:
    """Worker bootstrap: folder workspaces under WORKSPACES_ROOT (`agent_jobs_local.folder_workspaces`, no git remote
    to register); an apply_patch job's handler first sleeps `job_seconds` (real seconds), so the job takes a known
    time, and its start and end are appended as a JSON line to `log` (one whole line per job: O_APPEND)."""
    from agent_jobs.models import JobType
    from agent_jobs_local.folder_workspaces import LocalWorkspaceStore
    from job_worker import jobs

    build_worker = getattr(handler_module, "worker")  # noqa: B009 (a ModuleType has no declared attributes)

    def worker() -> Any:
        built = build_worker()
        if not isinstance(built.workspaces, LocalWorkspaceStore):
            built.workspaces = LocalWorkspaceStore(built.services.settings.workspaces_root)
        return built

    setattr(handler_module, "worker", worker)  # noqa: B010 (the handler calls the module's worker() by name)

    job_seconds, log = float(config["job_seconds"]), str(config["log"])
    original = jobs.JOB_HANDLERS[JobType.APPLY_PATCH]

    @functools.wraps(original)
    def timed(job: Any, context: Any) -> dict[str, Any]:
        start = time.time()
        time.sleep(job_seconds)
        try:
            return original(job, context)
        finally:
            line = json.dumps({"jobId": job.job_id, "start": start, "end": time.time(), "pid": os.getpid()})
            descriptor = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            try:
                os.write(descriptor, (line + "\n").encode())
            finally:
                os.close(descriptor)

    jobs.JOB_HANDLERS[JobType.APPLY_PATCH] = timed


# --- the measurement ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measurement:
    """One run: arrivals (accepted times), the handlers' start/end, the poller's figures; times in real seconds."""

    workspaces: int
    rate_per_workspace: float  # real jobs per second
    job_seconds: float  # real seconds each handler sleeps
    time_scale: float
    concurrency: int  # the poller's MaximumConcurrency
    accepted: dict[str, float]  # job id -> when the API accepted it
    workspace_of: dict[str, str]
    handler: dict[str, tuple[float, float]]  # job id -> (start, end)
    invocation_seconds: list[float]
    max_concurrent_invocations: int
    cold_starts: int

    @property
    def arrival_window(self) -> tuple[float, float]:
        return min(self.accepted.values()), max(self.accepted.values())

    def mean_concurrency(self) -> float:
        """Jobs in their handler, averaged over the arrival window."""
        first, last = self.arrival_window
        busy = sum(max(0.0, min(end, last) - max(start, first)) for start, end in self.handler.values())
        return busy / (last - first)

    def waits(self) -> dict[str, list[float]]:
        """Per workspace, each job's handler start minus its acceptance, in real seconds."""
        found: dict[str, list[float]] = defaultdict(list)
        for job_id, accepted in sorted(self.accepted.items(), key=lambda item: item[1]):
            if job_id in self.handler:
                found[self.workspace_of[job_id]].append(self.handler[job_id][0] - accepted)
        return dict(found)

    def mean_service_seconds(self) -> float:
        return sum(self.invocation_seconds) / len(self.invocation_seconds)

    def lindley_wait(self, service_seconds: float) -> float:
        """The mean wait a single server per workspace with this constant service time gives these very arrivals."""
        by_workspace: dict[str, list[float]] = defaultdict(list)
        for job_id, accepted in self.accepted.items():
            by_workspace[self.workspace_of[job_id]].append(accepted)
        waits = []
        for arrivals in by_workspace.values():
            arrivals.sort()
            wait = 0.0
            for index, arrival in enumerate(arrivals):
                if index:
                    wait = max(0.0, wait + service_seconds - (arrival - arrivals[index - 1]))
                waits.append(wait)
        return sum(waits) / len(waits)


def arrival_offsets(jobs: int, rate: float, rng: random.Random) -> list[float]:
    """`jobs` arrival times from 0: exponential gaps taken at evenly spaced quantiles (mean exactly 1 / rate), in a
    random order."""
    gaps = [-math.log(1 - (index + 0.5) / jobs) / rate for index in range(jobs)]
    rng.shuffle(gaps)
    times, now = [], 0.0
    for gap in gaps:
        times.append(now)
        now += gap
    return times


def measure(
    *,
    workspaces: int = 3,
    jobs_per_workspace: int = 10,
    job_seconds: float = JOB_SECONDS,
    utilisation: float = UTILISATION,
    time_scale: float = TIME_SCALE,
    seed: int = SEED,
    root: Path | None = None,
) -> Measurement:
    """Run the scenario on the local runtime and return what it measured (see the module docstring)."""
    from agent_jobs_bench.submit import register_folder_workspaces, submit_patch_job
    from agent_jobs_local.auth import mint_token
    from agent_jobs_local.runtime import LocalRuntime

    real_job_seconds = job_seconds * time_scale
    rate = utilisation / real_job_seconds  # real jobs per second per workspace
    rng = random.Random(seed)
    workspace_ids = [f"ws-plan-{index}" for index in range(workspaces)]
    schedule = sorted(
        (offset, workspace_id, f"job-plan-{workspace_id}-{number}")
        for workspace_id in workspace_ids
        for number, offset in enumerate(arrival_offsets(jobs_per_workspace, rate, rng))
    )
    with tempfile.TemporaryDirectory(prefix="agent-jobs-plan-", dir=root) as scratch:
        log = Path(scratch) / "handlers.jsonl"
        with LocalRuntime(
            workspaces_root=Path(scratch) / "workspaces",
            time_scale=time_scale,
            concurrency=workspaces,  # as many invocations as groups: the cap never binds, cold starts stay few
            parameter_overrides={"WorkerBatchSize": 1},
            worker_bootstrap="agent_jobs_bench.plan:install",
            bootstrap_config={"job_seconds": real_job_seconds, "log": str(log)},
        ) as runtime:
            token = mint_token(TENANT)
            # Warm every environment first: a cold start is not part of the queueing the plan models.
            warm = [f"job-plan-warm-{index}" for index in range(workspaces)]
            register_folder_workspaces(
                runtime.api_url, token, [*workspace_ids, *(f"ws-plan-warm-{index}" for index in range(workspaces))]
            )
            for index, job_id in enumerate(warm):
                submit_patch_job(
                    runtime.api_url, token, job_id, f"ws-plan-warm-{index}", patch=PATCH, message=f"change for {job_id}"
                )
            if not runtime.poller.drain(timeout=120):
                raise RuntimeError("the warm-up jobs did not finish within 120 s")
            warm_invocations = len(runtime.poller.invocation_log())

            accepted: dict[str, float] = {}
            workspace_of: dict[str, str] = {}
            start = time.time()
            for offset, workspace_id, job_id in schedule:
                delay = start + offset - time.time()
                if delay > 0:
                    time.sleep(delay)
                submit_patch_job(
                    runtime.api_url, token, job_id, workspace_id, patch=PATCH, message=f"change for {job_id}"
                )
                accepted[job_id] = time.time()
                workspace_of[job_id] = workspace_id
            if not runtime.poller.drain(timeout=120 + len(schedule) * real_job_seconds):
                raise RuntimeError("the jobs did not finish in time: is the machine overloaded?")
            stats, invocation_log = runtime.poller.stats, runtime.poller.invocation_log()
        handler = {}
        for line in log.read_text().splitlines():
            entry = json.loads(line)
            handler[str(entry["jobId"])] = (float(entry["start"]), float(entry["end"]))
    measured = [record.duration_seconds for record in invocation_log[warm_invocations:] if record.outcome == "ok"]
    return Measurement(
        workspaces=workspaces,
        rate_per_workspace=rate,
        job_seconds=real_job_seconds,
        time_scale=time_scale,
        concurrency=workspaces,
        accepted=accepted,
        workspace_of=workspace_of,
        handler={job_id: span for job_id, span in handler.items() if job_id in accepted},
        invocation_seconds=measured,
        max_concurrent_invocations=stats.max_concurrent_invocations,
        cold_starts=stats.cold_starts,
    )


# --- the comparison -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanCheck:
    """The plan's predictions for a measurement, and the measured figures, in the scenario's seconds."""

    predicted_concurrency: float
    measured_concurrency: float
    concurrency_cap: int
    max_concurrent_invocations: int
    service_seconds: float  # the measured job duration (mean invocation), scenario seconds
    predicted_wait: float  # plan, M/D/1, with the measured job duration
    nominal_wait: float  # plan, M/D/1, with the nominal job duration
    lindley_wait: float  # the same single-server model on the run's own arrivals
    measured_waits: Mapping[str, float]  # per workspace
    measured_wait: float  # all jobs


def compare(measurement: Measurement) -> PlanCheck:
    """The plan's predictions for the measured scenario, beside the measurement."""
    from agent_jobs_cli.plan import Deployment, PlanInput, estimate

    scale = measurement.time_scale
    deployment = Deployment.from_template(batch_size=1, maximum_concurrency=measurement.concurrency)
    workspaces, total_rate = measurement.workspaces, measurement.rate_per_workspace * measurement.workspaces

    def plan(job_seconds: float) -> Any:
        # In scenario units: rate per scenario second, durations in scenario seconds.
        return estimate(
            PlanInput(workspaces=workspaces, rate=total_rate * scale, job_seconds=job_seconds, deployment=deployment)
        )

    nominal = plan(measurement.job_seconds / scale)
    service = measurement.mean_service_seconds() / scale
    effective = plan(service)
    waits = measurement.waits()
    every_wait = [wait for values in waits.values() for wait in values]
    return PlanCheck(
        predicted_concurrency=nominal.mean_busy_groups,
        measured_concurrency=measurement.mean_concurrency(),
        concurrency_cap=nominal.concurrency_cap,
        max_concurrent_invocations=measurement.max_concurrent_invocations,
        service_seconds=service,
        predicted_wait=effective.mean_wait_seconds,
        nominal_wait=nominal.mean_wait_seconds,
        lindley_wait=measurement.lindley_wait(measurement.mean_service_seconds()) / scale,
        measured_waits={ws: sum(values) / len(values) / scale for ws, values in sorted(waits.items())},
        measured_wait=sum(every_wait) / len(every_wait) / scale,
    )


def figures(measurement: Measurement, result: PlanCheck) -> list[Figure]:
    note_setup = (
        f"{measurement.workspaces} workspaces, {len(measurement.accepted)} jobs, utilisation {UTILISATION:.0%} each, "
        f"{JOB_SECONDS:g} s jobs at time_scale {measurement.time_scale:g}; ratio = measured / predicted"
    )
    per_workspace = ", ".join(f"{ws}: {wait:.2f} s" for ws, wait in result.measured_waits.items())
    return [
        Figure(
            BENCHMARK,
            "Mean concurrency (jobs in their handler), measured vs the plan's rate x duration",
            result.measured_concurrency,
            "invocations",
            COMMAND,
            baseline=result.predicted_concurrency,
            note=f"{note_setup}; the baseline is the plan's prediction, not a naive pattern",
        ),
        Figure(
            BENCHMARK,
            "Most concurrent invocations vs the plan's cap min(workspaces, MaximumConcurrency)",
            result.max_concurrent_invocations,
            "invocations",
            COMMAND,
            baseline=result.concurrency_cap,
            goal=Goal(1.0, Comparison.AT_MOST, "never above the plan's cap"),
            goal_on="ratio",
        ),
        Figure(
            BENCHMARK,
            "Mean queueing delay per workspace, measured vs the plan's M/D/1 wait",
            result.measured_wait,
            "s (scenario)",
            COMMAND,
            baseline=result.predicted_wait,
            note=(
                f"plan fed the measured job duration {result.service_seconds:.2f} s (nominal {JOB_SECONDS:g} s: "
                f"{result.nominal_wait:.2f} s predicted); the same model on this run's own arrivals: "
                f"{result.lindley_wait:.2f} s; per workspace: {per_workspace}; the measured delay also holds the "
                "API-to-poller pickup and the claim, which the model leaves out"
            ),
        ),
    ]


# The two jobs the cost figures price: a 1 s apply_patch and a 60 s run_tests, at 10 jobs/s over 100 workspaces.
COST_PROFILES: Final = (("a 1 s apply_patch", 1.0), ("a 60 s run_tests", 60.0))


def _dynamodb_usd(plan: Plan) -> float:
    """What DynamoDB costs of a plan's million jobs."""
    return sum(line.usd_per_million_jobs for line in plan.cost_lines if line.service == "Amazon DynamoDB")


def cost_figures() -> list[Figure]:
    """Cost per million jobs from `agent-jobs plan`'s prices for the job calls as they are, beside the same plan with
    the calls as they were while the enqueue and the claim were transactions (`TRANSACTIONAL_USAGE`)."""
    from agent_jobs_cli.plan import TRANSACTIONAL_USAGE, PerJobUsage, PlanInput, estimate
    from agent_jobs_cli.plan_prices import READ_ON

    out = []
    for name, job_seconds in COST_PROFILES:
        plans = {
            usage: estimate(PlanInput(workspaces=100, rate=10.0, job_seconds=job_seconds, usage=usage))
            for usage in (PerJobUsage(), TRANSACTIONAL_USAGE)
        }
        now, before = plans[PerJobUsage()], plans[TRANSACTIONAL_USAGE]

        out.append(
            Figure(
                BENCHMARK,
                f"Cost per million jobs, {name} (us-east-1 list prices)",
                now.usd_per_million_jobs,
                "USD",
                "agent-jobs plan --workspaces 100 --rate 10 --job-seconds " + f"{job_seconds:g}",
                baseline=before.usd_per_million_jobs,
                note=(
                    f"The baseline is the same plan with the calls of the transactional claim and enqueue (10 write"
                    f" units per job, 0.5 read units), not a naive pattern. DynamoDB's share: ${_dynamodb_usd(now):.2f}"
                    f" now, ${_dynamodb_usd(before):.2f} before (4 write units and 1.5 read units per job now). Prices"
                    f" read on {READ_ON} (`agent_jobs_cli.plan_prices`: each with its page); computed, not measured"
                ),
            )
        )
    return out


def run(quick: bool = False) -> list[Figure]:
    """The plan's predictions beside the local runtime's measurement (quick: 10 jobs per workspace, else 30), and the
    plan's cost per million jobs now and with the transactional calls."""
    measurement = measure(jobs_per_workspace=10 if quick else 30)
    return [*figures(measurement, compare(measurement)), *cost_figures()]


__all__ = [
    "Measurement",
    "PlanCheck",
    "arrival_offsets",
    "compare",
    "cost_figures",
    "figures",
    "install",
    "measure",
    "run",
]
