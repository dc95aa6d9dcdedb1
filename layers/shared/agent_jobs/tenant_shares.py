"""Each tenant's share of the worker's concurrency: how many invocations may run its jobs at once.

The share is TENANT_SHARE (the template's WorkerTenantShare; 0: no share) unless the tenant's own item
(`tenant#<tenantId>`) names another in `concurrencyShare`, which only whoever holds the stack's AWS credentials sets
(`agent-jobs tenants share`): a tenant's tokens, operator scope included, never reach it, so no tenant raises its own.
The worker reads a tenant's override at most once a minute per execution environment.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from agent_jobs.store.codec import to_item, wire
from agent_jobs.workspaces import tenant_key

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

SHARE_ATTRIBUTE: Final = "concurrencyShare"
# How long an execution environment keeps a tenant's override before reading it again.
CACHE_SECONDS: Final = 60.0
# The largest share an override may name (MaximumConcurrency's own bound).
MAX_SHARE: Final = 1000


class TenantShares:
    """`share_of(tenant)`: the tenant's override, else `default_share` (0: the tenant's jobs are never deferred)."""

    def __init__(
        self,
        client: DynamoDBClient,
        table_name: str,
        default_share: int,
        *,
        cache_seconds: float = CACHE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._table = table_name
        self.default_share = default_share
        self._cache_seconds = cache_seconds
        self._clock = clock
        self._cache: dict[str, tuple[float, int | None]] = {}
        self._lock = threading.Lock()

    def share_of(self, tenant_id: str) -> int:
        with self._lock:
            cached = self._cache.get(tenant_id)
        if cached is not None and self._clock() - cached[0] < self._cache_seconds:
            override = cached[1]
        else:
            override = self.override(tenant_id)
            with self._lock:
                self._cache[tenant_id] = (self._clock(), override)
        return self.default_share if override is None else override

    def override(self, tenant_id: str) -> int | None:
        """The tenant's own share, read now; None when it has none."""
        response = self._client.get_item(
            TableName=self._table,
            Key=wire({"pk": tenant_key(tenant_id)}),
            ProjectionExpression=SHARE_ATTRIBUTE,
        )
        value = to_item(response.get("Item", {})).get(SHARE_ATTRIBUTE)
        return None if value is None else int(value)

    def set_override(self, tenant_id: str, share: int | None) -> None:
        """Give the tenant its own share (None: back to the default). Refuses a share outside 0..MAX_SHARE."""
        if share is None:
            self._client.update_item(
                TableName=self._table,
                Key=wire({"pk": tenant_key(tenant_id)}),
                UpdateExpression="REMOVE #share",
                ExpressionAttributeNames={"#share": SHARE_ATTRIBUTE},
            )
            return
        if not 0 <= share <= MAX_SHARE:
            raise ValueError(f"a share is 0 (no share: never deferred) to {MAX_SHARE} invocations, not {share}")
        self._client.update_item(
            TableName=self._table,
            Key=wire({"pk": tenant_key(tenant_id)}),
            UpdateExpression="SET #share = :share, tenantId = :tid",
            ExpressionAttributeNames={"#share": SHARE_ATTRIBUTE},
            ExpressionAttributeValues=wire({":share": share, ":tid": tenant_id}),
        )


__all__ = ["CACHE_SECONDS", "MAX_SHARE", "SHARE_ATTRIBUTE", "TenantShares"]
