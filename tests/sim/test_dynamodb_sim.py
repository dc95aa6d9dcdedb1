"""The simulated DynamoDB on its own: index lag, the template's table, the product's guard on it, its cost."""

from __future__ import annotations

import time
from typing import Any

import pytest
from botocore.exceptions import ClientError

from agent_jobs.guard import AcceptOutcome, ClaimOutcome, JobGuard
from agent_jobs.models import JobStatus
from agent_jobs.registration import WorkspaceRegistration
from agent_jobs.workspaces import WorkspaceRegistry
from agent_jobs_sim.dynamodb import SimDynamoDB, create_tables_from_template
from agent_jobs_sim.dynamodb.expressions import parse_condition
from tests.conftest import make_message
from tests.sim.conftest import table_definition


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def by_group(db: SimDynamoDB) -> list[tuple[str, Any]]:
    page = db.query(
        TableName="t",
        IndexName="byGroup",
        KeyConditionExpression="grp = :g",
        ExpressionAttributeValues={":g": {"S": "g"}},
    )
    return [(item["pk"]["S"], item.get("note", {}).get("S")) for item in page["Items"]]


def write(db: SimDynamoDB, pk: str, note: str, *, grouped: bool = True) -> None:
    item = {"pk": {"S": pk}, "sk": {"N": "1"}, "note": {"S": note}}
    if grouped:
        item.update({"grp": {"S": "g"}, "rank": {"N": "1"}})
    db.put_item(TableName="t", Item=item)


def test_index_write_is_invisible_until_its_lag_has_passed() -> None:
    clock = Clock()
    db = SimDynamoDB(clock, index_lag=lambda table, index: 2.0)
    db.create_table(**table_definition("t"))
    write(db, "a", "first")
    # The table has it at once; the index only once the lag has passed.
    assert db.get_item(TableName="t", Key={"pk": {"S": "a"}, "sk": {"N": "1"}})["Item"]["note"] == {"S": "first"}
    assert by_group(db) == []
    assert db.next_index_update() == 1_002.0
    clock.now = 1_001.999
    assert by_group(db) == []
    clock.now = 1_002.0
    # A scheduler that advanced the clock is never told of an update that is already due.
    assert db.next_index_update() is None
    assert by_group(db) == [("a", "first")]


def test_index_keeps_one_items_writes_in_order() -> None:
    # Given a first write that takes 5 s to reach the index and a second that would take 1 s
    clock = Clock()
    lags = iter([5.0, 1.0])
    db = SimDynamoDB(clock, index_lag=lambda table, index: next(lags))
    db.create_table(**table_definition("t"))
    write(db, "a", "first")
    clock.now += 1
    write(db, "a", "second")
    # Then the second never shows before the first: both arrive when the first does, the later one winning
    clock.now = 1_003.0
    assert by_group(db) == []
    clock.now = 1_005.0
    assert by_group(db) == [("a", "second")]


def test_index_removes_an_item_that_loses_its_key_after_the_lag() -> None:
    clock = Clock()
    db = SimDynamoDB(clock, index_lag=lambda table, index: 1.0 if index == "byGroup" else 0.0)
    db.create_table(**table_definition("t"))
    write(db, "a", "first")
    clock.now += 1
    assert by_group(db) == [("a", "first")]
    write(db, "a", "ungrouped", grouped=False)  # no longer carries the index's keys: leaves the sparse index
    assert by_group(db) == [("a", "first")]
    clock.now += 1
    assert by_group(db) == []


def test_lag_is_asked_per_write_and_per_index() -> None:
    asked: list[tuple[str, str]] = []

    def lag(table: str, index: str) -> float:
        asked.append((table, index))
        return 0.0

    db = SimDynamoDB(lambda: 0.0, index_lag=lag)
    db.create_table(**table_definition("t"))
    write(db, "a", "first")  # in byGroup only: byTag's keys are absent
    db.put_item(TableName="t", Item={"pk": {"S": "b"}, "sk": {"N": "1"}, "tag": {"S": "x"}})
    assert asked == [("t", "byGroup"), ("t", "byTag")]


def test_table_from_the_template_is_accepted() -> None:
    db = SimDynamoDB(lambda: 0.0)
    name = create_tables_from_template(db)
    table = db.describe_table(TableName=name)["Table"]
    assert table["TableStatus"] == "ACTIVE"
    assert table["KeySchema"] == [{"AttributeName": "pk", "KeyType": "HASH"}]
    assert {index["IndexName"] for index in table["GlobalSecondaryIndexes"]} >= {"byWorkspace", "parkedByWorkspace"}
    with pytest.raises(ClientError) as error:
        create_tables_from_template(db)
    assert error.value.response["Error"]["Code"] == "ResourceInUseException"


def test_key_condition_of_another_type_than_the_key_is_refused() -> None:
    db = SimDynamoDB(lambda: 0.0)
    db.create_table(**table_definition("t"))
    with pytest.raises(ClientError) as error:
        db.query(
            TableName="t",
            KeyConditionExpression="pk = :p AND sk > :s",
            ExpressionAttributeValues={":p": {"S": "q"}, ":s": {"S": "1"}},  # a string for a number key
        )
    assert error.value.response["Error"]["Code"] == "ValidationException"
    assert "does not match schema type" in error.value.response["Error"]["Message"]


def error_of(call: Any) -> dict[str, Any]:
    with pytest.raises(ClientError) as error:
        call()
    return dict(error.value.response)


def test_transaction_limits_and_update_errors() -> None:
    db = SimDynamoDB(lambda: 0.0)
    db.create_table(**table_definition("t"))
    write(db, "a", "text")
    checks = [
        {
            "ConditionCheck": {
                "TableName": "t",
                "Key": {"pk": {"S": f"k{i}"}, "sk": {"N": "1"}},
                "ConditionExpression": "attribute_not_exists(pk)",
            }
        }
        for i in range(101)
    ]
    # More than 100 actions: refused as a whole.
    assert error_of(lambda: db.transact_write_items(TransactItems=checks))["Error"]["Code"] == "ValidationException"
    assert db.transact_write_items(TransactItems=checks[:100]) == {}
    # An update that cannot apply to its item (arithmetic on a string) cancels with a ValidationError reason.
    add_to_text = {
        "Update": {
            "TableName": "t",
            "Key": {"pk": {"S": "a"}, "sk": {"N": "1"}},
            "UpdateExpression": "SET note = note + :one",
            "ExpressionAttributeValues": {":one": {"N": "1"}},
        }
    }
    answer = error_of(lambda: db.transact_write_items(TransactItems=[checks[0], add_to_text]))
    assert [reason["Code"] for reason in answer["CancellationReasons"]] == ["None", "ValidationError"]
    assert answer["Error"]["Code"] == "TransactionCanceledException"


def test_updated_return_values_name_the_attributes_the_update_touched() -> None:
    db = SimDynamoDB(lambda: 0.0)
    db.create_table(**table_definition("t"))
    write(db, "a", "old")
    request = {
        "TableName": "t",
        "Key": {"pk": {"S": "a"}, "sk": {"N": "1"}},
        "UpdateExpression": "SET note = :new, hits = :one",
        "ExpressionAttributeValues": {":new": {"S": "new"}, ":one": {"N": "1"}},
    }
    assert db.update_item(**request, ReturnValues="UPDATED_OLD") == {"Attributes": {"note": {"S": "old"}}}
    assert db.update_item(**request, ReturnValues="UPDATED_NEW") == {
        "Attributes": {"hits": {"N": "1"}, "note": {"S": "new"}}
    }
    assert db.update_item(**request) == {}
    assert (
        error_of(lambda: db.put_item(TableName="t", Item={"pk": {"S": "b"}}))["Error"]["Code"] == "ValidationException"
    )
    assert error_of(lambda: db.get_item(TableName="nope", Key={}))["Error"]["Code"] == "ResourceNotFoundException"


@pytest.fixture
def guard() -> tuple[JobGuard, SimDynamoDB, str]:
    clock = Clock()
    db = SimDynamoDB(clock)
    table = create_tables_from_template(db)
    registration = WorkspaceRegistration.model_validate(
        {"remoteUrl": "https://git.example.com/tenant-1/ws-a.git", "branch": "agent/ws-a"}
    )
    WorkspaceRegistry(db, table).register("ws-a", registration, "tenant-1")  # type: ignore[arg-type]
    guard = JobGuard(db, table, max_attempts=3, clock=lambda: int(clock() * 1000))  # type: ignore[arg-type]
    return guard, db, table


def test_guard_accepts_claims_and_completes_on_the_simulation(guard: tuple[JobGuard, SimDynamoDB, str]) -> None:
    store, _, _ = guard
    message = make_message("j1")
    assert store.record_accepted(message).outcome is AcceptOutcome.NEW
    assert store.record_accepted(message).outcome in (AcceptOutcome.UNSENT, AcceptOutcome.EXISTING)
    claim = store.claim(message, message_id="m-1", sequence_number="100", remaining_ms=60_000)
    assert claim.outcome is ClaimOutcome.CLAIMED
    assert claim.lease is not None
    # A second delivery while the lease is held is busy; after completion, a duplicate.
    assert (
        store.claim(message, message_id="m-1", sequence_number="100", remaining_ms=60_000).outcome is ClaimOutcome.BUSY
    )
    assert store.complete(claim.lease, {"ok": True}) is True
    assert (
        store.claim(message, message_id="m-2", sequence_number="101", remaining_ms=60_000).outcome
        is ClaimOutcome.DUPLICATE
    )
    job = store.get_job("tenant-1", "j1")
    assert job is not None
    assert job["status"] == JobStatus.SUCCEEDED
    assert job["result"] == {"ok": True}
    assert store.complete(claim.lease, {"ok": False}) is False


def test_guard_refuses_a_job_for_another_tenants_workspace(guard: tuple[JobGuard, SimDynamoDB, str]) -> None:
    store, _, _ = guard
    assert store.record_accepted(make_message("j2", tenant_id="tenant-2")).outcome is AcceptOutcome.WORKSPACE_FORBIDDEN


def test_conditional_update_cost() -> None:
    db = SimDynamoDB(lambda: 0.0)
    db.create_table(**table_definition("t"))
    db.put_item(
        TableName="t", Item={"pk": {"S": "a"}, "sk": {"N": "1"}, "n": {"N": "0"}, "grp": {"S": "g"}, "rank": {"N": "1"}}
    )
    request = {
        "TableName": "t",
        "Key": {"pk": {"S": "a"}, "sk": {"N": "1"}},
        "UpdateExpression": "SET n = n + :one, note = :note",
        "ConditionExpression": "attribute_exists(pk) AND n < :max",
        "ExpressionAttributeValues": {":one": {"N": "1"}, ":max": {"N": "1000000"}, ":note": {"S": "x"}},
    }
    calls = 10_000
    started = time.perf_counter()
    for _ in range(calls):
        db.update_item(**request)
    per_call_us = (time.perf_counter() - started) / calls * 1e6
    print(f"conditional update_item: {per_call_us:.1f} us per call")
    assert db.items("t")[0]["n"] == {"N": str(calls)}
    # Parsed once per distinct expression string.
    assert parse_condition.cache_info().hits > 0
