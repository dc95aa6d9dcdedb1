"""The seeded scheduler: actors are greenlets, only one runs at a time, and the seed alone chooses which one runs
next, when the virtual clock moves, and which process dies.

An actor runs real product code until that code reaches a yield point (`Scheduler.pause`: every simulated AWS call
and every git remote call makes one), then hands control back to the scheduler. Nothing else switches: no OS thread,
no wall clock, no unseeded randomness. A process (an execution environment, an agent's process) is killed by
throwing `Crash` into each of its actors at its yield point: code after that point never runs, and any call its
`finally` blocks try is refused, as a killed process makes none.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from greenlet import greenlet


class Crash(BaseException):
    """The actor's process died at this point (killed, out of memory, timed out). A BaseException, so the product's
    `except Exception` handlers never catch it: a dead process handles nothing."""


class SimulationError(Exception):
    """The simulated world itself went wrong (not the product): an actor raised where it never should."""


@dataclass(eq=False)
class Process:
    """What dies together: an execution environment with its invocation's threads, or an agent's process."""

    name: str
    # Virtual time at which the platform kills it (an invocation's timeout); None: never.
    deadline: float | None = None
    dead: bool = False
    cause: str = ""
    # How far its clock is ahead of the world's (behind when negative): execution environments' clocks differ.
    skew: float = 0.0


@dataclass(eq=False)
class Actor:
    name: str
    process: Process
    run: Callable[[], None]
    wake_at: float = 0.0
    waiting_for: Actor | None = None
    done: bool = False
    started: bool = False
    error: BaseException | None = None
    coroutine: greenlet | None = field(default=None, repr=False)

    def ready(self, now: float) -> bool:
        if self.done or self.wake_at > now:
            return False
        return self.waiting_for is None or self.waiting_for.done


class Scheduler:
    """Runs actors one step at a time. `step_seconds` bounds the virtual time one step takes (a call's latency)."""

    def __init__(self, rng: random.Random, *, start: float, step_seconds: float = 0.02) -> None:
        self.rng = rng
        self.now = start
        self.step_seconds = step_seconds
        self.steps = 0
        # Every step's actor and time: two runs of one seed have the same digest, or the seed does not replay.
        self.trace = hashlib.blake2b(digest_size=8)
        self.actors: list[Actor] = []
        self.current: Actor | None = None
        self.hub = greenlet.getcurrent()
        # Asked before each step: the actor's process to kill now and why, or None (the fault plan's crashes).
        self.choose_kill: Callable[[Actor], str | None] = lambda actor: None
        # Times at which something outside the actors happens (a message becomes visible, an index catches up).
        self.timers: list[Callable[[], float | None]] = []
        self.on_kill: Callable[[Process, str], None] = lambda process, cause: None

    # ---- what actors call ------------------------------------------------------------------------------------------

    def clock(self) -> float:
        return self.now

    def local_clock(self) -> float:
        """The time the running actor's own process reads: the world's, plus its process's skew."""
        actor = self.current
        return self.now + (actor.process.skew if actor is not None else 0.0)

    def spawn(self, name: str, run: Callable[[], None], process: Process, *, delay: float = 0.0) -> Actor:
        actor = Actor(name=name, process=process, run=run, wake_at=self.now + delay)
        actor.coroutine = greenlet(lambda: self._body(actor), parent=self.hub)
        self.actors.append(actor)
        return actor

    def pause(self) -> None:
        """A yield point of the running actor: the scheduler may run others, move the clock or kill this process."""
        actor = self.current
        if actor is None:  # the hub itself (setting the world up): nothing to yield to
            return
        if actor.process.dead:
            raise Crash(actor.process.cause)
        self.hub.switch()
        if actor.process.dead:
            raise Crash(actor.process.cause)

    def sleep(self, seconds: float) -> None:
        actor = self.current
        if actor is None:
            self.now += seconds
            return
        actor.wake_at = self.now + seconds
        self.pause()

    def join(self, other: Actor) -> None:
        """Wait until `other` is done (its body returned or its process died)."""
        actor = self.current
        assert actor is not None, "join is for actors"
        while not other.done:
            actor.waiting_for = other
            self.pause()
        actor.waiting_for = None

    # ---- the loop --------------------------------------------------------------------------------------------------

    def kill(self, process: Process, cause: str) -> None:
        """Kill every actor of `process` at its current yield point (from the hub)."""
        if process.dead:
            return
        process.dead = True
        process.cause = cause
        self.on_kill(process, cause)
        for actor in list(self.actors):
            if actor.process is process and not actor.done:
                self._throw(actor)

    def kill_current(self, cause: str) -> None:
        """The running actor's own process dies here (a job that exhausts its memory). The other actors of the process
        die when the scheduler next picks them (a greenlet cannot unwind another and carry on itself)."""
        actor = self.current
        assert actor is not None, "kill_current is for actors"
        process = actor.process
        if not process.dead:
            process.dead = True
            process.cause = cause
            self.on_kill(process, cause)
        raise Crash(cause)

    def close(self) -> None:
        """End the run: every actor still suspended unwinds now (its process dies, no one is told), so that nothing
        keeps the world alive after it (a suspended greenlet holds its frames)."""
        for actor in self.actors:
            if actor.done:
                continue
            if not actor.process.dead:
                actor.process.dead = True
                actor.process.cause = "the simulation ended"
            try:
                self._throw(actor)
            except SimulationError:  # what an actor raises while dying no longer matters
                actor.done = True
        self.actors = []

    def run(self, *, finished: Callable[[], bool], until: float, max_steps: int) -> bool:
        """Step actors until `finished()` (checked whenever nothing is ready), the clock passes `until`, or
        `max_steps`; True if finished."""
        while self.steps < max_steps:
            ready = [actor for actor in self.actors if actor.ready(self.now)]
            if not ready:
                if finished():
                    return True
                wake = self._next_wake()
                if wake is None or wake > until:
                    return False
                self.now = max(self.now, wake)
                continue
            actor = ready[self.rng.randrange(len(ready))] if len(ready) > 1 else ready[0]
            self.steps += 1
            self.now += self.rng.random() * self.step_seconds
            if actor.process.dead:  # its process died while it waited: it unwinds now, from here
                self._throw(actor)
                continue
            deadline = actor.process.deadline
            if deadline is not None and self.now >= deadline:
                self.kill(actor.process, "timeout")
                continue
            cause = self.choose_kill(actor) if actor.started else None
            if cause is None and deadline is not None and self.now >= deadline:
                cause = "timeout"  # a stall carried the clock past the deadline: the platform kills the process
            if cause is not None:
                self.kill(actor.process, cause)
                continue
            self.trace.update(f"{actor.name}@{self.now:.6f};".encode())
            self._switch(actor)
            if self.steps % 256 == 0:
                self.actors = [a for a in self.actors if not a.done]
        return False

    def _next_wake(self) -> float | None:
        times = [a.wake_at for a in self.actors if not a.done and a.waiting_for is None]
        times += [a.process.deadline for a in self.actors if not a.done and a.process.deadline is not None]
        for timer in self.timers:
            moment = timer()
            if moment is not None:
                times.append(moment)
        later = [t for t in times if t > self.now]
        return min(later) if later else None

    def _body(self, actor: Actor) -> None:
        actor.started = True
        try:
            actor.run()
        except Crash:
            pass
        except BaseException as error:  # surfaced by `_switch` as a failure of the world
            actor.error = error
        finally:
            actor.done = True

    def _switch(self, actor: Actor) -> None:
        assert actor.coroutine is not None
        self.current = actor
        try:
            actor.coroutine.switch()
        finally:
            self.current = None
        if actor.error is not None:
            error, actor.error = actor.error, None
            raise SimulationError(f"actor {actor.name} raised {error!r}") from error

    def _throw(self, actor: Actor) -> None:
        assert actor.coroutine is not None
        if not actor.started:
            actor.done = True
            return
        previous, self.current = self.current, actor
        try:
            actor.coroutine.throw(Crash(actor.process.cause))
        finally:
            self.current = previous
        # Its unwinding may not yield (every yield point raises Crash now): it is over.
        actor.done = True
        if actor.error is not None:
            error, actor.error = actor.error, None
            raise SimulationError(f"actor {actor.name} raised {error!r} while dying") from error
