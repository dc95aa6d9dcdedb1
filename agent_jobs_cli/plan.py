"""The capacity and cost plan: a model, no AWS calls. Given the workspaces, the job rate and the job duration, and
the deployment's settings, it estimates the worker's Lambda concurrency, the queueing delay per workspace, when a
workspace saturates, and what a million jobs cost at us-east-1 list prices (`PRICES`, each with its source).

The queueing model. Every workspace is one SQS FIFO message group, and a group runs one job at a time, so each
workspace is a single-server queue of its own: jobs arrive at random (Poisson, rate = rate / workspaces, the same for
every workspace) and take `job_seconds` each. The waiting time before a job starts is Pollaczek-Khinchine's M/G/1
mean, rho * S * (1 + cv^2) / (2 * (1 - rho)): M/D/1 (cv = 0) when only a mean duration is given, and, when a p99 is
given too, the cv of a lognormal duration with that mean and p99. The worker's concurrency is the number of busy
groups: by Little's law rate x S on average, never more than the workspaces nor MaximumConcurrency; at a random
instant each workspace is busy with probability rho, so the busy groups are Binomial(workspaces, rho) and the p99 of
that is the concurrency to provision. When more groups want to run than MaximumConcurrency allows, jobs also wait
for a free invocation: that extra wait is Erlang C's M/M/c mean with c = MaximumConcurrency (an estimate: it treats
the groups' jobs as one pool).

Records of different groups in one batch are assumed to run concurrently (the group-parallel worker); with a
sequential loop over the batch, a batch's groups also wait for each other, up to (BatchSize - 1) x S more.

A noisy tenant (`noisy_jobs` > 0): one tenant's backlog of N jobs over N workspaces, submitted at once, and another
tenant's small job after it. The worker holds MaximumConcurrency x min(BatchSize, GROUP_CONCURRENCY) records at once;
without a tenant share a backlog that fills them makes the small job wait up to one job of the backlog, and with a
share S the backlog keeps to S invocations, so the small job waits about its idle latency while the backlog takes at
least ceil(N / (S x records per invocation)) waves, plus the backoff of its deferred records, and the share holds
each record back for MaxReceiveCount - MaxAttempts - 3 deferrals at most (see `plan_noisy`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from agent_jobs_cli.plan_noisy import DEFERRAL_ROUND_SECONDS, NoisyTenantPlan, noisy_tenant
from agent_jobs_cli.plan_prices import MILLION, PRICES, Price
from agent_jobs_cli.plan_queueing import binomial_quantile, erlang_c_wait, lognormal_cv, mg1_wait

SECONDS_PER_MONTH: Final = 30 * 24 * 3600
SQS_CHUNK_KB: Final = 64  # SQS bills each 64 KB chunk of a request's payload as one request


@dataclass(frozen=True)
class Deployment:
    """The deployment's settings the plan needs. `from_template` reads template.yaml's parameter defaults."""

    batch_size: int = 5
    maximum_concurrency: int = 20
    reserved_concurrency: int | None = 50
    memory_mb: int = 512
    architecture: str = "arm64"
    max_attempts: int = 3
    max_receive_count: int = 10  # MaxReceiveCount: with MaxAttempts, how many times the share may defer a record
    tenant_share: int = 10  # WorkerTenantShare: invocations one tenant's jobs may hold (0: no share)
    group_concurrency: int = 10  # GROUP_CONCURRENCY: records of one batch that run at once
    backoff_base_seconds: float = 2.0  # BACKOFF_BASE_SECONDS: a deferred record's first backoff
    backoff_max_seconds: float = 300.0  # BACKOFF_MAX_SECONDS

    @classmethod
    def from_template(cls, path: Path | None = None, **overrides: Any) -> Deployment:
        """The worker's settings as template.yaml deploys them with its parameter defaults (through
        `agent_jobs_local.template`, so nothing here keeps a second copy), then `overrides` (None values ignored)."""
        from agent_jobs_local.template import DEFAULT_TEMPLATE_PATH, TemplateModel

        model = TemplateModel.from_path(path or DEFAULT_TEMPLATE_PATH)
        worker = model.worker

        def environment(name: str, default: float) -> float:
            value = model.function_environment_variable(worker.function.function_id, name)
            return default if value is None else float(value)

        settings = cls(
            batch_size=worker.batch_size,
            maximum_concurrency=worker.maximum_concurrency or 1000,
            reserved_concurrency=worker.function.reserved_concurrency,
            memory_mb=worker.function.memory_size_mb,
            architecture=(worker.function.architectures or ("x86_64",))[0],
            max_attempts=int(model.parameters["MaxAttempts"]),
            max_receive_count=int(model.parameters["MaxReceiveCount"]),
            tenant_share=int(model.parameters.get("WorkerTenantShare", "0")),
            group_concurrency=int(environment("GROUP_CONCURRENCY", 1)),
            backoff_base_seconds=environment("BACKOFF_BASE_SECONDS", cls.backoff_base_seconds),
            backoff_max_seconds=environment("BACKOFF_MAX_SECONDS", cls.backoff_max_seconds),
        )
        chosen = {name: value for name, value in overrides.items() if value is not None}
        return cls(**{**asdict(settings), **chosen})


@dataclass(frozen=True)
class PerJobUsage:
    """What one job asks of each service on the happy path (the guard's calls as the layer makes them today: items
    under 1 KB, every write a plain conditional one of 1 write unit)."""

    # Producer: the QUEUED record (a conditional put; the workspace's registered owner is a read kept per process, so
    # about nothing per job) and the message id and SequenceNumber (1); worker: the claim and the complete (1 each).
    dynamodb_write_units: float = 1 + 1 + 1 + 1
    # Worker: the workspace, read strongly consistent after the claim (1), and the pending index's empty range (0.5).
    dynamodb_read_units: float = 1 + 0.5
    # Each retried attempt: its claim and its recorded failure, and the same two reads.
    retry_write_units: float = 1 + 1
    retry_read_units: float = 1 + 0.5
    api_requests: float = 1.0  # one POST /jobs per job
    sqs_sends: float = 1.0  # one SendMessage per job
    invocation_overhead_seconds: float = 0.05  # billed time of an invocation beyond its jobs (parse, settle)
    job_overhead_seconds: float = 0.03  # the guard's calls around each job


# What a job asked of DynamoDB while the enqueue and the claim were transactions with a ConditionCheck of the workspace
# (every item of a transaction 2 write units): the record 4 + the message id 1, the claim 4 + the complete 1, and each
# retry a claim (4) and a failure (1). Kept to price a plan as it was (the benchmark's "before").
TRANSACTIONAL_USAGE: Final = PerJobUsage(
    dynamodb_write_units=4 + 1 + 4 + 1, dynamodb_read_units=0.5, retry_write_units=4 + 1, retry_read_units=0.5
)


@dataclass(frozen=True)
class PlanInput:
    workspaces: int
    rate: float  # jobs per second, all workspaces together
    job_seconds: float  # mean duration of one job
    job_p99_seconds: float | None = None
    large_payload_share: float = 0.0  # share of jobs whose payload goes to S3 (above the inline limit)
    message_kb: float = 1.0  # size of an inline job message
    failure_share: float = 0.0  # share of jobs that use up every attempt (DEAD)
    status_reads_per_job: float = 0.0
    idle_pollers: int = 5  # Lambda's SQS pollers long-polling an idle queue, 20 s each
    noisy_jobs: int = 0  # a noisy tenant's backlog: this many jobs over as many workspaces, at once (0: none)
    noisy_job_seconds: float | None = None  # duration of each of its jobs (None: job_seconds)
    pickup_seconds: float = 0.2  # a job's latency from submit to start on an idle stack
    deployment: Deployment = field(default_factory=Deployment)
    usage: PerJobUsage = field(default_factory=PerJobUsage)

    def problems(self) -> list[str]:
        """What makes this input unusable, each saying what to pass instead."""
        found = []
        if self.workspaces < 1:
            found.append("--workspaces must be at least 1")
        if self.rate <= 0:
            found.append("--rate must be a positive number of jobs per second")
        if self.job_seconds <= 0:
            found.append("--job-seconds must be a positive number of seconds")
        if self.job_p99_seconds is not None and self.job_p99_seconds < self.job_seconds:
            found.append("--job-p99-seconds must be at least the mean --job-seconds")
        if not 0 <= self.large_payload_share <= 1:
            found.append("--large-payload-share must be between 0 and 1")
        if not 0 <= self.failure_share <= 1:
            found.append("the failure share must be between 0 and 1")
        if not 1 <= self.deployment.batch_size <= 10:
            found.append("--batch-size must be between 1 and 10 (a FIFO event source takes at most 10)")
        if self.deployment.maximum_concurrency < 1:
            found.append("--max-concurrency must be at least 1")
        if self.deployment.architecture != "arm64":
            found.append("the price table holds arm64 Lambda prices only: plan for a worker on arm64")
        if self.deployment.memory_mb < 128:
            found.append("--memory-mb must be at least 128")
        return found + self._noisy_problems()

    def _noisy_problems(self) -> list[str]:
        found = []
        if self.noisy_jobs < 0:
            found.append("--noisy-jobs must be 0 (no noisy tenant) or a number of jobs")
        if self.noisy_job_seconds is not None and self.noisy_job_seconds <= 0:
            found.append("--noisy-job-seconds must be a positive number of seconds")
        if self.noisy_job_seconds is not None and self.noisy_jobs == 0:
            found.append("--noisy-job-seconds needs --noisy-jobs N, the noisy tenant's backlog")
        if self.deployment.tenant_share < 0:
            found.append("--tenant-share must be 0 (no share) or a number of invocations")
        if self.deployment.max_receive_count <= self.deployment.max_attempts:
            found.append(
                f"--max-receive-count must be above MaxAttempts ({self.deployment.max_attempts}): the queue's redrive"
                " is a backstop behind the attempts"
            )
        if self.deployment.group_concurrency < 1:
            found.append("GROUP_CONCURRENCY must be at least 1")
        if self.pickup_seconds < 0:
            found.append("--pickup-seconds must be 0 or more seconds")
        return found


@dataclass(frozen=True)
class CostLine:
    service: str
    item: str
    units_per_job: float
    price_key: str
    usd_per_million_jobs: float


@dataclass(frozen=True)
class Plan:
    inputs: PlanInput
    rate_per_workspace: float
    utilisation: float  # rho of each workspace
    duration_cv: float
    queue_model: str
    mean_concurrency_demand: float  # Little's law: rate x duration, at most one per workspace
    mean_busy_groups: float  # the same, capped by MaximumConcurrency: what runs on average
    p99_busy_groups: int
    concurrency_cap: int  # min(workspaces, MaximumConcurrency)
    mean_wait_seconds: float  # per workspace, before a job starts (math.inf when saturated)
    concurrency_wait_seconds: float  # extra wait for a free invocation (math.inf when overall saturated)
    records_per_invocation: float
    cost_lines: list[CostLine]
    usd_per_million_jobs: float
    monthly_jobs: float
    fixed_monthly_usd: float
    monthly_usd: float
    warnings: list[str]
    assumptions: list[str]
    noisy_tenant: NoisyTenantPlan | None = None  # with `noisy_jobs`: a small tenant's delay under that backlog

    @property
    def lambda_concurrency_needed(self) -> int:
        """The p99 of busy groups: what MaximumConcurrency should allow."""
        return self.p99_busy_groups

    @property
    def saturated(self) -> bool:
        return math.isinf(self.mean_wait_seconds) or math.isinf(self.concurrency_wait_seconds)

    def as_dict(self) -> dict[str, Any]:
        def finite(value: float) -> float | None:
            return None if math.isinf(value) else value

        return {
            "inputs": asdict(self.inputs),
            "ratePerWorkspace": self.rate_per_workspace,
            "utilisationPerWorkspace": self.utilisation,
            "durationCv": self.duration_cv,
            "queueModel": self.queue_model,
            "lambda": {
                "meanConcurrencyDemand": self.mean_concurrency_demand,
                "meanConcurrency": self.mean_busy_groups,
                "p99BusyGroups": self.p99_busy_groups,
                "concurrencyCap": self.concurrency_cap,
                "concurrencyNeeded": self.lambda_concurrency_needed,
                "recordsPerInvocation": self.records_per_invocation,
            },
            "delay": {
                "meanWaitSecondsPerWorkspace": finite(self.mean_wait_seconds),
                "concurrencyWaitSeconds": finite(self.concurrency_wait_seconds),
                "saturated": self.saturated,
            },
            "cost": {
                "usdPerMillionJobs": self.usd_per_million_jobs,
                "lines": [asdict(line) for line in self.cost_lines],
                "monthlyJobs": self.monthly_jobs,
                "fixedMonthlyUsd": self.fixed_monthly_usd,
                "monthlyUsd": self.monthly_usd,
            },
            "noisyTenant": None if self.noisy_tenant is None else self.noisy_tenant.as_dict(),
            "warnings": self.warnings,
            "assumptions": self.assumptions,
            "prices": [asdict(price) for price in PRICES.values()],
        }


# --- the plan -------------------------------------------------------------------------------------------------------


def estimate(inputs: PlanInput) -> Plan:
    """The plan for `inputs` (check `inputs.problems()` first: this assumes a valid input)."""
    deployment = inputs.deployment
    seconds = inputs.job_seconds
    rate_per_workspace = inputs.rate / inputs.workspaces
    rho = rate_per_workspace * seconds
    cv = lognormal_cv(seconds, inputs.job_p99_seconds)
    cap = min(inputs.workspaces, deployment.maximum_concurrency)
    offered = inputs.rate * seconds  # Little's law: jobs in service, if nothing capped it
    demand = min(offered, inputs.workspaces * min(rho, 1.0))
    mean_busy = min(demand, float(cap))
    p99_busy = binomial_quantile(inputs.workspaces, min(rho, 1.0))
    wait = mg1_wait(rate_per_workspace, seconds, cv)
    # More busy groups than MaximumConcurrency: jobs also wait for an invocation.
    concurrency_wait = 0.0
    if inputs.workspaces > deployment.maximum_concurrency:
        concurrency_wait = erlang_c_wait(deployment.maximum_concurrency, offered, seconds)
    queued_per_workspace = rate_per_workspace * wait if math.isfinite(wait) else float(deployment.batch_size)
    # A group's waiting jobs are received together when it frees up: a batch holds the job that starts plus its
    # queue, up to BatchSize.
    records = max(1.0, min(float(deployment.batch_size), 1.0 + queued_per_workspace))

    warnings = _warnings(inputs, rho, offered, p99_busy, wait=wait, concurrency_wait=concurrency_wait)
    lines = _cost_lines(inputs, records)
    per_million = sum(line.usd_per_million_jobs for line in lines)
    monthly_jobs = inputs.rate * SECONDS_PER_MONTH
    # Idle pollers long-poll (20 s) whether or not jobs arrive: a fixed monthly request count.
    fixed = inputs.idle_pollers * (SECONDS_PER_MONTH / 20) * PRICES["sqs_fifo_request"].usd
    queue_model = "M/D/1" if cv == 0 else f"M/G/1 (lognormal durations, cv {cv:.2f})"
    noisy = None
    if inputs.noisy_jobs > 0:
        noisy = noisy_tenant(
            noisy_jobs=inputs.noisy_jobs,
            noisy_job_seconds=inputs.noisy_job_seconds or seconds,
            tenant_share=deployment.tenant_share,
            maximum_concurrency=deployment.maximum_concurrency,
            batch_size=deployment.batch_size,
            group_concurrency=deployment.group_concurrency,
            pickup_seconds=inputs.pickup_seconds,
            backoff_base_seconds=deployment.backoff_base_seconds,
            backoff_max_seconds=deployment.backoff_max_seconds,
            max_receive_count=deployment.max_receive_count,
            max_attempts=deployment.max_attempts,
        )
    return Plan(
        inputs=inputs,
        rate_per_workspace=rate_per_workspace,
        utilisation=rho,
        duration_cv=cv,
        queue_model=queue_model,
        mean_concurrency_demand=demand,
        mean_busy_groups=mean_busy,
        p99_busy_groups=p99_busy,
        concurrency_cap=cap,
        mean_wait_seconds=wait,
        concurrency_wait_seconds=concurrency_wait,
        records_per_invocation=records,
        cost_lines=lines,
        usd_per_million_jobs=per_million,
        monthly_jobs=monthly_jobs,
        fixed_monthly_usd=fixed,
        monthly_usd=per_million * monthly_jobs / MILLION + fixed,
        warnings=warnings,
        assumptions=_assumptions(inputs, records, queue_model) + _noisy_assumptions(noisy),
        noisy_tenant=noisy,
    )


def _noisy_assumptions(noisy: NoisyTenantPlan | None) -> list[str]:
    if noisy is None:
        return []
    found = [
        f"a noisy tenant submits {noisy.noisy_jobs} jobs of {noisy.noisy_job_seconds:g} s over as many workspaces at "
        f"once; the worker holds MaximumConcurrency ({noisy.maximum_concurrency}) x min(BatchSize, GROUP_CONCURRENCY) "
        f"({noisy.records_per_invocation}) = {noisy.capacity_records} records at once",
        f"a small tenant's job starts {noisy.pickup_seconds:g} s after its submission on an idle stack (the pickup); "
        "without a share it waits up to one noisy job more when the backlog fills every invocation (the rest of the "
        "first wave)",
    ]
    if not noisy.share_applies:
        return found
    return [
        *found,
        f"with a share S below MaximumConcurrency the noisy tenant holds at most S invocations; the others defer its "
        f"surplus records in about {DEFERRAL_ROUND_SECONDS:g} s a round, so the small job waits at most one round "
        "more than its pickup",
        "with a share the backlog takes at least ceil(N / (S x records per invocation)) waves of its job duration; "
        "each deferred record comes back after min(BACKOFF_MAX_SECONDS, BACKOFF_BASE_SECONDS x 3^(receives - 1)) s, "
        "jittered between half that and that, which adds to that",
        f"the share holds a record back for its {noisy.deferrals} deferrals at most (MaxReceiveCount - MaxAttempts - 3:"
        " the receives its attempts and a crash do not need), "
        f"{noisy.share_holds_seconds_at_least:g} to {noisy.share_holds_seconds_at_most:g} s of backoff in all; a "
        "record still waiting then runs over the share (RecordsOverShare): raise MaxReceiveCount to hold longer",
    ]


def _warnings(
    inputs: PlanInput, rho: float, offered: float, p99_busy: int, *, wait: float, concurrency_wait: float
) -> list[str]:
    deployment = inputs.deployment
    warnings = []
    if rho >= 1:
        warnings.append(
            f"each workspace is saturated (utilisation {rho:.2f} >= 1): its jobs arrive faster than one at a time "
            "can run, so its queue grows without bound. More concurrency cannot help (a workspace runs one job at a "
            f"time): spread the jobs over more workspaces (at least {math.ceil(inputs.rate * inputs.job_seconds)}), "
            "or make the jobs shorter."
        )
    elif rho >= 0.8:
        warnings.append(
            f"each workspace is {rho:.0%} busy: its queueing delay ({wait:.1f} s) rises steeply as it nears 100%; "
            "spread the jobs over more workspaces to keep the delay down."
        )
    if offered >= deployment.maximum_concurrency and inputs.workspaces > deployment.maximum_concurrency:
        warnings.append(
            f"the jobs need {offered:.1f} concurrent invocations on average, at or above WorkerMaximumConcurrency "
            f"({deployment.maximum_concurrency}): the queue grows without bound. Raise WorkerMaximumConcurrency (and "
            f"WorkerReservedConcurrency) to at least {p99_busy}."
        )
    elif p99_busy > deployment.maximum_concurrency:
        warnings.append(
            f"WorkerMaximumConcurrency ({deployment.maximum_concurrency}) is below the p99 of busy workspaces "
            f"({p99_busy}): at peaks jobs wait for a free invocation ({concurrency_wait:.2f} s on average); raise it "
            f"to {p99_busy} to remove that wait."
        )
    if deployment.reserved_concurrency is not None and deployment.maximum_concurrency > deployment.reserved_concurrency:
        warnings.append(
            f"WorkerMaximumConcurrency ({deployment.maximum_concurrency}) is above WorkerReservedConcurrency "
            f"({deployment.reserved_concurrency}): the surplus invocations are throttled; raise the reservation."
        )
    return warnings


def _cost_lines(inputs: PlanInput, records: float) -> list[CostLine]:
    usage, deployment = inputs.usage, inputs.deployment
    share = inputs.large_payload_share
    # A large payload travels as a small reference; an inline message is billed per 64 KB chunk.
    chunks = (1 - share) * math.ceil(inputs.message_kb / SQS_CHUNK_KB) + share * 1
    message_kb = (1 - share) * inputs.message_kb + share * 1  # a reference message is well under 1 KB
    # A DEAD job is received MaxAttempts times and has its visibility changed (backoff) between attempts.
    attempts = 1 + inputs.failure_share * (deployment.max_attempts - 1)
    retries = attempts - 1
    sqs = (
        usage.sqs_sends * chunks  # send
        # receive: one request per batch of `records` jobs, billed per 64 KB chunk of the batch's messages
        + attempts * max(1 / records, message_kb / SQS_CHUNK_KB)
        + 1 / records  # DeleteMessageBatch per batch
        + retries  # ChangeMessageVisibility for each backoff
    )
    invocations = attempts / records
    gb_seconds = (
        attempts * (inputs.job_seconds + usage.job_overhead_seconds) + invocations * usage.invocation_overhead_seconds
    ) * (deployment.memory_mb / 1024)
    units = [
        (
            "Amazon SQS",
            "FIFO requests: send, receive and delete shares of a batch, 64 KB chunks",
            sqs,
            "sqs_fifo_request",
        ),
        ("AWS Lambda", "GB-seconds (job + overhead) x memory", gb_seconds, "lambda_arm_gb_second"),
        ("AWS Lambda", "invocations (one per batch)", invocations, "lambda_request"),
        (
            "Amazon DynamoDB",
            "write request units (accept + sent + claim + complete, and each retry's claim + fail)",
            usage.dynamodb_write_units + retries * usage.retry_write_units,
            "dynamodb_write_request_unit",
        ),
        (
            "Amazon DynamoDB",
            "read request units (the workspace after each claim, the pending index, status reads)",
            usage.dynamodb_read_units + retries * usage.retry_read_units + inputs.status_reads_per_job,
            "dynamodb_read_request_unit",
        ),
        ("Amazon S3", "PUT of a large payload (claim check)", share, "s3_put"),
        ("Amazon S3", "GET of a large payload, each attempt", share * attempts, "s3_get"),
        ("Amazon API Gateway", "HTTP API requests (POST /jobs)", usage.api_requests, "http_api_request"),
    ]
    return [
        CostLine(service, item, amount, key, amount * PRICES[key].usd * MILLION) for service, item, amount, key in units
    ]


def _assumptions(inputs: PlanInput, records: float, queue_model: str) -> list[str]:
    deployment = inputs.deployment
    return [
        "each workspace is one FIFO message group and runs one job at a time: a single-server queue",
        f"jobs arrive at random (Poisson), evenly over the {inputs.workspaces} workspaces; waits are {queue_model}",
        "concurrency = busy groups: Little's law on average; Binomial(workspaces, utilisation) p99 to provision",
        f"records of different groups in one batch run concurrently; a batch holds ~{records:.2f} records "
        f"(BatchSize {deployment.batch_size}): the job that starts plus its workspace's queue",
        f"worker memory {deployment.memory_mb} MB on {deployment.architecture}; "
        f"{inputs.usage.job_overhead_seconds * 1000:.0f} ms of guard calls per job and "
        f"{inputs.usage.invocation_overhead_seconds * 1000:.0f} ms per invocation are billed on top of the job",
        "DynamoDB items under 1 KB: each of a job's writes costs 1 write unit, none is a transaction",
        f"{inputs.large_payload_share:.0%} of payloads go to S3 (one PUT, one GET per attempt); inline messages of "
        f"{inputs.message_kb:g} KB",
        f"{inputs.failure_share:.0%} of jobs use every one of MaxAttempts ({deployment.max_attempts}) attempts",
        "one HTTP API request per job; no free tiers; us-east-1 first-tier list prices",
        f"{inputs.idle_pollers} Lambda pollers long-poll (20 s) the queue all month: a fixed cost, not per job",
    ]


__all__ = [
    "PRICES",
    "TRANSACTIONAL_USAGE",
    "CostLine",
    "Deployment",
    "NoisyTenantPlan",
    "PerJobUsage",
    "Plan",
    "PlanInput",
    "Price",
    "binomial_quantile",
    "erlang_c_wait",
    "estimate",
    "lognormal_cv",
    "mg1_wait",
]
