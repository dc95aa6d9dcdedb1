"""PutItem, UpdateItem, DeleteItem and ConditionCheck as planned writes: checked, their condition evaluated against
the current item and their new item computed, before anything is stored (so a transaction can apply all or none)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent_jobs_sim.dynamodb import evaluation
from agent_jobs_sim.dynamodb.evaluation import UpdateError
from agent_jobs_sim.dynamodb.expressions import ExpressionError, UpdateAction
from agent_jobs_sim.dynamodb.requests import RequestError, expressions
from agent_jobs_sim.dynamodb.table import Key, KeyError_, Table
from agent_jobs_sim.dynamodb.values import MAX_ITEM_BYTES, Item, item_size, may_exceed_item_size, validate_value

_RETURN_VALUES = {
    "Put": ("NONE", "ALL_OLD"),
    "Delete": ("NONE", "ALL_OLD"),
    "Update": ("NONE", "ALL_OLD", "ALL_NEW", "UPDATED_OLD", "UPDATED_NEW"),
    "ConditionCheck": ("NONE",),
}


class ConditionFailed(Exception):
    """The write's condition is false for the current item (`old`, None when there is none)."""

    def __init__(self, old: Item | None, return_old: bool) -> None:
        super().__init__("The conditional request failed")
        self.old = old
        self.return_old = return_old


@dataclass
class Write:
    """A checked write of one item: `new` is None for a delete, `old` the item it replaces."""

    table: Table
    key: Key
    old: Item | None
    new: Item | None
    stores: bool = True  # False for a ConditionCheck
    touched: set[str] = field(default_factory=set)

    def returned(self, mode: str) -> Item | None:
        """The Attributes of ReturnValues `mode` (None: none to return)."""
        if mode == "ALL_OLD":
            return self.old
        if mode == "ALL_NEW":
            return self.new
        if mode in ("UPDATED_OLD", "UPDATED_NEW"):
            source = (self.old if mode == "UPDATED_OLD" else self.new) or {}
            return {name: source[name] for name in sorted(self.touched) if name in source} or None
        return None


def plan(kind: str, request: Mapping[str, Any], table: Table) -> Write:
    """The write `request` (of `kind`: Put, Update, Delete or ConditionCheck) would make now. Raises RequestError for
    what DynamoDB rejects whatever the item, ConditionFailed when its condition is false, UpdateError when its
    update cannot apply to this item."""
    mode = request.get("ReturnValues", "NONE")
    if mode not in _RETURN_VALUES[kind]:
        raise RequestError(f"Return values set to invalid value: {mode}")
    if kind == "ConditionCheck" and "ConditionExpression" not in request:
        raise RequestError("The ConditionExpression of a ConditionCheck must be given")
    parsed = expressions(request)
    key = _key(kind, request, table)
    update = parsed.get("UpdateExpression")
    actions: tuple[UpdateAction, ...] = update.root if update is not None else ()  # type: ignore[assignment]
    for action in actions:
        name = evaluation.resolve(action.path, parsed.names)[0]
        if name in table.schema.names:
            raise RequestError(
                f"Invalid UpdateExpression: Cannot update attribute {name}. This attribute is part of the key"
            )
    old = table.items.get(key)
    condition = parsed.get("ConditionExpression")
    try:
        if condition is not None and not evaluation.condition(condition.root, old or {}, parsed.names, parsed.values):  # type: ignore[arg-type]
            raise ConditionFailed(old, request.get("ReturnValuesOnConditionCheckFailure") == "ALL_OLD")
        if kind == "Put":
            _check_size(request["Item"])
            return Write(table, key, old, dict(request["Item"]), touched=set(request["Item"]))
        if kind == "Delete":
            return Write(table, key, old, None)
        if kind == "ConditionCheck":
            return Write(table, key, old, old, stores=False)
        # An update of no item starts from its key (an UpdateItem without an UpdateExpression writes the key alone).
        base = old if old is not None else dict(request["Key"])
        new, touched = evaluation.update(base, actions, parsed.names, parsed.values, frozenset(table.schema.names))
        _check_updated(table, new)
        return Write(table, key, old, new, touched=touched)
    except ExpressionError as error:
        field_name = "UpdateExpression" if kind == "Update" and _in_update(str(error)) else "ConditionExpression"
        raise RequestError(f"Invalid {field_name}: {error}") from None


def _key(kind: str, request: Mapping[str, Any], table: Table) -> Key:
    try:
        if kind != "Put":
            return table.key(request["Key"])
        for name, value in request["Item"].items():
            problem = validate_value(value, f"Item.{name}")
            if problem:
                raise RequestError(problem)
        return table.check_item(request["Item"])
    except KeyError_ as error:
        raise RequestError(str(error)) from None


def _in_update(message: str) -> bool:
    return message.startswith(("Cannot update attribute", "Two document paths", "Incorrect operand type"))


def _check_updated(table: Table, item: Item) -> None:
    try:
        table.check_item(item)
    except KeyError_ as error:
        raise UpdateError(str(error)) from None
    _check_size(item, "Item size to update has exceeded the maximum allowed size")


def _check_size(item: Item, message: str = "Item size has exceeded the maximum allowed size") -> None:
    """Over 400 KB: a ValidationException, or in a transaction a ValidationError cancellation reason."""
    if may_exceed_item_size(item) and item_size(item) > MAX_ITEM_BYTES:
        raise UpdateError(message)


def store(write: Write, now: float) -> None:
    if write.stores:
        write.table.write(write.key, write.new, now)
