"""The capacity and cost plan's model: Little's law, the single-server waits, saturation, and the cost arithmetic
against a hand computation at the table's prices."""

from __future__ import annotations

import math
from datetime import date

import pytest

from agent_jobs_cli.plan import (
    PRICES,
    Deployment,
    PlanInput,
    binomial_quantile,
    erlang_c_wait,
    estimate,
    lognormal_cv,
    mg1_wait,
)
from agent_jobs_local.template import TemplateModel


def test_plan_busy_groups_follow_littles_law_and_waits_are_md1() -> None:
    # Given 10 workspaces sharing 2 jobs/s of 2 s jobs: 0.2 jobs/s and 40% busy each
    plan = estimate(PlanInput(workspaces=10, rate=2.0, job_seconds=2.0, deployment=Deployment()))

    # Then the mean concurrency is rate x duration, and each workspace waits as an M/D/1 server
    assert plan.rate_per_workspace == pytest.approx(0.2)
    assert plan.utilisation == pytest.approx(0.4)
    assert plan.mean_busy_groups == pytest.approx(4.0)
    assert plan.queue_model == "M/D/1"
    assert plan.mean_wait_seconds == pytest.approx(0.4 * 2.0 / (2 * 0.6))
    # and the p99 of Binomial(10, 0.4) busy workspaces is 8 (P(X <= 7) = 0.9877, P(X <= 8) = 0.9983)
    assert plan.p99_busy_groups == 8
    assert plan.lambda_concurrency_needed == 8
    assert plan.concurrency_wait_seconds == 0  # 10 workspaces never need more than MaximumConcurrency 20
    assert plan.warnings == []


def test_plan_concurrency_is_capped_by_workspaces_and_maximum_concurrency() -> None:
    few_workspaces = estimate(PlanInput(workspaces=3, rate=0.5, job_seconds=5.0, deployment=Deployment()))
    low_cap = estimate(
        PlanInput(workspaces=100, rate=1.0, job_seconds=3.0, deployment=Deployment(maximum_concurrency=4))
    )

    assert few_workspaces.concurrency_cap == 3
    assert few_workspaces.lambda_concurrency_needed <= 3
    assert low_cap.concurrency_cap == 4
    assert low_cap.mean_concurrency_demand == low_cap.mean_busy_groups == pytest.approx(3.0)
    # 100 workspaces 3% busy: the p99 of busy workspaces is above the cap, which the plan says to raise
    assert low_cap.lambda_concurrency_needed == binomial_quantile(100, 0.03) > 4
    assert any("below the p99 of busy workspaces" in warning for warning in low_cap.warnings)
    assert low_cap.concurrency_wait_seconds > 0  # 3 of 4 invocations busy on average: jobs wait for one


def test_plan_warns_when_a_workspace_saturates() -> None:
    # Given 2 workspaces each receiving a 4 s job every 2 s (utilisation 2)
    plan = estimate(PlanInput(workspaces=2, rate=1.0, job_seconds=4.0, deployment=Deployment()))

    assert math.isinf(plan.mean_wait_seconds)
    assert plan.saturated
    assert "grows without bound" in plan.warnings[0]
    assert "more workspaces (at least 4)" in plan.warnings[0]
    assert plan.as_dict()["delay"]["meanWaitSecondsPerWorkspace"] is None


def test_plan_warns_when_maximum_concurrency_is_too_low() -> None:
    plan = estimate(PlanInput(workspaces=100, rate=2.0, job_seconds=5.0, deployment=Deployment(maximum_concurrency=5)))

    assert math.isinf(plan.concurrency_wait_seconds)
    assert any("Raise WorkerMaximumConcurrency" in warning for warning in plan.warnings)


def test_plan_queueing_formulas_match_their_textbook_cases() -> None:
    # M/G/1 with cv 1 is M/M/1: rho S / (1 - rho); Erlang C with one server is M/M/1 too
    assert mg1_wait(0.25, 2.0, 1.0) == pytest.approx(0.5 * 2.0 / 0.5)
    assert erlang_c_wait(1, 0.5, 2.0) == pytest.approx(0.5 * 2.0 / 0.5)
    assert math.isinf(mg1_wait(1.0, 1.0))
    assert lognormal_cv(10.0, None) == 0.0
    # The lognormal of that cv with mean 10 has its p99 at 30 (sigma^2 = ln(1 + cv^2), mu = ln 10 - sigma^2 / 2)
    sigma = math.sqrt(math.log1p(lognormal_cv(10.0, 30.0) ** 2))
    assert math.exp(math.log(10.0) - sigma**2 / 2 + 2.3263478740408408 * sigma) == pytest.approx(30.0)
    assert binomial_quantile(10, 0.0) == 0
    assert binomial_quantile(10, 1.0) == 10


def test_plan_cost_per_million_jobs_matches_a_hand_computation() -> None:
    # Given batches of one record, 1 GB of memory, 2 s jobs, half the payloads in S3, no failures
    deployment = Deployment(batch_size=1, memory_mb=1024)
    plan = estimate(PlanInput(workspaces=10, rate=1.0, job_seconds=2.0, large_payload_share=0.5, deployment=deployment))

    # Then, per job: SQS send + receive + delete = 3 requests; Lambda (2 + 0.03 guard + 0.05 invocation) s x 1 GB;
    # one invocation; 4 write units (accept, sent, claim, complete: 1 each); 1.5 read units (the workspace after the
    # claim, strongly consistent, and the pending index's empty range); half a PUT and half a GET; one HTTP API request
    by_key = {line.price_key: line for line in plan.cost_lines}
    assert by_key["sqs_fifo_request"].units_per_job == pytest.approx(3.0)
    assert by_key["lambda_arm_gb_second"].units_per_job == pytest.approx(2.08)
    assert by_key["lambda_request"].units_per_job == pytest.approx(1.0)
    assert by_key["dynamodb_write_request_unit"].units_per_job == pytest.approx(4.0)
    assert by_key["dynamodb_read_request_unit"].units_per_job == pytest.approx(1.5)
    assert by_key["s3_put"].units_per_job == pytest.approx(0.5)
    assert by_key["s3_get"].units_per_job == pytest.approx(0.5)
    assert by_key["http_api_request"].units_per_job == pytest.approx(1.0)
    # $1.50 + $27.733472 + $0.20 + $2.50 + $0.1875 + $2.50 + $0.20 + $1.00 per million jobs
    assert plan.usd_per_million_jobs == pytest.approx(35.820972)
    assert plan.monthly_jobs == 30 * 24 * 3600
    assert plan.monthly_usd == pytest.approx(35.820972 * 2.592 + 5 * 129_600 * 0.5e-6)


def test_plan_retries_cost_more_receives_writes_and_compute() -> None:
    deployment = Deployment(batch_size=1, max_attempts=3)
    clean = estimate(PlanInput(workspaces=10, rate=1.0, job_seconds=2.0, deployment=deployment))
    failing = estimate(PlanInput(workspaces=10, rate=1.0, job_seconds=2.0, failure_share=1.0, deployment=deployment))

    assert failing.usd_per_million_jobs > 2.5 * clean.usd_per_million_jobs


def test_plan_prices_each_have_a_source_and_the_dates() -> None:
    assert {
        "sqs_fifo_request",
        "lambda_arm_gb_second",
        "dynamodb_write_request_unit",
        "s3_put",
        "http_api_request",
    } <= set(PRICES)
    for price in PRICES.values():
        assert price.usd > 0
        assert price.source.startswith("https://"), price.key
        assert date.fromisoformat(price.read_on) <= date(2026, 11, 29)
        if price.page_date is not None:
            assert date.fromisoformat(price.page_date) <= date.fromisoformat(price.read_on)


def test_plan_deployment_defaults_come_from_the_template() -> None:
    model = TemplateModel.from_path()
    deployment = Deployment.from_template(memory_mb=2048)

    assert deployment.batch_size == model.worker.batch_size
    assert deployment.maximum_concurrency == model.worker.maximum_concurrency
    assert deployment.max_attempts == int(model.parameters["MaxAttempts"])
    assert deployment.architecture == model.worker.function.architectures[0] == "arm64"
    assert deployment.memory_mb == 2048  # an override wins
    assert deployment.tenant_share == int(model.parameters["WorkerTenantShare"])
    worker_id = model.worker.function.function_id
    assert deployment.group_concurrency == int(model.function_environment_variable(worker_id, "GROUP_CONCURRENCY") or 0)
    assert deployment.backoff_base_seconds == float(
        model.function_environment_variable(worker_id, "BACKOFF_BASE_SECONDS") or 0
    )
    assert deployment.backoff_max_seconds == float(
        model.function_environment_variable(worker_id, "BACKOFF_MAX_SECONDS") or 0
    )
    assert Deployment.from_template(tenant_share=0).tenant_share == 0


def test_plan_input_problems_say_what_to_pass() -> None:
    problems = PlanInput(workspaces=0, rate=0, job_seconds=-1, large_payload_share=2).problems()

    assert problems == [
        "--workspaces must be at least 1",
        "--rate must be a positive number of jobs per second",
        "--job-seconds must be a positive number of seconds",
        "--large-payload-share must be between 0 and 1",
    ]


def _noisy(noisy_jobs: int = 120, tenant_share: int = 10, group_concurrency: int = 10) -> PlanInput:
    # The local runtime's scenario: 120 jobs of 10 s over 120 workspaces of one tenant, then another tenant's job;
    # MaximumConcurrency 20, BatchSize 5, GROUP_CONCURRENCY 10
    deployment = Deployment(
        maximum_concurrency=20, batch_size=5, group_concurrency=group_concurrency, tenant_share=tenant_share
    )
    return PlanInput(
        workspaces=1,
        rate=0.01,
        job_seconds=1.0,
        noisy_jobs=noisy_jobs,
        noisy_job_seconds=10.0,
        pickup_seconds=0.2,
        deployment=deployment,
    )


def test_plan_noisy_tenant_with_a_share_leaves_invocations_for_the_small_job() -> None:
    noisy = estimate(_noisy(tenant_share=10)).noisy_tenant

    assert noisy is not None
    # The worker holds 20 x min(5, 10) = 100 records: 120 jobs fill every invocation
    assert (noisy.records_per_invocation, noisy.capacity_records) == (5, 100)
    assert noisy.all_invocations_busy
    # Without the share the small job waits up to one 10 s job more than its pickup, and the backlog takes 2 waves
    assert noisy.small_job_delay_without_share == pytest.approx(10.2)
    assert noisy.backlog_seconds_without_share == 20.0
    # With a share of 10: 10 invocations stay for others; the small job waits its pickup and one deferral round
    assert noisy.share_applies
    assert noisy.invocations_left_for_others == 10
    assert noisy.noisy_records_deferred is True
    assert noisy.small_job_delay_with_share == pytest.approx(0.2 + 0.1)
    # and the backlog, 50 records at once, takes at least ceil(120 / 50) = 3 waves of 10 s (before the backoff)
    assert noisy.backlog_seconds_with_share_at_least == 30.0
    assert (noisy.backoff_base_seconds, noisy.backoff_max_seconds) == (2.0, 300.0)


def test_plan_noisy_tenant_without_a_share() -> None:
    plan = estimate(_noisy(tenant_share=0))
    noisy = plan.noisy_tenant

    assert noisy is not None
    assert not noisy.share_applies
    assert noisy.small_job_delay_without_share == pytest.approx(10.2)
    assert noisy.small_job_delay_with_share is None
    assert noisy.backlog_seconds_with_share_at_least is None
    assert any("a noisy tenant submits 120 jobs" in assumption for assumption in plan.assumptions)
    assert not any("with a share" in assumption for assumption in plan.assumptions)
    as_dict = plan.as_dict()["noisyTenant"]
    assert as_dict["withShare"] is None
    assert as_dict["withoutShare"] == {
        "allInvocationsBusy": True,
        "smallJobDelaySecondsUpTo": pytest.approx(10.2),
        "backlogSeconds": 20.0,
    }


def test_plan_noisy_tenant_share_at_maximum_concurrency_is_no_share() -> None:
    # A share of MaximumConcurrency or more never defers: the same as no share
    for share in (20, 50):
        noisy = estimate(_noisy(tenant_share=share)).noisy_tenant
        assert noisy is not None
        assert not noisy.share_applies
        assert noisy.invocations_left_for_others is None
        assert noisy.small_job_delay_without_share == pytest.approx(10.2)


def test_plan_noisy_backlog_below_capacity_leaves_an_invocation_free() -> None:
    # 99 records: one invocation keeps a slot; 40 fit in a share of 10 x 5 with nothing deferred
    under_capacity = estimate(_noisy(noisy_jobs=99)).noisy_tenant
    within_share = estimate(_noisy(noisy_jobs=40)).noisy_tenant

    assert under_capacity is not None
    assert within_share is not None
    assert not under_capacity.all_invocations_busy
    assert under_capacity.small_job_delay_without_share == pytest.approx(0.2)
    assert under_capacity.backlog_seconds_without_share == 10.0
    assert within_share.noisy_records_deferred is False
    assert within_share.small_job_delay_with_share == pytest.approx(0.2)
    assert within_share.backlog_seconds_with_share_at_least == 10.0
    # GROUP_CONCURRENCY below BatchSize bounds the records an invocation runs at once
    narrow = estimate(_noisy(noisy_jobs=40, group_concurrency=2)).noisy_tenant
    assert narrow is not None
    assert (narrow.records_per_invocation, narrow.capacity_records) == (2, 40)
    assert narrow.all_invocations_busy
    assert narrow.backlog_seconds_with_share_at_least == 20.0  # 20 records at once


def test_plan_without_noisy_jobs_has_no_noisy_tenant() -> None:
    plan = estimate(PlanInput(workspaces=10, rate=1.0, job_seconds=1.0))

    assert plan.noisy_tenant is None
    assert plan.as_dict()["noisyTenant"] is None
    assert not any("noisy tenant" in assumption for assumption in plan.assumptions)


def test_plan_noisy_inputs_problems_say_what_to_pass() -> None:
    deployment = Deployment(tenant_share=-1)
    problems = PlanInput(
        workspaces=1,
        rate=1,
        job_seconds=1,
        noisy_jobs=-1,
        noisy_job_seconds=0,
        pickup_seconds=-1,
        deployment=deployment,
    ).problems()
    alone = PlanInput(workspaces=1, rate=1, job_seconds=1, noisy_job_seconds=5).problems()

    assert problems == [
        "--noisy-jobs must be 0 (no noisy tenant) or a number of jobs",
        "--noisy-job-seconds must be a positive number of seconds",
        "--tenant-share must be 0 (no share) or a number of invocations",
        "--pickup-seconds must be 0 or more seconds",
    ]
    assert alone == ["--noisy-job-seconds needs --noisy-jobs N, the noisy tenant's backlog"]
