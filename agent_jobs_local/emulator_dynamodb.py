"""The emulator's DynamoDB correction, applied inside its process before moto serves (see `emulator`): item
operations and transactions atomic and isolated, a failed transaction undoing only the writes it made."""

from __future__ import annotations

import copy
import functools
import threading
from collections.abc import Callable
from typing import Any, Final

from agent_jobs_local.emulator_sqs import PATCHED

_TABLE_OPERATIONS: Final = (
    "put_item",
    "update_item",
    "delete_item",
    "get_item",
    "query",
    "scan",
    "batch_write_item",
    "batch_get_item",
    "transact_write_items",
    "transact_get_items",
)
_table_operations_lock = threading.RLock()


def patch_atomic_table_operations() -> None:
    """Make each DynamoDB item operation and transaction atomic and isolated, as in DynamoDB (idempotent).

    moto's TransactWriteItems backs up every table it touches before applying and, when a condition fails, puts the
    backup back: in moto's threaded server a write that another request made meanwhile is silently undone (a job's
    PARKED record reverting to QUEUED, say). Here item reads, writes and transactions of the DynamoDB backend hold
    one lock, so a transaction and its rollback never interleave with another write.
    """
    from moto.dynamodb import models

    backend_class = models.DynamoDBBackend
    missing = [name for name in _TABLE_OPERATIONS if not callable(getattr(backend_class, name, None))]
    if missing:
        raise RuntimeError(
            f"moto's DynamoDBBackend has no {missing}: update patch_atomic_table_operations for this moto version"
        )
    if getattr(backend_class.transact_write_items, PATCHED, False):
        return
    backend_class.transact_write_items = transact_write_items_undo_log  # type: ignore[method-assign]
    for name in _TABLE_OPERATIONS:
        method = getattr(backend_class, name)

        def atomic(*args: Any, _method: Callable[..., Any] = method, **kwargs: Any) -> Any:
            with _table_operations_lock:
                return _method(*args, **kwargs)

        functools.update_wrapper(atomic, method)
        setattr(atomic, PATCHED, True)
        setattr(backend_class, name, atomic)


_TRANSACTION_OPERATIONS: Final = frozenset({"ConditionCheck", "Put", "Delete", "Update"})


def transact_write_items_undo_log(self: Any, transact_items: list[dict[str, Any]]) -> None:
    """moto's `DynamoDBBackend.transact_write_items`, with the same checks, writes and errors in the same order, but
    rolled back from copies of the items it is about to write instead of copies of whole tables: the cost of a call
    follows its own items, not the size of the tables. Runs under `_table_operations_lock` once
    `patch_atomic_table_operations` has wrapped it, so nothing else writes between a write and its rollback."""
    from moto.dynamodb.exceptions import (
        ConditionalCheckFailed,
        MockValidationException,
        MultipleTransactionsException,
        TooManyTransactionsException,
        TransactionCanceledException,
        TransactWriteSingleOpException,
    )

    if len(transact_items) > 100:
        raise TooManyTransactionsException()
    undo = _ItemUndoLog()
    targets: set[tuple[str, str]] = set()
    errors: list[tuple[str | None, str | None, dict[str, Any] | None]] = []
    for item in transact_items:
        if len(item) > 1:  # refused before any write in DynamoDB; moto raises it after the earlier items' writes
            undo.roll_back()
            raise TransactWriteSingleOpException
        failed_item: list[dict[str, Any]] = []  # the item whose condition failed, when ALL_OLD asks for it
        try:
            _transaction_write(self, *next(iter(item.items())), targets=targets, undo=undo, failed_item=failed_item)
            errors.append((None, None, None))
        except (MultipleTransactionsException, MockValidationException):
            undo.roll_back()
            raise
        except ConditionalCheckFailed as error:
            errors.append(("ConditionalCheckFailed", str(error.message), failed_item[0] if failed_item else None))
        except Exception as error:  # moto reports any other failure as that item's cancellation reason
            errors.append((type(error).__name__, str(error), None))
    if any(code is not None for code, _, _ in errors):
        undo.roll_back()
        raise TransactionCanceledException(errors)


def _transaction_write(
    backend: Any,
    op_type: str,
    op: dict[str, Any],
    *,
    targets: set[tuple[str, str]],
    undo: _ItemUndoLog,
    failed_item: list[dict[str, Any]],
) -> None:
    """One item of a TransactWriteItems call, as moto runs it: its condition, then its write (saved first)."""
    from moto.dynamodb.comparisons import get_filter_expression
    from moto.dynamodb.exceptions import ConditionalCheckFailed, MultipleTransactionsException

    if op_type not in _TRANSACTION_OPERATIONS:
        raise ValueError("Unsupported transaction operation")
    table_name = op["TableName"]
    if op_type == "Put":
        table = backend.get_table(table_name)
        key_names = [table.hash_key_attr] + ([table.range_key_attr] if table.range_key_attr is not None else [])
        key = {name: op["Item"][name] for name in key_names}
    else:
        key = op["Key"]
    target = (str(table_name), str(dict(sorted(key.items()))))
    if target in targets:
        raise MultipleTransactionsException()
    targets.add(target)
    current = backend.get_item(table_name, key)
    conditions = {
        "condition_expression": op.get("ConditionExpression"),
        "expression_attribute_names": op.get("ExpressionAttributeNames"),
        "expression_attribute_values": op.get("ExpressionAttributeValues"),
    }
    condition = op.get("ConditionExpression")
    names, values = op.get("ExpressionAttributeNames"), op.get("ExpressionAttributeValues")
    if condition is not None and not get_filter_expression(condition, names, values).expr(current):
        if op.get("ReturnValuesOnConditionCheckFailure") == "ALL_OLD" and current:
            failed_item.append(current.to_json()["Attributes"])
        raise ConditionalCheckFailed(item=failed_item[0] if failed_item else None)
    if op_type == "ConditionCheck":
        return
    undo.save(backend.get_table(table_name), key)
    if op_type == "Put":
        backend.put_item(table_name, op["Item"], **conditions)
    elif op_type == "Delete":
        backend.delete_item(table_name, key, **conditions)
    else:
        backend.update_item(table_name, key, update_expression=op["UpdateExpression"], **conditions)


class _ItemUndoLog:
    """Copies of the items a transaction is about to write (None: the item did not exist), put back in reverse."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, Any, Any, Any]] = []  # (table, hash value, range value or None, item or None)

    def save(self, table: Any, key: dict[str, Any]) -> None:
        from moto.dynamodb.models.dynamo_type import DynamoType

        hash_value = DynamoType(key[table.hash_key_attr])
        range_value = DynamoType(key[table.range_key_attr]) if table.range_key_attr is not None else None
        self._saved.append((table, hash_value, range_value, copy.deepcopy(table.get_item(hash_value, range_value))))

    def roll_back(self) -> None:
        for table, hash_value, range_value, item in reversed(self._saved):
            items = table.items if range_value is None else table.items[hash_value]
            key = hash_value if range_value is None else range_value
            if item is None:
                items.pop(key, None)
            else:
                items[key] = item
