"""GetItem, Query, Scan and BatchGetItem over a table or one of its indexes (as far as the index has caught up)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent_jobs_sim.dynamodb import evaluation
from agent_jobs_sim.dynamodb import values as v
from agent_jobs_sim.dynamodb.expressions import Between, Call, Compare, Logical, Node, Path, Placeholder
from agent_jobs_sim.dynamodb.requests import Expressions, RequestError, expressions
from agent_jobs_sim.dynamodb.table import Index, KeyError_, KeySchema, Table
from agent_jobs_sim.dynamodb.values import Item, Value

_SELECTS = ("ALL_ATTRIBUTES", "ALL_PROJECTED_ATTRIBUTES", "SPECIFIC_ATTRIBUTES", "COUNT")


def projected(item: Item, parsed: Expressions) -> Item:
    projection = parsed.get("ProjectionExpression")
    if projection is None:
        return dict(item)
    return evaluation.project(item, projection.root, parsed.names)  # type: ignore[arg-type]


def get_item(request: Mapping[str, Any], table: Table) -> dict[str, Any]:
    parsed = expressions(request)
    try:
        key = table.key(request["Key"])
    except KeyError_ as error:
        raise RequestError(str(error)) from None
    item = table.items.get(key)
    return {"Item": projected(item, parsed)} if item is not None else {}


def batch_get_item(request: Mapping[str, Any], tables: Mapping[str, Table]) -> dict[str, Any]:
    """Every key's item (in the order asked); UnprocessedKeys is always empty, the model has no throttling."""
    requested = request.get("RequestItems") or {}
    if sum(len(entry.get("Keys", [])) for entry in requested.values()) > 100:
        raise RequestError("Too many items requested for the BatchGetItem call")
    responses: dict[str, list[Item]] = {}
    for name, entry in requested.items():
        table = tables[name]
        seen = set()
        parsed = expressions(entry)
        found: list[Item] = []
        for key in entry.get("Keys", []):
            try:
                position = table.key(key)
            except KeyError_ as error:
                raise RequestError(str(error)) from None
            if position in seen:
                raise RequestError("Provided list of item keys contains duplicates")
            seen.add(position)
            item = table.items.get(position)
            if item is not None:
                found.append(projected(item, parsed))
        responses[name] = found
    return {"Responses": responses, "UnprocessedKeys": {}}


def _terms(node: Node) -> list[Node]:
    if isinstance(node, Logical) and node.operator == "AND":
        return _terms(node.left) + _terms(node.right)
    if isinstance(node, Logical):
        raise RequestError("Invalid operator used in KeyConditionExpression: OR")
    return [node]


def _subject(term: Node, parsed: Expressions) -> str | None:
    """The attribute a key condition's term is about (None: not a single attribute)."""
    subject: Node | None = None
    if isinstance(term, Compare):
        subject = term.left
    elif isinstance(term, Between):
        subject = term.operand
    elif isinstance(term, Call) and term.name == "begins_with":
        subject = term.args[0]
    if isinstance(subject, Path) and len(subject.parts) == 1:
        return str(evaluation.resolve(subject, parsed.names)[0])
    return None


def _key_condition(parsed: Expressions, schema: KeySchema) -> tuple[Value, Node | None]:
    """The hash key value a Query asks for, and its condition on the range key (None: none)."""
    condition = parsed.get("KeyConditionExpression")
    if condition is None:
        raise RequestError(
            "Either the KeyConditions or KeyConditionExpression parameter must be specified in the request."
        )
    hash_value: Value | None = None
    range_term: Node | None = None
    for term in _terms(condition.root):  # type: ignore[arg-type]
        name = _subject(term, parsed)
        if name is None or name not in schema.names:
            raise RequestError("Query key condition not supported")
        if name == schema.hash:
            if not isinstance(term, Compare) or term.operator != "=" or not isinstance(term.right, Placeholder):
                raise RequestError("Query key condition not supported")
            hash_value = parsed.values[term.right.name]
            continue
        if range_term is not None or (isinstance(term, Compare) and term.operator == "<>"):
            raise RequestError("Query key condition not supported")
        if isinstance(term, Call) and schema.types[name] == "N":
            raise RequestError(
                "Invalid KeyConditionExpression: Incorrect operand type for operator or function; "
                "operator or function: begins_with, operand type: N"
            )
        _check_key_type(term, parsed, schema.types[name])
        range_term = term
    if hash_value is None:
        raise RequestError(f"Query condition missed key schema element: {schema.hash}")
    if schema.types[schema.hash] not in hash_value:
        raise RequestError(
            "One or more parameter values were invalid: Condition parameter type does not match schema type"
        )
    return hash_value, range_term


def _check_key_type(term: Node, parsed: Expressions, kind: str) -> None:
    """A range key condition compares the key with values of its own type."""
    operands: tuple[Node, ...] = ()
    if isinstance(term, Compare):
        operands = (term.right,)
    elif isinstance(term, Between):
        operands = (term.low, term.high)
    elif isinstance(term, Call):
        operands = term.args[1:]
    for node in operands:
        if isinstance(node, Placeholder) and kind not in parsed.values[node.name]:
            raise RequestError(
                "One or more parameter values were invalid: Condition parameter type does not match schema type"
            )


def _position(item: Mapping[str, Value], table: Table, index: KeySchema | None) -> tuple[Any, ...]:
    """Where an item (or an ExclusiveStartKey) stands in the order a Query or Scan reads."""
    table_key = table.schema.key_of(item)
    if index is None:
        return (table_key,)
    own = tuple(v.sort_key(item[name]) for name in index.names)
    return (*own, table_key)


def query(request: Mapping[str, Any], table: Table, *, scan: bool = False) -> dict[str, Any]:
    """A Query (or, with `scan`, a Scan): the items of the key condition in key order, Limit counting the items read
    before the FilterExpression, LastEvaluatedKey when the Limit stopped the read."""
    index_name = request.get("IndexName")
    index = _index(request, table)
    select, limit = _check_read(request, scan=scan)
    parsed = expressions(request)
    schema = index.schema if index is not None else table.schema
    hash_value, range_term = (None, None) if scan else _key_condition(parsed, schema)
    candidates = table.candidates(index_name, hash_value)
    if range_term is not None:
        candidates = [c for c in candidates if evaluation.condition(range_term, c, parsed.names, parsed.values)]
    if not request.get("ScanIndexForward", True) and not scan:
        candidates.reverse()
    start = request.get("ExclusiveStartKey")
    if start:
        candidates = _after(candidates, start, table, index.schema if index is not None else None, request)
    evaluated = candidates if limit is None else candidates[:limit]
    filter_expression = parsed.get("FilterExpression")
    matched = (
        evaluated
        if filter_expression is None
        else [c for c in evaluated if evaluation.condition(filter_expression.root, c, parsed.names, parsed.values)]  # type: ignore[arg-type]
    )
    response: dict[str, Any] = {"Count": len(matched), "ScannedCount": len(evaluated)}
    if select != "COUNT":
        response["Items"] = [projected(item, parsed) for item in matched]
    if limit is not None and len(candidates) >= limit and evaluated:
        last = evaluated[-1]
        names = set(table.schema.names) | (set(index.schema.names) if index is not None else set())
        response["LastEvaluatedKey"] = {name: last[name] for name in sorted(names)}
    return response


def _check_read(request: Mapping[str, Any], *, scan: bool) -> tuple[str, int | None]:
    """The Select and Limit of a Query or Scan, checked."""
    select = request.get("Select", "ALL_ATTRIBUTES")
    if select not in _SELECTS:
        raise RequestError(f"Invalid Select value: {select}")
    if select == "COUNT" and "ProjectionExpression" in request:
        raise RequestError("Cannot specify the ProjectionExpression when choosing to get only the Count")
    if scan and "KeyConditionExpression" in request:
        raise RequestError("KeyConditionExpression cannot be given to a Scan")
    limit = request.get("Limit")
    if limit is not None and limit < 1:
        raise RequestError(
            "1 validation error detected: Value at 'limit' failed to satisfy constraint: "
            "Member must have value greater than or equal to 1"
        )
    return select, limit


def _index(request: Mapping[str, Any], table: Table) -> Index | None:
    """The index a Query or Scan reads (None: the table)."""
    index_name = request.get("IndexName")
    if index_name is None:
        return None
    if index_name not in table.indexes:
        raise RequestError(f"The table does not have the specified index: {index_name}")
    if request.get("ConsistentRead"):
        raise RequestError("Consistent reads are not supported on global secondary indexes")
    return table.indexes[index_name]


def _after(
    candidates: list[Item],
    start: Mapping[str, Value],
    table: Table,
    index: KeySchema | None,
    request: Mapping[str, Any],
) -> list[Item]:
    names = set(table.schema.names) | (set(index.names) if index is not None else set())
    if set(start) != names or table.schema.key_of(start) is None:
        raise RequestError("The provided starting key is invalid: The provided key element does not match the schema")
    position = _position(start, table, index)
    forward = request.get("ScanIndexForward", True) or "KeyConditionExpression" not in request
    if forward:
        return [c for c in candidates if _position(c, table, index) > position]
    return [c for c in candidates if _position(c, table, index) < position]
