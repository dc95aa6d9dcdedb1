"""`plan`: capacity and cost of a workload, from template.yaml's settings (no AWS calls)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from agent_jobs_cli.context import CliError, JsonOption, handle_errors, out, print_json

if TYPE_CHECKING:
    from agent_jobs_cli.plan_noisy import NoisyTenantPlan


@handle_errors
def plan(
    workspaces: Annotated[int, typer.Option("--workspaces", help="Workspaces (message groups) with jobs.")],
    rate: Annotated[float, typer.Option("--rate", help="Jobs per second, all workspaces together.")],
    job_seconds: Annotated[float, typer.Option("--job-seconds", help="Mean duration of one job, in seconds.")],
    job_p99_seconds: Annotated[
        float | None, typer.Option("--job-p99-seconds", help="p99 job duration (default: every job takes the mean).")
    ] = None,
    memory_mb: Annotated[
        int | None, typer.Option("--memory-mb", help="Worker memory (default: template.yaml's).")
    ] = None,
    batch_size: Annotated[
        int | None, typer.Option("--batch-size", help="WorkerBatchSize (default: template.yaml's).")
    ] = None,
    max_concurrency: Annotated[
        int | None, typer.Option("--max-concurrency", help="WorkerMaximumConcurrency (default: template.yaml's).")
    ] = None,
    large_payload_share: Annotated[
        float, typer.Option("--large-payload-share", help="Share of jobs whose payload goes to S3, 0 to 1.")
    ] = 0.0,
    noisy_jobs: Annotated[
        int,
        typer.Option(
            "--noisy-jobs",
            help="A noisy tenant's backlog: this many jobs over as many workspaces, submitted at once; the plan "
            "predicts another tenant's small job's delay under it, with and without the tenant share (0: none).",
        ),
    ] = 0,
    noisy_job_seconds: Annotated[
        float | None,
        typer.Option("--noisy-job-seconds", help="Duration of each noisy job (default: --job-seconds)."),
    ] = None,
    tenant_share: Annotated[
        int | None,
        typer.Option(
            "--tenant-share",
            help="WorkerTenantShare: invocations one tenant may hold (default: template.yaml's; 0: no share).",
        ),
    ] = None,
    max_receive_count: Annotated[
        int | None,
        typer.Option(
            "--max-receive-count",
            help="MaxReceiveCount (default: template.yaml's): with MaxAttempts, how many times the tenant share may "
            "defer a record, so how long it holds.",
        ),
    ] = None,
    pickup_seconds: Annotated[
        float,
        typer.Option("--pickup-seconds", help="A job's latency from submit to start on an idle stack."),
    ] = 0.2,
    as_json: JsonOption = False,
) -> None:
    """Estimate Lambda concurrency, queueing delay per workspace and the cost per million jobs (no AWS calls); with
    --noisy-jobs, a small tenant's delay under another tenant's backlog, with and without the tenant share."""
    from agent_jobs_cli.plan import PRICES, Deployment, PlanInput, estimate

    deployment = Deployment.from_template(
        memory_mb=memory_mb,
        batch_size=batch_size,
        maximum_concurrency=max_concurrency,
        tenant_share=tenant_share,
        max_receive_count=max_receive_count,
    )
    inputs = PlanInput(
        workspaces=workspaces,
        rate=rate,
        job_seconds=job_seconds,
        job_p99_seconds=job_p99_seconds,
        large_payload_share=large_payload_share,
        noisy_jobs=noisy_jobs,
        noisy_job_seconds=noisy_job_seconds,
        pickup_seconds=pickup_seconds,
        deployment=deployment,
    )
    problems = inputs.problems()
    if problems:
        raise CliError("; ".join(problems))
    result = estimate(inputs)
    if as_json:
        print_json(result.as_dict())
        return
    console = out()

    def seconds(value: float) -> str:
        return "unbounded (saturated)" if value == float("inf") else f"{value:.2f} s"

    summary = Table("estimate", "value", title="capacity", show_header=False)
    summary.add_row("jobs per second per workspace", f"{result.rate_per_workspace:.4g}")
    summary.add_row("utilisation of each workspace", f"{result.utilisation:.1%}")
    summary.add_row("mean Lambda concurrency needed (Little's law)", f"{result.mean_concurrency_demand:.2f}")
    summary.add_row(
        "concurrency to provision (p99 busy workspaces)",
        f"{result.lambda_concurrency_needed} (runs at most min(workspaces, MaximumConcurrency) = "
        f"{result.concurrency_cap})",
    )
    summary.add_row(f"mean wait per workspace ({result.queue_model})", seconds(result.mean_wait_seconds))
    summary.add_row("extra wait for a free invocation", seconds(result.concurrency_wait_seconds))
    summary.add_row("records per invocation", f"{result.records_per_invocation:.2f}")
    console.print(summary)
    if result.noisy_tenant is not None:
        console.print(_noisy_table(result.noisy_tenant))
    costs = Table("service", "item", "units per job", "USD per million jobs", title="cost per million jobs")
    for line in result.cost_lines:
        costs.add_row(line.service, line.item, f"{line.units_per_job:.4g}", f"{line.usd_per_million_jobs:.2f}")
    costs.add_row("total", "", "", f"{result.usd_per_million_jobs:.2f}", style="bold")
    console.print(costs)
    console.print(
        f"At {rate:g} jobs/s: {result.monthly_jobs:,.0f} jobs a month, about ${result.monthly_usd:,.2f} a month "
        f"(of which ${result.fixed_monthly_usd:.2f} is idle polling)."
    )
    for warning in result.warnings:
        console.print(f"[bold red]warning:[/] {warning}")
    console.print("Assumptions:")
    for assumption in result.assumptions:
        console.print(f"  - {assumption}")
    # One line per price: the source URLs must stay whole to be usable.
    console.print("us-east-1 list prices:")
    for price in PRICES.values():
        console.print(
            f"  - {price.service}, {price.item}: ${price.usd * 1_000_000:.6g} per million ({price.unit}); "
            f"{price.source} "
            f"(page dated {price.page_date or 'nowhere on the page'}, read on {price.read_on})",
            soft_wrap=True,
        )


def _noisy_table(noisy: NoisyTenantPlan) -> Table:
    table = Table("estimate", "value", title="a small tenant's job under a noisy tenant", show_header=False)
    table.add_row(
        "noisy backlog",
        f"{noisy.noisy_jobs} jobs of {noisy.noisy_job_seconds:g} s over {noisy.noisy_jobs} workspaces, at once",
    )
    table.add_row(
        "records the worker runs at once",
        f"{noisy.capacity_records} (MaximumConcurrency {noisy.maximum_concurrency} x "
        f"min(BatchSize, GROUP_CONCURRENCY) {noisy.records_per_invocation})",
    )
    busy = "every invocation busy" if noisy.all_invocations_busy else "an invocation stays free"
    table.add_row(
        "small job's delay, no share",
        f"up to {noisy.small_job_delay_without_share:.2f} s ({busy}: pickup {noisy.pickup_seconds:g} s"
        + (f" + up to one noisy job, {noisy.noisy_job_seconds:g} s)" if noisy.all_invocations_busy else ")"),
    )
    table.add_row(
        "noisy backlog's time, no share",
        f"about {noisy.backlog_seconds_without_share:g} s (ceil({noisy.noisy_jobs} / {noisy.capacity_records}) "
        f"waves of {noisy.noisy_job_seconds:g} s)",
    )
    if not noisy.share_applies:
        why = "0" if noisy.tenant_share == 0 else f"{noisy.tenant_share}, at least MaximumConcurrency: it never defers"
        table.add_row("tenant share", f"none ({why})")
        return table
    share_records = noisy.tenant_share * noisy.records_per_invocation
    table.add_row(
        "tenant share",
        f"{noisy.tenant_share} invocations ({share_records} records); "
        f"{noisy.invocations_left_for_others} left for other tenants",
    )
    deferred = "+ up to one round of deferrals" if noisy.noisy_records_deferred else "nothing deferred"
    table.add_row(
        "small job's delay, with the share",
        f"up to {noisy.small_job_delay_with_share:.2f} s (pickup {noisy.pickup_seconds:g} s {deferred})",
    )
    table.add_row(
        "noisy backlog's time, with the share",
        f"at least {noisy.backlog_seconds_with_share_at_least:g} s (ceil({noisy.noisy_jobs} / {share_records}) waves "
        f"of {noisy.noisy_job_seconds:g} s), plus the backoff of its deferred records: "
        f"min({noisy.backoff_max_seconds:g}, {noisy.backoff_base_seconds:g} x 3^(receives - 1)) s each time, jittered",
    )
    outlasted = (
        "its last wave may wait longer: those records then run over the share"
        if noisy.backlog_outlasts_share
        else "the backlog runs through the share within that"
    )
    table.add_row(
        "the share holds",
        f"{noisy.deferrals} deferrals of a record (MaxReceiveCount - MaxAttempts - 3), "
        f"{noisy.share_holds_seconds_at_least:g} to {noisy.share_holds_seconds_at_most:g} s of backoff; {outlasted}",
    )
    return table
