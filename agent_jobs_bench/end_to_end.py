"""End to end, local: enqueue→applied latency (p50, p99) and throughput against the number of workspaces.

The whole system runs on this machine (`agent_jobs_local.runtime.LocalRuntime`): moto's server, the resources from
template.yaml, the producer behind the local HTTP API with its JWT checks, and the worker in its own processes fed by
the local SQS event source, at most `MAXIMUM_CONCURRENCY` invocations at a time (the template's
WorkerMaximumConcurrency, overridden to fit this machine). The jobs are apply_patch on folder workspaces (the worker's
`LocalWorkspaceStore`, installed by `install` in each worker process), so a job costs the queue, the table and a
local commit; a second series gives each commit a 100 ms wait, as a push to a git remote would, since bare jobs on
this machine are bound by the emulator and the CPUs rather than by the queue. One agent per workspace submits its
jobs one after another over HTTP with a real token (`agent_jobs_local.auth.mint_token`), all agents at once.

A job's latency runs from the start of its POST to the moment the worker's record processing for it returned (the
job SUCCEEDED in the table, its commit on the workspace), recorded by `install` in each worker process. Throughput is
the level's jobs over the time from its first POST to its last applied job. The baseline of the throughput ratio is
the 1-workspace throughput of the same run: one message group is processed in order, one job at a time, so more
throughput can only come from more groups, up to MaximumConcurrency invocations at once.

The naive pattern (`agent_jobs_bench.naive`) runs the same levels in a runtime of its own (`install_naive`): its
producer called directly on the emulator, its worker as the function's handler; its latencies are the baselines of
Agent Jobs' latencies. A last series drains a backlog of small patches on one workspace with the worker's BatchSize
at 1 and at 10 (`measure_backlog`), each in a fresh runtime: what batching within one group buys.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from agent_jobs_bench.figures import Comparison, Figure, Goal

if TYPE_CHECKING:
    from agent_jobs_local.runtime import LocalRuntime

BENCHMARK = "End to end, local runtime"
COMMAND = ".venv/bin/python -m agent_jobs_bench --only end_to_end"
MAXIMUM_CONCURRENCY = 4  # WorkerMaximumConcurrency for this run: 4 worker processes fit a small machine
WORKSPACE_COUNTS = (1, 2, 4, 8)
QUICK_WORKSPACE_COUNTS = (1, 2, 4)
JOBS_PER_WORKSPACE = 6
QUICK_JOBS_PER_WORKSPACE = 3
TIME_SCALE = 0.1  # backoffs, visibility timeout and the invocation deadline, scaled alike
LEVEL_TIMEOUT_SECONDS = 120
# Two series: bare jobs (the queue, the table and a local commit: what the system itself costs, bound here by the
# emulator and the CPUs), and jobs whose side effect waits 100 ms on IO as a push to a git remote would.
SIDE_EFFECTS = (0.0, 0.1)
GROWTH_GOAL = Goal(1.5, Comparison.AT_LEAST, "throughput grows with workspaces up to MaximumConcurrency (>= 1.5x)")
GROWTH_NOTE = (
    "no target is set elsewhere; 1.5x is this benchmark's bar for growth on a 2-core machine. A receive returns up to "
    "BatchSize records of several groups, so groups share an invocation: with a worker that runs a batch's records "
    "one after another they share its time too, and only a worker that runs a batch's groups concurrently lets "
    "throughput grow with groups inside a batch"
)
BARE_NOTE = (
    "no goal: bare jobs are bound by the emulator (one moto process) and this machine's CPUs, not by the queue's "
    "groups; compare the series with a side effect"
)
APPLIED_LOG = "applied.log"
NAIVE_NOTE = (
    "its producer is `naive_enqueue` called directly, with no HTTP API or token check in front; its worker loops over a"
    " batch's records one after another, with no claim, no check of the jobs ahead and no fencing"
)
# A backlog on one workspace: small patches submitted at once (POST /jobs:batch, 10 a request), drained by the worker
# with the template's BatchSize at 1 and at 10 (the FIFO maximum): what batching within one message group buys.
BACKLOG_JOBS = 100
QUICK_BACKLOG_JOBS = 20
BACKLOG_BATCH_SIZES = (1, 10)
BACKLOG_NOTE = (
    "one message group is processed in order, one record at a time, whatever the batch size: a larger batch saves"
    " what each invocation costs around its records (the poller's receive, the invocation, the delete, the worker's"
    " batch set-up), not the jobs' own calls"
)


def install(handler_module: ModuleType, config: dict[str, Any]) -> None:
    """Worker bootstrap (in each worker process): folder workspaces under the worker's WORKSPACES_ROOT, and a line
    `<jobId> <epoch seconds>` appended to `config["applied_log"]` when a record's processing returns; each commit
    first waits the seconds written in `config["side_effect_file"]` (the series' simulated IO)."""
    from agent_jobs_local.folder_workspaces import LocalWorkspaceStore
    from job_worker import processing

    applied_log = str(config["applied_log"])
    side_effect_file = Path(str(config["side_effect_file"]))
    app: Any = handler_module
    built = app.worker

    @functools.cache
    def worker() -> Any:
        batch_worker = built()
        folders = LocalWorkspaceStore(Path(batch_worker.services.settings.workspaces_root))
        return replace(batch_worker, workspaces=folders)

    app.worker = worker
    original = processing.BatchWorker.process_record

    @functools.wraps(original)
    def process_record(self: Any, record: Any, context: Any) -> None:
        job_id = json.loads(record.body).get("jobId")
        original(self, record, context)
        if job_id:
            _append(applied_log, f"{job_id} {time.time():.6f}\n")

    processing.BatchWorker.process_record = process_record  # type: ignore[method-assign]
    _wait_in_commits(side_effect_file)


def install_naive(handler_module: ModuleType, config: dict[str, Any]) -> None:
    """Worker bootstrap of the naive series: the function's handler is the naive pattern's worker
    (`agent_jobs_bench.naive.NaiveWorker`, a sequential loop over the batch) on the same queue and table, committing to
    the same folder workspaces with the same simulated IO; a line to the applied log when a record's processing
    returns, as `install` writes for Agent Jobs."""
    from agent_jobs.services import build_services
    from agent_jobs_bench.naive import NaiveWorker, commit_to_folder

    applied_log = str(config["applied_log"])
    _wait_in_commits(Path(str(config["side_effect_file"])))
    services = build_services()

    class LoggedNaiveWorker(NaiveWorker):
        def process(self, record: dict[str, Any]) -> None:
            super().process(record)
            _append(applied_log, f"{json.loads(record['body'])['jobId']} {time.time():.6f}\n")

    naive = LoggedNaiveWorker(
        services.dynamodb,
        services.settings.table_name,
        commit_to_folder(Path(services.settings.workspaces_root)),
    )
    setattr(handler_module, "lambda_handler", naive.handle)  # noqa: B010


def _wait_in_commits(side_effect_file: Path) -> None:
    from agent_jobs_local.folder_workspaces import LocalWorkspace

    original_commit = LocalWorkspace.commit

    @functools.wraps(original_commit)
    def commit(self: Any, **kwargs: Any) -> Any:
        # What a real side effect adds (a git push, a call to a forge): the series' seconds of waiting on IO.
        seconds = float(side_effect_file.read_text()) if side_effect_file.exists() else 0.0
        if seconds:
            time.sleep(seconds)
        return original_commit(self, **kwargs)

    LocalWorkspace.commit = commit  # type: ignore[method-assign]


def _append(path: str, line: str) -> None:
    # One short O_APPEND write per line: lines of concurrent processes never interleave.
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(descriptor, line.encode())
    finally:
        os.close(descriptor)


@dataclass(frozen=True)
class Level:
    workspaces: int
    jobs: int
    latencies: list[float]  # seconds, one per job
    seconds: float  # first POST to the last applied job

    @property
    def throughput(self) -> float:
        return self.jobs / self.seconds

    def percentile(self, fraction: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


def wait_applied(log: Path, job_ids: Sequence[str]) -> dict[str, float]:
    """When each job was applied, once every one of them is (RuntimeError past LEVEL_TIMEOUT_SECONDS)."""
    deadline = time.monotonic() + LEVEL_TIMEOUT_SECONDS
    while True:
        applied = _applied(log)
        missing = [job_id for job_id in job_ids if job_id not in applied]
        if not missing:
            return applied
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(missing)} of {len(job_ids)} jobs not applied in {LEVEL_TIMEOUT_SECONDS} s")
        time.sleep(0.05)


def _applied(log: Path) -> dict[str, float]:
    if not log.exists():
        return {}
    applied: dict[str, float] = {}
    for line in log.read_text().splitlines():
        job_id, _, at = line.partition(" ")
        applied.setdefault(job_id, float(at))  # a job processed twice (a redelivery) was applied the first time
    return applied


# How a level's agents submit one job: (job id, workspace id) → nothing, once the job is accepted.
Submit = Callable[[str, str], None]


def api_submitter(api_url: str) -> tuple[Submit, Callable[[Sequence[str]], None]]:
    """Agent Jobs' producer: POST /jobs over HTTP with a real token; and how a level registers its workspaces."""
    from agent_jobs_bench.submit import register_folder_workspaces, submit_patch_job
    from agent_jobs_local.auth import mint_token

    token = mint_token("default")

    def submit(job_id: str, workspace_id: str) -> None:
        submit_patch_job(api_url, token, job_id, workspace_id, patch=_patch(job_id), message=job_id)

    return submit, lambda workspace_ids: register_folder_workspaces(api_url, token, workspace_ids)


def naive_submitter(runtime: LocalRuntime) -> Submit:
    """The naive pattern's producer (`agent_jobs_bench.naive.naive_enqueue`: GetItem, PutItem, SendMessage) called
    directly on the emulator, as a service would without an API in front; one set of clients per agent thread."""
    from agent_jobs_bench.naive import naive_enqueue
    from agent_jobs_bench.submit import patch_job
    from agent_jobs_local.runtime_aws import aws_clients

    resources = runtime.resources
    local = threading.local()

    def submit(job_id: str, workspace_id: str) -> None:
        if not hasattr(local, "clients"):
            local.clients = aws_clients(runtime.region, runtime.endpoint_url)
        naive_enqueue(
            patch_job(job_id, workspace_id, patch=_patch(job_id), message=job_id),
            "default",
            dynamodb=local.clients.dynamodb,
            sqs=local.clients.sqs,
            table_name=resources.table_name,
            queue_url=resources.queue_url,
        )

    return submit


def _patch(job_id: str) -> str:
    return f"--- a/{job_id}\n+++ b/{job_id}\n@@ -0,0 +1 @@\n+{job_id}\n"


def run_level(
    submit: Submit,
    register: Callable[[Sequence[str]], None] | None,
    log: Path,
    *,
    workspaces: int,
    jobs_per_workspace: int,
    run_id: str,
) -> Level:
    """One agent per workspace submits its jobs in order, all agents at once, while the worker runs; waits until
    every job is applied."""
    plan = {
        f"e2e-{run_id}-w{workspaces}-{ws}": [f"e2e-{run_id}-w{workspaces}-{ws}-{n}" for n in range(jobs_per_workspace)]
        for ws in range(workspaces)
    }
    if register is not None:
        register(list(plan))
    submitted: dict[str, float] = {}
    errors: list[BaseException] = []

    def agent(workspace_id: str, job_ids: Sequence[str]) -> None:
        try:
            for job_id in job_ids:
                submitted[job_id] = time.time()
                submit(job_id, workspace_id)
        except BaseException as error:  # reported below, in this thread
            errors.append(error)

    threads = [threading.Thread(target=agent, args=item) for item in plan.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    applied = wait_applied(log, list(submitted))
    latencies = [applied[job_id] - at for job_id, at in submitted.items()]
    seconds = max(applied[job_id] for job_id in submitted) - min(submitted.values())
    return Level(workspaces=workspaces, jobs=len(submitted), latencies=latencies, seconds=seconds)


@contextlib.contextmanager
def _local_runtime(
    prefix: str, overrides: Mapping[str, object], *, naive_pattern: bool = False
) -> Iterator[tuple[LocalRuntime, Path, Path]]:
    """A running local runtime at most `MAXIMUM_CONCURRENCY` worker invocations wide (plus `overrides`), whose worker
    is installed by `install` (or `install_naive`), in a scratch folder; yields it with its applied log and the file
    that sets its side effect's seconds."""
    from agent_jobs_local.runtime import LocalRuntime

    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        log, side_effect_file = Path(tmp) / APPLIED_LOG, Path(tmp) / "side-effect-seconds"
        runtime = LocalRuntime(
            workspaces_root=Path(tmp) / "workspaces",
            time_scale=TIME_SCALE,
            parameter_overrides={"WorkerMaximumConcurrency": MAXIMUM_CONCURRENCY, **overrides},
            worker_bootstrap=f"agent_jobs_bench.end_to_end:{'install_naive' if naive_pattern else 'install'}",
            bootstrap_config={"applied_log": str(log), "side_effect_file": str(side_effect_file)},
        )
        with runtime:
            yield runtime, log, side_effect_file


def measure(
    counts: Sequence[int],
    jobs_per_workspace: int,
    side_effects: Sequence[float] = (0.0,),
    *,
    naive_pattern: bool = False,
) -> dict[float, list[Level]]:
    """The local runtime with `MAXIMUM_CONCURRENCY` worker invocations at most; a warm-up level (so each level meets
    warm execution environments, as a steady load does), then a level for each side effect duration (a series) and
    each workspace count. `naive_pattern`: the naive pattern's producer and worker on the runtime instead."""
    run_id = uuid.uuid4().hex[:6]
    series: dict[float, list[Level]] = {}
    with _local_runtime("agent-jobs-e2e-", {}, naive_pattern=naive_pattern) as (runtime, log, side_effect_file):
        if naive_pattern:
            submit, register = naive_submitter(runtime), None
        else:
            submit, register = api_submitter(runtime.api_url)
        run_level(submit, register, log, workspaces=MAXIMUM_CONCURRENCY, jobs_per_workspace=2, run_id=f"{run_id}warm")
        for number, seconds in enumerate(side_effects):
            side_effect_file.write_text(str(seconds))
            series[seconds] = [
                run_level(
                    submit,
                    register,
                    log,
                    workspaces=count,
                    jobs_per_workspace=jobs_per_workspace,
                    run_id=f"{run_id}s{number}",
                )
                for count in counts
            ]
    return series


@dataclass(frozen=True)
class Backlog:
    batch_size: int
    jobs: int
    seconds: float  # first POST to the last applied job
    submit_seconds: float  # first POST to the last POST's answer

    @property
    def throughput(self) -> float:
        return self.jobs / self.seconds


def measure_backlog(batch_size: int, jobs: int) -> Backlog:
    """A fresh local runtime whose worker takes `batch_size` records an invocation; one workspace gets `jobs` small
    patches at once, after a warm-up job; waits until every one is applied."""
    from agent_jobs_bench.submit import patch_job, submit_in_batches
    from agent_jobs_local.auth import mint_token

    run_id = uuid.uuid4().hex[:6]
    # The backlog is submitted at once: the tenant's rate quota (25 new jobs a second by default) is raised.
    overrides = {"WorkerBatchSize": batch_size, "MaxJobsPerSecondPerTenant": 10 * jobs}
    with _local_runtime("agent-jobs-backlog-", overrides) as (runtime, log, _):
        submit, register = api_submitter(runtime.api_url)
        run_level(submit, register, log, workspaces=1, jobs_per_workspace=1, run_id=f"{run_id}warm")
        workspace_id = f"backlog-{run_id}"
        register([workspace_id])
        job_ids = [f"{workspace_id}-{n:03d}" for n in range(jobs)]
        started = time.time()
        submit_in_batches(
            runtime.api_url,
            mint_token("default"),
            [patch_job(job_id, workspace_id, patch=_patch(job_id), message=job_id) for job_id in job_ids],
        )
        submitted = time.time()
        applied = wait_applied(log, job_ids)
    if sorted(job_ids, key=lambda job_id: applied[job_id]) != job_ids:
        raise RuntimeError("the backlog's jobs were applied out of order")
    last = max(applied[job_id] for job_id in job_ids)
    return Backlog(batch_size, jobs, last - started, submitted - started)


def backlog_figures(backlogs: Sequence[Backlog]) -> list[Figure]:
    baseline = backlogs[0]
    figures = []
    for backlog in backlogs:
        figures.append(
            Figure(
                BENCHMARK,
                f"backlog of {backlog.jobs} small patches on 1 workspace: throughput, BatchSize {backlog.batch_size}",
                backlog.throughput,
                "jobs/s",
                COMMAND,
                baseline=baseline.throughput,
                note=(
                    f"first POST to last applied {backlog.seconds:.2f} s (submitted in {backlog.submit_seconds:.2f} s"
                    f" by POST /jobs:batch, 10 a request, the tenant's rate quota raised); applied in order, checked;"
                    " baseline: BatchSize"
                    f" {baseline.batch_size}, same run; {BACKLOG_NOTE}"
                ),
            )
        )
    return figures


def series_name(side_effect_seconds: float) -> str:
    if not side_effect_seconds:
        return "bare jobs"
    return f"jobs with a {side_effect_seconds * 1000:.0f} ms side effect"


def run(quick: bool = False) -> list[Figure]:
    counts = QUICK_WORKSPACE_COUNTS if quick else WORKSPACE_COUNTS
    per_workspace = QUICK_JOBS_PER_WORKSPACE if quick else JOBS_PER_WORKSPACE
    measured = measure(counts, per_workspace, SIDE_EFFECTS)
    naive = measure(counts, per_workspace, SIDE_EFFECTS, naive_pattern=True)
    backlog_jobs = QUICK_BACKLOG_JOBS if quick else BACKLOG_JOBS
    backlogs = [measure_backlog(batch_size, backlog_jobs) for batch_size in BACKLOG_BATCH_SIZES]
    figures: list[Figure] = []
    for seconds, levels in measured.items():
        name = series_name(seconds)
        baseline = levels[0].throughput
        setup = (
            f"{per_workspace} apply_patch jobs per workspace on folder workspaces, {name}, one agent per workspace; "
            f"MaximumConcurrency {MAXIMUM_CONCURRENCY}, time_scale {TIME_SCALE}"
        )
        for level, naive_level in zip(levels, naive[seconds], strict=True):
            label = f"{level.workspaces} workspace{'s' if level.workspaces > 1 else ''}"
            latency_note = (
                f"enqueue (POST) to applied, {level.jobs} jobs submitted while the worker runs; baseline: the naive"
                f" pattern in a runtime of its own, same run ({NAIVE_NOTE}); {setup}"
            )
            figures += [
                Figure(
                    BENCHMARK,
                    f"{name}: latency p50, {label}",
                    level.percentile(0.5) * 1000,
                    "ms",
                    COMMAND,
                    baseline=naive_level.percentile(0.5) * 1000,
                    note=latency_note,
                ),
                Figure(
                    BENCHMARK,
                    f"{name}: latency p99, {label}",
                    level.percentile(0.99) * 1000,
                    "ms",
                    COMMAND,
                    baseline=naive_level.percentile(0.99) * 1000,
                    note=latency_note,
                ),
                Figure(
                    BENCHMARK,
                    f"{name}: throughput, {label}",
                    level.throughput,
                    "jobs/s",
                    COMMAND,
                    baseline=baseline,
                    note=f"{level.jobs} jobs, first POST to last applied {level.seconds:.2f} s; baseline: 1 workspace, "
                    f"same run; the naive pattern: {naive_level.throughput:.2f} jobs/s; {setup}",
                ),
            ]
        at_limit = [level for level in levels if level.workspaces <= MAXIMUM_CONCURRENCY][-1]
        figures.append(
            Figure(
                BENCHMARK,
                f"{name}: throughput at {at_limit.workspaces} workspaces against 1 workspace (MaximumConcurrency "
                f"{MAXIMUM_CONCURRENCY})",
                at_limit.throughput,
                "jobs/s",
                COMMAND,
                baseline=baseline,
                goal=GROWTH_GOAL if seconds else None,
                goal_on="ratio",
                note=GROWTH_NOTE if seconds else BARE_NOTE,
            )
        )
    return figures + backlog_figures(backlogs)
