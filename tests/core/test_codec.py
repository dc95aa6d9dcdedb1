"""The table's wire format: the codec's own conversion of the common types gives exactly what boto3's TypeSerializer
and TypeDeserializer give (the reference), on a few thousand random values, and the same errors."""

from __future__ import annotations

import random
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from boto3.dynamodb.types import Binary, TypeDeserializer, TypeSerializer

from agent_jobs.models import JobStatus
from agent_jobs.store.codec import _dynamodb_value, _plain, to_item, wire

REFERENCE_OUT, REFERENCE_IN = TypeSerializer(), TypeDeserializer()
EDGES: list[Any] = [
    0, -1, 10**38 - 1, -(10**38) + 1, 10**37, True, False, None, "", "x", "ünïcode", 0.5, -2.25, 1e20, Decimal("1.5"),
    Decimal("100"), b"bytes", {"a", "b"}, {1, 2}, (1, "two"), JobStatus.PARKED, [], {},
]  # fmt: skip


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kinds: list[Callable[[], Any]] = [
        lambda: rng.choice(EDGES),
        lambda: rng.randint(-(10**40), 10**40) if rng.random() < 0.1 else rng.randint(-(10**12), 10**12),
        lambda: "".join(rng.choice("ab#:- é") for _ in range(rng.randrange(6))),
        lambda: rng.choice([True, False, None]),
        lambda: round(rng.uniform(-1e6, 1e6), rng.randrange(4)),
        lambda: Decimal(rng.randint(-999, 999)) / Decimal(rng.choice([1, 10, 100])),
        lambda: [random_value(rng, depth + 1) for _ in range(rng.randrange(4))],
        lambda: tuple(random_value(rng, depth + 1) for _ in range(rng.randrange(3))),
        lambda: {f"k{i}": random_value(rng, depth + 1) for i in range(rng.randrange(4))},
    ]
    return kinds[rng.randrange(9 if depth < 3 else 6)]()


def reference_wire(values: dict[str, Any]) -> dict[str, Any]:
    return {key: REFERENCE_OUT.serialize(_dynamodb_value(value)) for key, value in values.items()}


def reference_item(raw: dict[str, Any]) -> dict[str, Any]:
    return {key: _plain(REFERENCE_IN.deserialize(value)) for key, value in raw.items()}


def outcome(function: Any, argument: Any) -> Any:
    try:
        return ("value", function(argument))
    except Exception as error:  # the same error class and message as the reference
        return ("error", type(error), str(error))


def test_wire_and_to_item_agree_with_boto3_on_random_values():
    rng = random.Random(20261203)
    for _ in range(3000):
        values = {f"v{i}": random_value(rng) for i in range(rng.randrange(1, 5))}
        expected = outcome(reference_wire, values)
        assert outcome(wire, values) == expected, values
        if expected[0] == "value":
            raw = expected[1]
            assert to_item(raw) == reference_item(raw), raw


@pytest.mark.parametrize(
    "raw",
    [
        {"N": "1E+2"}, {"N": "-0"}, {"N": "007"}, {"N": "0.10"}, {"N": "-12.5"}, {"NS": ["1", "2.5"]},
        {"SS": ["a"]}, {"B": b"x"}, {"BS": [b"x"]}, {"NULL": True}, {"BOOL": False},
        {"M": {"n": {"N": "3"}, "l": {"L": [{"S": "s"}]}}},
    ],
)  # fmt: skip
def test_to_item_agrees_with_boto3_on_every_wire_type(raw: dict[str, Any]):
    assert to_item({"v": raw}) == reference_item({"v": raw})


def test_binary_and_out_of_range_numbers_keep_boto3s_answers():
    assert wire({"b": b"\x00"}) == {"b": {"B": b"\x00"}}
    assert to_item({"b": {"B": b"\x00"}}) == {"b": Binary(b"\x00")}
    with pytest.raises(Exception, match=r"Inexact|Rounded|Overflow|Underflow"):
        wire({"n": 10**40 + 1})
