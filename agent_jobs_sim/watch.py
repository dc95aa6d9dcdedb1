"""The simulated table as the product's calls reach it: a planted bug's rewrite of the request, the call, and the
oracle's check of every job record the call changed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

WRITES = frozenset({"put_item", "update_item", "delete_item", "transact_write_items"})


def _keys(operation: str, request: dict[str, Any]) -> list[str]:
    if operation == "put_item":
        return [request["Item"]["pk"]["S"]]
    if operation in ("update_item", "delete_item"):
        return [request["Key"]["pk"]["S"]]
    keys: list[str] = []
    for action in request.get("TransactItems", []):
        for body in action.values():
            key = body.get("Key") or body.get("Item") or {}
            if "pk" in key:
                keys.append(key["pk"]["S"])
    return keys


def _lease_holders(operation: str, request: dict[str, Any]) -> list[tuple[str, str]]:
    """(job key, lease owner) of each job write that a worker makes as the holder of a lease it took earlier (its
    values name `:owner` and it does not take the lease itself)."""
    if operation == "update_item":
        bodies = [request]
    elif operation == "transact_write_items":
        bodies = [action["Update"] for action in request.get("TransactItems", []) if "Update" in action]
    else:
        return []
    held: list[tuple[str, str]] = []
    for body in bodies:
        owner = body.get("ExpressionAttributeValues", {}).get(":owner", {}).get("S")
        pk = body.get("Key", {}).get("pk", {}).get("S", "")
        if owner and pk.startswith("job#") and "leaseOwner = :owner" not in str(body.get("UpdateExpression", "")):
            held.append((pk, owner))
    return held


class WatchedTable:
    def __init__(
        self,
        table: Any,
        table_name: str,
        *,
        on_job_write: Callable[[str, tuple[str | None, int] | None, tuple[str | None, int] | None], None],
        rewrite: Callable[[str, dict[str, Any]], dict[str, Any] | None] | None = None,
        on_stale_write: Callable[[str, str, str | None], None] = lambda pk, owner, holder: None,
        on_lease_taken: Callable[[str, str], None] = lambda pk, owner: None,
        on_place_write: Callable[[str, str | None, str | None], None] = lambda pk, old, new: None,
    ) -> None:
        self._table = table
        self._name = table_name
        self._on_job_write = on_job_write
        self._rewrite = rewrite
        self._on_stale_write = on_stale_write
        self._on_lease_taken = on_lease_taken
        self._on_place_write = on_place_write

    def _read(self, pk: str) -> tuple[str | None, int] | None:
        """The record's status and the length of its history (wire format: nothing converted)."""
        item = self._table.peek(self._name, {"pk": {"S": pk}})
        if item is None:
            return None
        return (item["status"]["S"] if "status" in item else None), len(item.get("history", {}).get("L", ()))

    def _holder(self, pk: str) -> str | None:
        item = self._table.peek(self._name, {"pk": {"S": pk}})
        return None if item is None or "leaseOwner" not in item else str(item["leaseOwner"]["S"])

    def _place(self, pk: str) -> str | None:
        """The record's place in its queue (`sequenceNumber`), if it has one."""
        item = self._table.peek(self._name, {"pk": {"S": pk}})
        return None if item is None or "sequenceNumber" not in item else str(item["sequenceNumber"]["S"])

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._table, name)
        if name not in WRITES:
            return method

        def call(**kwargs: Any) -> Any:
            held = _lease_holders(name, kwargs)  # as the product sent it, before a planted bug's rewrite
            if self._rewrite is not None:
                kwargs = self._rewrite(name, kwargs) or kwargs
            before = {pk: self._read(pk) for pk in _keys(name, kwargs) if pk.startswith("job#")}
            owners = {pk: self._holder(pk) for pk in before}
            places = {pk: self._place(pk) for pk in before}
            holders = {pk: self._holder(pk) for pk, _ in held}
            answer = method(**kwargs)
            for pk, old in before.items():
                self._on_job_write(pk, old, self._read(pk))
                self._on_place_write(pk, places[pk], self._place(pk))
                owner = self._holder(pk)
                if owner is not None and owner != owners[pk]:
                    self._on_lease_taken(pk, owner)
            for pk, owner in held:
                if holders[pk] != owner and self._read(pk) != before.get(pk):
                    self._on_stale_write(pk, owner, holders[pk])
            return answer

        return call
