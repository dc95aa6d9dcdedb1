"""Batch enqueue's calls per job, asserted as counts (quick mode; they do not depend on the machine)."""

from __future__ import annotations

import pytest

from agent_jobs_bench import batch_enqueue
from agent_jobs_bench.figures import Figure


@pytest.fixture(scope="module")
def measured() -> batch_enqueue.Results:
    """One quick run of the four producers (40 jobs each over 10 workspaces), shared by the tests of this module."""
    return batch_enqueue.measure(quick=True)


def test_batch_enqueue_is_one_send_message_batch_per_ten_jobs(measured: batch_enqueue.Results) -> None:
    for result in (measured.batch, measured.route):
        assert result.accepted == result.jobs == 40
        assert result.sqs_calls == 4  # <= 0.1 SQS calls per job
        assert result.per_job(result.sqs_calls) <= batch_enqueue.SQS_CALLS_GOAL


def test_batch_enqueue_is_two_dynamodb_transactions_per_batch(measured: batch_enqueue.Results) -> None:
    # The QUEUED puts with one ownership check per workspace, then the message ids: two calls per 10 jobs.
    assert measured.batch.dynamodb_calls == measured.batch.dynamodb_write_calls == 8
    assert measured.batch.items_written == 80  # each job: its record, then its message id and SequenceNumber
    # The API adds its quotas to each batch: a COUNT query of the pending index per workspace (the batches span all
    # 10 workspaces) and one UpdateItem of the tenant's counter of jobs this second.
    assert measured.route.dynamodb_write_calls == 8 + 4
    assert measured.route.dynamodb_calls == 8 + 4 + 4 * 10
    assert measured.route.items_written == 80 + 4


def test_batch_enqueue_baselines_are_one_send_per_job(measured: batch_enqueue.Results) -> None:
    # One by one: the record and the message id per job, and each of the 10 workspaces' registration read once
    assert (measured.one_by_one.sqs_calls, measured.one_by_one.dynamodb_calls) == (40, 80 + 10)
    assert (measured.naive.sqs_calls, measured.naive.dynamodb_calls, measured.naive.dynamodb_write_calls) == (
        40,
        80,
        40,
    )


def test_batch_enqueue_figures_state_the_goal_and_how_to_reproduce_them(measured: batch_enqueue.Results) -> None:
    figures = {figure.name: figure for figure in batch_enqueue.figures(measured)}

    route = figures["SQS calls per job, POST /jobs:batch"]
    assert (route.value, route.baseline, route.met) == (0.1, 1.0, True)
    assert figures["SQS calls per job, enqueue_jobs"].met is True
    throughput = figures["Throughput, enqueue_jobs against enqueue_job one by one"]
    assert throughput.unit == "jobs/s"
    assert throughput.ratio is not None  # measured; its size is a timing, never asserted
    assert all(isinstance(figure, Figure) for figure in figures.values())
    assert {figure.command for figure in figures.values()} == {batch_enqueue.COMMAND}
    assert {figure.benchmark for figure in figures.values()} == {batch_enqueue.BENCHMARK}
