"""Tenant shares: a tenant whose jobs run in as many other invocations as its share has its records deferred (its
groups wait, in order, nothing written, no attempt counted) while other tenants' records run in the same batch."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest
from aws_lambda_powertools import Logger, Metrics

from agent_jobs.models import JobStatus
from agent_jobs.registration import WorkspaceRegistration
from agent_jobs.settings import deferrals_allowed, share_hold_seconds
from agent_jobs.tenant_shares import TenantShares
from job_worker.processing import BatchWorker
from tests.conftest import Stack, enqueue, make_job, make_message
from tests.integration.test_worker_metrics import emitted_metrics, named

NOISY, QUIET = "tenant-noisy", "tenant-quiet"


def with_share(stack: Stack, share: int, *, cache_seconds: float = 0) -> Stack:
    """`stack` with a default share of `share`; a tenant's own share read again after `cache_seconds` (0: each time,
    so a test sees an override at once)."""
    settings = stack.settings.model_copy(update={"tenant_share": share})
    shares = TenantShares(stack.services.dynamodb, stack.table_name, share, cache_seconds=cache_seconds)
    return replace(stack, settings=settings, services=replace(stack.services, settings=settings, tenant_shares=shares))


def worker(stack: Stack, workspaces: Any) -> BatchWorker:
    return BatchWorker(
        services=stack.services,
        workspaces=workspaces,
        logger=Logger(service="shares-test"),
        metrics=Metrics(namespace="AgentJobsSharesTest", service="shares-test"),
    )


def occupy(stack: Stack, tenant_id: str, invocation_id: str, job_id: str, remaining_ms: int = 60_000) -> Any:
    """Another invocation claims a job of `tenant_id` (as the worker does), which puts it in the running index."""
    message = make_message(job_id, workspace_id=f"ws-{job_id}", tenant_id=tenant_id)
    claim = stack.guard.claim(
        message, message_id=f"m-{job_id}", sequence_number=None, remaining_ms=remaining_ms, invocation_id=invocation_id
    )
    assert claim.lease is not None
    return claim.lease


def failed(response: Mapping[str, Any]) -> set[str]:
    return {item["itemIdentifier"] for item in response["batchItemFailures"]}


def message_ids(event: dict[str, Any]) -> dict[str, str]:
    return {json.loads(record["body"])["jobId"]: record["messageId"] for record in event["Records"]}


def test_running_invocations_counts_each_invocation_once_until_its_jobs_settle(stack: Stack) -> None:
    a1 = occupy(stack, NOISY, "invocation-a", "a1")
    occupy(stack, NOISY, "invocation-a", "a2")
    occupy(stack, NOISY, "invocation-b", "b1")
    occupy(stack, QUIET, "invocation-c", "c1")

    assert stack.guard.running_invocations(NOISY, limit=10) == {"invocation-a", "invocation-b"}
    assert stack.guard.running_invocations(QUIET, limit=10) == {"invocation-c"}
    # a settled job leaves the index; its invocation still counts while another of its jobs runs
    assert stack.guard.complete(a1, {"ok": True})
    assert stack.guard.running_invocations(NOISY, limit=10) == {"invocation-a", "invocation-b"}
    # a claim without an invocation id (no share) is not in the index
    message = make_message("free", workspace_id="ws-free", tenant_id=NOISY)
    stack.guard.claim(message, message_id="m-free", sequence_number=None, remaining_ms=60_000)
    assert stack.guard.running_invocations(NOISY, limit=10) == {"invocation-a", "invocation-b"}


def test_a_crashed_invocations_jobs_stop_counting_when_their_leases_expire(stack: Stack) -> None:
    # Given an invocation that claimed a job and never came back (its lease is the invocation's deadline)
    occupy(stack, NOISY, "crashed", "lost", remaining_ms=50)
    assert stack.guard.running_invocations(NOISY, limit=10) == {"crashed"}

    time.sleep(0.1)

    # Then its slot is free once the lease expired, with nothing written
    assert stack.guard.running_invocations(NOISY, limit=10) == set()


def test_a_tenant_at_its_share_waits_while_another_tenant_runs(
    stack: Stack, workspaces: Any, lambda_context: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a share of one invocation, the noisy tenant's jobs running in another invocation, and one batch with two
    # more of its jobs (one workspace of two jobs, one of one) and a job of the quiet tenant
    shared = with_share(stack, 1)
    elsewhere = occupy(shared, NOISY, "other-invocation", "running")
    enqueue(shared, make_job("n-1", "ws-n1"), make_job("n-2", "ws-n1"), make_job("n-3", "ws-n2"), tenant_id=NOISY)
    enqueue(shared, make_job("q-1", "ws-q"), tenant_id=QUIET)
    event = shared.receive(10)
    ids = message_ids(event)
    capsys.readouterr()

    # When the worker runs the batch
    response = worker(shared, workspaces).handle(event, lambda_context())

    # Then the quiet tenant's job ran; the noisy tenant's records came back, unclaimed, in their groups' order
    assert failed(response) == {ids["n-1"], ids["n-2"], ids["n-3"]}
    assert shared.job("q-1")["status"] == JobStatus.SUCCEEDED
    for job_id in ("n-1", "n-2", "n-3"):
        job = shared.job(job_id)
        assert (job["status"], job.get("attempt", 0), job.get("failures", 0)) == (JobStatus.QUEUED, 0, 0), job
    assert workspaces.commits("ws-n1") == []
    # counted as deferred, by tenant, and not as retried
    metrics = emitted_metrics(capsys.readouterr().out)
    assert [(m.value, m.dimensions["TenantId"]) for m in named(metrics, "RecordsDeferred")] == [(3, NOISY)]
    assert named(metrics, "RecordsRetried") == []
    in_use = {m.dimensions["TenantId"]: m.value for m in named(metrics, "TenantShareInUse")}
    assert in_use == {NOISY: 1, QUIET: 1}

    # When the other invocation's job settles, the records come back and run, in order, once
    assert shared.guard.complete(elsewhere, {"ok": True})
    again = shared.receive(10)
    assert failed(worker(shared, workspaces).handle(again, lambda_context())) == set()
    assert workspaces.commits("ws-n1") == ["n-1", "n-2"]
    assert workspaces.commits("ws-n2") == ["n-3"]
    for job_id in ("n-1", "n-2", "n-3"):
        assert (shared.job(job_id)["status"], shared.job(job_id)["attempt"]) == (JobStatus.SUCCEEDED, 1)


def test_a_group_near_its_delivery_limit_runs_over_the_share(
    stack: Stack, workspaces: Any, lambda_context: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given the noisy tenant at its share, and its record with no delivery to spare: one more deferral and its job
    # would have fewer deliveries left than its attempts and a crash need (10 receives: after its 4th)
    shared = with_share(stack, 1)
    occupy(shared, NOISY, "other-invocation", "running")
    enqueue(shared, make_job("late-1", "ws-late"), tenant_id=NOISY)
    event = shared.receive(10)
    settings = shared.settings
    receives = settings.max_receive_count - settings.max_attempts - 3 + 1
    assert not settings.deferrable(receives)
    assert settings.deferrable(receives - 1)
    assert not settings.near_delivery_limit(receives)
    for record in event["Records"]:
        record["attributes"]["ApproximateReceiveCount"] = str(receives)

    capsys.readouterr()

    # When the worker runs it, then it runs (deferred again, its job would lose a retry), counted as over the share
    assert failed(worker(shared, workspaces).handle(event, lambda_context())) == set()
    assert shared.job("late-1")["status"] == JobStatus.SUCCEEDED
    over = named(emitted_metrics(capsys.readouterr().out), "RecordsOverShare")
    assert [(m.value, m.dimensions["TenantId"]) for m in over] == [(1, NOISY)]


def test_a_tenants_own_share_overrides_the_default(stack: Stack, workspaces: Any, lambda_context: Any) -> None:
    # Given a default share of one, the noisy tenant in one other invocation, and its own share of two
    shared = with_share(stack, 1)
    occupy(shared, NOISY, "other-invocation", "running")
    assert shared.services.tenant_shares is not None
    shared.services.tenant_shares.set_override(NOISY, 2)
    enqueue(shared, make_job("o-1", "ws-o"), tenant_id=NOISY)

    # Then its record runs; with its own share back to the default, the next one waits
    assert failed(worker(shared, workspaces).handle(shared.receive(10), lambda_context())) == set()
    shared.services.tenant_shares.set_override(NOISY, None)
    enqueue(shared, make_job("o-2", "ws-o2"), tenant_id=NOISY)
    assert len(failed(worker(shared, workspaces).handle(shared.receive(10), lambda_context()))) == 1


def test_no_share_defers_nothing_and_writes_nothing_to_the_running_index(
    stack: Stack, workspaces: Any, lambda_context: Any
) -> None:
    unshared = with_share(stack, 0)
    occupy(unshared, NOISY, "other-invocation", "running")
    enqueue(unshared, make_job("u-1", "ws-u"), tenant_id=NOISY)

    assert failed(worker(unshared, workspaces).handle(unshared.receive(10), lambda_context())) == set()
    assert "runningTenant" not in unshared.job("u-1")


@pytest.mark.parametrize("share", [-1, 1001])
def test_an_override_outside_the_bounds_is_refused(stack: Stack, share: int) -> None:
    with pytest.raises(ValueError, match="a share is 0"):
        TenantShares(stack.services.dynamodb, stack.table_name, 1).set_override(NOISY, share)


def test_a_tenant_cannot_name_its_own_share_in_a_registration() -> None:
    # The only tenant-written item near the tenant's record is its registrations: they take no share
    with pytest.raises(ValueError, match="concurrencyShare"):
        WorkspaceRegistration.model_validate(
            {"remoteUrl": "https://git.example.com/r.git", "branch": "agent/w", "concurrencyShare": 99}
        )


def test_a_takeover_without_a_share_takes_the_job_out_of_the_count(stack: Stack) -> None:
    # Given a job claimed by an invocation that counted against the tenant's share, whose lease then expired
    occupy(stack, NOISY, "crashed", "taken", remaining_ms=50)
    time.sleep(0.1)

    # When another invocation, for which the tenant has no share, takes the job over with a fresh lease
    message = make_message("taken", workspace_id="ws-taken", tenant_id=NOISY)
    claim = stack.guard.claim(message, message_id="m-taken-2", sequence_number=None, remaining_ms=60_000)

    # Then the job runs under the new lease without counting as the crashed invocation's
    assert claim.lease is not None
    assert stack.guard.running_invocations(NOISY, limit=10) == set()
    assert "runningInvocation" not in stack.job("taken")


def test_a_share_that_cannot_be_checked_lets_the_records_run(
    stack: Stack, workspaces: Any, lambda_context: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a share, and a table whose running index cannot be read (throttled, unreachable)
    shared = with_share(stack, 1)
    enqueue(shared, make_job("open-1", "ws-open"), tenant_id=NOISY)
    batch_worker = worker(shared, workspaces)

    def unavailable(tenant_id: str, limit: int) -> set[str]:
        raise RuntimeError("ProvisionedThroughputExceededException")

    batch_worker._running_invocations = unavailable  # type: ignore[method-assign]
    capsys.readouterr()

    # Then the records run (fairness is not worth a retry), and the miss is counted
    assert failed(batch_worker.handle(shared.receive(10), lambda_context())) == set()
    assert (shared.job("open-1")["status"], shared.job("open-1")["attempt"]) == (JobStatus.SUCCEEDED, 1)
    assert "runningTenant" not in shared.job("open-1")
    assert [m.value for m in named(emitted_metrics(capsys.readouterr().out), "TenantShareUnchecked")] == [1]


def test_each_deferral_holds_a_record_back_longer_than_a_retry_would_wait(
    stack: Stack, workspaces: Any, lambda_context: Any
) -> None:
    # Given the template's backoff (2 s, at most 300 s), the noisy tenant at its share of one, and a worker whose
    # jitter takes each backoff's bound
    shared = with_share(stack, 1)
    settings = shared.settings.model_copy(update={"backoff_base_seconds": 2, "backoff_max_seconds": 300})
    shared = replace(shared, settings=settings, services=replace(shared.services, settings=settings))
    log = io.StringIO()
    deferring = BatchWorker(
        services=shared.services,
        workspaces=workspaces,
        logger=Logger(service="shares-deferral-test", stream=log),
        metrics=Metrics(namespace="AgentJobsSharesTest", service="shares-test"),
        jitter=lambda bound: bound,
    )
    occupy(shared, NOISY, "other-invocation", "running")
    enqueue(shared, make_job("held-1", "ws-held"), tenant_id=NOISY)
    event = shared.receive(10)
    allowed = deferrals_allowed(max_receive_count=settings.max_receive_count, max_attempts=settings.max_attempts)

    # When its record is deferred on each receive a deferral may spend
    for receives in range(1, allowed + 1):
        for record in event["Records"]:
            record["attributes"]["ApproximateReceiveCount"] = str(receives)
        assert failed(deferring.handle(event, lambda_context())) == {event["Records"][0]["messageId"]}

    # Then each deferral hands it back for three times the one before (a retry's backoff only doubles), and together
    # they hold it back for what the share's stated bound says, with the template's settings 80 s (was 30 s)
    lines = [json.loads(line) for line in log.getvalue().splitlines()]
    held = [
        line["deferredSeconds"] for line in lines if line["message"] == "tenant at its share of the worker: deferred"
    ]
    assert held == [2, 6, 18, 54]
    assert (
        sum(held)
        == share_hold_seconds(
            max_receive_count=settings.max_receive_count,
            max_attempts=settings.max_attempts,
            base_seconds=settings.backoff_base_seconds,
            max_seconds=settings.backoff_max_seconds,
        )[1]
    )
    assert shared.job("held-1")["status"] == JobStatus.QUEUED
