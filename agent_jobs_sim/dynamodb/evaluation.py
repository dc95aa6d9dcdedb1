"""Parsed expressions applied to items: conditions evaluated, updates applied, projections taken. Items are never
changed in place: an update copies what it changes, so a stored item (and an index entry) can be shared."""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from agent_jobs_sim.dynamodb import values as v
from agent_jobs_sim.dynamodb.expressions import (
    Arithmetic,
    Between,
    Call,
    Compare,
    ExpressionError,
    In,
    Logical,
    Node,
    Not,
    Path,
    Placeholder,
    UpdateAction,
)
from agent_jobs_sim.dynamodb.values import Item, Value

Names = Mapping[str, str]
Values = Mapping[str, Value]
Resolved = tuple[str | int, ...]


class UpdateError(ValueError):
    """An update that cannot apply to this item (DynamoDB answers a ValidationException; in a transaction, a
    ValidationError cancellation reason)."""


def resolve(path: Path, names: Names) -> Resolved:
    return tuple(names[p] if isinstance(p, str) and p[0] == "#" else p for p in path.parts)


def get(item: Mapping[str, Value], path: Resolved) -> Value | None:
    current: Value | None = item.get(str(path[0]))
    for part in path[1:]:
        if current is None:
            return None
        if isinstance(part, int):
            elements = current.get("L")
            current = elements[part] if elements is not None and part < len(elements) else None
        else:
            members = current.get("M")
            current = members.get(part) if members is not None else None
    return current


def operand(node: Node, item: Mapping[str, Value], names: Names, values: Values) -> Value | None:
    if isinstance(node, Placeholder):
        return values[node.name]
    if isinstance(node, Path):
        return get(item, resolve(node, names))
    if isinstance(node, Call) and node.name == "size":
        target = operand(node.args[0], item, names, values)
        length = v.size(target) if target is not None else None
        return {"N": str(length)} if length is not None else None
    raise ExpressionError("Syntax error; a condition is not an operand")


def _scalar(node: Node, value: Value | None, operator: str) -> None:
    """A literal of the wrong type for an ordering is DynamoDB's error; an attribute of the wrong type is false."""
    if isinstance(node, Placeholder) and value is not None and v.type_of(value) not in ("S", "N", "B"):
        raise ExpressionError(
            f"Incorrect operand type for operator or function; operator: {operator}, operand type: {v.type_of(value)}"
        )


def condition(node: Node, item: Mapping[str, Value], names: Names, values: Values) -> bool:
    """Whether `item` ({} for no item) satisfies the condition `node`."""
    if isinstance(node, Logical):
        if node.operator == "AND":
            return condition(node.left, item, names, values) and condition(node.right, item, names, values)
        return condition(node.left, item, names, values) or condition(node.right, item, names, values)
    if isinstance(node, Not):
        return not condition(node.operand, item, names, values)
    evaluate = _PREDICATES.get(type(node))
    if evaluate is None:
        raise ExpressionError("Syntax error; an operand is not a condition")
    return evaluate(node, item, names, values)


def _in(node: In, item: Mapping[str, Value], names: Names, values: Values) -> bool:
    target = operand(node.operand, item, names, values)
    options = (operand(option, item, names, values) for option in node.options)
    return target is not None and any(o is not None and v.equal(target, o) for o in options)


_ORDERINGS: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def _compare(node: Compare, item: Mapping[str, Value], names: Names, values: Values) -> bool:
    left = operand(node.left, item, names, values)
    right = operand(node.right, item, names, values)
    if node.operator not in ("=", "<>"):
        _scalar(node.left, left, node.operator)
        _scalar(node.right, right, node.operator)
    if left is None or right is None:
        # A missing attribute equals nothing, so it is "not equal" to any value.
        return node.operator == "<>" and (left is not None or right is not None)
    if node.operator == "=":
        return v.equal(left, right)
    if node.operator == "<>":
        return not v.equal(left, right)
    pair = v.ordered(left, right)
    return pair is not None and _ORDERINGS[node.operator](*pair)


def _between(node: Between, item: Mapping[str, Value], names: Names, values: Values) -> bool:
    target = operand(node.operand, item, names, values)
    low = operand(node.low, item, names, values)
    high = operand(node.high, item, names, values)
    for side, value in ((node.low, low), (node.high, high)):
        _scalar(side, value, "BETWEEN")
    if low is not None and high is not None:
        bounds = v.ordered(low, high)
        if bounds is not None and bounds[0] > bounds[1]:
            raise ExpressionError(
                "The BETWEEN operator requires upper bound to be greater than or equal to lower bound; "
                f"lower bound operand: AttributeValue: {low}, upper bound operand: AttributeValue: {high}"
            )
    if target is None or low is None or high is None:
        return False
    above, below = v.ordered(target, low), v.ordered(target, high)
    return above is not None and below is not None and above[0] >= above[1] and below[0] <= below[1]


def _function(node: Call, item: Mapping[str, Value], names: Names, values: Values) -> bool:
    first = operand(node.args[0], item, names, values)
    if node.name == "attribute_exists":
        return first is not None
    if node.name == "attribute_not_exists":
        return first is None
    second = operand(node.args[1], item, names, values)
    if node.name == "attribute_type":
        if second is None or v.type_of(second) != "S" or second["S"] not in v.TYPES:
            raise ExpressionError(f"Invalid attribute type name found; type: {second}, valid types: {sorted(v.TYPES)}")
        return first is not None and v.type_of(first) == second["S"]
    if first is None or second is None:
        return False
    if node.name == "begins_with":
        return v.begins_with(first, second)
    return v.contains(first, second)  # contains


_PREDICATES: dict[type, Callable[[Any, Mapping[str, Value], Names, Values], bool]] = {
    Compare: _compare,
    Between: _between,
    In: _in,
    Call: _function,
}


def update(
    item: Item, actions: Iterable[UpdateAction], names: Names, values: Values, key: frozenset[str]
) -> tuple[Item, set[str]]:
    """The item after `actions` (every operand read from the item as it was), and the top-level attributes they
    touch. Raises ExpressionError for what DynamoDB rejects whatever the item, UpdateError for what it rejects of this
    item."""
    planned: list[tuple[str, Resolved, Value | None]] = []
    for action in actions:
        path = resolve(action.path, names)
        if path[0] in key:
            raise ExpressionError(f"Cannot update attribute {path[0]}. This attribute is part of the key")
        if action.value is None:
            planned.append(("REMOVE", path, None))
        elif action.clause == "SET":
            planned.append(("SET", path, _update_value(action.value, item, names, values)))
        else:
            planned.append((action.clause, path, values[action.value.name]))  # type: ignore[union-attr]
    _check_overlap([path for _, path, _ in planned])
    result = dict(item)
    # Removing list elements from the highest index down keeps the lower indexes where the expression named them.
    removals = sorted((p for c, p, _ in planned if c == "REMOVE"), key=lambda p: [(isinstance(x, int), x) for x in p])
    for clause, path, value in planned:
        if clause == "SET":
            _write(result, path, value)
        elif clause in ("ADD", "DELETE"):
            _write(result, path, _add_or_delete(clause, get(result, path), value))  # type: ignore[arg-type]
    for path in reversed(removals):
        _write(result, path, None)
    return result, {str(path[0]) for _, path, _ in planned}


def _update_value(node: Node, item: Mapping[str, Value], names: Names, values: Values) -> Value:
    if isinstance(node, Placeholder):
        return values[node.name]
    if isinstance(node, Path):
        found = get(item, resolve(node, names))
        if found is None:
            raise UpdateError("The provided expression refers to an attribute that does not exist in the item")
        return found
    if isinstance(node, Arithmetic):
        left = _update_value(node.left, item, names, values)
        right = _update_value(node.right, item, names, values)
        if v.type_of(left) != "N" or v.type_of(right) != "N":
            raise UpdateError("An operand in the update expression has an incorrect data type")
        return v.add_numbers(left, right, subtract=node.operator == "-")
    if isinstance(node, Call) and node.name == "if_not_exists":
        found = get(item, resolve(node.args[0], names))  # type: ignore[arg-type]
        return found if found is not None else _update_value(node.args[1], item, names, values)
    if isinstance(node, Call) and node.name == "list_append":
        first = _update_value(node.args[0], item, names, values)
        second = _update_value(node.args[1], item, names, values)
        if v.type_of(first) != "L" or v.type_of(second) != "L":
            raise UpdateError("An operand in the update expression has an incorrect data type")
        return {"L": [*first["L"], *second["L"]]}
    raise ExpressionError("Syntax error; not an update operand")


def _add_or_delete(clause: str, current: Value | None, value: Value) -> Value | None:
    kind = v.type_of(value)
    if clause == "ADD" and kind == "N":
        if current is None:
            return value
        if v.type_of(current) != "N":
            raise UpdateError("An operand in the update expression has an incorrect data type")
        return v.add_numbers(current, value)
    if kind not in v.SET_TYPES:
        raise ExpressionError(
            f"Incorrect operand type for operator or function; operator: {clause}, operand type: {kind}"
        )
    if current is None:
        return value if clause == "ADD" else None
    if v.type_of(current) != kind:
        raise UpdateError("An operand in the update expression has an incorrect data type")
    if clause == "ADD":
        merged = list(current[kind]) + [x for x in value[kind] if not _in_set(kind, x, current[kind])]
        return {kind: merged}
    left = [x for x in current[kind] if not _in_set(kind, x, value[kind])]
    return {kind: left} if left else None


def _in_set(kind: str, element: Any, elements: list[Any]) -> bool:
    if kind == "NS":
        return any(v.number(element) == v.number(other) for other in elements)
    return element in elements


def _check_overlap(paths: list[Resolved]) -> None:
    if all(len(path) == 1 for path in paths) and len({path[0] for path in paths}) == len(paths):
        return  # distinct top-level attributes: the common case
    for index, first in enumerate(paths):
        for second in paths[index + 1 :]:
            shorter = min(len(first), len(second))
            if first[:shorter] == second[:shorter]:
                raise ExpressionError(
                    "Two document paths overlap with each other; must remove or rewrite one of these paths; "
                    f"path one: {list(first)}, path two: {list(second)}"
                )


def _write(item: Item, path: Resolved, value: Value | None) -> None:
    """Set (or, with None, remove) the value at `path`, copying the containers on the way."""
    if len(path) == 1:
        if value is None:
            item.pop(str(path[0]), None)
        else:
            item[str(path[0])] = value
        return
    parent = get(item, path[:-1])
    last = path[-1]
    if parent is None or ("L" if isinstance(last, int) else "M") not in parent:
        if value is None:
            return
        raise UpdateError("The document path provided in the update expression is invalid for update")
    if isinstance(last, int):
        _write(item, path[:-1], {"L": _with_element(parent["L"], last, value)})
    else:
        members = dict(parent["M"])
        if value is None:
            members.pop(last, None)
        else:
            members[last] = value
        _write(item, path[:-1], {"M": members})


def _with_element(elements: list[Value], index: int, value: Value | None) -> list[Value]:
    """The list with its `index`th element set (appended past the end) or, with None, removed."""
    changed = list(elements)
    if value is None:
        if index < len(changed):
            del changed[index]
    elif index < len(changed):
        changed[index] = value
    else:
        changed.append(value)
    return changed


def project(item: Mapping[str, Value], paths: Iterable[Path], names: Names) -> Item:
    """The attributes of `item` named by `paths` (a nested path keeps the maps around it; list elements are
    compacted, as DynamoDB does)."""
    result: Item = {}
    for path in paths:
        resolved = resolve(path, names)
        found = get(item, resolved)
        if found is None:
            continue
        if len(resolved) == 1:
            result[str(resolved[0])] = found
            continue
        _merge(result, resolved, found)
    return result


def _merge(result: Item, path: Resolved, value: Value) -> None:
    head, rest = str(path[0]), path[1:]
    nested: Value = value
    for part in reversed(rest):
        nested = {"L": [nested]} if isinstance(part, int) else {"M": {str(part): nested}}
    existing = result.get(head)
    if existing is None or "M" not in existing or "M" not in nested:
        result[head] = nested if existing is None else _combine(existing, nested)
        return
    result[head] = _combine(existing, nested)


def _combine(left: Value, right: Value) -> Value:
    if "M" in left and "M" in right:
        members = dict(left["M"])
        for name, value in right["M"].items():
            members[name] = _combine(members[name], value) if name in members else value
        return {"M": members}
    if "L" in left and "L" in right:
        return {"L": [*left["L"], *right["L"]]}
    return right
