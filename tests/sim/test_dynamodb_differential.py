"""The simulated DynamoDB against moto's server: the same requests, the same answers (items, error codes,
cancellation reasons, pages). Where moto departs from DynamoDB's documented behaviour, the test says so: it asserts
that the simulation does what DynamoDB documents and that moto does the other thing, so it fails if moto changes."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from botocore.exceptions import ClientError, ParamValidationError

from tests.sim.conftest import Pair, error_message, outcome

Outcomes = list[dict[str, Any]]


def s(text: str) -> dict[str, str]:
    return {"S": text}


def n(number: int | str) -> dict[str, str]:
    return {"N": str(number)}


def key(pk: str, sk: int) -> dict[str, Any]:
    return {"pk": s(pk), "sk": n(sk)}


def seed(db: Any, table: str) -> None:
    """Six items: a, b and c of partition p (b and c in group g), and three of partition q (two in group g)."""
    rows: list[tuple[str, int, dict[str, Any]]] = [
        ("p", 1, {"grp": s("g"), "rank": n(3), "note": s("one"), "body": s("x" * 10), "tag": s("t")}),
        ("p", 2, {"grp": s("g"), "rank": n(1), "note": s("two"), "count": n(5), "tags": {"SS": ["a", "b"]}}),
        ("p", 3, {"count": n(10), "doc": {"M": {"parts": {"L": [n(1), s("two")]}, "flag": {"BOOL": True}}}}),
        ("q", 1, {"grp": s("g"), "rank": n(2), "count": n(7), "tag": s("t")}),
        ("q", 2, {"grp": s("h"), "rank": n(1), "count": n(-1), "none": {"NULL": True}}),
        ("q", 10, {"grp": s("g"), "rank": n(2), "note": s("ten"), "count": n("7.50")}),
    ]
    for pk, sk, attributes in rows:
        db.put_item(TableName=table, Item={**key(pk, sk), **attributes})


def test_conditions_and_filters_match_moto(pair: Pair) -> None:
    filters = [
        ("#c = :v", {"#c": "count"}, {":v": n("7.5")}),
        ("#c <> :v", {"#c": "count"}, {":v": n(7)}),
        ("#c BETWEEN :lo AND :hi", {"#c": "count"}, {":lo": n(0), ":hi": n(9)}),
        ("#c > :v OR note = :note", {"#c": "count"}, {":v": n(6), ":note": s("one")}),
        ("NOT (#c < :v)", {"#c": "count"}, {":v": n(6)}),
        ("#c IN (:a, :b)", {"#c": "count"}, {":a": n(10), ":b": n(-1)}),
        ("attribute_not_exists(#c) AND attribute_exists(grp)", {"#c": "count"}, None),
        ("attribute_type(#c, :t)", {"#c": "none"}, {":t": s("NULL")}),
        ("begins_with(note, :p)", None, {":p": s("t")}),
        ("contains(tags, :e) OR contains(body, :x)", None, {":e": s("b"), ":x": s("xx")}),
        ("doc.parts[1] = :v AND doc.flag = :t", None, {":v": s("two"), ":t": {"BOOL": True}}),
        ("absent < :v", None, {":v": n(1)}),  # a missing attribute compared: false
        ("#c < :v AND items = :v", {"#c": "count"}, {":v": n(1)}),  # a reserved word
    ]

    def scenario(db: Any, table: str) -> Outcomes:
        seed(db, table)
        results = []
        for expression, names, values in filters:
            request: dict[str, Any] = {"TableName": table, "FilterExpression": expression}
            if names:
                request["ExpressionAttributeNames"] = names
            if values:
                request["ExpressionAttributeValues"] = values
            results.append(outcome(partial(db.scan, **request)))
        return results

    sim, moto = pair.both(scenario)
    for (expression, _, _), mine, theirs in zip(filters, sim, moto, strict=True):
        assert mine == theirs, expression
    assert [len(r["Items"]) for r in sim[:3]] == [1, 5, 3]
    assert sim[-1] == {"error": "ValidationException"}


def test_updates_match_moto(pair: Pair) -> None:
    updates: list[tuple[str, dict[str, str] | None, dict[str, Any] | None, str]] = [
        ("SET #c = #c + :one, note = :note", {"#c": "count"}, {":one": n(1), ":note": s("new")}, "ALL_NEW"),
        ("SET hits = if_not_exists(hits, :zero) + :one", None, {":zero": n(0), ":one": n(1)}, "UPDATED_NEW"),
        ("SET hits = if_not_exists(hits, :zero) + :one", None, {":zero": n(0), ":one": n(1)}, "UPDATED_OLD"),
        (
            "SET entries = list_append(if_not_exists(entries, :empty), :more)",
            None,
            {":empty": {"L": []}, ":more": {"L": [n(1)]}},
            "ALL_NEW",
        ),
        ("REMOVE note, body ADD tags :more", None, {":more": {"SS": ["c"]}}, "ALL_OLD"),
        ("ADD tags :more DELETE spare :gone", None, {":more": {"SS": ["a", "z"]}, ":gone": {"NS": ["1"]}}, "ALL_NEW"),
        ("DELETE tags :all", None, {":all": {"SS": ["a", "b", "c", "z"]}}, "ALL_NEW"),
        ("ADD amount :n SET doc = :doc", None, {":n": n("2.5"), ":doc": {"M": {"a": {"L": [n(1)]}}}}, "ALL_NEW"),
        ("SET doc.a[0] = :v, doc.b = :v", None, {":v": s("z")}, "ALL_NEW"),
        ("SET #c = #c - :n", {"#c": "count"}, {":n": n(3)}, "UPDATED_NEW"),
        ("SET note = :a, note = :b", None, {":a": s("a"), ":b": s("b")}, "NONE"),  # overlapping paths
        ("SET pk = :v", None, {":v": s("x")}, "NONE"),  # a key attribute
        ("SET note = nothing", None, None, "NONE"),  # an attribute that does not exist
        ("SET note = note + :n", None, {":n": n(1)}, "NONE"),  # a string in arithmetic
        ("SET rank = :v", None, {":v": s("not a number")}, "NONE"),  # an index key of the wrong type
        ("SET a = :v REMOVE b SET c = :v", None, {":v": s("x")}, "NONE"),  # a clause twice
    ]

    def scenario(db: Any, table: str) -> Outcomes:
        seed(db, table)
        results = []
        for expression, names, values, returned in updates:
            request: dict[str, Any] = {
                "TableName": table,
                "Key": key("p", 2),
                "UpdateExpression": expression,
                "ReturnValues": returned,
            }
            if names:
                request["ExpressionAttributeNames"] = names
            if values:
                request["ExpressionAttributeValues"] = values
            results.append(outcome(partial(db.update_item, **request)))
        results.append(outcome(lambda: db.get_item(TableName=table, Key=key("p", 2))))
        # An update of an item that does not exist creates it from its key.
        results.append(
            outcome(
                lambda: db.update_item(
                    TableName=table,
                    Key=key("new", 1),
                    UpdateExpression="ADD hits :one",
                    ExpressionAttributeValues={":one": n(1)},
                    ReturnValues="ALL_NEW",
                )
            )
        )
        return results

    sim, moto = pair.both(scenario)
    for (expression, _, _, _), mine, theirs in zip([*updates, ("get",) * 4, ("create",) * 4], sim, moto, strict=True):
        assert mine == theirs, expression
    assert [r.get("error") for r in sim[10:]] == ["ValidationException"] * 6 + [None, None]


def test_conditional_failure_returns_the_old_item(pair: Pair) -> None:
    def scenario(db: Any, table: str) -> Outcomes:
        seed(db, table)
        results = []
        for mode in ("ALL_OLD", "NONE"):
            results.append(
                outcome(
                    partial(
                        db.update_item,
                        TableName=table,
                        Key=key("p", 2),
                        UpdateExpression="SET note = :v",
                        ConditionExpression="#c > :big",
                        ExpressionAttributeNames={"#c": "count"},
                        ExpressionAttributeValues={":v": s("no"), ":big": n(100)},
                        ReturnValuesOnConditionCheckFailure=mode,
                    )
                )
            )
        results.append(
            outcome(
                lambda: db.put_item(
                    TableName=table,
                    Item=key("p", 1),
                    ConditionExpression="attribute_not_exists(pk)",
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
            )
        )
        results.append(
            outcome(
                lambda: db.delete_item(
                    TableName=table,
                    Key=key("p", 1),
                    ConditionExpression="note = :v",
                    ExpressionAttributeValues={":v": s("one")},
                    ReturnValues="ALL_OLD",
                )
            )
        )
        results.append(outcome(lambda: db.get_item(TableName=table, Key=key("p", 1))))
        return results

    sim, moto = pair.both(scenario)
    assert sim == moto
    assert sim[0]["error"] == "ConditionalCheckFailedException"
    assert sim[0]["item"]["note"] == "two"
    assert "item" not in sim[1]
    assert sim[2]["item"]["note"] == "one"
    assert sim[4] == {}


def test_transaction_cancellation_reasons_match_moto(pair: Pair) -> None:
    def scenario(db: Any, table: str) -> Outcomes:
        seed(db, table)
        actions: list[dict[str, Any]] = [
            {
                "Put": {
                    "TableName": table,
                    "Item": {**key("t", 1), "note": s("new")},
                    "ConditionExpression": "attribute_not_exists(pk)",
                }
            },
            {
                "Update": {
                    "TableName": table,
                    "Key": key("p", 2),
                    "UpdateExpression": "SET note = :v",
                    "ConditionExpression": "note = :other",
                    "ExpressionAttributeValues": {":v": s("x"), ":other": s("other")},
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                }
            },
            {
                "ConditionCheck": {
                    "TableName": table,
                    "Key": key("p", 1),
                    "ConditionExpression": "attribute_exists(grp)",
                }
            },
            {
                "Delete": {
                    "TableName": table,
                    "Key": key("q", 1),
                    "ConditionExpression": "attribute_not_exists(grp)",
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                }
            },
            {"Delete": {"TableName": table, "Key": key("q", 2), "ConditionExpression": "attribute_exists(nothing)"}},
        ]
        results = [outcome(lambda: db.transact_write_items(TransactItems=actions))]
        # Nothing of a cancelled transaction is written.
        results.append(outcome(lambda: db.get_item(TableName=table, Key=key("t", 1))))
        # Two actions on one item.
        twice = [actions[2], {"Delete": {"TableName": table, "Key": key("p", 1)}}]
        results.append(outcome(lambda: db.transact_write_items(TransactItems=twice)))
        # All conditions hold: every action applies.
        fine = [actions[0], actions[2], {"Delete": {"TableName": table, "Key": key("q", 2)}}]
        results.append(outcome(lambda: db.transact_write_items(TransactItems=fine)))
        results.append(outcome(lambda: db.scan(TableName=table, ProjectionExpression="pk, sk")))
        return results

    sim, moto = pair.both(scenario)
    assert sim == moto
    assert [reason["Code"] for reason in sim[0]["reasons"]] == [
        "None",
        "ConditionalCheckFailed",
        "None",
        "ConditionalCheckFailed",
        "ConditionalCheckFailed",
    ]
    assert sim[0]["reasons"][1]["Item"]["note"] == "two"
    assert "Item" not in sim[0]["reasons"][4]
    assert sim[2] == {"error": "ValidationException"}


def test_unused_and_undefined_placeholders_are_refused_like_moto(pair: Pair) -> None:
    requests: list[dict[str, Any]] = [
        {"UpdateExpression": "SET note = :v", "ExpressionAttributeValues": {":v": s("a"), ":x": s("b")}},
        {
            "UpdateExpression": "SET note = :v",
            "ExpressionAttributeValues": {":v": s("a")},
            "ExpressionAttributeNames": {"#n": "note"},
        },
        {"UpdateExpression": "SET note = :v", "ExpressionAttributeValues": {":w": s("a")}},
        {
            "UpdateExpression": "SET #n = :v",
            "ExpressionAttributeNames": {"#m": "note"},
            "ExpressionAttributeValues": {":v": s("a")},
        },
        {
            "UpdateExpression": "SET note = :v",
            "ConditionExpression": "#c = :c",
            "ExpressionAttributeNames": {"#c": "count"},
            "ExpressionAttributeValues": {":v": s("a"), ":c": n(5)},
        },
    ]

    def scenario(db: Any, table: str) -> Outcomes:
        seed(db, table)
        return [outcome(partial(db.update_item, TableName=table, Key=key("p", 2), **r)) for r in requests]

    sim, moto = pair.both(scenario)
    assert sim == moto
    assert [r.get("error") for r in sim] == ["ValidationException"] * 4 + [None]
    unused = error_message(lambda: pair.sim.update_item(TableName=pair.sim_table, Key=key("p", 2), **requests[0]))
    assert unused == "Value provided in ExpressionAttributeValues unused in expressions: keys: {:x}"
    theirs = error_message(lambda: pair.moto.update_item(TableName=pair.moto_table, Key=key("p", 2), **requests[0]))
    assert theirs.endswith(unused)


def test_sparse_index_queries_match_moto(pair: Pair) -> None:
    def scenario(db: Any, table: str) -> Outcomes:
        seed(db, table)
        query = {"TableName": table, "IndexName": "byGroup", "ExpressionAttributeValues": {":g": s("g"), ":r": n(2)}}
        return [
            outcome(
                lambda: db.query(
                    **query, KeyConditionExpression="grp = :g AND #r >= :r", ExpressionAttributeNames={"#r": "rank"}
                )
            ),
            outcome(
                lambda: db.query(
                    **{**query, "ExpressionAttributeValues": {":g": s("g")}},
                    KeyConditionExpression="grp = :g",
                    ScanIndexForward=False,
                )
            ),
            outcome(
                lambda: db.query(
                    TableName=table,
                    IndexName="byTag",
                    KeyConditionExpression="tag = :t",
                    ExpressionAttributeValues={":t": s("t")},
                )
            ),
            outcome(
                lambda: db.query(
                    **query,
                    KeyConditionExpression="grp = :g AND #r BETWEEN :r AND :r",
                    ExpressionAttributeNames={"#r": "rank"},
                    Select="COUNT",
                )
            ),
            outcome(
                lambda: db.query(
                    **query,
                    KeyConditionExpression="grp = :g AND #r = :r",
                    ExpressionAttributeNames={"#r": "rank"},
                    ConsistentRead=True,
                )
            ),
            outcome(lambda: db.scan(TableName=table, IndexName="byGroup")),
            outcome(
                lambda: db.query(
                    TableName=table,
                    KeyConditionExpression="pk = :p AND sk > :s",
                    ExpressionAttributeValues={":p": s("q"), ":s": n(1)},
                )
            ),
        ]

    sim, moto = pair.both(scenario)
    assert sim == moto
    # Only the projected attributes (INCLUDE note; KEYS_ONLY none), only items that carry the index's keys.
    assert sim[0]["Items"] == [
        {"pk": "q", "sk": 1, "grp": "g", "rank": 2},
        {"pk": "q", "sk": 10, "grp": "g", "rank": 2, "note": "ten"},
        {"pk": "p", "sk": 1, "grp": "g", "rank": 3, "note": "one"},
    ]
    assert sim[2]["Items"] == [{"pk": "p", "sk": 1, "tag": "t"}, {"pk": "q", "sk": 1, "tag": "t"}]
    assert sim[4] == {"error": "ValidationException"}


def read_pages(db: Any, table: str, limit: int) -> list[Outcomes]:
    """Every page of a filtered Query, Scan and index Query with `limit`, following LastEvaluatedKey."""
    seed(db, table)
    reads: list[Outcomes] = []
    for operation, request in (
        ("query", {"KeyConditionExpression": "pk = :p", "ExpressionAttributeValues": {":p": s("q"), ":c": n(0)}}),
        ("scan", {"ExpressionAttributeValues": {":c": n(0)}}),
        (
            "index",
            {
                "IndexName": "byGroup",
                "KeyConditionExpression": "grp = :g",
                "ExpressionAttributeValues": {":g": s("g"), ":c": n(0)},
            },
        ),
    ):
        call = db.scan if operation == "scan" else db.query
        pages: Outcomes = []
        start = None
        for _ in range(10):
            arguments = {
                "TableName": table,
                "Limit": limit,
                "FilterExpression": "#c > :c",
                "ExpressionAttributeNames": {"#c": "count"},
                **request,
            }
            if start:
                arguments["ExclusiveStartKey"] = start
            page = call(**arguments)
            pages.append(outcome(partial(dict, page)))
            start = page.get("LastEvaluatedKey")
            if not start:
                break
        reads.append(pages)
    return reads


@pytest.mark.parametrize("limit", [1, 2, 3, 5])
def test_paging_with_limit_and_filter_matches_moto(pair: Pair, limit: int) -> None:
    def pages(db: Any, table: str) -> list[Outcomes]:
        return read_pages(db, table, limit)

    sim_reads, moto_reads = pair.both(pages)
    for mine, theirs in zip(sim_reads, moto_reads, strict=True):
        # Limit counts the items read before the filter: the same pages, the same Count and ScannedCount.
        assert mine[: len(theirs) - 1] == theirs[:-1]
        last = dict(mine[len(theirs) - 1])
        if len(mine) > len(theirs):
            # The read stopped at the Limit on the last item: DynamoDB answers a LastEvaluatedKey and then an empty
            # page, moto neither (test_last_evaluated_key_when_the_limit_ends_the_read).
            assert last.pop("LastEvaluatedKey")
            assert mine[-1] == {"Count": 0, "ScannedCount": 0, "Items": []}
            assert len(mine) == len(theirs) + 1
        assert last == theirs[-1]


def test_error_responses_have_the_shape_botocore_parses(pair: Pair) -> None:
    # Given a conditional write that fails with ALL_OLD, and a transaction that is cancelled
    def failures(db: Any, table: str) -> list[dict[str, Any]]:
        seed(db, table)
        caught: list[dict[str, Any]] = []
        update: dict[str, Any] = {
            "TableName": table,
            "Key": key("p", 1),
            "UpdateExpression": "SET note = :v",
            "ConditionExpression": "attribute_not_exists(pk)",
            "ExpressionAttributeValues": {":v": s("x")},
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        calls: list[Callable[[], Any]] = [
            partial(db.update_item, **update),
            partial(db.transact_write_items, TransactItems=[{"Update": update}]),
        ]
        for call in calls:
            with pytest.raises(ClientError) as error:
                call()
            caught.append(dict(error.value.response))
        return caught

    sim, moto = pair.both(failures)
    # Then the two answers carry the same fields, where the product reads them
    for mine, theirs in zip(sim, moto, strict=True):
        assert set(mine) == set(theirs)
        assert mine["Error"]["Code"] == theirs["Error"]["Code"]
        assert mine["ResponseMetadata"]["HTTPStatusCode"] == theirs["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert (
        sim[1]["CancellationReasons"][0].keys()
        == moto[1]["CancellationReasons"][0].keys()
        == {"Code", "Message", "Item"}
    )


# Where moto departs from DynamoDB's documented behaviour: the simulation does what DynamoDB documents, and moto's
# answer is asserted too, so that these tests fail (and are revisited) when moto changes.


def test_last_evaluated_key_when_the_limit_ends_the_read(pair: Pair) -> None:
    # DynamoDB's Query reference: "If LastEvaluatedKey is not empty, it does not necessarily mean that there is more
    # data in the result set. The only way to know when you have reached the end of the result set is when
    # LastEvaluatedKey is empty." DynamoDB stops where the Limit stops it and says where: a Limit equal to the number
    # of matching items still answers a LastEvaluatedKey (and the next page is empty). moto answers none.
    def read(db: Any, table: str) -> Outcomes:
        seed(db, table)
        return [
            outcome(
                lambda: db.query(
                    TableName=table, KeyConditionExpression="pk = :p", ExpressionAttributeValues={":p": s("q")}, Limit=3
                )
            )
        ]

    sim, moto = pair.both(read)
    assert sim[0]["LastEvaluatedKey"] == {"pk": "q", "sk": 10}
    assert "LastEvaluatedKey" not in moto[0]
    assert sim[0]["Items"] == moto[0]["Items"]


def test_undefined_name_placeholder_without_any_names(pair: Pair) -> None:
    # DynamoDB's expression attribute names guide: a placeholder the request does not define is a
    # ValidationException ("An expression attribute name used in the document path is not defined"). moto's server
    # fails with an internal error when the request has no ExpressionAttributeNames at all.
    request = {"UpdateExpression": "SET #n = :v", "ExpressionAttributeValues": {":v": s("a")}}

    def update(db: Any, table: str) -> Outcomes:
        seed(db, table)
        return [outcome(lambda: db.update_item(TableName=table, Key=key("p", 2), **request))]

    sim, moto = pair.both(update)
    assert sim == [{"error": "ValidationException"}]
    assert moto == [{"error": "500"}]
    assert "attribute name: #n" in error_message(
        lambda: pair.sim.update_item(TableName="t", Key=key("p", 2), **request)
    )


def test_begins_with_on_a_number_sort_key_is_refused(pair: Pair) -> None:
    # DynamoDB's Query reference, KeyConditionExpression: "begins_with (sortKeyName, :sortkeyval) ... (You cannot use
    # this function with a sort key that is of type Number.)": a ValidationException. moto's server fails with an
    # internal error.
    def query(db: Any, table: str) -> Outcomes:
        seed(db, table)
        return [
            outcome(
                lambda: db.query(
                    TableName=table,
                    KeyConditionExpression="pk = :p AND begins_with(sk, :s)",
                    ExpressionAttributeValues={":p": s("q"), ":s": n(1)},
                )
            )
        ]

    sim, moto = pair.both(query)
    assert sim == [{"error": "ValidationException"}]
    assert moto == [{"error": "500"}]


def test_size_of_an_attribute_some_items_lack(pair: Pair) -> None:
    # DynamoDB's filter expressions guide: a filter is applied to each item read, and the items it does not hold for
    # are discarded; size(path) is the size of that item's attribute, so an item without it does not match. moto
    # refuses the whole Scan ("Invalid attribute name") as soon as one item lacks the attribute.
    def scan(db: Any, table: str) -> Outcomes:
        seed(db, table)
        return [
            outcome(
                lambda: db.scan(
                    TableName=table, FilterExpression="size(tags) = :two", ExpressionAttributeValues={":two": n(2)}
                )
            )
        ]

    sim, moto = pair.both(scan)
    assert [(item["pk"], item["sk"]) for item in sim[0]["Items"]] == [("p", 2)]
    assert moto == [{"error": "ValidationException"}]


def test_a_comparison_of_mismatched_types_is_false(pair: Pair) -> None:
    # DynamoDB's comparison operator reference (ComparisonOperator, GT/LT...): "If an item contains an AttributeValue
    # element of a different type than the one provided in the request, the value does not match. For example,
    # {"S":"6"} does not compare to {"N":"6"}." A string attribute compared with a number matches no item; moto's
    # server fails with an internal error.
    def scan(db: Any, table: str) -> Outcomes:
        seed(db, table)
        return [
            outcome(
                lambda: db.scan(TableName=table, FilterExpression="note > :v", ExpressionAttributeValues={":v": n(1)})
            )
        ]

    sim, moto = pair.both(scan)
    assert sim == [{"Count": 0, "ScannedCount": 6, "Items": []}]
    assert moto == [{"error": "500"}]


def test_projections_and_batch_reads_match_moto(pair: Pair) -> None:
    def scenario(db: Any, table: str) -> Outcomes:
        seed(db, table)
        projection = {
            "ProjectionExpression": "doc.parts[1], doc.flag, #c, note",
            "ExpressionAttributeNames": {"#c": "count"},
        }
        return [
            outcome(lambda: db.get_item(TableName=table, Key=key("p", 3), **projection)),
            outcome(lambda: db.get_item(TableName=table, Key=key("p", 9))),
            outcome(
                lambda: db.query(
                    TableName=table,
                    KeyConditionExpression="pk = :p",
                    ExpressionAttributeValues={":p": s("p")},
                    ScanIndexForward=False,
                    **projection,
                )
            ),
            outcome(
                lambda: db.batch_get_item(
                    RequestItems={
                        table: {
                            "Keys": [key("q", 10), key("p", 1), key("nobody", 1)],
                            "ProjectionExpression": "pk, sk, note",
                            "ConsistentRead": True,
                        }
                    }
                )
            ),
            outcome(lambda: db.batch_get_item(RequestItems={table: {"Keys": [key("p", 1), key("p", 1)]}})),
        ]

    sim, moto = pair.both(scenario)
    assert sim == moto
    assert sim[0]["Item"] == {"doc": {"parts": ["two"], "flag": True}, "count": 10}
    assert sim[3]["Responses"] == [{"pk": "p", "sk": 1, "note": "one"}, {"pk": "q", "sk": 10, "note": "ten"}]
    assert sim[3]["UnprocessedKeys"] == {}
    assert sim[4] == {"error": "ValidationException"}


def test_an_item_over_400_kb_is_refused(pair: Pair) -> None:
    big = s("x" * (400 * 1024))

    def scenario(db: Any, table: str) -> Outcomes:
        seed(db, table)
        update = {
            "TableName": table,
            "Key": key("p", 1),
            "UpdateExpression": "SET body = :big",
            "ExpressionAttributeValues": {":big": big},
        }
        return [
            outcome(lambda: db.put_item(TableName=table, Item={**key("p", 9), "body": big})),
            outcome(lambda: db.update_item(**update)),
            outcome(lambda: db.transact_write_items(TransactItems=[{"Update": update}])),
            # Under the limit (moto counts it as 400,000 bytes, DynamoDB as 400 KB): written.
            outcome(lambda: db.put_item(TableName=table, Item={**key("p", 9), "b": s("x" * 399_000)})),
        ]

    sim, moto = pair.both(scenario)
    assert [sim[0], sim[1], sim[3]] == [moto[0], moto[1], moto[3]]
    assert [answer.get("error") for answer in (sim[0], sim[1], sim[3])] == ["ValidationException"] * 2 + [None]
    # DynamoDB's TransactionCanceledException reference: it cancels a transaction when "an item size becomes too large
    # (larger than 400 KB) ... because of changes made by the transaction", with a ValidationError reason (what the
    # API's 413 answer reads). moto refuses the whole request with a ValidationException instead.
    assert sim[2] == {"error": "TransactionCanceledException", "reasons": [{"Code": "ValidationError"}]}
    assert moto[2] == {"error": "ValidationException"}
    message = error_message(
        lambda: pair.sim.transact_write_items(
            TransactItems=[{"Put": {"TableName": pair.sim_table, "Item": {**key("p", 8), "body": big}}}]
        )
    )
    assert message.startswith("Transaction cancelled")


def test_malformed_expressions_are_refused_like_moto(pair: Pair) -> None:
    updates: list[dict[str, Any]] = [
        {"UpdateExpression": "SET note =", "ExpressionAttributeValues": {":v": s("a")}},
        {"UpdateExpression": "REMOVE"},
        {"UpdateExpression": "SET note = :v", "ExpressionAttributeValues": {}},
        {"UpdateExpression": "SET note = :v ADD note :one", "ExpressionAttributeValues": {":v": s("a"), ":one": n(1)}},
    ]

    def scenario(db: Any, table: str) -> Outcomes:
        seed(db, table)
        results = [outcome(partial(db.update_item, TableName=table, Key=key("p", 2), **update)) for update in updates]
        results.append(outcome(lambda: db.get_item(TableName=table, Key={"pk": s("p")})))
        return results

    sim, moto = pair.both(scenario)
    assert sim == moto
    assert all(answer == {"error": "ValidationException"} for answer in sim)
    # A condition cut short, a function that needs a path given a value, and BETWEEN with its bounds the wrong way
    # round: DynamoDB refuses them as invalid expressions (moto's server fails with an internal error on the first
    # two, and evaluates the third as false).
    for condition, refusal in (
        ("note = :v AND", "Invalid ConditionExpression: Syntax error"),
        ("attribute_exists(:v)", "Invalid ConditionExpression: Operator or function requires a document path"),
        (":v BETWEEN :hi AND :lo", "Invalid ConditionExpression: The BETWEEN operator requires upper bound"),
    ):
        message = error_message(
            partial(
                pair.sim.update_item,
                TableName=pair.sim_table,
                Key=key("p", 2),
                UpdateExpression="SET note = :v",
                ConditionExpression=condition,
                ExpressionAttributeValues={
                    ":v": s("a"),
                    **({":hi": n(9), ":lo": n(1)} if "BETWEEN" in condition else {}),
                },
            )
        )
        assert message.startswith(refusal)


def test_parameters_are_checked_as_a_real_client_checks_them(pair: Pair) -> None:
    # Given requests botocore refuses before sending: an unknown parameter, a missing one, a number for a string
    requests: list[dict[str, Any]] = [
        {"Key": key("p", 2), "ExpressionAttributeValues": {":v": s("a")}},
        {},
        {"Key": key("p", 2), "ConsistentRead": "yes"},
    ]
    for request in requests:
        with pytest.raises(ParamValidationError) as mine:
            pair.sim.get_item(TableName=pair.sim_table, **request)
        with pytest.raises(ParamValidationError) as theirs:
            pair.moto.get_item(TableName=pair.moto_table, **request)
        # Then the simulation raises the same error with the same report
        assert str(mine.value) == str(theirs.value)
