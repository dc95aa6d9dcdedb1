"""DynamoDB AttributeValues in their wire format ({"S": "x"}, {"N": "3"}, {"M": {...}} ...): comparison, ordering,
size, and the typing rules of the expression language."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Context, Decimal
from functools import lru_cache
from typing import Any

Value = dict[str, Any]
Item = dict[str, Value]

SET_TYPES = frozenset({"SS", "NS", "BS"})
_SET_NAMES = {"SS": "string", "NS": "number", "BS": "binary"}
# DynamoDB numbers have up to 38 significant digits.
_NUMBERS = Context(prec=38)
TYPES = frozenset({"S", "N", "B", "BOOL", "NULL", "M", "L", "SS", "NS", "BS"})


@lru_cache(maxsize=65_536)
def number(text: str) -> Decimal:
    """A wire number as a Decimal (cached: the same few numbers are compared over and over)."""
    return Decimal(text)


def type_of(value: Value) -> str:
    return next(iter(value))


def equal(left: Value, right: Value) -> bool:
    """DynamoDB's `=`: same type and same value; numbers and number sets compare numerically, sets as sets."""
    kind = type_of(left)
    if kind != type_of(right):
        return False
    a, b = left[kind], right[kind]
    if kind == "N":
        return number(a) == number(b)
    if kind == "NS":
        return {number(n) for n in a} == {number(n) for n in b}
    if kind in ("SS", "BS"):
        return set(a) == set(b)
    if kind == "M":
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if kind == "L":
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def ordered(left: Value, right: Value) -> tuple[Any, Any] | None:
    """Both sides as comparable Python values when `<`/`>`/BETWEEN apply (both S, both N or both B), else None: a
    comparison of other or mismatched types is false, not an error."""
    kind = type_of(left)
    if kind != type_of(right) or kind not in ("S", "N", "B"):
        return None
    if kind == "N":
        return number(left["N"]), number(right["N"])
    return left[kind], right[kind]


def sort_key(value: Value) -> Any:
    """The order DynamoDB keeps key attributes in: strings and binaries by their bytes, numbers by value."""
    kind = type_of(value)
    if kind == "N":
        return number(value["N"])
    if kind == "S":
        # Code point order is UTF-8 byte order.
        return value["S"]
    return bytes(value[kind]) if not isinstance(value[kind], bytes) else value[kind]


def size(value: Value) -> int | None:
    """The `size()` function: characters of a string, bytes of a binary, elements of a set, list or map."""
    kind = type_of(value)
    if kind == "S":
        return len(value["S"])
    if kind == "B":
        return len(value["B"])
    if kind in ("SS", "NS", "BS", "L", "M"):
        return len(value[kind])
    return None


def contains(container: Value, operand: Value) -> bool:
    kind = type_of(container)
    if kind == "S":
        return type_of(operand) == "S" and operand["S"] in container["S"]
    if kind == "B":
        return type_of(operand) == "B" and operand["B"] in container["B"]
    if kind == "SS":
        return type_of(operand) == "S" and operand["S"] in container["SS"]
    if kind == "BS":
        return type_of(operand) == "B" and operand["B"] in container["BS"]
    if kind == "NS":
        return type_of(operand) == "N" and number(operand["N"]) in {number(n) for n in container["NS"]}
    if kind == "L":
        return any(equal(element, operand) for element in container["L"])
    return False


def begins_with(value: Value, prefix: Value) -> bool:
    kind = type_of(value)
    if kind not in ("S", "B") or type_of(prefix) != kind:
        return False
    return bool(value[kind].startswith(prefix[kind]))


def validate_value(value: Any, where: str) -> str | None:
    """Why `value` is not a valid AttributeValue (None when it is): one type key, no empty set, sets without
    duplicates, numbers that parse."""
    if type(value) is dict and len(value) == 1 and ("S" in value or "BOOL" in value):
        return None  # the common case, checked first
    if not isinstance(value, Mapping) or len(value) != 1:
        return f"{where}: an AttributeValue must have exactly one type"
    kind, inner = next(iter(value.items()))
    if kind not in TYPES:
        return f"{where}: unknown AttributeValue type {kind}"
    if kind in SET_TYPES:
        if not inner:
            return f"One or more parameter values were invalid: An {_SET_NAMES[kind]} set  may not be empty"
        if len(set(inner)) != len(inner):
            return "One or more parameter values were invalid: Input collection contains duplicates"
    if kind in ("N", "NS"):
        for text in [inner] if kind == "N" else inner:
            try:
                number(text)
            except ArithmeticError:
                return "A value provided cannot be converted into a number"
    if kind == "M":
        return next((e for k, v in inner.items() if (e := validate_value(v, f"{where}.{k}"))), None)
    if kind == "L":
        return next((e for v in inner if (e := validate_value(v, where))), None)
    return None


def add_numbers(left: Value, right: Value, *, subtract: bool = False) -> Value:
    a, b = number(left["N"]), number(right["N"])
    result = _NUMBERS.subtract(a, b) if subtract else _NUMBERS.add(a, b)
    return {"N": format_number(result)}


def format_number(value: Decimal) -> str:
    """A Decimal as DynamoDB writes a number back: no exponent, no trailing zeros."""
    return format(value.normalize(_NUMBERS), "f")


MAX_ITEM_BYTES = 400 * 1024


def item_size(item: Mapping[str, Value]) -> int:
    """An item's size as DynamoDB counts it against its 400 KB limit: names and values, strings in UTF-8 bytes, a
    number about one byte per two digits, three bytes for each list or map and one per element."""
    return sum(len(name.encode()) + _value_size(value) for name, value in item.items())


def _value_size(value: Value) -> int:
    kind, inner = next(iter(value.items()))
    if kind == "S":
        return len(inner.encode())
    if kind == "N":
        return (len(inner.lstrip("-").replace(".", "")) + 1) // 2 + 1
    if kind == "B":
        return len(inner)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "M":
        return 3 + sum(len(name.encode()) + _value_size(member) + 1 for name, member in inner.items())
    if kind == "L":
        return 3 + sum(_value_size(element) + 1 for element in inner)
    element_kind = kind[0]  # SS, NS, BS: the elements' sizes
    return sum(_value_size({element_kind: element}) for element in inner)


def may_exceed_item_size(item: Mapping[str, Value]) -> bool:
    """A cheap test that rules out most items before `item_size` counts bytes: the item's repr holds every name and
    every value's text at least once, and a character is at most four bytes, so four times its length bounds the size
    (repr runs in C: this costs a few microseconds on every write)."""
    return 4 * len(repr(item)) > MAX_ITEM_BYTES
