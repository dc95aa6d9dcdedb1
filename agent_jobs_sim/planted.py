"""Planted bugs: each puts back, for one run, a mistake of the naive pattern that the product exists to avoid, so the
simulation can show that it finds it (a failing seed) and that the replay of that seed shows the same violation.

A plant either swaps one product function for its naive version for the run, or rewrites the product's requests
where they leave for DynamoDB (`RequestRewrite`), which keeps the rest of the product's code as it is.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType

from agent_jobs.store.conditions import PLACE_UNSET_OR_SAME
from agent_jobs.store.drain import DrainStore
from agent_jobs_sim.faults import RECORD_SENT_SIGNATURE
from job_worker.worker import batch as worker_batch
from job_worker.worker.last_delivery import LastDeliveryParking
from job_worker.worker.running import JobRunning
from job_worker.worker.shares import ShareDeferral

# A request the plant may rewrite: (operation, kwargs) → kwargs, or None to leave it.
RequestRewrite = Callable[[str, dict[str, Any]], dict[str, Any] | None]

_CLAIM_SIGNATURE = "attempt = if_not_exists(attempt, :zero) + :one, leaseOwner = :owner"
_COMPLETE_SIGNATURE = "SET #status = :succeeded"


@dataclass(frozen=True)
class Plant:
    description: str
    # Swaps product code for the run (entered around the whole run).
    patch: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext
    # Rewrites the product's DynamoDB requests for the run.
    rewrite: RequestRewrite | None = None


def _placeholders(request: dict[str, Any]) -> tuple[set[str], set[str]]:
    text = " ".join(
        str(request.get(key, ""))
        for key in ("UpdateExpression", "ConditionExpression", "KeyConditionExpression", "FilterExpression")
    )
    return set(re.findall(r":\w+", text)), set(re.findall(r"#\w+", text))


def _pruned(request: dict[str, Any]) -> dict[str, Any]:
    """Drop the values and names no expression uses any more (DynamoDB refuses unused ones)."""
    values, names = _placeholders(request)
    request = dict(request)
    if "ExpressionAttributeValues" in request:
        request["ExpressionAttributeValues"] = {
            k: v for k, v in request["ExpressionAttributeValues"].items() if k in values
        }
        if not request["ExpressionAttributeValues"]:
            del request["ExpressionAttributeValues"]
    if "ExpressionAttributeNames" in request:
        request["ExpressionAttributeNames"] = {
            k: v for k, v in request["ExpressionAttributeNames"].items() if k in names
        }
        if not request["ExpressionAttributeNames"]:
            del request["ExpressionAttributeNames"]
    return request


def _claim_update(operation: str, request: dict[str, Any]) -> dict[str, Any] | None:
    """The claim's update of the job: a worker's claim (an UpdateItem) or a drain's (a transaction's first item)."""
    if operation == "update_item":
        update = request
    elif operation == "transact_write_items":
        update = request["TransactItems"][0].get("Update")
    else:
        return None
    if update is None or _CLAIM_SIGNATURE not in str(update.get("UpdateExpression", "")):
        return None
    return dict(update)


def _as_sent(operation: str, request: dict[str, Any], update: dict[str, Any], *, alone: bool = False) -> dict[str, Any]:
    """The request `operation` sends with the claim's update replaced by `update` (pruned); `alone` drops the other
    items of a drain's transaction."""
    if operation == "update_item":
        return _pruned(update)
    others = [] if alone else request["TransactItems"][1:]
    return {**request, "TransactItems": [{"Update": _pruned(update)}, *others]}


def _naive_claim_condition(operation: str, request: dict[str, Any]) -> dict[str, Any] | None:
    """(a) The claim succeeds unless the job already SUCCEEDED: a live lease, a DEAD or PARKED job are claimed."""
    update = _claim_update(operation, request)
    if update is None:
        return None
    update["ConditionExpression"] = "attribute_not_exists(pk) OR #status <> :succeeded"
    update["ExpressionAttributeValues"] = {**update["ExpressionAttributeValues"], ":succeeded": {"S": "SUCCEEDED"}}
    return _as_sent(operation, request, update)


def _unfenced_complete(operation: str, request: dict[str, Any]) -> dict[str, Any] | None:
    """(c) SUCCEEDED is written whoever holds the lease now."""
    if operation != "update_item" or not str(request.get("UpdateExpression", "")).startswith(_COMPLETE_SIGNATURE):
        return None
    request = {
        k: v for k, v in request.items() if k not in ("ConditionExpression", "ReturnValuesOnConditionCheckFailure")
    }
    return _pruned(request)


def _moving_place(update: dict[str, Any]) -> dict[str, Any] | None:
    """A send's record (`record_sent`) without its condition on the place: it keeps only `attribute_exists(pk)`."""
    expression = str(update.get("UpdateExpression", ""))
    condition = str(update.get("ConditionExpression", ""))
    if not expression.startswith(RECORD_SENT_SIGNATURE) or f" AND {PLACE_UNSET_OR_SAME}" not in condition:
        return None
    return {**update, "ConditionExpression": condition.replace(f" AND {PLACE_UNSET_OR_SAME}", "")}


def _resend_moves_place(operation: str, request: dict[str, Any]) -> dict[str, Any] | None:
    """(l) The record of a send's answer sets the place whatever place the job has: a resend after the deduplication
    window (a second message) moves the job to the second message's later SequenceNumber, and the producer answers
    that place, though a worker already placed the job by its first message, and may have run it there."""
    if operation == "update_item":
        return _moving_place(request)
    if operation != "transact_write_items":
        return None
    actions = []
    for action in request.get("TransactItems", []):
        moved = _moving_place(action["Update"]) if "Update" in action else None
        actions.append(action if moved is None else {"Update": moved})
    return {**request, "TransactItems": actions} if actions != request.get("TransactItems") else None


@contextlib.contextmanager
def swapped(owner: Any, name: str, replacement: Any) -> Iterator[None]:
    """`owner.name` is `replacement` for the run, and what it was again after."""
    original = getattr(owner, name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)


def _get_then_put() -> contextlib.AbstractContextManager[None]:
    """(b) The claim reads the job and then writes its lease unconditionally: two workers that read before either
    wrote both hold it."""
    from agent_jobs.store.leases import LeaseStore

    claim = LeaseStore.claim

    def naive(self: Any, message: Any, **kwargs: Any) -> Any:
        from agent_jobs.core.outcomes import ClaimOutcome
        from agent_jobs.store.base import message_tenant
        from agent_jobs.store.results import ClaimResult

        job = self.get_job(message_tenant(message), message.job_id) or {}
        if job.get("status") in ("SUCCEEDED", "SKIPPED"):
            return ClaimResult(ClaimOutcome.DUPLICATE, previous=job)
        return claim(self, message, **kwargs)  # its write made unconditional by `_unconditional_claim`

    return swapped(LeaseStore, "claim", naive)


def _unconditional_claim(operation: str, request: dict[str, Any]) -> dict[str, Any] | None:
    update = _claim_update(operation, request)
    if update is None:
        return None
    update.pop("ConditionExpression", None)
    update.pop("ReturnValuesOnConditionCheckFailure", None)
    return _as_sent(operation, request, update, alone=True)


def _lost_claims_as_failures() -> contextlib.AbstractContextManager[None]:
    """(e) A claim whose worker never came back counts against the job's attempts, whoever killed the invocation:
    every lease is taken over as if its job had run alone, and claims are capped at the attempts."""
    from agent_jobs.store.leases import LeaseStore

    claim = LeaseStore.claim

    def counting(self: Any, message: Any, **kwargs: Any) -> Any:
        self._max_claims = self._max_attempts
        return claim(self, message, **{**kwargs, "alone": True})

    return swapped(LeaseStore, "claim", counting)


def _whole_batch_processor() -> contextlib.AbstractContextManager[None]:
    """(d) Every record of a batch is processed, whatever failed before it in its group."""
    return swapped(worker_batch, "SqsFifoPartialProcessor", lambda **_: BatchProcessor(event_type=EventType.SQS))


def _no_last_delivery_parking() -> contextlib.AbstractContextManager[None]:
    """(f) A record near its delivery limit is left to the queue's redrive: dead-lettered, nothing halted."""
    return swapped(
        LastDeliveryParking,
        "_park_last_deliveries",
        lambda self, records, failures, failed_runs: (set(), frozenset()),
    )


@contextlib.contextmanager
def _no_last_delivery_parking_unguarded() -> Iterator[None]:
    """(f) with the predecessor check of (h) taken out too. The product has two defences against a job dead-lettered
    after a worker saw it: parking it near its last delivery, and the check for unsettled jobs ahead of each claimed
    one. Either alone keeps the order, so (f) shows only once (h) is gone too; a seed that fails here and passes with
    (h) alone is a violation that the last-delivery parking prevents."""
    with _no_last_delivery_parking(), _no_predecessor_check():
        yield


def _trusting_drain() -> contextlib.AbstractContextManager[None]:
    """(g) The drain takes the parked index as it is, however far it lags behind the parked count."""
    original = DrainStore.list_parked

    def trusting(self: Any, workspace_id: str, *, after_seq: str | None, expected: int) -> Any:
        return original(self, workspace_id, after_seq=after_seq, expected=0) or []

    return swapped(DrainStore, "list_parked", trusting)


def _no_predecessor_check() -> contextlib.AbstractContextManager[None]:
    """(h) A claimed job runs without looking for jobs accepted ahead of it that left the queue unsettled."""
    return swapped(JobRunning, "_parked_behind_jobs_ahead", lambda self, record, message, claim: False)


def _drain_past_missing_jobs() -> contextlib.AbstractContextManager[None]:
    """A resume's drain runs parked jobs without looking for jobs accepted ahead of them that left the queue unsettled
    (a bug the simulation found; tests/sim/test_world.py keeps a seed that shows it)."""
    from job_worker.worker.drain import Draining

    return swapped(Draining, "_halted_behind_missing_jobs", lambda self, marker, job: False)


def _halting_park_leaves_pending_index(operation: str, request: dict[str, Any]) -> dict[str, Any] | None:
    """A park that halts the workspace (a redrive from the DLQ) takes the job out of the pending index, as every
    other park does: a job behind it claimed a moment before, while the workspace was ACTIVE, finds nothing unsettled
    ahead and runs (a bug the simulation found; tests/sim/test_world.py keeps a seed that shows it)."""
    if operation != "transact_write_items":
        return None
    actions = []
    changed = False
    for action in request.get("TransactItems", []):
        update = action.get("Update")
        expression = str((update or {}).get("UpdateExpression", ""))
        # A halting park removes #ttl (and the running index's attributes) and keeps the job pending.
        removed = expression.partition(" REMOVE ")[2]
        halting = removed.startswith("#ttl") and "pendingWorkspace" not in removed
        if update and "parkedReason = :reason" in expression and halting:
            actions.append({"Update": {**update, "UpdateExpression": expression + ", pendingWorkspace"}})
            changed = True
        else:
            actions.append(action)
    return {**request, "TransactItems": actions} if changed else None


def _deferral_as_failed_attempt() -> contextlib.AbstractContextManager[None]:
    """(k) A record deferred over its tenant's share is handed back as a failed attempt: the worker claims its job and
    records the failure before handing it back, so waiting for a share uses up the job's attempts."""
    defer = worker_batch.BatchWorker._defer_over_share

    def failing(self: Any, record: Any, message: Any) -> None:
        try:
            defer(self, record, message)
        except ShareDeferral as deferral:
            guard = self.services.guard
            claim = guard.claim(
                message,
                message_id=record.message_id,
                sequence_number=record.attributes.sequence_number,
                remaining_ms=60_000,
            )
            if claim.lease is not None:
                guard.fail(claim.lease, str(deferral))
            raise

    return swapped(worker_batch.BatchWorker, "_defer_over_share", failing)


def _held_job_commits(store: Any, head: Any, base: Any, shallow: Any) -> list[tuple[Any, str]]:
    """The job commits a shallow cache holds from `head` down, as `git log` lists them in a shallow clone: through the
    first shallow commit, and no further."""
    from job_worker.jobs.git.commits import job_id_of

    jobs = []
    sha = head
    while sha is not None and sha != base and sha in store:
        commit = store[sha]
        job_id = job_id_of(commit.message)
        if job_id is not None:
            jobs.append((commit.id, job_id))
        if sha in shallow:
            break
        sha = commit.parents[0] if commit.parents else None
    return jobs


def _shallow_as_absent() -> contextlib.AbstractContextManager[None]:
    """(m) A lookup on a shallow cache answers from the history the cache holds, as `git log` does in a shallow
    clone: a job whose commit lies below the shallow tips is absent, and runs again."""
    from job_worker.jobs.git import branch
    from job_worker.jobs.git.trailer_index import ShallowHistoryError

    lookup = getattr(branch, "indexed_job_commits")  # noqa: B009 - the name FetchedBranch calls, swapped below

    def as_held(store: Any, cache: Any, ref: Any, head: Any, base: Any, **kwargs: Any) -> Any:
        try:
            return lookup(store, cache, ref, head, base, **kwargs)
        except ShallowHistoryError:
            return _held_job_commits(store, head, base, kwargs.get("shallow", frozenset()))

    return swapped(branch, "indexed_job_commits", as_held)


def _index_as_far_as_walked() -> contextlib.AbstractContextManager[None]:
    """(o) A walk cut short at the shallow boundary still indexes what it walked (as a `finally` would), at the
    branch's head: the walk after deepening, and every later one, trusts that index and misses what lies below."""
    from job_worker.jobs.git import branch, trailer_index

    lookup = getattr(branch, "indexed_job_commits")  # noqa: B009 - the name FetchedBranch calls, swapped below

    def indexing(store: Any, cache: Any, ref: Any, head: Any, base: Any, **kwargs: Any) -> Any:
        try:
            return lookup(store, cache, ref, head, base, **kwargs)
        except trailer_index.ShallowHistoryError:
            walked = _held_job_commits(store, head, base, kwargs.get("shallow", frozenset()))
            trailer_index._write(cache / trailer_index.INDEX_FILE, ref, base, head, walked)
            raise

    return swapped(branch, "indexed_job_commits", indexing)


def _fetch_only_the_tips() -> contextlib.AbstractContextManager[None]:
    """(n) A warm cache's fetch brings only the new tips, without the commits between them and what the cache holds,
    and records no shallow boundary for them (the simulation's model of the worker's fetch, swapped)."""
    from agent_jobs_sim import git_history

    def tips_only(remote: Any, cache: Any, tips: Any) -> list[Any]:
        return [remote.objects[sha] for sha in tips if not cache.holds(sha)]

    return swapped(git_history, "new_history", tips_only)


PLANTS: dict[str, Plant] = {
    "naive-claim": Plant(
        "(a) claim condition `attribute_not_exists(pk) OR status <> SUCCEEDED`", rewrite=_naive_claim_condition
    ),
    "get-then-put": Plant(
        "(b) claim by GetItem, then an unconditional write", patch=_get_then_put, rewrite=_unconditional_claim
    ),
    "unfenced-complete": Plant("(c) complete without checking the lease", rewrite=_unfenced_complete),
    "lost-claims-as-failures": Plant("(e) lost claims counted as failures", patch=_lost_claims_as_failures),
    "past-failure": Plant("(d) a group processed past its first failure", patch=_whole_batch_processor),
    "no-last-delivery-park": Plant(
        "(f) dead-lettering without parking near the last delivery", patch=_no_last_delivery_parking
    ),
    "no-last-delivery-park-unguarded": Plant(
        "(f) dead-lettering without parking near the last delivery, and no predecessor check either",
        patch=_no_last_delivery_parking_unguarded,
    ),
    "trusting-drain": Plant("(g) a drain that trusts a lagging index", patch=_trusting_drain),
    "no-predecessor-check": Plant(
        "(h) a job runs although an accepted predecessor was dead-lettered unseen", patch=_no_predecessor_check
    ),
    "drain-past-missing": Plant(
        "(i) a drain runs parked jobs past a predecessor dead-lettered while halted", patch=_drain_past_missing_jobs
    ),
    "redriven-unlisted": Plant(
        "(j) a job redriven from the DLQ leaves the pending index when it is parked",
        rewrite=_halting_park_leaves_pending_index,
    ),
    "deferral-as-failure": Plant(
        "(k) a record deferred over its tenant's share counted as a failed attempt", patch=_deferral_as_failed_attempt
    ),
    "resend-moves-place": Plant(
        "(l) the record of a send's answer moves the job's place to the latest send's SequenceNumber",
        rewrite=_resend_moves_place,
    ),
    "shallow-as-absent": Plant(
        "(m) a lookup on a shallow cache answers from the commits it holds instead of deepening",
        patch=_shallow_as_absent,
    ),
    "tips-only-fetch": Plant(
        "(n) a warm cache's fetch brings only the new tips, not the commits below them", patch=_fetch_only_the_tips
    ),
    "partial-index": Plant(
        "(o) a walk cut short at the shallow boundary writes the trailer index of what it walked",
        patch=_index_as_far_as_walked,
    ),
}
