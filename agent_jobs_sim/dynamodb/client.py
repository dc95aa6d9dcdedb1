"""`SimDynamoDB`: an in-memory stand-in for a boto3 low-level DynamoDB client, on a virtual clock."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from agent_jobs_sim.dynamodb import errors, reads, writes
from agent_jobs_sim.dynamodb.evaluation import UpdateError
from agent_jobs_sim.dynamodb.requests import RequestError
from agent_jobs_sim.dynamodb.table import KeyError_, Table
from agent_jobs_sim.dynamodb.values import Item
from agent_jobs_sim.dynamodb.writes import ConditionFailed, Write

MAX_TRANSACTION_ACTIONS = 100
_ACTIONS = ("Put", "Update", "Delete", "ConditionCheck")


def _no_lag(table: str, index: str) -> float:
    return 0.0


class SimDynamoDB:
    """Used in place of `session.client("dynamodb")`: the same methods, keyword arguments, wire format, responses and
    exception classes, for the subset of DynamoDB the product uses (see the package's docstring).

    `now` is the virtual clock (seconds). `index_lag(table, index)` is asked once per write and per index it
    touches: the seconds until that write reaches the index. `check_parameters` checks each request against
    botocore's model as a real client does (an unknown or mistyped parameter raises ParamValidationError); it about
    doubles a call's cost. Deterministic: no wall clock, randomness or threads.
    """

    def __init__(
        self,
        now: Callable[[], float],
        *,
        index_lag: Callable[[str, str], float] = _no_lag,
        check_parameters: bool = True,
    ) -> None:
        self._now = now
        self._index_lag = index_lag
        self._check_parameters = check_parameters
        self._tables: dict[str, Table] = {}

    # Tables.
    def create_table(self, **request: Any) -> dict[str, Any]:
        self._check("create_table", request)
        name = str(request.get("TableName", ""))
        if name in self._tables:
            raise errors.in_use(name)
        try:
            table = Table(request, self._index_lag)
        except (KeyError_, KeyError) as error:
            raise errors.validation(str(error), "CreateTable") from None
        self._tables[name] = table
        return {"TableDescription": table.describe()}

    def describe_table(self, *, TableName: str) -> dict[str, Any]:
        self._check("describe_table", {"TableName": TableName})
        return {"Table": self._table(TableName, "DescribeTable").describe()}

    def delete_table(self, *, TableName: str) -> dict[str, Any]:
        table = self._table(TableName, "DeleteTable")
        del self._tables[TableName]
        return {"TableDescription": {**table.describe(), "TableStatus": "DELETING"}}

    # What a scheduler and invariant checks read.
    def next_index_update(self) -> float | None:
        """The earliest time a pending write reaches an index, always later than `now()` (None: every index has caught
        up)."""
        self._catch_up()
        times = [t for table in self._tables.values() if (t := table.next_update()) is not None]
        return min(times) if times else None

    def peek(self, table_name: str, key: Mapping[str, Any]) -> Item | None:
        """One item as stored now (wire format, not a copy: do not change it), without a request's checks: for
        invariant checks on every write, where a GetItem's validation would cost more than the write."""
        table = self._tables[table_name]
        return table.items.get(table.key(key))

    def items(self, table_name: str) -> list[Item]:
        """The table's current items (wire format) in key order."""
        table = self._tables[table_name]
        return [dict(item) for _, item in sorted(table.items.items(), key=lambda pair: pair[0])]

    # Reads.
    def get_item(self, **request: Any) -> dict[str, Any]:
        self._check("get_item", request)
        return self._call("GetItem", lambda: reads.get_item(request, self._table(request.get("TableName"), "GetItem")))

    def query(self, **request: Any) -> dict[str, Any]:
        self._check("query", request)
        return self._call("Query", lambda: reads.query(request, self._table(request.get("TableName"), "Query")))

    def scan(self, **request: Any) -> dict[str, Any]:
        self._check("scan", request)
        return self._call(
            "Scan", lambda: reads.query(request, self._table(request.get("TableName"), "Scan"), scan=True)
        )

    def batch_get_item(self, **request: Any) -> dict[str, Any]:
        self._check("batch_get_item", request)
        for name in request.get("RequestItems") or {}:
            self._table(name, "BatchGetItem")
        return self._call("BatchGetItem", lambda: reads.batch_get_item(request, self._tables))

    # Writes.
    def put_item(self, **request: Any) -> dict[str, Any]:
        self._check("put_item", request)
        return self._write("Put", "PutItem", request)

    def update_item(self, **request: Any) -> dict[str, Any]:
        self._check("update_item", request)
        return self._write("Update", "UpdateItem", request)

    def delete_item(self, **request: Any) -> dict[str, Any]:
        self._check("delete_item", request)
        return self._write("Delete", "DeleteItem", request)

    def transact_write_items(self, **request: Any) -> dict[str, Any]:
        """All or nothing: every action is checked, then every condition evaluated against the items as they are;
        one false condition (or update that cannot apply) cancels all, with one reason per action, in order."""
        self._check("transact_write_items", request)
        actions: list[Mapping[str, Any]] = request.get("TransactItems") or []
        if not actions or len(actions) > MAX_TRANSACTION_ACTIONS:
            raise errors.validation(
                "1 validation error detected: Value at 'transactItems' failed to satisfy constraint: Member must have "
                f"length less than or equal to {MAX_TRANSACTION_ACTIONS} and greater than or equal to 1",
                "TransactWriteItems",
            )
        self._catch_up()
        planned: list[Write | None] = []
        reasons: list[dict[str, Any]] = []
        keys: set[tuple[str, Any]] = set()
        for action in actions:
            kinds = [kind for kind in _ACTIONS if kind in action]
            if len(kinds) != 1:
                raise errors.validation(
                    "TransactItems can only contain one of Check, Put, Update or Delete", "TransactWriteItems"
                )
            body = action[kinds[0]]
            table = self._table(body.get("TableName"), "TransactWriteItems")
            write, reason = self._plan_action(kinds[0], body, table)
            planned.append(write)
            reasons.append(reason)
            key = (table.name, self._key_of(kinds[0], body, table))
            if key in keys:
                raise errors.validation(
                    "Transaction request cannot include multiple operations on one item", "TransactWriteItems"
                )
            keys.add(key)
        if any(reason["Code"] != "None" for reason in reasons):
            raise errors.transaction_cancelled(reasons)
        now = self._now()
        for write in planned:
            writes.store(write, now)  # type: ignore[arg-type]
        return {}

    @staticmethod
    def _plan_action(kind: str, body: Mapping[str, Any], table: Table) -> tuple[Write | None, dict[str, Any]]:
        """A transaction action's write, or its cancellation reason."""
        try:
            return writes.plan(kind, body, table), {"Code": "None"}
        except RequestError as error:
            raise errors.validation(str(error), "TransactWriteItems") from None
        except ConditionFailed as failure:
            reason: dict[str, Any] = {"Code": "ConditionalCheckFailed", "Message": "The conditional request failed"}
            if failure.return_old and failure.old is not None:
                reason["Item"] = dict(failure.old)
            return None, reason
        except UpdateError as error:
            return None, {"Code": "ValidationError", "Message": str(error)}

    # Internals.
    def _check(self, method: str, request: Mapping[str, Any]) -> None:
        if self._check_parameters:
            errors.check_parameters(method, request)

    def _table(self, name: Any, operation: str) -> Table:
        table = self._tables.get(str(name))
        if table is None:
            raise errors.not_found(operation)
        return table

    def _catch_up(self) -> None:
        now = self._now()
        for table in self._tables.values():
            table.catch_up(now)

    def _call(self, operation: str, read: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        self._catch_up()
        try:
            return read()
        except RequestError as error:
            raise errors.validation(str(error), operation) from None

    @staticmethod
    def _key_of(kind: str, body: Mapping[str, Any], table: Table) -> Any:
        return table.schema.key_of(body["Item"] if kind == "Put" else body["Key"])

    def _write(self, kind: str, operation: str, request: Mapping[str, Any]) -> dict[str, Any]:
        table = self._table(request.get("TableName"), operation)
        self._catch_up()
        try:
            write = writes.plan(kind, request, table)
        except RequestError as error:
            raise errors.validation(str(error), operation) from None
        except UpdateError as error:
            raise errors.validation(str(error), operation) from None
        except ConditionFailed as failure:
            old = dict(failure.old) if failure.return_old and failure.old is not None else None
            raise errors.condition_failed(operation, old) from None
        writes.store(write, self._now())
        attributes = write.returned(request.get("ReturnValues", "NONE"))
        return {"Attributes": dict(attributes)} if attributes else {}
