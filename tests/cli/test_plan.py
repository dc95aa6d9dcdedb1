"""`agent-jobs plan`: the capacity and cost estimate on the command line, as JSON and as tables (no AWS calls)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from agent_jobs_bench.plan import cost_figures
from agent_jobs_cli.main import app
from agent_jobs_cli.plan import PRICES, PerJobUsage, PlanInput, estimate
from agent_jobs_cli.plan_prices import MILLION
from agent_jobs_local.template import TemplateModel


def test_plan_command_prints_the_estimate_as_json_with_the_templates_defaults() -> None:
    result = CliRunner().invoke(app, ["plan", "--workspaces", "10", "--rate", "2", "--job-seconds", "2", "--json"])

    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    model = TemplateModel.from_path()
    deployment = plan["inputs"]["deployment"]
    assert deployment["batch_size"] == model.worker.batch_size
    assert deployment["maximum_concurrency"] == model.worker.maximum_concurrency
    assert deployment["memory_mb"] == model.worker.function.memory_size_mb
    assert plan["lambda"]["meanConcurrency"] == 4.0
    assert plan["lambda"]["concurrencyNeeded"] == 8
    assert abs(plan["delay"]["meanWaitSecondsPerWorkspace"] - 0.4 * 2 / (2 * 0.6)) < 1e-9  # M/D/1
    assert plan["cost"]["usdPerMillionJobs"] > 0
    assert [price["key"] for price in plan["prices"]] == list(PRICES)


def test_plan_command_options_override_the_template() -> None:
    result = CliRunner().invoke(
        app,
        [
            "plan",
            *("--workspaces", "100", "--rate", "1", "--job-seconds", "3"),
            *("--memory-mb", "1024", "--batch-size", "1", "--max-concurrency", "4", "--large-payload-share", "0.25"),
            "--json",
        ],
    )

    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    deployment = plan["inputs"]["deployment"]
    assert (deployment["memory_mb"], deployment["batch_size"], deployment["maximum_concurrency"]) == (1024, 1, 4)
    assert plan["inputs"]["large_payload_share"] == 0.25
    assert plan["lambda"]["concurrencyCap"] == 4
    assert plan["delay"]["concurrencyWaitSeconds"] > 0


def test_plan_command_tables_show_warnings_assumptions_and_every_price_source() -> None:
    result = CliRunner().invoke(app, ["plan", "--workspaces", "2", "--rate", "1", "--job-seconds", "4"])

    assert result.exit_code == 0, result.output
    assert "warning:" in result.output
    assert "grows without bound" in result.output
    assert "Assumptions:" in result.output
    for price in PRICES.values():
        assert price.source in result.output


def test_plan_command_says_what_to_pass_for_an_unusable_input() -> None:
    result = CliRunner().invoke(app, ["plan", "--workspaces", "5", "--rate", "0", "--job-seconds", "2"])

    assert result.exit_code == 1
    assert "--rate must be a positive number of jobs per second" in result.output


def test_plan_prices_the_job_calls_as_the_layer_makes_them() -> None:
    # Happy path: accept, sent, claim, complete (1 write unit each); the workspace read and the pending index's empty
    # range (1 + 0.5 read units). Each retried attempt: a claim and a failure, and the same reads.
    usage = PerJobUsage()
    assert (usage.dynamodb_write_units, usage.dynamodb_read_units) == (4, 1.5)
    failing = estimate(PlanInput(workspaces=10, rate=1.0, job_seconds=1.0, failure_share=1.0))
    lines = {line.price_key: line for line in failing.cost_lines}
    retries = failing.inputs.deployment.max_attempts - 1
    assert lines["dynamodb_write_request_unit"].units_per_job == 4 + retries * 2
    assert lines["dynamodb_read_request_unit"].units_per_job == 1.5 + retries * 1.5


def test_cost_figures_compare_the_plan_with_the_transactional_calls() -> None:
    figures = {figure.name: figure for figure in cost_figures()}
    short = figures["Cost per million jobs, a 1 s apply_patch (us-east-1 list prices)"]
    long = figures["Cost per million jobs, a 60 s run_tests (us-east-1 list prices)"]
    # The same prices, 6 write units fewer and 1 read unit more per job
    assert short.baseline is not None
    assert long.baseline is not None
    difference = short.baseline - short.value
    assert difference == pytest.approx(long.baseline - long.value)
    assert difference == pytest.approx(
        6 * PRICES["dynamodb_write_request_unit"].usd * MILLION - 1 * PRICES["dynamodb_read_request_unit"].usd * MILLION
    )


def _noisy_plan(*share: str) -> dict[str, Any]:
    result = CliRunner().invoke(
        app,
        [
            "plan",
            *("--workspaces", "1", "--rate", "0.01", "--job-seconds", "1"),
            *("--noisy-jobs", "120", "--noisy-job-seconds", "10", *share, "--json"),
        ],
    )
    assert result.exit_code == 0, result.output
    noisy: dict[str, Any] = json.loads(result.output)["noisyTenant"]
    return noisy


def test_plan_command_predicts_a_small_job_under_a_noisy_tenant_with_the_templates_share() -> None:
    noisy = _noisy_plan()

    assert noisy["tenantShare"] == int(TemplateModel.from_path().parameters["WorkerTenantShare"]) == 10
    assert noisy["capacityRecords"] == 100
    assert noisy["withoutShare"]["allInvocationsBusy"] is True
    assert noisy["withoutShare"]["smallJobDelaySecondsUpTo"] == pytest.approx(10.2)
    assert noisy["withShare"]["invocationsLeftForOthers"] == 10
    assert noisy["withShare"]["smallJobDelaySecondsUpTo"] == pytest.approx(0.3)
    assert noisy["withShare"]["backlogSecondsAtLeast"] == 30.0
    assert _noisy_plan("--tenant-share", "0")["withShare"] is None


def test_plan_command_states_how_long_the_share_holds_and_what_raises_it() -> None:
    # With the template's MaxReceiveCount 10 and MaxAttempts 3, a record may be deferred 4 times (3 receives stay for
    # a crash), each backoff three times the one before from 2 s (jittered down to half): 40 to 80 s in all
    held = _noisy_plan()["withShare"]
    assert (held["deferrals"], held["shareHoldsSecondsAtLeast"], held["shareHoldsSecondsAtMost"]) == (4, 40, 80)
    assert held["backlogOutlastsShare"] is False

    # A larger MaxReceiveCount holds longer: two more deferrals, each at most BACKOFF_MAX_SECONDS (300 s)
    longer = _noisy_plan("--max-receive-count", "12")["withShare"]
    assert (longer["deferrals"], longer["shareHoldsSecondsAtMost"]) == (6, 80 + 162 + 300)

    # and a backlog whose last wave waits longer than the share holds is named as outlasting it
    outlasting = CliRunner().invoke(
        app,
        [
            "plan",
            *("--workspaces", "1", "--rate", "0.01", "--job-seconds", "1"),
            *("--noisy-jobs", "600", "--noisy-job-seconds", "60", "--json"),
        ],
    )
    assert json.loads(outlasting.output)["noisyTenant"]["withShare"]["backlogOutlastsShare"] is True


def test_plan_command_refuses_a_max_receive_count_at_or_below_the_attempts() -> None:
    result = CliRunner().invoke(
        app,
        ["plan", *("--workspaces", "1", "--rate", "1", "--job-seconds", "1", "--max-receive-count", "3")],
    )

    assert result.exit_code == 1
    assert "--max-receive-count must be above MaxAttempts (3)" in result.output


def test_plan_command_tables_show_the_noisy_tenant() -> None:
    result = CliRunner().invoke(
        app,
        ["plan", *("--workspaces", "1", "--rate", "0.01", "--job-seconds", "1", "--noisy-jobs", "120")],
    )

    assert result.exit_code == 0, result.output
    assert "under a noisy tenant" in result.output
    assert "with the share" in result.output
    assert "plus the backoff" in result.output
    assert "the share holds" in result.output


def test_plan_command_says_what_to_pass_for_an_unusable_noisy_input() -> None:
    result = CliRunner().invoke(
        app,
        ["plan", *("--workspaces", "1", "--rate", "1", "--job-seconds", "1", "--tenant-share", "-1")],
    )

    assert result.exit_code == 1
    assert "--tenant-share must be 0 (no share) or a number of invocations" in result.output
