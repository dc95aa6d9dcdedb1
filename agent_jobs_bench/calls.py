"""Calls and capacity per job: Agent Jobs against the naive pattern, in the same run, on the same table and queue.

Both run on the template's resources in the local emulator (moto's server, every call over HTTP). Agent Jobs is the
real producer (`enqueue_job`) and the real worker (`BatchWorker`, in this process, on a local folder workspace as
the integration tests run it); the naive pattern is `agent_jobs_bench.naive`. Calls are counted with botocore event
hooks on the clients the product and the baseline use (see `capacity.CallRecorder`); Lambda's event source (receive,
delete) is played with a separate client and is not counted: it is the same for both.

Three paths, each over `jobs` jobs of one workspace (happy path) or one workspace per job (retry):
- happy path: enqueue, one delivery, the job takes effect;
- duplicate delivery: the same records delivered again after they took effect (SQS's at-least-once delivery);
- retry: the job's side effect fails once, the next delivery succeeds. Agent Jobs shortens the failed record's
  visibility itself (one ChangeMessageVisibilityBatch); the naive worker leaves it to the queue's visibility timeout,
  which the benchmark skips by making the message visible again through the uncounted event-source client.
"""

from __future__ import annotations

from typing import Any

from agent_jobs_bench.calls_measure import (
    PRODUCT_HAPPY_STEPS,
    PRODUCT_RETRY_STEPS,
    PathCounts,
    Sides,
    both_sides,
    measure,
)
from agent_jobs_bench.figures import Comparison, Figure, Goal

__all__ = ["BENCHMARK", "COMMAND", "Sides", "figures", "measure", "run"]

BENCHMARK = "Calls and capacity per job"
COMMAND = ".venv/bin/python -m agent_jobs_bench --only calls"
CAPACITY_SOURCE = "Source: computed from DynamoDB's documented capacity rules (see the first WCU figure)"


# ---- figures -----------------------------------------------------------------------------------------------------

CALLS_GOAL = Goal(2, Comparison.AT_MOST, "<= 2 DynamoDB calls per job")
WCU_GOAL = Goal(2, Comparison.AT_MOST, "<= 2 WCU per job in the worker (items under 1 KB)")
END_TO_END_WCU_GOAL = Goal(3, Comparison.AT_MOST, "<= 3 WCU per job, enqueue + worker (items under 1 KB)")
DUPLICATE_GOAL = Goal(1, Comparison.AT_MOST, "duplicates <= 1 call")
DUPLICATE_UNITS_GOAL = Goal(1, Comparison.AT_MOST, "duplicates <= 1 write-or-read unit")


def _moto_answers(reported: dict[str, list[float | None]]) -> str:
    def shown(values: list[float | None]) -> str:
        return " or ".join("nothing" if v is None else f"{v:g}" for v in values)

    return "; ".join(f"{op} {shown(values)}" for op, values in reported.items())


def figures(sides: Sides) -> list[Figure]:
    product, naive = sides.product, sides.naive
    source = (
        "Source: computed from DynamoDB's documented rules (1 WCU per 1 KB of the larger of the item before and after"
        " a write, at least 1; every action of a TransactWriteItems twice, ConditionCheck included; 1 RCU per 4 KB"
        " read, half when eventually consistent) on the item sizes DynamoDB's formula gives (attribute names +"
        " values), the items read before and after each call. Not moto's ConsumedCapacity (asked for with"
        " ReturnConsumedCapacity=TOTAL on every call): its server answered, per successful call, "
        f"{_moto_answers(sides.moto_reported)}; it answers the same for a 3 KB item and for a strongly consistent"
        " read, nothing for a transaction and less than 1 for a write (tests/bench checks this): not DynamoDB's"
        " accounting"
    )

    def figure(name: str, value: float, baseline: float | None, unit: str, **kw: Any) -> Figure:
        return Figure(BENCHMARK, name, value, unit, COMMAND, baseline=baseline, **kw)

    def split(counts: PathCounts, kind: str) -> str:
        method = {"calls": counts.dynamodb_calls, "wcu": counts.wcu}[kind]
        return f"producer {method('producer'):g} + worker {method('worker'):g}"

    happy, naive_happy = product.happy, naive.happy
    out = [
        figure(
            "DynamoDB calls per job, happy path (worker)",
            happy.dynamodb_calls("worker"),
            naive_happy.dynamodb_calls("worker"),
            "calls",
            goal=CALLS_GOAL,
            note=(
                f"Agent Jobs: {happy.operations('worker')}; naive: {naive_happy.operations('worker')}. Not met: after"
                " the claim (a plain conditional UpdateItem), one strongly consistent GetItem of the workspace (is it"
                " HALTED or RESUMING? then the job is parked) and one Query of the pending index (usually an empty"
                " range) checks that no job the workspace accepted ahead of this one left the queue unsettled"
                " (dead-lettered), which would otherwise let this one take effect out of order. Both are reads: the"
                " writes are the claim and the completion. With a tenant share (WorkerTenantShare), each invocation"
                " also counts the tenant's invocations once per tenant of its batch (one Query of the running index,"
                " a fraction per job) and reads the tenant's own share once a minute per execution environment; the"
                " running index's own entries (one written with the claim, one removed with the completion) are"
                " index writes, not counted here, as for the pending index"
            ),
        ),
        figure(
            "DynamoDB calls per job, happy path (enqueue + worker)",
            happy.dynamodb_calls(),
            naive_happy.dynamodb_calls(),
            "calls",
            goal=CALLS_GOAL,
            note=(
                f"Agent Jobs {split(happy, 'calls')} (enqueue: {happy.operations('producer')});"
                f" naive {split(naive_happy, 'calls')} (enqueue: {naive_happy.operations('producer')})."
                " Not met: enqueue records the job QUEUED before sending"
                " (a conditional write, so a resubmission with another payload is refused) and then stores the"
                " message id and SequenceNumber SQS answered (a second write); it reads the workspace's registration"
                " once per workspace and process (its owner never changes, so it is kept), the fraction here"
            ),
        ),
        figure(
            "WCU per job, happy path (worker)",
            happy.wcu("worker"),
            naive_happy.wcu("worker"),
            "WCU",
            goal=WCU_GOAL,
            note=(
                "The claim is one conditional UpdateItem (1 WCU) and the completion another (1 WCU). The halt check is"
                " a strongly consistent read of the workspace after the claim (1 RCU), not a ConditionCheck in a"
                " transaction, which charges every action twice: 2 + 2 WCU for the claim alone before."
                f" {source}"
            ),
        ),
        figure(
            "WCU per job, happy path (enqueue + worker)",
            happy.wcu(),
            naive_happy.wcu(),
            "WCU",
            goal=END_TO_END_WCU_GOAL,
            note=(
                f"Agent Jobs {split(happy, 'wcu')}, naive {split(naive_happy, 'wcu')}. Not met by 1: enqueue writes"
                " the QUEUED record (1 WCU: a plain conditional put; the workspace's owner is a kept read, no longer"
                " a ConditionCheck in a transaction, which cost 4) and then the SequenceNumber SQS answered (1 WCU)."
                " That second write puts the job in the pending index before any worker sees it, so that a job the"
                " queue dead-letters before any claim still stops the jobs behind it; the claim cannot write it for"
                f" a message no worker reached. {CAPACITY_SOURCE}; moto's ConsumedCapacity summed to"
                f" {happy.reported():g}/job"
            ),
        ),
        figure(
            "RCU per job, happy path (enqueue + worker)",
            happy.rcu(),
            naive_happy.rcu(),
            "RCU",
            note=(
                "Agent Jobs reads the workspace once per job after its claim (a strongly consistent GetItem: 1 read"
                " unit) and the pending index (a Query, eventually consistent: half a read unit for its empty range);"
                " enqueue reads a workspace's registration once per process (1 read unit over this run's jobs);"
                " the naive pattern reads (eventually consistent) before it writes, in the producer and in the worker."
                f" {CAPACITY_SOURCE}"
            ),
        ),
        figure(
            "SQS calls per job, happy path (enqueue + worker)",
            happy.sqs_calls(),
            naive_happy.sqs_calls(),
            "calls",
            note="SendMessage; receive and delete are Lambda's event source's (the same for both, not counted)",
        ),
        figure(
            "DynamoDB calls per job, duplicate delivery",
            product.duplicate.dynamodb_calls("worker"),
            naive.duplicate.dynamodb_calls("worker"),
            "calls",
            goal=DUPLICATE_GOAL,
            note=(
                f"Agent Jobs: {product.duplicate.operations('worker')} (the failed claim returns the old item: no"
                f" read); naive: {naive.duplicate.operations('worker')}. Not met with a tenant share: the share is"
                " checked before the claim (a deferral must write nothing), so a batch of duplicates pays one Query per"
                " tenant too; without a share (WorkerTenantShare 0) the claim alone: 1 call"
            ),
        ),
        figure(
            "WCU + RCU per job, duplicate delivery",
            product.duplicate.wcu("worker") + product.duplicate.rcu("worker"),
            naive.duplicate.wcu("worker") + naive.duplicate.rcu("worker"),
            "capacity units",
            goal=DUPLICATE_UNITS_GOAL,
            note=(
                "Agent Jobs pays one failed conditional UpdateItem (DynamoDB charges a failed conditional write like"
                " a write: 1 WCU for an item under 1 KB) and reads nothing: the failed claim returns the old item"
                " (ReturnValuesOnConditionCheckFailure); with a tenant share, half a read unit per tenant of the batch"
                " for the share check (the fraction over 1). Naive pays an eventually consistent GetItem (half a read"
                f" unit). {CAPACITY_SOURCE}"
            ),
        ),
        figure(
            "SQS calls per job, duplicate delivery",
            product.duplicate.sqs_calls("worker"),
            naive.duplicate.sqs_calls("worker"),
            "calls",
        ),
        figure(
            "DynamoDB calls per job, retry (fails once, then succeeds)",
            product.retry.dynamodb_calls(),
            naive.retry.dynamodb_calls(),
            "calls",
            note=(
                f"Agent Jobs: {product.retry.operations()}; naive: {naive.retry.operations()} (the naive worker"
                " records no failure: its job stays IN_FLIGHT until the next delivery). Enqueue included"
            ),
        ),
        figure(
            "WCU per job, retry (fails once, then succeeds)",
            product.retry.wcu(),
            naive.retry.wcu(),
            "WCU",
            note=CAPACITY_SOURCE,
        ),
        figure(
            "SQS calls per job, retry (fails once, then succeeds)",
            product.retry.sqs_calls(),
            naive.retry.sqs_calls(),
            "calls",
            note=(
                f"Agent Jobs: {product.retry.operations(service='sqs')};"
                f" naive: {naive.retry.operations(service='sqs')}."
                " Agent Jobs shortens the failed record's visibility (one ChangeMessageVisibilityBatch per batch with"
                " a failure) so the retry comes after its backoff; the naive worker waits out the queue's visibility"
                " timeout"
            ),
        ),
    ]
    for step in (*PRODUCT_HAPPY_STEPS, *PRODUCT_RETRY_STEPS[3:]):
        note = "DynamoDB's formula (attribute names + values), the item read after the write"
        if step == PRODUCT_HAPPY_STEPS[0]:
            note += (
                "; Agent Jobs appends a history entry at every status change (a failure's entry keeps up to 500"
                " characters of its error, and the item its `error`), so the item grows with each attempt: past 1 KB"
                " every write of it costs 2 WCU, 4 in a transaction"
            )
        out.append(
            figure(f"Job item size, {step}", product.item_sizes[step], naive.item_sizes.get(step), "bytes", note=note)
        )
    return out


def run(quick: bool = False) -> list[Figure]:
    jobs = 2 if quick else 10
    with both_sides(jobs) as measured:
        return figures(measured)
