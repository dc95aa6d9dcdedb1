"""Fixtures of the simulation's tests: the simulated DynamoDB and moto's server side by side, with the same tables."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import boto3
import pytest
from boto3.dynamodb.types import TypeDeserializer
from botocore.config import Config
from botocore.exceptions import ClientError

from agent_jobs_sim.dynamodb import SimDynamoDB

REGION = "us-east-1"
_deserializer = TypeDeserializer()
T = TypeVar("T")


def table_definition(name: str) -> dict[str, Any]:
    """A table keyed by `pk` and `sk` (a number), with a sparse INCLUDE index and a sparse KEYS_ONLY index."""
    return {
        "TableName": name,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "N"},
            {"AttributeName": "grp", "AttributeType": "S"},
            {"AttributeName": "rank", "AttributeType": "N"},
            {"AttributeName": "tag", "AttributeType": "S"},
        ],
        "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": "byGroup",
                "KeySchema": [
                    {"AttributeName": "grp", "KeyType": "HASH"},
                    {"AttributeName": "rank", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["note"]},
            },
            {
                "IndexName": "byTag",
                "KeySchema": [{"AttributeName": "tag", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            },
        ],
    }


def plain(raw: Any) -> Any:
    """Wire values as Python values, so that "1" and "1.0" compare as the same number."""
    if raw is None:
        return None
    return {key: _deserializer.deserialize(value) for key, value in raw.items()}


def outcome(call: Callable[[], Mapping[str, Any]]) -> dict[str, Any]:
    """What a call answered, comparable across the two: the response without its metadata, or the error's code,
    cancellation reasons and old item."""
    try:
        response = call()
    except ClientError as error:
        answer: dict[str, Any] = dict(error.response)
        result: dict[str, Any] = {"error": answer["Error"]["Code"]}
        if "Item" in answer:
            result["item"] = plain(answer["Item"])
        if "CancellationReasons" in answer:
            result["reasons"] = [
                {"Code": reason["Code"], **({"Item": plain(reason["Item"])} if "Item" in reason else {})}
                for reason in answer["CancellationReasons"]
            ]
        return result
    # The simulation reports no capacity (moto does).
    skipped = ("ResponseMetadata", "ConsumedCapacity", "ItemCollectionMetrics")
    result = {key: value for key, value in response.items() if key not in skipped}
    for key in ("Item", "Attributes", "LastEvaluatedKey"):
        if key in result:
            result[key] = plain(result[key])
    if "Items" in result:
        result["Items"] = [plain(item) for item in result["Items"]]
    if "Responses" in result:
        # The tables' names differ between the two, and DynamoDB does not order a batch's items.
        found = [plain(item) for items in result["Responses"].values() for item in items]
        result["Responses"] = sorted(found, key=lambda item: (item.get("pk"), item.get("sk")))
    return result


def error_message(call: Callable[[], Mapping[str, Any]]) -> str:
    with pytest.raises(ClientError) as caught:
        call()
    return str(caught.value.response["Error"]["Message"])


@dataclass
class Pair:
    """The simulated DynamoDB and moto's server, each with the table `table_definition` gives."""

    sim: SimDynamoDB
    moto: Any
    sim_table: str
    moto_table: str

    def both(self, scenario: Callable[[Any, str], T]) -> tuple[T, T]:
        """`scenario(client, table)` run on each."""
        return scenario(self.sim, self.sim_table), scenario(self.moto, self.moto_table)


@pytest.fixture
def pair(moto_server: str) -> Pair:
    sim = SimDynamoDB(lambda: 0.0)
    # No retries: moto's internal errors are answers the tests assert, not failures to retry.
    config = Config(retries={"mode": "standard", "total_max_attempts": 1})
    moto = boto3.client("dynamodb", endpoint_url=moto_server, region_name=REGION, config=config)
    name = f"sim-diff-{uuid.uuid4().hex[:8]}"
    sim.create_table(**table_definition("t"))
    moto.create_table(**table_definition(name))
    return Pair(sim, moto, "t", name)
