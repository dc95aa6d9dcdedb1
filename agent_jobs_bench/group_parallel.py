"""Group-parallel worker: one batch of 10 IO-bound jobs over 10 message groups and over 1 group, run by the worker
with groups in parallel (GROUP_CONCURRENCY=10), by the same worker one record at a time (GROUP_CONCURRENCY=1) and by
the naive sequential loop (GetItem + PutItem IN_FLIGHT + job + PutItem SUCCEEDED per record), all in the same run.

Every call crosses real HTTP to moto's server (the local emulator, `agent_jobs_local.emulator.Emulator`). Each job is
a real apply_patch whose commit first waits `io_seconds` (standing for the git push of a registered workspace): the
workspace store is injected the way the tests inject theirs. Only the worker's handling of a received batch is timed
(receive and delete are the event source's; the table is emptied between batches, see `_Bench._empty_table`); each
layout is repeated and interleaved, and the median is reported.
"""

from __future__ import annotations

import contextlib
import io
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3

from agent_jobs_bench.figures import Comparison, Figure, Goal
from agent_jobs_local.unregistered_workspaces import UnregisteredWorkspaces

if TYPE_CHECKING:
    from agent_jobs.services import Services

REPO = Path(__file__).resolve().parent.parent
BENCHMARK = "Group-parallel worker"
COMMAND = ".venv/bin/python -m agent_jobs_bench --only group_parallel"
JOBS_PER_BATCH = 10
WORKERS = ("parallel", "sequential", "naive")
REGION = "us-east-1"
BENCH_TENANT = "tenant-bench"
SPEED_UP_GOAL = Goal(0.2, Comparison.AT_MOST, "at least 5x faster than the sequential loop (time ratio <= 0.2)")
NO_SLOWER_GOAL = Goal(1.05, Comparison.AT_MOST, "over 1 group no slower than the sequential loop (ratio <= 1.05)")


def _worker_imports() -> None:
    """The worker's code as its Lambda sees it: the layer and the function's folder on the import path."""
    for folder in ("layers/shared", "functions/job_worker"):
        path = str(REPO / folder)
        if path not in sys.path:
            sys.path.insert(0, path)


class IoBoundWorkspaceStore(UnregisteredWorkspaces):
    """Local workspaces whose commit first waits `io_seconds`, as a push to a git remote would."""

    def __init__(self, root: Path, io_seconds: float) -> None:
        from agent_jobs_local.folder_workspaces import LocalWorkspaceStore

        self.inner = LocalWorkspaceStore(root)
        self.io_seconds = io_seconds  # read at each commit: the benchmark changes it between batches

    def open(self, workspace_id: str) -> Any:
        workspace = self.inner.open(workspace_id)
        commit = workspace.commit

        def pushing_commit(**kwargs: Any) -> Any:
            time.sleep(self.io_seconds)
            return commit(**kwargs)

        workspace.commit = pushing_commit  # type: ignore[method-assign]
        return workspace


class NaiveSequentialLoop:
    """The naive worker: for each record in turn, GetItem, PutItem IN_FLIGHT, run the job, PutItem SUCCEEDED."""

    def __init__(self, services: Services, workspaces: IoBoundWorkspaceStore) -> None:
        self.dynamodb = services.dynamodb
        self.table = services.settings.table_name
        self.workspaces = workspaces

    def handle(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        from agent_jobs.models import JobMessage
        from job_worker.jobs import run_job
        from job_worker.jobs.context import JobContext

        failures = []
        for record in event["Records"]:
            try:
                message = JobMessage.model_validate_json(record["body"])
                key = {"pk": {"S": f"naive#job#{message.job_id}"}}
                item = self.dynamodb.get_item(TableName=self.table, Key=key).get("Item")
                if item and item["status"]["S"] == "SUCCEEDED":
                    continue
                self.dynamodb.put_item(
                    TableName=self.table,
                    Item={**key, "status": {"S": "IN_FLIGHT"}},
                    ConditionExpression="attribute_not_exists(pk) OR #s <> :succeeded",
                    ExpressionAttributeNames={"#s": "status"},
                    ExpressionAttributeValues={":succeeded": {"S": "SUCCEEDED"}},
                )
                job_context = JobContext(
                    workspace=self.workspaces.open(message.workspace_id),
                    remaining_ms=context.get_remaining_time_in_millis,
                    safety_margin_ms=0,
                )
                run_job(message.request(), job_context)
                self.dynamodb.put_item(TableName=self.table, Item={**key, "status": {"S": "SUCCEEDED"}})
            except Exception:
                failures.append({"itemIdentifier": record["messageId"]})
        return {"batchItemFailures": failures}


@dataclass
class _Bench:
    services: Services
    queue_url: str
    queue_arn: str
    workspaces: IoBoundWorkspaceStore
    workers: Mapping[str, Any]  # name -> an object with handle(event, context)

    def one_batch(self, worker: str, groups: int, tag: str) -> float:
        """Seconds the worker takes over one batch of JOBS_PER_BATCH jobs spread over `groups` workspaces."""
        from agent_jobs.models import job_request_adapter
        from agent_jobs.producer import enqueue_job
        from agent_jobs_local.event_source import LambdaContextStub, receive_event, settle

        for i in range(JOBS_PER_BATCH):
            job_id = f"gp-{tag}-{i}-{uuid.uuid4().hex[:8]}"
            job = job_request_adapter.validate_python(
                {
                    "jobId": job_id,
                    "workspaceId": f"gp-ws-{i % groups}",
                    "type": "apply_patch",
                    "payload": {
                        "patch": f"--- a/f.txt\n+++ b/f.txt\n@@ -0,0 +1 @@\n+{job_id}\n",
                        "commitMessage": f"change for {job_id}",
                    },
                }
            )
            enqueue_job(job, BENCH_TENANT, guard=self.services.guard, sqs=self.services.sqs, queue_url=self.queue_url)
        event = receive_event(
            self.services.sqs, self.queue_url, queue_arn=self.queue_arn, region=REGION, batch_size=JOBS_PER_BATCH
        )
        if len(event["Records"]) != JOBS_PER_BATCH:
            raise RuntimeError(f"expected a batch of {JOBS_PER_BATCH} records, received {len(event['Records'])}")
        context = LambdaContextStub(timeout_seconds=120)
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):  # the worker's log lines and metrics, not the report's
            response = self.workers[worker].handle(event, context)
        elapsed = time.perf_counter() - started
        settle(self.services.sqs, self.queue_url, event, response)
        if response["batchItemFailures"]:
            raise RuntimeError(f"{worker} failed records of a benchmark batch: {response['batchItemFailures']}")
        self._empty_table()
        return elapsed

    def _empty_table(self) -> None:
        """Every batch starts on a table of the registrations alone: moto copies a whole table for each transaction
        (to roll it back), so a growing table would slow the worker's claims batch after batch, an emulator cost AWS
        does not have. The workspace and tenant items stay: jobs are accepted only for registered workspaces."""
        dynamodb, table = self.services.dynamodb, self.services.settings.table_name
        keys = [
            {"pk": item["pk"]}
            for page in dynamodb.get_paginator("scan").paginate(TableName=table, ProjectionExpression="pk")
            for item in page["Items"]
            if item["pk"]["S"].startswith("job#")
        ]
        for start in range(0, len(keys), 25):
            dynamodb.batch_write_item(
                RequestItems={table: [{"DeleteRequest": {"Key": key}} for key in keys[start : start + 25]]}
            )


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _bench(io_seconds: float) -> Iterator[_Bench]:
    _worker_imports()
    from aws_lambda_powertools import Logger, Metrics, Tracer

    from agent_jobs.registration import WorkspaceRegistration
    from agent_jobs.services import build_services
    from agent_jobs.settings import Settings
    from agent_jobs.workspaces import WorkspaceRegistry
    from agent_jobs_local.emulator import Emulator
    from agent_jobs_local.template import TemplateModel, load_template, provision
    from job_worker.processing import BatchWorker

    with Emulator() as emulator, tempfile.TemporaryDirectory(prefix="agent-jobs-bench-") as root:
        environment = {
            "AWS_ENDPOINT_URL": emulator.url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": REGION,
            "POWERTOOLS_TRACE_DISABLED": "true",
            "POWERTOOLS_SERVICE_NAME": "agent-jobs-bench",
            "POWERTOOLS_METRICS_NAMESPACE": "AgentJobsBench",
        }
        with _environment(environment):
            session = boto3.Session(region_name=REGION)
            model = TemplateModel(load_template(), stack_name=f"bench-{uuid.uuid4().hex[:8]}")
            resources = provision(session, model)
            template_env = model.function_environment("JobWorkerFunction", resources.references)
            base = {name.lower(): value for name, value in template_env.items()}
            workspaces = IoBoundWorkspaceStore(Path(root) / "workspaces", io_seconds)

            def worker(group_concurrency: int) -> BatchWorker:
                settings = Settings.model_validate({**base, "group_concurrency": group_concurrency})
                return BatchWorker(
                    services=build_services(settings, session),
                    workspaces=workspaces,
                    logger=Logger(service="agent-jobs-bench", level="WARNING"),
                    metrics=Metrics(namespace="AgentJobsBench"),
                    tracer=Tracer(disabled=True),
                )

            parallel = worker(int(base.get("group_concurrency", 10)))
            # Jobs are accepted only for a workspace their tenant registered (its remote is never used here).
            registry = WorkspaceRegistry(parallel.services.dynamodb, resources.table_name)
            for index in range(JOBS_PER_BATCH):
                registration = WorkspaceRegistration.model_validate(
                    {"remoteUrl": f"https://git.example.com/bench/gp-ws-{index}.git", "branch": f"agent/gp-ws-{index}"}
                )
                registry.register(f"gp-ws-{index}", registration, BENCH_TENANT)
            yield _Bench(
                services=parallel.services,
                queue_url=resources.queue_url,
                queue_arn=resources.queue_arn,
                workspaces=workspaces,
                workers={
                    "parallel": parallel,
                    "sequential": worker(1),
                    "naive": NaiveSequentialLoop(parallel.services, workspaces),
                },
            )


def measure(*, rounds: int, io_seconds: float) -> dict[tuple[str, int, float], float]:
    """Median seconds per batch for each (worker, groups, io seconds): workers "parallel", "sequential", "naive";
    groups 10 and 1 with `io_seconds` per job; and "parallel" and "naive" over 10 groups with no IO at all (the
    emulator's and the client's own time, which the IO-bound figures cannot go below)."""
    samples: dict[tuple[str, int, float], list[float]] = {}
    with _bench(io_seconds) as bench:
        bench.one_batch("parallel", JOBS_PER_BATCH, "warm")  # first connections and imports, not measured
        bench.one_batch("naive", JOBS_PER_BATCH, "warm")
        for round_ in range(rounds):
            runs = [(worker, groups, io_seconds) for groups in (JOBS_PER_BATCH, 1) for worker in WORKERS]
            runs += [("parallel", JOBS_PER_BATCH, 0.0), ("naive", JOBS_PER_BATCH, 0.0)]
            for worker, groups, io in runs:
                bench.workspaces.io_seconds = io
                seconds = bench.one_batch(worker, groups, f"{worker}-{groups}-{io}-{round_}")
                samples.setdefault((worker, groups, io), []).append(seconds)
    return {key: statistics.median(values) for key, values in samples.items()}


def run(quick: bool = False) -> list[Figure]:
    """The group-parallel figures; `quick`: one round with 100 ms of IO per job instead of five with 200 ms."""
    rounds, io_seconds = (1, 0.1) if quick else (5, 0.2)
    times = measure(rounds=rounds, io_seconds=io_seconds)
    setting = (
        f"a batch of {JOBS_PER_BATCH} apply_patch jobs, each waiting {io_seconds * 1000:.0f} ms on IO (a git push"
        f" stand-in); moto's server over HTTP; median of {rounds} round(s); seconds per batch"
    )

    def figure(
        name: str, worker: str, groups: int, baseline: str, *, goal: Goal | None, what: str, io: float = io_seconds
    ) -> Figure:
        value, base = times[(worker, groups, io)], times[(baseline, groups, io)]
        if abs(value / base - 1) <= 0.05:
            speed = f"{value / base:.2f}x the baseline's time (the same, within 5%)"
        elif value < base:
            speed = f"{base / value:.1f}x faster"
        else:
            speed = f"{value / base:.2f}x the baseline's time"
        return Figure(
            benchmark=BENCHMARK,
            name=name,
            value=round(value, 3),
            unit="s",
            command=COMMAND,
            baseline=round(base, 3),
            goal=goal,
            goal_on="ratio",
            note=f"{what}: {speed}; {setting}",
        )

    return [
        figure(
            "10 jobs over 10 groups, group-parallel worker vs the naive sequential loop",
            "parallel",
            JOBS_PER_BATCH,
            "naive",
            goal=SPEED_UP_GOAL,
            what="baseline: the naive sequential loop",
        ),
        figure(
            "10 jobs over 10 groups, group-parallel worker vs GROUP_CONCURRENCY=1",
            "parallel",
            JOBS_PER_BATCH,
            "sequential",
            goal=SPEED_UP_GOAL,
            what="baseline: the same worker one record at a time",
        ),
        figure(
            "10 jobs over 1 group, group-parallel worker vs GROUP_CONCURRENCY=1",
            "parallel",
            1,
            "sequential",
            goal=NO_SLOWER_GOAL,
            what="baseline: the same worker one record at a time",
        ),
        figure(
            "10 jobs over 1 group, group-parallel worker vs the naive sequential loop",
            "parallel",
            1,
            "naive",
            goal=NO_SLOWER_GOAL,
            what="baseline: the naive sequential loop (3 plain calls per job against the guard's transaction)",
        ),
        figure(
            "10 jobs over 10 groups without IO (the floor), group-parallel worker vs the naive sequential loop",
            "parallel",
            JOBS_PER_BATCH,
            "naive",
            goal=None,
            io=0.0,
            what=(
                "the same batch with no IO: the emulator's and the client's own time, which no IO-bound figure goes"
                " below (the emulator runs DynamoDB operations one at a time and copies the table for each"
                " transaction, where DynamoDB serves them concurrently)"
            ),
        ),
    ]


def main() -> None:
    """`python -m agent_jobs_bench.group_parallel [--quick]`: the figures of this benchmark alone."""
    for item in run(quick="--quick" in sys.argv[1:]):
        met = {None: "no goal", True: "met", False: "not met"}[item.met]
        print(f"{item.name}: {item.value} {item.unit}, baseline {item.baseline}, ratio {item.ratio:.3f} ({met})")
        print(f"    {item.note}")


if __name__ == "__main__":
    main()
