"""Faults: what each seed's plan injects, where, and the count of each kind.

Every simulated AWS call and git remote call goes through `FaultyClient` (or `RemoteCallFaults`): it is a yield
point (the scheduler may run others or kill the caller's process there), and the plan may throttle it, fail it with a
5xx before it takes effect, or let it take effect and lose its answer (botocore's read timeout after its retries).
The scheduler asks `FaultPlan.choose_kill` before each step: a crash between any two calls. Stalls move the clock (a
long GC pause, a slow network) so leases and visibility timeouts expire under a running job.
"""

from __future__ import annotations

import collections
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError, ReadTimeoutError

from agent_jobs_sim.remote import RemoteFaults, RemoteUnavailableError
from agent_jobs_sim.scheduler import Actor, Scheduler

THROTTLE_CODES = {"dynamodb": "ProvisionedThroughputExceededException", "sqs": "RequestThrottled"}
SERVER_ERROR_CODES = {"dynamodb": "InternalServerError", "sqs": "InternalError"}


@dataclass
class FaultPlan:
    """Per-step and per-call probabilities of each fault, drawn from the seed: calm seeds and stormy ones. No fault is
    injected once the clock passes `quiet_after` (the liveness phase)."""

    crash: float = 0.0
    throttle: float = 0.0
    server_error: float = 0.0
    lost_answer: float = 0.0
    stall: float = 0.0
    stall_seconds: float = 0.0
    early_visibility: float = 0.0
    lost_delete: float = 0.0
    duplicate_send: float = 0.0
    poison: float = 0.0
    bad_patch: float = 0.0
    killer: float = 0.0
    # A window of virtual time in which most DynamoDB calls fail (a regional incident), and how many fail.
    outage_start: float = 0.0
    outage_end: float = 0.0
    outage_rate: float = 0.0
    index_lag_seconds: float = 0.0
    # A window in which every invocation fails before the worker's handler runs (a deployment whose code cannot start):
    # long enough for the queue to dead-letter what it keeps handing out, unseen by the worker.
    failing_start: float = 0.0
    failing_end: float = 0.0
    # How far an execution environment's clock may be off the world's, either way (seconds).
    clock_skew: float = 0.0
    # The share of job runs that take a good part of an invocation's time (up to 90% of its timeout).
    slow_jobs: float = 0.0
    # A queue whose visibility timeout is shorter than the worker's timeout (a stack deployed with the two out of
    # step): every message received comes back after this many seconds, while a long job may still run it. 0: none.
    short_visibility: float = 0.0
    # The share of the writes confirming a send (`JobGuard.record_sent`: the message went out) that fail, before
    # taking effect or with their answer lost: the client is answered 503 for a job the queue holds, or may hold.
    unconfirmed_send: float = 0.0
    # The share of failed submissions after which the agent moves on to its next job, and submits the failed one
    # again later (soon, within the queue's deduplication window; late, after it) or never.
    careless: float = 0.0
    # Other writers of the git remote (a bot answering pushes with commits of its own, people merging into the base
    # branch): the share of job commits another writer answers, a few seconds later, with commits of its own. A job
    # retried after its commit then finds other commits above its own.
    other_writers: float = 0.0
    # The share of job runs that find their worker's git cache of the workspace lost (evicted over the worker's cache
    # budget, or a new execution environment's empty /tmp): the job fetches the tips alone, shallow, as a cold cache
    # does.
    cache_loss: float = 0.0
    # The share of job commits whose push takes effect and loses its answer (a flaky network), beside `lost_answer`.
    lost_push: float = 0.0
    # Whether a fetch that deepens a shallow cache within a use is a yield point of its own, which may fail: the branch
    # may move between a use's first fetch and its deepening. Off, a use of the cache is one step, as the simulation
    # ran it before the caches (the seeds without the git faults keep their schedules).
    interleaved_deepening: bool = False
    quiet_after: float = float("inf")

    @classmethod
    def draw(cls, rng: random.Random, *, start: float, quiet_after: float) -> FaultPlan:
        def some(limit: float) -> float:
            return rng.choice((0.0, limit / 4, limit / 2, limit))

        outage_start = start + rng.uniform(0.0, 600.0)
        outage = rng.random() < 0.25
        outage_end = outage_start + rng.uniform(300.0, 1500.0) if outage else outage_start
        return cls(
            crash=some(0.02),
            throttle=some(0.03),
            server_error=some(0.03),
            lost_answer=some(0.03),
            stall=some(0.01),
            stall_seconds=rng.choice((30.0, 150.0, 900.0)),
            early_visibility=some(0.01),
            lost_delete=some(0.1),
            duplicate_send=some(0.1),
            poison=some(0.05),
            bad_patch=some(0.05),
            killer=some(0.04),
            outage_start=outage_start,
            outage_end=outage_end,
            outage_rate=rng.choice((0.7, 0.9, 1.0)) if outage else 0.0,
            index_lag_seconds=rng.choice((0.0, 0.5, 5.0, 60.0)),
            quiet_after=max(quiet_after, outage_end),
        )

    @classmethod
    def calm(cls) -> FaultPlan:
        return cls()

    def draw_clock_faults(self, rng: random.Random) -> None:
        """Environments' clocks off by up to a second, or ten, in some seeds; and how often a message becomes visible
        again while its invocation still runs (`early_visibility`, drawn with the other faults) keeps its draw."""
        self.clock_skew = rng.choice((0.0, 0.0, 1.0, 10.0))
        self.slow_jobs = rng.choice((0.0, 0.1, 0.3))

    def draw_short_visibility(self, rng: random.Random, *, timeout_seconds: float) -> None:
        """In one seed of ten, the queue's visibility timeout is a quarter to nine tenths of the worker's timeout."""
        if rng.random() < 0.1:
            self.short_visibility = rng.uniform(0.25, 0.9) * timeout_seconds

    def draw_careless_agents(self, rng: random.Random) -> None:
        """In one seed of three, sends whose confirmation fails (a twentieth to a fifth of them) and agents that, after
        a failed submission, move on to their next job (half the time, or always)."""
        if rng.random() >= 1 / 3:
            return
        self.unconfirmed_send = rng.choice((0.05, 0.1, 0.2))
        self.careless = rng.choice((0.5, 1.0))

    def draw_git_faults(self, rng: random.Random) -> None:
        """In one seed of two, other writers push to the remote, caches are lost, pushes lose their answers, and a
        cache's deepening is a step of its own."""
        if rng.random() >= 0.5:
            return
        self.other_writers = rng.choice((0.2, 0.5, 1.0))
        self.cache_loss = rng.choice((0.2, 0.4, 0.7))
        self.lost_push = rng.choice((0.05, 0.1, 0.2))
        self.interleaved_deepening = True

    def draw_failing_deployment(self, rng: random.Random, *, start: float, dead_letter_seconds: float) -> None:
        """In one seed of ten, a failing deployment from a moment in the first ten minutes, for a little longer than the
        queue takes to dead-letter a message (maxReceiveCount visibility timeouts). Faults go on until it ends."""
        if rng.random() >= 0.1:
            return
        self.failing_start = start + rng.uniform(0.0, 600.0)
        self.failing_end = self.failing_start + rng.uniform(1.0, 1.3) * dead_letter_seconds
        self.quiet_after = max(self.quiet_after, self.failing_end)


class FaultLog:
    """The faults injected, by kind, and the decisions taken from the seed."""

    def __init__(
        self,
        plan: FaultPlan,
        rng: random.Random,
        scheduler: Scheduler,
        *,
        incident_rng: random.Random | None = None,
        careless_rng: random.Random | None = None,
        git_rng: random.Random | None = None,
    ) -> None:
        self.plan = plan
        self.rng = rng
        self.scheduler = scheduler
        self.counts: collections.Counter[str] = collections.Counter()
        # Faults added later draw from their own stream, so that adding them left the others' draws alone.
        self.incident_rng = incident_rng or random.Random(0)
        # Processes the plan may kill (environments and agents; never the platform's own pollers).
        self.mortal: Callable[[Actor], bool] = lambda actor: False
        # The careless agents' faults and choices draw from their own stream: a seed without them draws as before.
        self.careless_rng = careless_rng or random.Random(0)
        # So do the git remote's (other writers, lost caches, lost pushes, failed deepening).
        self.git_rng = git_rng or random.Random(0)

    @property
    def active(self) -> bool:
        return self.scheduler.now < self.plan.quiet_after

    def happens(self, kind: str, probability: float) -> bool:
        if probability <= 0.0 or not self.active or self.rng.random() >= probability:
            return False
        self.counts[kind] += 1
        return True

    def git_happens(self, kind: str, probability: float) -> bool:
        """`happens`, drawn from the git remote's own stream."""
        if probability <= 0.0 or not self.active or self.git_rng.random() >= probability:
            return False
        self.counts[kind] += 1
        return True

    def outage(self, service: str) -> bool:
        plan = self.plan
        if service != "dynamodb" or not plan.outage_start <= self.scheduler.now < plan.outage_end:
            return False
        return self.happens("outage", plan.outage_rate)

    def visible_early(self) -> float | None:
        """Seconds after which a message just received becomes visible again, while its invocation may still run (a
        visibility timeout shorter than the invocation's), or None. Drawn from its own stream."""
        if self.plan.early_visibility <= 0.0 or not self.active:
            return None
        if self.incident_rng.random() >= self.plan.early_visibility:
            return None
        self.counts["early_visibility"] += 1
        return self.incident_rng.uniform(1.0, 120.0)

    def visibility_cut_short(self) -> float | None:
        """Seconds after which a message just received becomes visible again in a seed whose queue's visibility
        timeout is shorter than the worker's timeout, or None."""
        if self.plan.short_visibility <= 0.0 or not self.active:
            return None
        self.counts["short_visibility"] += 1
        return self.plan.short_visibility

    def slow_job(self, timeout_seconds: float) -> float:
        """How long a job run takes before it does anything (0.0 for most runs). Drawn from its own stream."""
        if self.plan.slow_jobs <= 0.0 or not self.active or self.incident_rng.random() >= self.plan.slow_jobs:
            return 0.0
        self.counts["slow_job"] += 1
        return self.incident_rng.uniform(0.1, 1.0) * timeout_seconds

    def failing_invocation(self) -> bool:
        plan = self.plan
        if not plan.failing_start <= self.scheduler.now < plan.failing_end:
            return False
        self.counts["failing_invocation"] += 1
        return True

    def unconfirmed(self, operation: str, request: dict[str, Any]) -> str | None:
        """Whether this write confirming a send fails: "before" it takes effect (throttled), "after" it (its answer
        lost), or None (it goes through, or it is another call)."""
        if self.plan.unconfirmed_send <= 0.0 or not self.active or not confirms_send(operation, request):
            return None
        if self.careless_rng.random() >= self.plan.unconfirmed_send:
            return None
        self.counts["unconfirmed_send"] += 1
        return self.careless_rng.choice(("before", "after"))

    def put_off(self) -> str | None:
        """What a careless agent does with a job whose submission failed: "soon" (again within the deduplication
        window), "late" (after it), "never" (it gives the job up), or None (it submits it again at once)."""
        if self.plan.careless <= 0.0 or self.careless_rng.random() >= self.plan.careless:
            return None
        choice = self.careless_rng.choices(("soon", "late", "never"), weights=(4, 4, 2))[0]
        self.counts[f"careless_{choice}"] += 1
        return choice

    def choose_kill(self, actor: Actor) -> str | None:
        if self.mortal(actor) and self.happens("crash", self.plan.crash):
            return "crash"
        if self.happens("stall", self.plan.stall):
            self.scheduler.now += self.rng.uniform(0.5, 1.0) * self.plan.stall_seconds
        return None

    def index_lag(self, table: str, index: str) -> float:
        if self.plan.index_lag_seconds <= 0.0 or not self.active:
            return 0.0
        lag = self.rng.uniform(0.0, self.plan.index_lag_seconds)
        if lag > self.plan.index_lag_seconds / 2:
            self.counts["index_lag"] += 1
        return lag


def _operation(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _client_error(code: str, operation: str, status: int) -> ClientError:
    response: Any = {
        "Error": {"Code": code, "Message": f"simulated {code}"},
        "ResponseMetadata": {"HTTPStatusCode": status, "RequestId": "sim"},
    }
    return ClientError(response, operation)


# The write that records the queue's answer to a job's send (`JobGuard.record_sent`, alone or in a transaction).
RECORD_SENT_SIGNATURE = "SET messageId = :mid, sentAt = :now"


def confirms_send(operation: str, request: dict[str, Any]) -> bool:
    """Whether a DynamoDB request records the answer to a send (`record_sent`, `record_sent_batch`)."""
    if operation == "update_item":
        updates = [request]
    elif operation == "transact_write_items":
        updates = [action["Update"] for action in request.get("TransactItems", []) if "Update" in action]
    else:
        return False
    return any(str(update.get("UpdateExpression", "")).startswith(RECORD_SENT_SIGNATURE) for update in updates)


_READS = re.compile(r"^(get_|batch_get_|query$|scan$|describe_|receive_message$|list_)")


class FaultyClient:
    """A simulated AWS client as the product sees it: each call is a yield point and may fail as the plan says."""

    def __init__(
        self,
        target: Any,
        service: str,
        faults: FaultLog,
        *,
        calls: collections.Counter[str],
        after: Callable[[str], None] = lambda name: None,
    ) -> None:
        self._after = after
        self._target = target
        self._service = service
        self._faults = faults
        self._calls = calls

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._target, name)
        if name.startswith("_") or not callable(method) or name in ("get_waiter", "get_paginator"):
            return method
        service, faults, calls, after = self._service, self._faults, self._calls, self._after
        operation = _operation(name)
        read = bool(_READS.match(name))
        plan = faults.plan

        def call(**kwargs: Any) -> Any:
            faults.scheduler.pause()
            calls[f"{service}.{name}"] += 1
            if faults.happens("throttle", plan.throttle) or faults.outage(service):
                raise _client_error(THROTTLE_CODES[service], operation, 400)
            if faults.happens("server_error", plan.server_error):
                raise _client_error(SERVER_ERROR_CODES[service], operation, 500)
            unconfirmed = faults.unconfirmed(name, kwargs) if service == "dynamodb" else None
            if unconfirmed == "before":
                raise _client_error(THROTTLE_CODES[service], operation, 400)
            answer = method(**kwargs)
            after(name)
            if unconfirmed == "after" or (not read and faults.happens("lost_answer", plan.lost_answer)):
                raise ReadTimeoutError(endpoint_url=f"https://{service}.sim")
            return answer

        self.__dict__[name] = call  # built once per method: the next lookups never reach __getattr__
        return call


class RemoteCallFaults(RemoteFaults):
    """The git remote's calls: yield points that may fail before or after taking effect."""

    def __init__(self, faults: FaultLog) -> None:
        self._faults = faults

    def before(self, name: str) -> None:
        self._faults.scheduler.pause()
        if self._faults.happens("remote_error", self._faults.plan.server_error):
            raise RemoteUnavailableError(f"simulated: the remote failed {name}")

    def after(self, name: str) -> None:
        if name != "commit":
            return
        faults = self._faults
        if faults.happens("remote_lost_answer", faults.plan.lost_answer) or faults.git_happens(
            "lost_push", faults.plan.lost_push
        ):
            raise RemoteUnavailableError("simulated: the push took effect, its answer was lost")

    def deepen(self) -> None:
        faults = self._faults
        if not faults.plan.interleaved_deepening:
            return
        faults.scheduler.pause()
        if faults.git_happens("deepen_error", faults.plan.server_error):
            raise RemoteUnavailableError("simulated: the remote failed a deepening fetch")

    def cache_lost(self) -> bool:
        return self._faults.git_happens("cache_lost", self._faults.plan.cache_loss)
