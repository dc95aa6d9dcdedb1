"""The oracle's view of the table: a job write made as the holder of a lease that another worker has taken over since
is reported (no fencing), whichever way the product sends it; the product's own fenced complete never is."""

from __future__ import annotations

from typing import Any

from agent_jobs.guard import JobGuard
from agent_jobs_sim.dynamodb import SimDynamoDB, create_tables_from_template
from agent_jobs_sim.planted import PLANTS
from agent_jobs_sim.watch import WatchedTable
from tests.conftest import make_message


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def taken_over(rewrite: Any = None) -> tuple[JobGuard, Any, list[tuple[str, str, str | None]]]:
    """A job claimed by worker A, whose lease ran out and which worker B claimed since: A's guard, A's lease, and the
    stale writes the table reported."""
    clock = Clock()
    table = SimDynamoDB(clock)
    name = create_tables_from_template(table)
    stale: list[tuple[str, str, str | None]] = []
    watched = WatchedTable(
        table,
        name,
        on_job_write=lambda pk, old, new: None,
        rewrite=rewrite,
        on_stale_write=lambda pk, owner, holder: stale.append((pk, owner, holder)),
    )
    guard = JobGuard(watched, name, clock=lambda: int(clock.now * 1000))  # type: ignore[arg-type]
    message = make_message("j1")
    first = guard.claim(message, message_id="m1", sequence_number="1", remaining_ms=10_000)
    assert first.lease is not None
    clock.now += 11  # A's lease ran out
    second = guard.claim(message, message_id="m1", sequence_number="1", remaining_ms=10_000)
    assert second.lease is not None
    assert second.lease.owner != first.lease.owner
    return guard, first.lease, stale


def test_a_fenced_complete_of_a_lease_taken_over_writes_nothing_and_is_not_reported():
    guard, stale_lease, stale = taken_over()
    assert not guard.complete(stale_lease, {"ok": True})
    assert stale == []


def test_an_unfenced_complete_of_a_lease_taken_over_is_reported():
    guard, stale_lease, stale = taken_over(rewrite=PLANTS["unfenced-complete"].rewrite)
    assert guard.complete(stale_lease, {"ok": True})
    assert [(pk, owner) for pk, owner, _ in stale] == [("job#tenant-1#j1", stale_lease.owner)]
