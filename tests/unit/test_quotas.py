"""The jobs-per-second counter of `agent_jobs.quotas` on its own: what it takes, in which second, and what it gives
back. The second comes from a clock the test moves."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from agent_jobs.keys import rate_key
from agent_jobs.quotas import JobQuotas
from tests.conftest import ManualClock, Stack


def quotas(stack: Stack, clock: ManualClock, limit: int = 5) -> JobQuotas:
    return JobQuotas(stack.services.dynamodb, stack.table_name, jobs_per_second_per_tenant=limit, clock=clock)


def count(stack: Stack, tenant: str, clock: ManualClock) -> int:
    item = stack.item(rate_key(tenant, clock.now // 1000))
    return int(item["jobCount"]) if item else 0


def test_take_counts_what_fits_in_the_second_and_starts_again_in_the_next(stack: Stack) -> None:
    clock = ManualClock()
    limit = quotas(stack, clock)

    assert [limit.take("t1", 3).taken, limit.take("t1", 3).taken, limit.take("t1", 1).taken] == [3, 2, 0]
    assert count(stack, "t1", clock) == 5
    assert limit.take("t2", 5).taken == 5  # another tenant's second is its own

    clock.advance(1)
    assert limit.take("t1", 10).taken == 5  # never more than the limit, even in a new second


def test_the_counter_expires_after_its_second(stack: Stack) -> None:
    clock = ManualClock()
    quotas(stack, clock).take("t1", 1)

    item = stack.item(rate_key("t1", clock.now // 1000))
    assert item["ttl"] == clock.now // 1000 + 120
    assert item["tenantId"] == "t1"


def test_give_back_uncounts_at_most_what_was_taken(stack: Stack) -> None:
    clock = ManualClock()
    limit = quotas(stack, clock)
    permit = limit.take("t1", 4)

    limit.give_back(permit, 10)

    assert count(stack, "t1", clock) == 0
    assert limit.take("t1", 5).taken == 5


class RefusingAboveTwo:
    """A table client whose counter refuses more than two jobs, without the old count in its answer."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def update_item(self, **arguments: Any) -> dict[str, Any]:
        jobs = int(arguments["ExpressionAttributeValues"][":n"]["N"])
        self.asked.append(jobs)
        if jobs > 2:
            error = {"Error": {"Code": "ConditionalCheckFailedException", "Message": "The conditional request failed"}}
            raise ClientError(error, "UpdateItem")  # type: ignore[arg-type]
        return {}


def test_take_without_the_old_count_tries_one_job_fewer_each_time() -> None:
    client = RefusingAboveTwo()
    limit = JobQuotas(client, "table", jobs_per_second_per_tenant=10, clock=lambda: 0)  # type: ignore[arg-type]

    assert limit.take("t1", 5).taken == 2
    assert client.asked == [5, 4, 3, 2]


class CountingQueries:
    """The table's client, counting the index entries its Query calls read."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.scanned = 0

    def query(self, **arguments: Any) -> dict[str, Any]:
        response: dict[str, Any] = self.client.query(**arguments)
        self.scanned += int(response.get("ScannedCount", 0))
        return response


def test_queue_room_reads_at_most_the_limit_of_entries_of_another_tenants_workspace(stack: Stack) -> None:
    # Given tenant-a's workspace with 30 pending jobs
    for n in range(30):
        stack.services.dynamodb.put_item(
            TableName=stack.table_name,
            Item={
                "pk": {"S": f"job#tenant-a#a-{n}"},
                "jobId": {"S": f"a-{n}"},
                "tenantId": {"S": "tenant-a"},
                "pendingWorkspace": {"S": "ws-a"},
                "queueSeq": {"S": str(n).rjust(40, "0")},
            },
        )
    client = CountingQueries(stack.services.dynamodb)
    limit = JobQuotas(client, stack.table_name, queued_jobs_per_workspace=5)  # type: ignore[arg-type]

    # When tenant-b asks for room in it (its job is then refused 404), and tenant-a for room in its own
    room_b = limit.queue_room("ws-a", "tenant-b")
    scanned_b, client.scanned = client.scanned, 0
    room_a = limit.queue_room("ws-a", "tenant-a")

    # Then tenant-b's request read no more entries than the limit, as tenant-a's own does
    assert (room_b, room_a) == (5, 0)
    assert scanned_b <= 5
    assert client.scanned <= 5
