"""A request's expressions, parsed (from the cache) and checked as DynamoDB checks them before touching an item: every
placeholder used is defined, every one defined is used, every value is a valid AttributeValue."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent_jobs_sim.dynamodb.expressions import (
    ExpressionError,
    Parsed,
    parse_condition,
    parse_projection,
    parse_update,
)
from agent_jobs_sim.dynamodb.values import Value, validate_value

_PARSERS: dict[str, Callable[[str], Parsed]] = {
    "ConditionExpression": parse_condition,
    "FilterExpression": parse_condition,
    "KeyConditionExpression": parse_condition,
    "UpdateExpression": parse_update,
    "ProjectionExpression": parse_projection,
}


class RequestError(ValueError):
    """A request DynamoDB rejects as a whole (a ValidationException)."""


@dataclass(frozen=True)
class Expressions:
    """The parsed expressions of one request (or one transaction action) and its placeholders."""

    parsed: Mapping[str, Parsed]
    names: Mapping[str, str]
    values: Mapping[str, Value]

    def get(self, field: str) -> Parsed | None:
        return self.parsed.get(field)


_EMPTY: Mapping[str, Any] = {}
# Request shapes (expression texts, placeholder names) whose placeholders were found in order.
_CHECKED: set[tuple[tuple[tuple[str, str], ...], frozenset[str], frozenset[str]]] = set()
_CHECKED_LIMIT = 10_000


def expressions(request: Mapping[str, Any]) -> Expressions:
    """Parse and check the expressions of `request`; RequestError with DynamoDB's message when it would refuse."""
    parsed = _parse_all(request)
    names: Mapping[str, str] = request.get("ExpressionAttributeNames", _EMPTY)
    values: Mapping[str, Value] = request.get("ExpressionAttributeValues", _EMPTY)
    if "ExpressionAttributeNames" in request and not names:
        raise RequestError("ExpressionAttributeNames must not be empty")
    if "ExpressionAttributeValues" in request and not values:
        raise RequestError("ExpressionAttributeValues must not be empty")
    if (names or values) and not parsed:
        which = "ExpressionAttributeNames" if names else "ExpressionAttributeValues"
        raise RequestError(f"{which} can only be specified when using expressions")
    shape = (tuple((field, request[field]) for field in parsed), frozenset(names), frozenset(values))
    if shape not in _CHECKED:  # the same shape of request is checked once: the product sends few shapes, many times
        _check_placeholders(parsed, names, values)
        if len(_CHECKED) < _CHECKED_LIMIT:
            _CHECKED.add(shape)
    for name, value in values.items():
        problem = validate_value(value, f"ExpressionAttributeValues contains invalid value: {name}")
        if problem:
            raise RequestError(problem)
    return Expressions(parsed, names, values)


def _parse_all(request: Mapping[str, Any]) -> dict[str, Parsed]:
    parsed: dict[str, Parsed] = {}
    for field, parser in _PARSERS.items():
        text = request.get(field)
        if text is None:
            continue
        try:
            parsed[field] = parser(text)
        except ExpressionError as error:
            raise RequestError(f"Invalid {field}: {error}") from None
    return parsed


def _check_placeholders(parsed: Mapping[str, Parsed], names: Mapping[str, str], values: Mapping[str, Value]) -> None:
    """Every placeholder an expression uses is defined, and every one defined is used by some expression."""
    used_names: set[str] = set()
    used_values: set[str] = set()
    for field, expression in parsed.items():
        undefined_name = next((name for name in sorted(expression.names) if name not in names), None)
        if undefined_name is not None:
            raise RequestError(
                f"Invalid {field}: An expression attribute name used in the document path is not defined; "
                f"attribute name: {undefined_name}"
            )
        undefined_value = next((value for value in sorted(expression.values) if value not in values), None)
        if undefined_value is not None:
            raise RequestError(
                f"Invalid {field}: An expression attribute value used in expression is not defined; "
                f"attribute value: {undefined_value}"
            )
        used_names |= expression.names
        used_values |= expression.values
    for kind, defined, used in (("Names", names, used_names), ("Values", values, used_values)):
        unused = sorted(set(defined) - used)
        if unused:
            raise RequestError(
                f"Value provided in ExpressionAttribute{kind} unused in expressions: keys: {{{', '.join(unused)}}}"
            )
