"""A noisy tenant in the capacity plan (see `plan`): how long a small tenant's job waits while another tenant's backlog
holds the worker's invocations, with and without the tenant share, and how long that backlog takes.

The model. The worker's capacity is C = MaximumConcurrency invocations, each running up to R = min(BatchSize,
GROUP_CONCURRENCY) records of distinct workspaces at once: C x R records. The noisy tenant submits N jobs of D seconds
over N workspaces at once; the small tenant then submits one job, which starts after `pickup` seconds on an idle stack.

- No share (WorkerTenantShare 0, or a share of at least C, which never defers): when N >= C x R every invocation is
  busy with the backlog and the small job waits for the first to free: up to D (what is left of the first wave) plus
  the pickup. When N < C x R an invocation stays free and the small job starts after the pickup. The backlog takes
  ceil(N / (C x R)) waves of D.
- A share S < C: the noisy tenant runs in at most S invocations, so C - S stay for the others. The invocations that
  receive the noisy tenant's surplus records defer them (hand them back without running them) in a fraction of a
  second, so the small job waits the pickup plus at most one round of deferrals: about its idle latency. The backlog
  takes at least ceil(N / (S x R)) waves of D: a lower bound, since a deferred record comes back only after its
  jittered backoff, min(BACKOFF_MAX_SECONDS, BACKOFF_BASE_SECONDS x 3^(receives - 1)), which grows with each deferral
  and so starts it later than the moment a slot of the share frees.
- How long the share holds. A record may be deferred only on the receives its job's attempts and a crash do not need:
  MaxReceiveCount - MaxAttempts - 3 of them (4 with the template's settings). Their backoffs together hold it back
  between half their sum and their sum (40 to 80 s with the template's settings); a record of a backlog that has not
  run by then runs over the share (`RecordsOverShare`), so a backlog needing more than D plus that time to run through
  the share takes more than its share at its end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

from agent_jobs.settings import deferrals_allowed, share_hold_seconds

# One round of deferrals: an invocation's query of the tenant's running jobs and the hand-back of its records.
DEFERRAL_ROUND_SECONDS: Final = 0.1


@dataclass(frozen=True)
class NoisyTenantPlan:
    noisy_jobs: int  # N, over N workspaces of one tenant, submitted at once
    noisy_job_seconds: float  # D
    tenant_share: int  # the share asked for (0: none)
    share_applies: bool  # 0 < share < MaximumConcurrency: a share that can defer
    maximum_concurrency: int  # C
    records_per_invocation: int  # R = min(BatchSize, GROUP_CONCURRENCY)
    pickup_seconds: float
    # Without a share
    all_invocations_busy: bool  # N >= C x R
    small_job_delay_without_share: float  # upper bound: pickup, plus D when every invocation is busy
    backlog_seconds_without_share: float  # ceil(N / (C x R)) x D
    # With the share (None when it does not apply)
    invocations_left_for_others: int | None  # C - S
    noisy_records_deferred: bool | None  # N > S x R: surplus records are received and deferred
    small_job_delay_with_share: float | None  # pickup, plus one deferral round when records are deferred
    backlog_seconds_with_share_at_least: float | None  # ceil(N / (S x R)) x D, before the deferrals' backoff
    backoff_base_seconds: float
    backoff_max_seconds: float
    # How long the share holds a record back (None when it does not apply): its deferrals, and their backoff together
    deferrals: int | None = None
    share_holds_seconds_at_least: float | None = None
    share_holds_seconds_at_most: float | None = None
    backlog_outlasts_share: bool | None = None  # the backlog's last wave may wait longer than the share holds

    @property
    def capacity_records(self) -> int:
        return self.maximum_concurrency * self.records_per_invocation

    def as_dict(self) -> dict[str, Any]:
        return {
            "noisyJobs": self.noisy_jobs,
            "noisyJobSeconds": self.noisy_job_seconds,
            "tenantShare": self.tenant_share,
            "shareApplies": self.share_applies,
            "maximumConcurrency": self.maximum_concurrency,
            "recordsPerInvocation": self.records_per_invocation,
            "capacityRecords": self.capacity_records,
            "pickupSeconds": self.pickup_seconds,
            "withoutShare": {
                "allInvocationsBusy": self.all_invocations_busy,
                "smallJobDelaySecondsUpTo": self.small_job_delay_without_share,
                "backlogSeconds": self.backlog_seconds_without_share,
            },
            "withShare": None
            if not self.share_applies
            else {
                "invocationsLeftForOthers": self.invocations_left_for_others,
                "noisyRecordsDeferred": self.noisy_records_deferred,
                "smallJobDelaySecondsUpTo": self.small_job_delay_with_share,
                "backlogSecondsAtLeast": self.backlog_seconds_with_share_at_least,
                "backoffBaseSeconds": self.backoff_base_seconds,
                "backoffMaxSeconds": self.backoff_max_seconds,
                "deferrals": self.deferrals,
                "shareHoldsSecondsAtLeast": self.share_holds_seconds_at_least,
                "shareHoldsSecondsAtMost": self.share_holds_seconds_at_most,
                "backlogOutlastsShare": self.backlog_outlasts_share,
            },
        }


def noisy_tenant(
    *,
    noisy_jobs: int,
    noisy_job_seconds: float,
    tenant_share: int,
    maximum_concurrency: int,
    batch_size: int,
    group_concurrency: int,
    pickup_seconds: float,
    backoff_base_seconds: float,
    backoff_max_seconds: float,
    max_receive_count: int,
    max_attempts: int,
) -> NoisyTenantPlan:
    """The small tenant's delay and the noisy tenant's backlog time under the module's model (valid inputs assumed)."""
    per_invocation = min(batch_size, group_concurrency)
    busy = noisy_jobs >= maximum_concurrency * per_invocation
    applies = 0 < tenant_share < maximum_concurrency
    deferred = applies and noisy_jobs > tenant_share * per_invocation
    at_least, at_most = share_hold_seconds(
        max_receive_count=max_receive_count,
        max_attempts=max_attempts,
        base_seconds=backoff_base_seconds,
        max_seconds=backoff_max_seconds,
    )
    backlog_with_share = _waves(noisy_jobs, tenant_share * per_invocation) * noisy_job_seconds if applies else None
    return NoisyTenantPlan(
        noisy_jobs=noisy_jobs,
        noisy_job_seconds=noisy_job_seconds,
        tenant_share=tenant_share,
        share_applies=applies,
        maximum_concurrency=maximum_concurrency,
        records_per_invocation=per_invocation,
        pickup_seconds=pickup_seconds,
        all_invocations_busy=busy,
        small_job_delay_without_share=round(pickup_seconds + (noisy_job_seconds if busy else 0.0), 3),
        backlog_seconds_without_share=_waves(noisy_jobs, maximum_concurrency * per_invocation) * noisy_job_seconds,
        invocations_left_for_others=maximum_concurrency - tenant_share if applies else None,
        noisy_records_deferred=deferred if applies else None,
        small_job_delay_with_share=round(pickup_seconds + (DEFERRAL_ROUND_SECONDS if deferred else 0.0), 3)
        if applies
        else None,
        backlog_seconds_with_share_at_least=backlog_with_share,
        backoff_base_seconds=backoff_base_seconds,
        backoff_max_seconds=backoff_max_seconds,
        deferrals=deferrals_allowed(max_receive_count=max_receive_count, max_attempts=max_attempts)
        if applies
        else None,
        share_holds_seconds_at_least=round(at_least, 3) if applies else None,
        share_holds_seconds_at_most=round(at_most, 3) if applies else None,
        # The last wave's records wait out every wave before it, deferred all along.
        backlog_outlasts_share=deferred
        and backlog_with_share is not None
        and backlog_with_share - noisy_job_seconds > at_least
        if applies
        else None,
    )


def _waves(jobs: int, at_once: int) -> int:
    return math.ceil(jobs / at_once)
