"""The oracle's checks: as a job starts to run, the run must hold the job's lease, unless a process whose own clock had
passed the lease's expiry took it over (clock skew between execution environments, which no lease survives); the
jobs of a workspace take effect in the order of the places their answers named, and after every job answered before
they were first submitted; an answered place never changes, and a recorded place never moves."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from agent_jobs.guard import JobGuard, Lease
from agent_jobs_sim.dynamodb import SimDynamoDB, create_tables_from_template
from agent_jobs_sim.oracle import Oracle, Violation
from agent_jobs_sim.scheduler import Process
from agent_jobs_sim.watch import WatchedTable
from agent_jobs_sim.workload import Workload, WorkspacePlan
from tests.conftest import make_job, make_message


class World:
    """One table under the oracle's watch, and the process whose actor makes the next write."""

    def __init__(self) -> None:
        self.now = 1_000.0
        self.table = SimDynamoDB(lambda: self.now)
        self.name = create_tables_from_template(self.table)
        self.oracle = Oracle(workload=Workload(workspaces=[]), table_name=self.name, dynamodb=self.table)
        self.writer = SimpleNamespace(process=Process("nobody"))
        self.watched = WatchedTable(
            self.table,
            self.name,
            on_job_write=lambda pk, old, new: None,
            on_lease_taken=lambda pk, owner: self.oracle.lease_taken(pk, owner, self.writer, self.now),
        )

    def guard_of(self, process: Process) -> JobGuard:
        return JobGuard(self.watched, self.name, clock=lambda: int((self.now + process.skew) * 1000))  # type: ignore[arg-type]

    def claim(self, process: Process) -> Lease:
        self.writer = SimpleNamespace(process=process)
        message = make_message("j1")
        claim = self.guard_of(process).claim(message, message_id="m1", sequence_number="1", remaining_ms=10_000)
        assert claim.lease is not None
        return claim.lease

    def take_without_waiting(self, process: Process) -> None:
        """A broken claim: the lease written over whatever holds it (as a read-then-write claim would)."""
        self.writer = SimpleNamespace(process=process)
        self.watched.update_item(
            TableName=self.name,
            Key={"pk": {"S": "job#tenant-1#j1"}},
            UpdateExpression="SET leaseOwner = :owner",
            ExpressionAttributeValues={":owner": {"S": "b" * 32}},
        )


def runs(world: World, lease: Lease, process: Process) -> Any:
    world.oracle.run_started(lease, process, world.now)
    return world.oracle.runs[lease.job_id]


def test_a_run_that_holds_its_lease_is_recorded():
    world = World()
    holder = Process("env-a")
    lease = world.claim(holder)
    assert runs(world, lease, holder) == [(holder, lease.owner)]


def test_a_lease_taken_over_by_a_clock_already_past_its_expiry_is_not_a_violation():
    # A claimed with 10 s left by its own clock; 3 s later B, whose clock is 8 s ahead, reads 11 s past A's claim and
    # takes the expired lease over fairly, before A's handler started.
    world = World()
    holder, ahead = Process("env-a"), Process("env-b", skew=8.0)
    lease = world.claim(holder)
    world.now += 3
    taken = world.claim(ahead)
    assert taken.owner != lease.owner
    assert runs(world, lease, holder) == [(holder, lease.owner)]


def test_a_lease_taken_over_before_it_ran_out_by_the_takers_clock_is_a_violation():
    world = World()
    holder, other = Process("env-a"), Process("env-b", skew=8.0)
    lease = world.claim(holder)
    world.now += 1  # the other's clock reads 1,009: A's lease runs to 1,010
    world.take_without_waiting(other)
    with pytest.raises(Violation, match="ran without holding its lease"):
        world.oracle.run_started(lease, holder, world.now)


def test_a_lease_whose_record_left_in_flight_is_a_violation_whoever_took_it():
    world = World()
    holder, ahead = Process("env-a"), Process("env-b", skew=8.0)
    lease = world.claim(holder)
    world.now += 3
    taken = world.claim(ahead)
    assert world.guard_of(ahead).complete(taken, {"ok": True})
    with pytest.raises(Violation, match="its record is SUCCEEDED"):
        world.oracle.run_started(lease, holder, world.now)


def _record(message_id: str, group: str) -> dict[str, Any]:
    return {"messageId": message_id, "attributes": {"MessageGroupId": group}}


def test_a_deferred_group_handed_back_whole_keeps_its_order():
    world = World()
    records = [_record("m1", "ws-a"), _record("m2", "ws-b"), _record("m3", "ws-a")]
    response = {"batchItemFailures": [{"itemIdentifier": "m1"}, {"itemIdentifier": "m3"}]}
    assert world.oracle.after_deferrals(records, response, [("m1", "ws-a")]) == 2


def test_a_deferred_record_whose_group_is_partly_deleted_is_a_violation():
    world = World()
    records = [_record("m1", "ws-a"), _record("m2", "ws-a")]
    response = {"batchItemFailures": [{"itemIdentifier": "m1"}]}
    with pytest.raises(Violation, match="lets the queue delete m2"):
        world.oracle.after_deferrals(records, response, [("m1", "ws-a")])


def test_a_deferred_record_that_wrote_its_job_is_a_violation():
    world = World()
    deciding = Process("env-a")
    world.oracle.deciding_share(deciding, "tenant-1", "j1")
    world.oracle.on_job_write("job#tenant-1#j1", None, ("IN_FLIGHT", 1), writer=deciding)
    with pytest.raises(Violation, match="j1 was deferred over its tenant's share, yet its record was written"):
        world.oracle.share_decided(deciding, deferred=True)


def test_a_write_by_another_actor_while_deciding_is_not_the_deferrals():
    world = World()
    deciding, other = Process("env-a"), Process("env-b")
    world.oracle.deciding_share(deciding, "tenant-1", "j1")
    world.oracle.on_job_write("job#tenant-1#j1", None, ("IN_FLIGHT", 1), writer=other)
    world.oracle.share_decided(deciding, deferred=True)


# ---- places and answers ----------------------------------------------------------------------------------------------


def _place(n: int) -> str:
    return str(18_000_000_000_000_000_000 + n)


def places_world(*, jobs: int = 2) -> World:
    """A world whose oracle watches one workspace, ws-a of tenant-1, with jobs j0, j1, ..."""
    world = World()
    plan = WorkspacePlan("ws-a", "tenant-1", jobs=[make_job(f"j{i}", "ws-a") for i in range(jobs)])
    world.oracle.workload = Workload(workspaces=[plan])
    return world


def test_a_retry_answered_with_its_first_place_takes_effect_before_the_job_answered_meanwhile():
    # j0's submission failed after its send; its careless agent submitted j1, then j0 again within the deduplication
    # window: j0 is answered with its first message's place, before j1's, and takes effect first.
    oracle = places_world().oracle
    oracle.submitted("j0")
    oracle.submitted("j1")
    oracle.answered("ws-a", "j1", _place(2))
    oracle.submitted("j0")
    oracle.answered("ws-a", "j0", _place(1))
    oracle.on_commit("ws-a", "j0")
    oracle.on_commit("ws-a", "j1")
    assert oracle.effects["ws-a"] == ["j0", "j1"]
    assert oracle.answered_out_of_order == 1


def test_effects_against_the_order_of_answered_places_are_a_violation():
    oracle = places_world().oracle
    oracle.submitted("j0")
    oracle.submitted("j1")
    oracle.answered("ws-a", "j1", _place(2))
    oracle.on_commit("ws-a", "j1")
    oracle.on_commit("ws-a", "j0")  # not answered yet: no place to order it by
    with pytest.raises(Violation, match="j0 took effect on ws-a after j1, but was answered with an earlier place"):
        oracle.answered("ws-a", "j0", _place(1))


def test_a_job_answered_before_another_was_submitted_must_take_effect_first():
    oracle = places_world().oracle
    oracle.submitted("j0")
    oracle.answered("ws-a", "j0", _place(1))
    oracle.submitted("j1")  # its answer lost: it has no place to compare, only its submission
    with pytest.raises(Violation, match="j1 took effect on ws-a while j0, accepted before it, is unrecorded"):
        oracle.on_commit("ws-a", "j1")


def test_a_job_submitted_before_another_was_answered_may_take_effect_first():
    # j0 failed and was put off; j1 was submitted before j0 had any answer: nothing orders j1 after j0
    oracle = places_world().oracle
    oracle.submitted("j0")
    oracle.submitted("j1")
    oracle.answered("ws-a", "j1", _place(1))
    oracle.on_commit("ws-a", "j1")
    oracle.answered("ws-a", "j0", _place(2))
    oracle.on_commit("ws-a", "j0")
    assert oracle.effects["ws-a"] == ["j1", "j0"]


def test_an_answer_that_names_another_place_than_before_is_a_violation():
    oracle = places_world().oracle
    oracle.submitted("j0")
    oracle.answered("ws-a", "j0", _place(1))
    oracle.answered("ws-a", "j0", _place(1))
    with pytest.raises(Violation, match=f"j0 was answered with place {_place(1)}, then with {_place(5)}"):
        oracle.answered("ws-a", "j0", _place(5))


def test_a_recorded_place_that_moves_is_a_violation():
    oracle = places_world().oracle
    oracle.on_place_write("job#tenant-1#j0", None, _place(1))  # placed: by a claim, or a send's record
    oracle.on_place_write("job#tenant-1#j0", _place(1), _place(1))
    with pytest.raises(Violation, match=f"j0 was placed at {_place(1)} in its queue, then moved to {_place(3)}"):
        oracle.on_place_write("job#tenant-1#j0", _place(1), _place(3))


def _put_job(world: World, job_id: str, **attributes: str) -> None:
    item = {"pk": {"S": f"job#tenant-1#{job_id}"}, **{k: {"S": v} for k, v in attributes.items()}}
    world.table.put_item(TableName=world.name, Item=item)


def test_an_answered_place_that_is_not_the_recorded_one_at_the_end_is_a_violation():
    world = places_world(jobs=1)
    world.oracle.submitted("j0")
    world.oracle.answered("ws-a", "j0", _place(1))
    _put_job(world, "j0", status="QUEUED", sequenceNumber=_place(2))
    with pytest.raises(Violation, match=f"j0 was answered with place {_place(1)} but is recorded at {_place(2)}"):
        world.oracle.check_outcomes()


def test_a_job_given_up_unsent_is_settled_and_one_still_to_be_sent_again_is_not():
    world = places_world()
    _put_job(world, "j0", status="QUEUED")  # recorded, its send never confirmed, no copy placed it
    _put_job(world, "j1", status="QUEUED")
    world.oracle.given_up.add("j0")
    assert world.oracle.unsettled() == ["j1 is QUEUED with 0 effects"]
    _put_job(world, "j0", status="QUEUED", sequenceNumber=_place(1))  # a copy of it reached a worker: it must run
    assert world.oracle.unsettled() == ["j0 is QUEUED with 0 effects", "j1 is QUEUED with 0 effects"]
