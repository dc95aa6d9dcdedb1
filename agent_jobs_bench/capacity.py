"""DynamoDB and SQS calls counted on the real clients, with the capacity each DynamoDB call consumed.

`CallRecorder.attach(client)` registers botocore event hooks on a client: `provide-client-params` adds
`ReturnConsumedCapacity=TOTAL` to every DynamoDB operation that takes it (the benchmark's doing, never the product's),
`before-call` counts the call and notes the size of every item it touches, `after-call` reads the `ConsumedCapacity`
the server answered and the sizes after the call. The sizes are read through a second client the recorder owns, so
they are never counted.

Capacity is also computed from DynamoDB's documented rules, because moto's server does not report it faithfully
(see `capacity_note`):

- item size = the sum of attribute name lengths and value sizes: a string its UTF-8 bytes, a number 1 byte per two
  significant digits + 1, a binary its raw bytes, a boolean or null 1 byte, a list or map 3 bytes + 1 byte per
  element + the elements (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/CapacityUnitCalculations.html);
- a write costs 1 WCU per 1 KB of the larger of the item before and after it (rounded up, at least 1), also when its
  condition fails (then the item as it was); a read 1 RCU per 4 KB strongly consistent, half that eventually
  consistent (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/provisioned-capacity-mode.html);
- in TransactWriteItems every action costs twice that, a ConditionCheck included (it is charged as a transactional
  write of the item it checks) (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/transaction-apis.html,
  "Capacity management for transactions"). A cancelled transaction is counted as if every action was charged at
  the size of its item before the call: DynamoDB does not document it, so that part is an estimate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

WRITE_UNIT_BYTES = 1024
READ_UNIT_BYTES = 4096
_ITEM_WRITES = ("PutItem", "UpdateItem", "DeleteItem")


def _number_size(text: str) -> int:
    digits = text.lstrip("+-").replace(".", "").lstrip("0").rstrip("0").split("e")[0].split("E")[0]
    return (max(len(digits), 1) + 1) // 2 + 1


def attribute_size(value: Mapping[str, Any]) -> int:
    """The size DynamoDB counts for one attribute value in its wire form ({"S": "..."}, {"N": "1"}, ...)."""
    ((kind, raw),) = value.items()
    if kind == "S":
        return len(str(raw).encode())
    if kind == "N":
        return _number_size(str(raw))
    if kind == "B":
        return len(raw) if isinstance(raw, bytes | bytearray) else len(str(raw).encode())
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(s.encode()) for s in raw)
    if kind == "NS":
        return sum(_number_size(n) for n in raw)
    if kind == "BS":
        return sum(len(b) for b in raw)
    if kind == "L":
        return 3 + sum(1 + attribute_size(element) for element in raw)
    if kind == "M":
        return 3 + sum(1 + len(name.encode()) + attribute_size(element) for name, element in raw.items())
    raise ValueError(f"not a DynamoDB attribute value: {value!r}")


def item_size(item: Mapping[str, Mapping[str, Any]] | None) -> int:
    """An item's size as DynamoDB's formula gives it (attribute names + values), 0 for no item."""
    if not item:
        return 0
    return sum(len(name.encode()) + attribute_size(value) for name, value in item.items())


def _units(size: int, unit_bytes: int) -> int:
    return max(1, math.ceil(size / unit_bytes))


@dataclass
class Call:
    """One API call as the recorder saw it."""

    service: str
    operation: str
    phase: str
    error: str | None = None
    # What the server answered in ConsumedCapacity (None: nothing reported, e.g. SQS or a failed call).
    reported_rcu: float | None = None
    reported_wcu: float | None = None
    reported_total: float | None = None
    computed_rcu: float = 0.0
    computed_wcu: float = 0.0
    # pk -> item size (bytes) after the call, for the items the call touched.
    sizes_after: dict[str, int] = field(default_factory=dict)


def _touched_keys(operation: str, params: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(action, pk) of every item a write or key read touches; action is the transaction action or the operation."""
    if operation in ("GetItem", *_ITEM_WRITES):
        key = params.get("Key") or {"pk": params.get("Item", {}).get("pk")}
        return [(operation, key["pk"]["S"])] if key.get("pk") else []
    if operation == "TransactWriteItems":
        touched = []
        for action in params.get("TransactItems", []):
            ((kind, body),) = action.items()
            key = body.get("Key") or {"pk": body.get("Item", {}).get("pk")}
            touched.append((kind, key["pk"]["S"]))
        return touched
    return []


class CallRecorder:
    """Counts the calls of the clients attached to it, per phase (set `phase` before each step)."""

    def __init__(self, reader: DynamoDBClient, table_name: str) -> None:
        self._reader = reader
        self._table = table_name
        self.phase = ""
        self.calls: list[Call] = []

    def attach(self, client: Any) -> None:
        service = client.meta.service_model.service_id.hyphenize()
        events = client.meta.events
        if service == "dynamodb":
            events.register("provide-client-params.dynamodb", self._ask_for_capacity)
        events.register(f"before-call.{service}", self._before_call)
        events.register(f"after-call.{service}", self._after_call)

    def _ask_for_capacity(self, params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
        context["bench_params"] = dict(params)
        if "ReturnConsumedCapacity" in model.input_shape.members:
            params["ReturnConsumedCapacity"] = "TOTAL"

    def _size_of(self, pk: str) -> int:
        response = self._reader.get_item(TableName=self._table, Key={"pk": {"S": pk}}, ConsistentRead=True)
        return item_size(response.get("Item"))

    def _before_call(self, model: Any, context: dict[str, Any], **_: Any) -> None:
        service = model.service_model.service_id.hyphenize()
        context["bench_sizes_before"] = {
            pk: self._size_of(pk) for _, pk in _touched_keys(model.name, context.get("bench_params", {}))
        }
        context["bench_service"] = service

    def _after_call(self, parsed: Mapping[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
        operation = model.name
        params: Mapping[str, Any] = context.get("bench_params", {})
        error = parsed.get("Error", {}).get("Code") if "Error" in parsed else None
        call = Call(service=context.get("bench_service", ""), operation=operation, phase=self.phase, error=error)
        self.calls.append(call)
        if call.service != "dynamodb":
            return
        self._read_reported(call, parsed.get("ConsumedCapacity"))
        before: dict[str, int] = context.get("bench_sizes_before", {})
        touched = _touched_keys(operation, params)
        call.sizes_after = {pk: self._size_of(pk) for _, pk in touched}
        consistent = 1.0 if params.get("ConsistentRead") else 0.5
        if operation == "GetItem":
            call.computed_rcu = _units(item_size(parsed.get("Item")), READ_UNIT_BYTES) * consistent
        elif operation in ("Query", "Scan"):
            size = sum(item_size(item) for item in parsed.get("Items", []))
            call.computed_rcu = _units(size, READ_UNIT_BYTES) * consistent
        elif operation in _ITEM_WRITES:
            ((_action, pk),) = touched
            size = before[pk] if error else max(before[pk], call.sizes_after[pk])
            call.computed_wcu = _units(size, WRITE_UNIT_BYTES)
        elif operation == "TransactWriteItems":
            for action, pk in touched:
                size = before[pk] if (error or action == "ConditionCheck") else max(before[pk], call.sizes_after[pk])
                call.computed_wcu += 2 * _units(size, WRITE_UNIT_BYTES)

    @staticmethod
    def _read_reported(call: Call, consumed: Any) -> None:
        if not consumed:  # absent, or moto's empty list for a transaction
            return
        entries = consumed if isinstance(consumed, list) else [consumed]
        call.reported_total = sum(float(entry.get("CapacityUnits", 0)) for entry in entries)
        reads = [entry["ReadCapacityUnits"] for entry in entries if "ReadCapacityUnits" in entry]
        writes = [entry["WriteCapacityUnits"] for entry in entries if "WriteCapacityUnits" in entry]
        call.reported_rcu = float(sum(reads)) if reads else None
        call.reported_wcu = float(sum(writes)) if writes else None

    # ---- summaries -------------------------------------------------------------------------------------------------

    def select(self, *phases: str, service: str | None = None) -> list[Call]:
        return [c for c in self.calls if c.phase in phases and (service is None or c.service == service)]

    def reported_by_operation(self) -> dict[str, list[float | None]]:
        """Operation -> the distinct ConsumedCapacity totals the server answered to its successful calls."""
        seen: dict[str, set[float | None]] = {}
        for call in self.calls:
            if call.service == "dynamodb" and call.error is None:
                seen.setdefault(call.operation, set()).add(call.reported_total)
        return {op: sorted(values, key=lambda v: -1.0 if v is None else v) for op, values in sorted(seen.items())}
