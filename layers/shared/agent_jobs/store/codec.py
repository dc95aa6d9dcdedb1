"""The table's wire format: DynamoDB values to plain Python and back, the reading of a failed condition, and what a
record stores of a message body or an error."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError

Item = dict[str, Any]
Clock = Callable[[], int]

# A stored message body larger than this (in characters, and in UTF-8 bytes) is truncated (DynamoDB items are capped
# at 400 KB).
MAX_STORED_BODY_CHARS = 300_000
# A stored error (or rejection reason) longer than this is cut short: it may quote what a tenant sent (a path).
MAX_STORED_ERROR_CHARS = 10_000
_serializer = TypeSerializer()
_deserializer = TypeDeserializer()


def epoch_ms() -> int:
    return time.time_ns() // 1_000_000


# Integers DynamoDB stores exactly (38 significant digits): written without boto3's Decimal context round trip.
_MAX_PLAIN_INT = 10**38


def to_item(raw: Mapping[str, Any]) -> Item:
    """A DynamoDB wire item as plain Python (numbers as int where integral)."""
    return {key: _from_wire(value) for key, value in raw.items()}


def _from_wire(value: Mapping[str, Any]) -> Any:
    """One wire value as plain Python: the common types here, anything else (sets, binary, unusual numbers) through
    boto3's TypeDeserializer, with the same result as that alone."""
    if len(value) == 1:
        ((tag, inner),) = value.items()
        if tag == "N":
            if inner.lstrip("-").isdigit():
                return int(inner)
        elif (convert := _FROM_WIRE.get(tag)) is not None:
            return convert(inner)
    return _plain(_deserializer.deserialize(value))  # type: ignore[arg-type]


_FROM_WIRE: dict[str, Callable[[Any], Any]] = {
    "S": lambda inner: inner,
    "BOOL": lambda inner: inner,
    "NULL": lambda inner: None,
    "M": lambda inner: {key: _from_wire(v) for key, v in inner.items()},
    "L": lambda inner: [_from_wire(v) for v in inner],
}


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _dynamodb_value(value: Any) -> Any:
    """DynamoDB numbers are Decimals: a float anywhere in a value (a job result, say) becomes one."""
    if isinstance(value, float):
        return Decimal(str(value))
    if isinstance(value, Mapping):
        return {k: _dynamodb_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_dynamodb_value(v) for v in value]
    return value


def wire(values: Mapping[str, Any]) -> dict[str, Any]:
    """Plain Python values (a key, an item, expression values) in DynamoDB's wire format."""
    return {key: _to_wire(value) for key, value in values.items()}


def _to_wire(value: Any) -> dict[str, Any]:
    """One value in the wire format: the common types here, anything else (sets, binary, floats, Decimals, huge
    integers) through boto3's TypeSerializer, with the same result and the same errors as that alone."""
    kind = type(value)
    if kind is int:
        if -_MAX_PLAIN_INT < value < _MAX_PLAIN_INT:
            return {"N": str(value)}
    elif (convert := _TO_WIRE.get(kind)) is not None:
        return convert(value)
    return dict(_serializer.serialize(_dynamodb_value(value)))


_TO_WIRE: dict[type, Callable[[Any], dict[str, Any]]] = {
    str: lambda value: {"S": value},
    bool: lambda value: {"BOOL": value},
    type(None): lambda value: {"NULL": True},
    dict: lambda value: {"M": {key: _to_wire(v) for key, v in value.items()}},
    list: lambda value: {"L": [_to_wire(v) for v in value]},
}


def condition_failed(error: ClientError) -> bool:
    return error.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException"


def cancellation(error: ClientError) -> list[dict[str, Any]] | None:
    """The cancellation reasons of a cancelled transaction, one per item; None for any other error."""
    if error.response.get("Error", {}).get("Code") != "TransactionCanceledException":
        return None
    return list(error.response.get("CancellationReasons", []))  # type: ignore[arg-type]


def reason_failed(reason: Mapping[str, Any]) -> bool:
    return reason.get("Code") == "ConditionalCheckFailed"


def reason_item(reasons: list[dict[str, Any]], index: int) -> Item | None:
    """The old item of a transaction's `index`th item when its condition failed (ALL_OLD), else None."""
    reason = reasons[index] if len(reasons) > index else {}
    return to_item(reason.get("Item", {})) if reason_failed(reason) else None


BODY_SET = "body = :body, bodyBytes = :bodyBytes, bodySha256 = :bodySha256"
"""The update clause of a stored message body, with `body_values`."""


def body_values(body: str) -> dict[str, Any]:
    """A message body as a record stores it: `body` (cut by `stored_body` when too large), and the whole body's
    UTF-8 size and sha256, so that a cut body still says what was sent (SQS takes bodies up to 1 MiB, more than a
    DynamoDB item holds). A valid job's body never needs the cut: the worker stores its payload in the payload
    bucket first (`agent_jobs.payloads.storable_body`)."""
    encoded = body.encode("utf-8", errors="replace")
    return {
        ":body": stored_body(body),
        ":bodyBytes": len(encoded),
        ":bodySha256": hashlib.sha256(encoded).hexdigest(),
    }


def stored_body(body: str) -> str:
    """`body` cut to MAX_STORED_BODY_CHARS characters and as many UTF-8 bytes: a character takes up to four bytes, and
    a body cut by characters alone could make its item too large to write, on every delivery of its message."""
    head = body[:MAX_STORED_BODY_CHARS].encode("utf-8", errors="replace")[:MAX_STORED_BODY_CHARS]
    return head.decode("utf-8", errors="ignore")  # a character the cut split in two is left out


def stored_error(error: str) -> str:
    """`error` cut to MAX_STORED_ERROR_CHARS characters (marked with an ellipsis), so that its record stays writable."""
    return error if len(error) <= MAX_STORED_ERROR_CHARS else error[: MAX_STORED_ERROR_CHARS - 1] + "…"
