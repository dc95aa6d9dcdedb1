"""A table's items and its global secondary indexes. An index is sparse (an item without its key attributes is not in
it), holds what its Projection says, and is eventually consistent: each write reaches it at the time the lag function
gives, never before an earlier write of the same item."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent_jobs_sim.dynamodb import values as v
from agent_jobs_sim.dynamodb.values import Item, Value

Key = tuple[Any, Any]  # the hash and range key values in sort order (range None without a range key)


class KeyError_(ValueError):
    """A key or item whose key attributes are missing or of the wrong type (a ValidationException)."""


@dataclass(frozen=True)
class KeySchema:
    hash: str
    range: str | None
    types: Mapping[str, str]

    @classmethod
    def parse(cls, schema: list[Mapping[str, str]], types: Mapping[str, str]) -> KeySchema:
        roles = {entry["KeyType"]: entry["AttributeName"] for entry in schema}
        if "HASH" not in roles or len(schema) != len(roles):
            raise KeyError_("Invalid KeySchema: one HASH key and at most one RANGE key")
        for name in roles.values():
            if name not in types:
                raise KeyError_(f"One or more parameter values were invalid: {name} is not in AttributeDefinitions")
        return cls(roles["HASH"], roles.get("RANGE"), types)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.hash,) if self.range is None else (self.hash, self.range)

    def key_of(self, item: Mapping[str, Value]) -> Key | None:
        """The item's key, or None when a key attribute is missing, of another type or an empty string/binary."""
        hash_value = item.get(self.hash)
        first = _key_part(hash_value, self.types[self.hash]) if hash_value is not None else None
        if first is None:
            return None
        if self.range is None:
            return (first, None)
        range_value = item.get(self.range)
        second = _key_part(range_value, self.types[self.range]) if range_value is not None else None
        return None if second is None else (first, second)

    def wire_key(self, item: Mapping[str, Value]) -> Item:
        return {name: item[name] for name in self.names}


def _key_part(value: Value, kind: str) -> Any:
    """A key attribute's value in sort order (as `values.sort_key`), None when of another type or empty."""
    inner = value.get(kind)
    if inner is None:
        return None
    if kind == "N":
        return v.number(inner)
    return inner or None


@dataclass
class Index:
    name: str
    schema: KeySchema
    projection: str  # ALL, KEYS_ONLY or INCLUDE
    included: frozenset[str]
    table_keys: tuple[str, ...]
    # Table key -> entry, and index hash key -> {table key -> entry}.
    entries: dict[Key, Item] = field(default_factory=dict)
    partitions: dict[Any, dict[Key, Item]] = field(default_factory=dict)

    def entry(self, item: Item | None) -> Item | None:
        """What the index holds of `item` (None: not in the index)."""
        if item is None or self.schema.key_of(item) is None:
            return None
        if self.projection == "ALL":
            return item
        kept = set(self.table_keys) | set(self.schema.names) | self.included
        return {name: value for name, value in item.items() if name in kept}

    def apply(self, key: Key, entry: Item | None) -> None:
        old = self.entries.pop(key, None)
        if old is not None:
            partition = self.partitions[self.schema.key_of(old)[0]]  # type: ignore[index]
            del partition[key]
        if entry is not None:
            self.entries[key] = entry
            self.partitions.setdefault(self.schema.key_of(entry)[0], {})[key] = entry  # type: ignore[index]


class Table:
    """A table's items, kept by key, and its indexes with their pending updates."""

    def __init__(self, request: Mapping[str, Any], lag: Callable[[str, str], float]) -> None:
        self.name = str(request["TableName"])
        self.request = dict(request)
        types = {d["AttributeName"]: d["AttributeType"] for d in request.get("AttributeDefinitions", [])}
        self.schema = KeySchema.parse(request["KeySchema"], types)
        self.indexes: dict[str, Index] = {}
        for spec in request.get("GlobalSecondaryIndexes", []) or []:
            projection = spec.get("Projection", {})
            self.indexes[spec["IndexName"]] = Index(
                name=spec["IndexName"],
                schema=KeySchema.parse(spec["KeySchema"], types),
                projection=projection.get("ProjectionType", "ALL"),
                included=frozenset(projection.get("NonKeyAttributes", [])),
                table_keys=self.schema.names,
            )
        self.items: dict[Key, Item] = {}
        self.partitions: dict[Any, dict[Key, Item]] = {}
        self._lag = lag
        self._pending: list[tuple[float, int, str, Key, Item | None]] = []
        self._latest: dict[tuple[str, Key], float] = {}
        self._sequence = 0
        self.index_key_names = {name for index in self.indexes.values() for name in index.schema.names}

    def key(self, key: Mapping[str, Value]) -> Key:
        """The key of a request's Key: exactly the key attributes, of their declared types."""
        found = self.schema.key_of(key)
        if found is None or len(key) != len(self.schema.names):
            raise KeyError_("The provided key element does not match the schema")
        return found

    def check_item(self, item: Mapping[str, Value]) -> Key:
        """The key of an item to write, after DynamoDB's checks of its key and index key attributes."""
        for name in self.schema.names:
            value = item.get(name)
            if value is None:
                raise KeyError_(f"One or more parameter values were invalid: Missing the key {name} in the item")
            if self.schema.types[name] not in value:
                raise KeyError_(
                    f"One or more parameter values were invalid: Type mismatch for key {name} expected: "
                    f"{self.schema.types[name]} actual: {v.type_of(value)}"
                )
        for name in self.index_key_names & item.keys():
            value, kind = item[name], self.schema.types[name]
            if kind not in value:
                raise KeyError_(
                    "One or more parameter values were invalid: Type mismatch for Index Key "
                    f"{name} Expected: {kind} Actual: {v.type_of(value)}"
                )
        found = self.schema.key_of(item)
        if found is None:
            raise KeyError_(
                "One or more parameter values are not valid. The AttributeValue for a key attribute cannot contain "
                "an empty string value."
            )
        return found

    def write(self, key: Key, item: Item | None, now: float) -> None:
        """Store `item` under `key` (None: delete it) and schedule its arrival at each index."""
        old = self.items.pop(key, None)
        if old is not None:
            self.partitions[key[0]].pop(key, None)
        if item is not None:
            self.items[key] = item
            self.partitions.setdefault(key[0], {})[key] = item
        for index in self.indexes.values():
            before, after = index.entry(old), index.entry(item)
            if before is None and after is None:
                continue
            at = max(now + self._lag(self.name, index.name), self._latest.get((index.name, key), now))
            self._latest[(index.name, key)] = at
            self._sequence += 1
            heapq.heappush(self._pending, (at, self._sequence, index.name, key, after))

    def catch_up(self, now: float) -> None:
        """Apply every index update due by `now`, in time order (a tie in write order)."""
        while self._pending and self._pending[0][0] <= now:
            at, _, index_name, key, entry = heapq.heappop(self._pending)
            self.indexes[index_name].apply(key, entry)
            if self._latest.get((index_name, key)) == at:
                del self._latest[(index_name, key)]

    def next_update(self) -> float | None:
        return self._pending[0][0] if self._pending else None

    def candidates(self, index_name: str | None, hash_value: Value | None) -> list[Item]:
        """The items (or index entries) of one hash key, or all of them, in key order: hash key, range key, then
        (for an index) the table's key."""
        if index_name is None:
            source, schema = self.partitions, self.schema
        else:
            index = self.indexes[index_name]
            source, schema = index.partitions, index.schema
        if hash_value is None:
            groups: list[tuple[Any, dict[Key, Item]]] = sorted(source.items(), key=lambda pair: pair[0])
        else:
            groups = [(None, source.get(v.sort_key(hash_value), {}))]
        ordered: list[Item] = []
        for _, group in groups:
            if index_name is None or schema.range is None:
                ordered.extend(item for _, item in sorted(group.items(), key=lambda pair: pair[0]))
            else:
                rank = schema.range
                entries = sorted(group.items(), key=lambda pair: (v.sort_key(pair[1][rank]), pair[0]))
                ordered.extend(item for _, item in entries)
        return ordered

    def describe(self) -> dict[str, Any]:
        arn = f"arn:aws:dynamodb:us-east-1:123456789012:table/{self.name}"
        description: dict[str, Any] = {
            "TableName": self.name,
            "TableArn": arn,
            "TableStatus": "ACTIVE",
            "KeySchema": self.request["KeySchema"],
            "AttributeDefinitions": self.request.get("AttributeDefinitions", []),
            "ItemCount": len(self.items),
            "BillingModeSummary": {"BillingMode": self.request.get("BillingMode", "PROVISIONED")},
        }
        if self.indexes:
            description["GlobalSecondaryIndexes"] = [
                {**spec, "IndexStatus": "ACTIVE", "IndexArn": f"{arn}/index/{spec['IndexName']}"}
                for spec in self.request["GlobalSecondaryIndexes"]
            ]
        return description
