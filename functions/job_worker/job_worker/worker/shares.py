"""Tenant shares: a tenant whose jobs already run in as many invocations as its share has its records deferred.

The event source's concurrency is one pool: without a share, one tenant's backlog over many workspaces fills every
invocation and another tenant's one job waits for a slot. With one, an invocation decides once per tenant of its
batch, on the tenant's first record: if fewer than the tenant's share of other invocations run its jobs (the sparse
running index, `JobGuard.running_invocations`), every record of the tenant in this batch runs here; else each is
deferred: handed back with the rest of its group (the group waits, in order), before any claim, so nothing is
written and no attempt or failure is counted. The queue's receive count still grows with each deferral, so a group
is deferred only while each of its records keeps every delivery its job's attempts and a crash need
(`Settings.deferrable`); past that it runs over the share. Each deferral's backoff triples with the receives
(`Settings.deferral_backoff_bound`), so those few receives hold a record back for longer (`share_hold_seconds`).
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from job_worker.worker.redelivery import RetryLaterError

if TYPE_CHECKING:
    from collections.abc import Callable

    from agent_jobs.tenant_shares import TenantShares


class ShareDeferral(RetryLaterError):
    """The record's tenant is at its share: hand it back with the rest of its group, nothing written."""

    def __init__(self, tenant_id: str, in_use: int, share: int, delay_seconds: int) -> None:
        super().__init__(f"tenant {tenant_id} runs in {in_use} invocations, its share {share}: deferred", delay_seconds)
        self.tenant_id = tenant_id


@dataclass(frozen=True)
class ShareDecision:
    """Whether this invocation runs the tenant's records, how many other invocations ran its jobs, and its share
    (0: no share, never deferred)."""

    admitted: bool
    in_use: int
    share: int


@dataclass
class ShareGate:
    """One invocation's decisions, one per tenant of its batch (the batch's groups ask from their own threads)."""

    shares: TenantShares
    running_invocations: Callable[[str, int], set[str]]
    invocation_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    _decisions: dict[str, ShareDecision] = field(default_factory=dict)
    # What makes a lock (threading.Lock; a simulation gives its own, which yields instead of blocking).
    lock_factory: Callable[[], Any] = threading.Lock
    _lock: Any = None
    _tenant_locks: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = self.lock_factory()

    def decide(self, tenant_id: str) -> ShareDecision:
        """The tenant's decision for this invocation, taken on its first call (under the tenant's own lock: groups of
        other tenants never wait on this tenant's reads). Raises what the reads raise; `admit` then records a pass."""
        with self._lock:
            decision = self._decisions.get(tenant_id)
            if decision is not None:
                return decision
            tenant_lock = self._tenant_locks.setdefault(tenant_id, self.lock_factory())
        with tenant_lock:
            with self._lock:
                decision = self._decisions.get(tenant_id)
            if decision is not None:
                return decision
            share = self.shares.share_of(tenant_id)
            if share <= 0:
                decision = ShareDecision(admitted=True, in_use=0, share=0)
            else:
                # one more than the share is enough to know; this invocation itself never counts against it
                others = self.running_invocations(tenant_id, share + 1) - {self.invocation_id}
                decision = ShareDecision(admitted=len(others) < share, in_use=len(others), share=share)
            with self._lock:
                self._decisions[tenant_id] = decision
            return decision

    def admit(self, tenant_id: str) -> None:
        """Record that the tenant's records run here without a decision (its share could not be checked)."""
        with self._lock:
            self._decisions.setdefault(tenant_id, ShareDecision(admitted=True, in_use=0, share=0))

    def decided(self, tenant_id: str) -> ShareDecision | None:
        with self._lock:
            return self._decisions.get(tenant_id)

    def decisions(self) -> dict[str, ShareDecision]:
        with self._lock:
            return dict(self._decisions)


__all__ = ["ShareDecision", "ShareDeferral", "ShareGate"]
