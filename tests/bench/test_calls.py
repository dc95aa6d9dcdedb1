"""Calls per job, for Agent Jobs and for the naive baseline, asserted as counts (they do not depend on the machine)."""

from __future__ import annotations

import pytest

from agent_jobs_bench import calls
from agent_jobs_bench.capacity import CallRecorder, attribute_size, item_size
from agent_jobs_bench.stack import provision_stack


@pytest.fixture(scope="module")
def measured() -> calls.Sides:
    """One quick run of both sides (2 jobs per path), shared by the tests of this module."""
    return calls.measure(quick=True)


def test_calls_agent_jobs_happy_path_is_two_dynamodb_writes_a_read_and_a_query_in_the_worker(
    measured: calls.Sides,
) -> None:
    happy = measured.product.happy
    # Worker: the claim and the completion (plain conditional writes, no transaction), the workspace read after the
    # claim (halted?) and the pending index's query (jobs ahead left unsettled?); once for the batch of two, the
    # template's tenant share checked (a query of the running index, a read of the tenant's own share).
    assert happy.dynamodb_calls("worker") == 4 + 1
    assert happy.operations("worker") == "1.5 GetItem, 1.5 Query, 2 UpdateItem"
    # Enqueue: the QUEUED record (one conditional PutItem), then the message id SQS answered; the workspace's
    # registration is read once for the run's jobs (its owner is kept: it never changes).
    assert happy.jobs == 2
    assert happy.dynamodb_calls("producer") == 2.5
    assert happy.operations("producer") == "0.5 GetItem, 1 PutItem, 1 UpdateItem"
    assert happy.sqs_calls() == 1
    assert happy.operations(service="sqs") == "1 SendMessage"
    # Worker: the workspace read strongly consistent (1), the pending index's empty range eventually consistent
    # (0.5), the share's query and read eventually consistent (0.5 each, over two jobs); enqueue: the registration,
    # strongly consistent, once for the two jobs.
    assert happy.rcu("worker") == 1.5 + 0.5
    assert happy.rcu("producer") == 0.5


def test_calls_naive_happy_path_reads_before_each_write(measured: calls.Sides) -> None:
    happy = measured.naive.happy
    assert happy.dynamodb_calls("worker") == 3
    assert happy.operations("worker") == "1 GetItem, 2 PutItem"
    assert happy.dynamodb_calls("producer") == 2
    assert happy.operations("producer") == "1 GetItem, 1 PutItem"
    assert happy.sqs_calls() == 1


def test_calls_duplicate_delivery_is_one_call_for_both(measured: calls.Sides) -> None:
    product, naive = measured.product.duplicate, measured.naive.duplicate
    # Agent Jobs: one failed claim that returns the old item (SUCCEEDED): no read after it; the tenant share's query,
    # before any claim, once for the batch of two.
    assert product.dynamodb_calls() == 1.5
    assert product.operations() == "0.5 Query, 1 UpdateItem (ConditionalCheckFailedException)"
    assert product.wcu() + product.rcu() == 1.25
    assert naive.dynamodb_calls() == 1
    assert naive.operations() == "1 GetItem"
    assert product.sqs_calls() == naive.sqs_calls() == 0


def test_calls_retry_counts(measured: calls.Sides) -> None:
    product, naive = measured.product.retry, measured.naive.retry
    # The failed record's visibility is shortened once.
    # Enqueue 3 (one workspace per job: its registration read), then (claim, workspace read, query, fail) and
    # (claim, workspace read, query, complete); the tenant share's query in each of the two batches.
    assert product.dynamodb_calls() == 11 + 2
    assert product.sqs_calls() == 2
    assert product.operations(service="sqs") == "1 SendMessage, 1 ChangeMessageVisibilityBatch"
    # Enqueue 2 + (GetItem, PutItem IN_FLIGHT) + (GetItem, PutItem IN_FLIGHT, PutItem SUCCEEDED).
    assert naive.dynamodb_calls() == 7
    assert naive.sqs_calls() == 1


def test_calls_capacity_units_per_job(measured: calls.Sides) -> None:
    # Items under 1 KB: a plain write costs 1 WCU, and no write is a transaction.
    assert measured.product.happy.wcu("worker") == 2
    assert measured.product.happy.wcu("producer") == 2
    assert measured.product.retry.wcu() == 6  # enqueue 2, a failed attempt 2, a successful one 2
    assert measured.naive.happy.wcu("worker") == 2
    assert measured.naive.happy.wcu("producer") == 1
    assert measured.naive.happy.rcu() == 1  # two eventually consistent GetItems of half an RCU
    assert all(size < 1024 for size in measured.product.item_sizes.values())


def test_calls_figures_carry_the_goals(measured: calls.Sides) -> None:
    figures = {figure.name: figure for figure in calls.figures(measured)}
    worker_calls = figures["DynamoDB calls per job, happy path (worker)"]
    assert (worker_calls.value, worker_calls.baseline, worker_calls.met) == (5, 3, False)
    # the tenant share's query (a batch of two here) puts a duplicate over its goal of one call and one unit
    assert figures["DynamoDB calls per job, duplicate delivery"].met is False
    assert figures["WCU + RCU per job, duplicate delivery"].met is False
    worker_wcu = figures["WCU per job, happy path (worker)"]
    assert (worker_wcu.value, worker_wcu.met) == (2, True)
    end_to_end = figures["WCU per job, happy path (enqueue + worker)"]
    assert (end_to_end.value, end_to_end.goal, end_to_end.met) == (4, calls.END_TO_END_WCU_GOAL, False)
    assert all(figure.command == calls.COMMAND for figure in figures.values())
    assert {
        "Job item size, accepted (QUEUED)",
        "Job item size, succeeded after the retry (SUCCEEDED)",
    } <= figures.keys()


def test_item_size_follows_dynamodbs_formula() -> None:
    assert attribute_size({"S": "héllo"}) == 6  # UTF-8 bytes
    assert attribute_size({"N": "12345"}) == 4  # 3 bytes for 5 significant digits + 1
    assert attribute_size({"N": "1000"}) == 2  # trailing zeros do not count
    assert attribute_size({"BOOL": True}) == 1
    # A list: 3 bytes + 1 per element + the elements; a map also counts its keys.
    assert attribute_size({"L": [{"S": "ab"}, {"S": "c"}]}) == 3 + (1 + 2) + (1 + 1)
    assert attribute_size({"M": {"at": {"N": "7"}}}) == 3 + 1 + 2 + 2
    assert item_size({"pk": {"S": "job#1"}, "status": {"S": "QUEUED"}}) == 2 + 5 + 6 + 6
    assert item_size(None) == 0


def test_moto_server_does_not_report_dynamodbs_consumed_capacity(moto_server: str) -> None:
    """Why the benchmark computes capacity: if this fails, moto reports it now, and the note should say so."""
    stack = provision_stack(moto_server)
    client = stack.session.client("dynamodb", endpoint_url=moto_server)
    reader = stack.session.client("dynamodb", endpoint_url=moto_server)
    recorder = CallRecorder(reader, stack.table_name)
    recorder.attach(client)
    table = stack.table_name
    # Given a 3 KB item (3 WCU to write, 1 RCU to read strongly consistent in DynamoDB)
    client.put_item(TableName=table, Item={"pk": {"S": "big"}, "blob": {"S": "x" * 3000}})
    client.get_item(TableName=table, Key={"pk": {"S": "big"}}, ConsistentRead=True)
    client.update_item(
        TableName=table,
        Key={"pk": {"S": "big"}},
        UpdateExpression="SET n = :n",
        ExpressionAttributeValues={":n": {"N": "1"}},
    )
    client.transact_write_items(
        TransactItems=[
            {"Put": {"TableName": table, "Item": {"pk": {"S": "small"}}}},
            {
                "ConditionCheck": {
                    "TableName": table,
                    "Key": {"pk": {"S": "none"}},
                    "ConditionExpression": "attribute_not_exists(pk)",
                }
            },
        ]
    )
    put, get, update, transaction = recorder.calls
    assert (put.reported_total, put.computed_wcu) == (1.0, 3)
    assert (get.reported_total, get.computed_rcu) == (0.5, 1)
    assert (update.reported_total, update.computed_wcu) == (0.5, 3)
    assert (transaction.reported_total, transaction.computed_wcu) == (None, 4)
