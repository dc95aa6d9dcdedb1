"""Batch enqueue against one-by-one enqueue and the naive producer, measured in the same run on moto's server (the
local emulator, every call over HTTP): SQS and DynamoDB calls per job, DynamoDB items written per job, and jobs/s.

Three producers submit the same number of fresh jobs over the same workspaces, each into its own provisioned copy of
the template's queue and table: `enqueue_jobs` in batches of 10 (what `POST /jobs:batch` runs), `enqueue_job` one job
at a time (what `POST /jobs` runs), and the naive producer (GetItem + PutItem + SendMessage per job, in a sequential
loop). The batch route itself is then driven in-process through the API handler, to count its calls as deployed.
Calls are counted from botocore's events on the clients the producers use; throughput is jobs over wall time on a
shared machine, so only its ratio (batch against one-by-one, same run) is meaningful.
"""

from __future__ import annotations

import sys
from typing import Any

from agent_jobs.producer import MAX_BATCH_JOBS
from agent_jobs_bench.batch_enqueue_measure import WORKSPACES, Measurement, Results, measure
from agent_jobs_bench.figures import Comparison, Figure, Goal

__all__ = ["BENCHMARK", "COMMAND", "SQS_CALLS_GOAL", "Results", "figures", "measure", "run"]

BENCHMARK = "Batch enqueue"
COMMAND = ".venv/bin/python -m agent_jobs_bench --only batch_enqueue"
SQS_CALLS_GOAL = 0.1


def figures(results: Results) -> list[Figure]:
    batch, one, naive, route = results.batch, results.one_by_one, results.naive, results.route
    size = f"{batch.jobs} jobs over {WORKSPACES} workspaces, batches of {MAX_BATCH_JOBS}"

    def figure(name: str, value: float, unit: str, baseline: float | None, **extra: Any) -> Figure:
        return Figure(BENCHMARK, name, round(value, 4), unit, COMMAND, baseline=baseline, **extra)

    return [
        figure(
            "SQS calls per job, POST /jobs:batch",
            route.per_job(route.sqs_calls),
            "calls/job",
            naive.per_job(naive.sqs_calls),
            goal=Goal(SQS_CALLS_GOAL, Comparison.AT_MOST, f"<= {SQS_CALLS_GOAL} SQS calls per job"),
            note=f"the batch route through the API handler; baseline: the naive producer; {size}",
        ),
        figure(
            "SQS calls per job, enqueue_jobs",
            batch.per_job(batch.sqs_calls),
            "calls/job",
            naive.per_job(naive.sqs_calls),
            goal=Goal(SQS_CALLS_GOAL, Comparison.AT_MOST, f"<= {SQS_CALLS_GOAL} SQS calls per job"),
            note="baseline: the naive producer",
        ),
        figure(
            "SQS calls per job, enqueue_job one by one",
            one.per_job(one.sqs_calls),
            "calls/job",
            naive.per_job(naive.sqs_calls),
            note="POST /jobs; baseline: the naive producer",
        ),
        figure(
            "DynamoDB calls per job, enqueue_jobs",
            batch.per_job(batch.dynamodb_calls),
            "calls/job",
            naive.per_job(naive.dynamodb_calls),
            note="one transaction of the QUEUED puts and workspace checks, one of the message-id updates, per batch",
        ),
        figure(
            "DynamoDB calls per job, enqueue_job one by one",
            one.per_job(one.dynamodb_calls),
            "calls/job",
            naive.per_job(naive.dynamodb_calls),
            note="the QUEUED put and the message-id update per job; each workspace's registration read once, then kept",
        ),
        figure(
            "DynamoDB write calls per job, enqueue_jobs",
            batch.per_job(batch.dynamodb_write_calls),
            "calls/job",
            naive.per_job(naive.dynamodb_write_calls),
        ),
        figure(
            "DynamoDB items written per job, enqueue_jobs",
            batch.per_job(batch.items_written),
            "items/job",
            naive.per_job(naive.items_written),
            note="the QUEUED record, then its message id and SequenceNumber (the naive producer records neither "
            "and keeps no workspace ownership)",
        ),
        figure(
            "Throughput, enqueue_jobs against enqueue_job one by one",
            batch.jobs_per_second,
            "jobs/s",
            one.jobs_per_second,
            note=f"ratio = batch / one-by-one, same run; one-by-one {one.jobs_per_second:.1f} jobs/s, naive "
            f"{naive.jobs_per_second:.1f} jobs/s, batch route {route.jobs_per_second:.1f} jobs/s (moto's server, "
            "a shared machine)",
        ),
        figure(
            "Time per job inside AWS calls (the emulator), enqueue_jobs",
            1000 * sum(batch.seconds_by_operation.values()) / batch.jobs,
            "ms/job",
            1000 * sum(one.seconds_by_operation.values()) / one.jobs,
            note="baseline: enqueue_job one by one; by operation, batch "
            + _breakdown(batch)
            + "; one by one "
            + _breakdown(one)
            + " (moto copies the table for each transaction and handles a batch entry by entry, so the emulator "
            "caps the gain that fewer round trips give against AWS)",
        ),
        figure(
            "Throughput, enqueue_jobs against the naive producer",
            batch.jobs_per_second,
            "jobs/s",
            naive.jobs_per_second,
            note="ratio = batch / naive, same run",
        ),
    ]


def _breakdown(measurement: Measurement) -> str:
    return ", ".join(
        f"{name} {1000 * seconds / measurement.jobs:.1f} ms/job"
        for name, seconds in sorted(measurement.seconds_by_operation.items())
    )


def run(quick: bool = False) -> list[Figure]:
    """The batch-enqueue figures (quick: 40 jobs per producer instead of 200)."""
    return figures(measure(quick))


if __name__ == "__main__":
    for result in run(quick="--quick" in sys.argv):
        print(
            f"{result.name}: {result.value} {result.unit} (baseline {result.baseline}, ratio {result.ratio}, "
            f"met {result.met})"
        )
