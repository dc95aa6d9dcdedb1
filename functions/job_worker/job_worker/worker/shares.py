"""Tenant shares: a tenant whose jobs already run in as many invocations as its share has its records deferred.

The event source's concurrency is one pool: without a share, one tenant's backlog over many workspaces fills every
invocation and another tenant's one job waits for a slot. With one, an invocation decides once per tenant of its
batch, on the tenant's first record: if fewer than the tenant's share of other invocations run its jobs (the sparse
running index, `JobGuard.running_invocations`), every record of the tenant in this batch runs here; else each is
deferred: handed back with the rest of its group (the group waits, in order), before any claim, so nothing is
written and no attempt or failure is counted. The queue's receive count still grows with each deferral, so a group
whose records are near their delivery limit is never deferred (it runs over the share rather than be parked).
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

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
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def decide(self, tenant_id: str) -> ShareDecision:
        with self._lock:
            decision = self._decisions.get(tenant_id)
            if decision is None:
                share = self.shares.share_of(tenant_id)
                if share <= 0:
                    decision = ShareDecision(admitted=True, in_use=0, share=0)
                else:
                    # one more than the share is enough to know; this invocation itself never counts against it
                    others = self.running_invocations(tenant_id, share + 1) - {self.invocation_id}
                    decision = ShareDecision(admitted=len(others) < share, in_use=len(others), share=share)
                self._decisions[tenant_id] = decision
            return decision

    def decisions(self) -> dict[str, ShareDecision]:
        with self._lock:
            return dict(self._decisions)


__all__ = ["ShareDecision", "ShareDeferral", "ShareGate"]
