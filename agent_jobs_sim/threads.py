"""The worker's group threads, as actors: the worker runs a batch's message groups on a `ThreadPoolExecutor`; in the
simulation each submitted group runs as an actor of the invocation's own process, so the scheduler (not the OS)
interleaves the groups, and a crash of the invocation takes all of them. A lock the groups hold across a call (a yield
point) is a `SimLock`: a `threading.Lock` would block the one OS thread every actor runs on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent_jobs_sim.scheduler import Actor, Scheduler


class SimFuture:
    def __init__(self, scheduler: Scheduler, actor: Actor, outcome: dict[str, Any]) -> None:
        self._scheduler = scheduler
        self._actor = actor
        self._outcome = outcome

    def result(self) -> Any:
        self._scheduler.join(self._actor)
        if "error" in self._outcome:
            raise self._outcome["error"]
        return self._outcome.get("value")


class SimExecutor:
    """`concurrent.futures.ThreadPoolExecutor`'s surface the worker uses; every task is an actor at once (the pool's
    bound only limits how many run at a time, which the scheduler's interleaving already covers)."""

    scheduler: Scheduler | None = None  # the running world's (set by the world)

    def __init__(self, max_workers: int | None = None, thread_name_prefix: str = "") -> None:
        self._prefix = thread_name_prefix or "thread"
        self._futures: list[SimFuture] = []

    def submit(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> SimFuture:
        scheduler = SimExecutor.scheduler
        assert scheduler is not None, "the world sets the scheduler"
        assert scheduler.current is not None, "tasks are submitted by an actor"
        outcome: dict[str, Any] = {}

        def task() -> None:
            try:
                outcome["value"] = function(*args, **kwargs)
            except Exception as error:  # the future carries it, as a thread pool's does
                outcome["error"] = error

        parent = scheduler.current
        actor = scheduler.spawn(f"{parent.name}/{self._prefix}-{len(self._futures)}", task, parent.process)
        future = SimFuture(scheduler, actor, outcome)
        self._futures.append(future)
        return future

    def __enter__(self) -> SimExecutor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        scheduler = SimExecutor.scheduler
        assert scheduler is not None
        for future in self._futures:
            scheduler.join(future._actor)


class SimLock:
    """`threading.Lock`'s surface for the group actors of one invocation: a group that finds it held waits (a little
    virtual time at a go, so the holder's calls and timers go on) instead of blocking the OS thread."""

    WAIT_SECONDS = 0.01

    def __init__(self) -> None:
        self._held = False

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        scheduler = SimExecutor.scheduler
        while self._held:
            if not blocking or scheduler is None:
                return False
            scheduler.sleep(self.WAIT_SECONDS)
        self._held = True
        return True

    def release(self) -> None:
        self._held = False

    def locked(self) -> bool:
        return self._held

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()
