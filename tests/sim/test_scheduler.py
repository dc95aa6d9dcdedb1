"""The seeded scheduler: the seed alone orders the actors' steps; a killed process's actors run nothing after their
yield point, and refuse the calls their cleanup tries; group threads are actors of their invocation's process."""

from __future__ import annotations

import functools
import random

import pytest

from agent_jobs_sim.scheduler import Crash, Process, Scheduler, SimulationError
from agent_jobs_sim.threads import SimExecutor


def _interleaving(seed: int) -> list[str]:
    scheduler = Scheduler(random.Random(seed), start=0.0)
    steps: list[str] = []

    def actor(name: str) -> None:
        for index in range(5):
            steps.append(f"{name}{index}")
            scheduler.pause()

    for name in "abc":
        scheduler.spawn(name, functools.partial(actor, name), Process(name))
    assert scheduler.run(finished=lambda: True, until=10.0, max_steps=1_000)
    return steps


def test_the_seed_alone_orders_the_steps():
    assert _interleaving(1) == _interleaving(1)
    assert len({tuple(_interleaving(seed)) for seed in range(10)}) > 1
    # Each actor's own steps stay in its order.
    steps = _interleaving(3)
    assert [s for s in steps if s.startswith("a")] == [f"a{i}" for i in range(5)]


def test_a_killed_process_runs_nothing_after_its_yield_point_and_its_cleanup_calls_fail():
    scheduler = Scheduler(random.Random(0), start=0.0)
    process = Process("env")
    seen: list[str] = []

    def worker() -> None:
        try:
            seen.append("before")
            scheduler.pause()
            seen.append("after")  # never: the process died at the pause
        finally:
            try:
                scheduler.pause()  # a call its cleanup tries
                seen.append("cleanup call answered")
            except Crash:
                seen.append("cleanup call refused")

    actor = scheduler.spawn("worker", worker, process)
    scheduler.choose_kill = lambda chosen: "crash" if chosen is actor and seen == ["before"] else None
    assert scheduler.run(finished=lambda: True, until=10.0, max_steps=100)
    assert seen == ["before", "cleanup call refused"]
    assert process.dead
    assert actor.done


def test_a_process_dies_at_its_deadline():
    scheduler = Scheduler(random.Random(0), start=0.0)
    process = Process("env", deadline=5.0)
    seen: list[float] = []

    def slow() -> None:
        while True:
            seen.append(scheduler.now)
            scheduler.sleep(2.0)

    actor = scheduler.spawn("slow", slow, process)
    assert scheduler.run(finished=lambda: actor.done, until=60.0, max_steps=100)
    assert process.dead
    assert process.cause == "timeout"
    assert max(seen) < 5.0


def test_a_stall_that_carries_the_clock_past_the_deadline_kills_the_process_before_its_next_step():
    scheduler = Scheduler(random.Random(0), start=0.0)
    process = Process("env", deadline=5.0)
    seen: list[float] = []

    def worker() -> None:
        while True:
            seen.append(scheduler.now)
            scheduler.pause()

    def stall(actor: object) -> str | None:
        if len(seen) == 2:  # a long pause just before the third step
            scheduler.now = 30.0
        return None

    scheduler.spawn("worker", worker, process)
    scheduler.choose_kill = stall
    assert scheduler.run(finished=lambda: True, until=60.0, max_steps=100)
    assert process.dead
    assert process.cause == "timeout"
    assert len(seen) == 2  # the step after the stall never ran
    assert max(seen) < 5.0


def test_group_threads_die_with_their_invocation():
    scheduler = Scheduler(random.Random(2), start=0.0)
    SimExecutor.scheduler = scheduler
    process = Process("env")
    finished: list[str] = []

    def group(name: str) -> str:
        if name == "killer":
            scheduler.kill_current("out of memory")
        scheduler.pause()
        finished.append(name)
        return name

    def invocation() -> None:
        with SimExecutor(max_workers=3) as pool:
            futures = [pool.submit(group, name) for name in ("a", "killer", "b")]
            for future in futures:
                future.result()
        finished.append("invocation")

    try:
        scheduler.spawn("invocation", invocation, process)
        assert scheduler.run(finished=lambda: True, until=10.0, max_steps=100)
    finally:
        SimExecutor.scheduler = None
    assert process.dead
    assert "invocation" not in finished
    assert all(actor.done for actor in scheduler.actors)


def test_an_actor_that_raises_breaks_the_world_loudly():
    scheduler = Scheduler(random.Random(0), start=0.0)

    def broken() -> None:
        raise ValueError("a bug in the world")

    scheduler.spawn("broken", broken, Process("p"))
    with pytest.raises(SimulationError, match="a bug in the world"):
        scheduler.run(finished=lambda: True, until=10.0, max_steps=10)


def test_closing_unwinds_every_suspended_actor_so_nothing_keeps_the_world_alive():
    scheduler = Scheduler(random.Random(0), start=0.0)
    unwound: list[str] = []

    def forever(name: str) -> None:
        try:
            while True:
                scheduler.sleep(60.0)
        finally:
            unwound.append(name)

    actors = [scheduler.spawn(name, functools.partial(forever, name), Process(name)) for name in ("poller", "operator")]
    never_started = scheduler.spawn("late", functools.partial(forever, "late"), Process("late"), delay=1e9)
    assert not scheduler.run(finished=lambda: False, until=300.0, max_steps=1_000)
    assert all(actor.coroutine is not None and not actor.coroutine.dead for actor in actors)  # suspended

    scheduler.close()

    assert sorted(unwound) == ["operator", "poller"]
    assert all(actor.done and actor.coroutine is not None and actor.coroutine.dead for actor in actors)
    assert never_started.done
    assert scheduler.actors == []
