"""Per-tenant job quotas (`agent_jobs.quotas`) through the API's Lambda handler, against the table and queue of
template.yaml in moto: new jobs per second per tenant (MaxJobsPerSecondPerTenant) and jobs queued per workspace
(MaxQueuedJobsPerWorkspace). A tenant at its limit gets 429 with Retry-After; another tenant's jobs are accepted; a
refused job leaves no record and no message; a repeat of an accepted job is never refused. The rate's second comes
from a clock the test moves, never from the machine's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from agent_jobs import quotas
from agent_jobs.guard import JobGuard
from agent_jobs.keys import rate_key
from agent_jobs.models import JobMessage
from agent_jobs.producer import PayloadTooLargeError, enqueue_job
from enqueue_api import app
from tests.conftest import ManualClock, Stack, make_job, register_workspace
from tests.integration.test_batch_enqueue import batch_event
from tests.integration.test_enqueue_api import Api, job_body, use_environment


def claims(tenant: str) -> dict[str, str]:
    return {"tenant_id": tenant}


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> ManualClock:
    """The quotas' clock: the rate's second moves only when the test says so."""
    manual = ManualClock()
    manual.now -= manual.now % 1000  # the start of a second
    monkeypatch.setattr(quotas, "epoch_ms", manual)
    return manual


def quota_api(stack: Stack, monkeypatch: pytest.MonkeyPatch, **limits: int) -> Iterator[Api]:
    environment = stack.env("EnqueueApiFunction")
    environment.update({name.upper(): str(value) for name, value in limits.items()})
    use_environment(monkeypatch, environment)
    monkeypatch.setattr(app.metrics, "namespace", "AgentJobsTest")
    yield Api(stack)
    app.reset_services()


@pytest.fixture
def rate_api(any_stack: Stack, clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    """The API with MaxJobsPerSecondPerTenant = 3."""
    yield from quota_api(any_stack, monkeypatch, max_jobs_per_second_per_tenant=3)


@pytest.fixture
def queue_api(any_stack: Stack, clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    """The API with MaxQueuedJobsPerWorkspace = 2."""
    yield from quota_api(any_stack, monkeypatch, max_queued_jobs_per_workspace=2)


def queued_job_ids(api: Api) -> list[str]:
    return [JobMessage.model_validate_json(record["body"]).job_id for record in api.drain()]


# ---- jobs per second per tenant ------------------------------------------------------------------------------------


def test_the_template_gives_the_api_the_job_quotas(stack: Stack) -> None:
    environment = stack.env("EnqueueApiFunction")
    assert environment["MAX_JOBS_PER_SECOND_PER_TENANT"] == "25"
    assert environment["MAX_QUEUED_JOBS_PER_WORKSPACE"] == "200"


def test_a_tenant_hammering_gets_429_while_another_tenants_jobs_are_accepted(rate_api: Api) -> None:
    # Given a tenant that sends five jobs in one second, above its three
    hammering = [rate_api.post(job_body(f"a-{n}", "ws-a"), claims=claims("tenant-a")) for n in range(5)]

    # Then three are accepted and two refused with 429, Retry-After and the parameter to raise
    assert [r.status for r in hammering] == [202, 202, 202, 429, 429]
    refused = hammering[3]
    assert refused.headers["Retry-After"] == "1"
    assert "MaxJobsPerSecondPerTenant = 3" in refused.body["message"]
    assert "raise the MaxJobsPerSecondPerTenant parameter" in refused.body["message"]

    # And in the same second another tenant's jobs are all accepted
    other = [rate_api.post(job_body(f"b-{n}", "ws-b"), claims=claims("tenant-b")) for n in range(3)]
    assert [r.status for r in other] == [202, 202, 202]

    # And the refused jobs left no record and no message
    assert rate_api.stack.job("a-3") is None
    assert rate_api.stack.job("a-4") is None
    assert sorted(queued_job_ids(rate_api)) == ["a-0", "a-1", "a-2", "b-0", "b-1", "b-2"]


def test_a_refused_job_is_accepted_in_the_next_second(rate_api: Api, clock: ManualClock) -> None:
    for n in range(3):
        assert rate_api.post(job_body(f"a-{n}", "ws-a"), claims=claims("tenant-a")).status == 202
    assert rate_api.post(job_body("a-3", "ws-a"), claims=claims("tenant-a")).status == 429

    clock.advance(1)

    again = rate_api.post(job_body("a-3", "ws-a"), claims=claims("tenant-a"))
    assert (again.status, again.body["created"]) == (202, True)
    assert queued_job_ids(rate_api) == ["a-0", "a-1", "a-2", "a-3"]


def test_a_repeat_of_an_accepted_job_is_not_refused_and_counts_nothing(rate_api: Api) -> None:
    # Given a tenant at its limit for this second
    for n in range(3):
        assert rate_api.post(job_body(f"a-{n}", "ws-a"), claims=claims("tenant-a")).status == 202

    # When it repeats an accepted job (a client retry)
    repeat = rate_api.post(job_body("a-1", "ws-a"), claims=claims("tenant-a"))

    # Then it is answered from the job's record, not refused, and nothing is sent again
    assert (repeat.status, repeat.body["created"]) == (202, False)
    assert queued_job_ids(rate_api) == ["a-0", "a-1", "a-2"]


def test_a_batch_counts_each_of_its_jobs(rate_api: Api, clock: ManualClock) -> None:
    jobs = [job_body(f"a-{n}", "ws-a") for n in range(5)]

    # A batch of five with three allowed: the first three accepted, the last two refused
    response = rate_api.invoke(batch_event({"jobs": jobs}, claims=claims("tenant-a")))
    assert response.status == 200
    assert [r["statusCode"] for r in response.body["results"]] == [202, 202, 202, 429, 429]
    assert response.headers["Retry-After"] == "1"
    assert "MaxJobsPerSecondPerTenant" in response.body["results"][3]["message"]
    assert rate_api.stack.job("a-3") is None

    # The same batch again in the same second: the accepted ones are repeats, the others still wait
    again = rate_api.invoke(batch_event({"jobs": jobs}, claims=claims("tenant-a")))
    assert [(r["statusCode"], r["created"]) for r in again.body["results"]] == [
        (202, False),
        (202, False),
        (202, False),
        (429, False),
        (429, False),
    ]

    # In the next second the retried batch accepts the rest, in order, each job once
    clock.advance(1)
    later = rate_api.invoke(batch_event({"jobs": jobs}, claims=claims("tenant-a")))
    assert [(r["statusCode"], r["created"]) for r in later.body["results"]] == [
        (202, False),
        (202, False),
        (202, False),
        (202, True),
        (202, True),
    ]
    assert "Retry-After" not in later.headers
    assert queued_job_ids(rate_api) == [f"a-{n}" for n in range(5)]


# ---- jobs queued per workspace -------------------------------------------------------------------------------------


def settle_one(stack: Stack) -> str:
    """Run the oldest queued job to SUCCEEDED as a worker would (claim, complete, delete its message)."""
    (record,) = stack.receive(batch_size=1)["Records"]
    message = JobMessage.model_validate_json(record["body"])
    guard: JobGuard = stack.guard
    claimed = guard.claim(
        message,
        message_id=record["messageId"],
        sequence_number=record["attributes"]["SequenceNumber"],
        remaining_ms=60_000,
    )
    assert claimed.lease is not None, claimed.outcome
    assert guard.complete(claimed.lease, {})
    stack.services.sqs.delete_message(QueueUrl=stack.queue_url, ReceiptHandle=record["receiptHandle"])
    return message.job_id


def test_a_full_workspace_refuses_new_jobs_while_another_tenants_are_accepted(queue_api: Api) -> None:
    # Given a workspace with two jobs queued, its limit
    for n in range(2):
        assert queue_api.post(job_body(f"a-{n}", "ws-a"), claims=claims("tenant-a")).status == 202

    # When its tenant sends a third
    refused = queue_api.post(job_body("a-2", "ws-a"), claims=claims("tenant-a"))

    # Then it is refused with 429, Retry-After and the parameter to raise, leaving no record and no message
    assert refused.status == 429
    assert refused.headers["Retry-After"] == "10"
    assert "MaxQueuedJobsPerWorkspace = 2" in refused.body["message"]
    assert "raise the MaxQueuedJobsPerWorkspace parameter" in refused.body["message"]
    assert queue_api.stack.job("a-2") is None

    # And another tenant's workspace takes its jobs
    other = [queue_api.post(job_body(f"b-{n}", "ws-b"), claims=claims("tenant-b")) for n in range(2)]
    assert [r.status for r in other] == [202, 202]
    # And another tenant sending to the full workspace learns only that it is not theirs (404), not that it is full
    assert queue_api.post(job_body("b-x", "ws-a"), claims=claims("tenant-b")).status == 404

    # And a repeat of a queued job is answered from its record
    repeat = queue_api.post(job_body("a-0", "ws-a"), claims=claims("tenant-a"))
    assert (repeat.status, repeat.body["created"]) == (202, False)
    assert sorted(queued_job_ids(queue_api)) == ["a-0", "a-1", "b-0", "b-1"]


def test_a_full_workspace_takes_jobs_again_once_the_worker_settles_some(queue_api: Api) -> None:
    for n in range(2):
        assert queue_api.post(job_body(f"a-{n}", "ws-a"), claims=claims("tenant-a")).status == 202
    assert queue_api.post(job_body("a-2", "ws-a"), claims=claims("tenant-a")).status == 429

    assert settle_one(queue_api.stack) == "a-0"

    accepted = queue_api.post(job_body("a-2", "ws-a"), claims=claims("tenant-a"))
    assert (accepted.status, accepted.body["created"]) == (202, True)
    assert queue_api.post(job_body("a-3", "ws-a"), claims=claims("tenant-a")).status == 429


def test_a_batch_fills_a_workspace_up_to_its_limit(queue_api: Api) -> None:
    jobs = [job_body("a-0", "ws-a"), job_body("b-0", "ws-b"), job_body("a-1", "ws-a"), job_body("a-2", "ws-a")]

    response = queue_api.invoke(batch_event({"jobs": jobs}, claims=claims("tenant-a")))

    results: list[dict[str, Any]] = response.body["results"]
    assert [r["statusCode"] for r in results] == [202, 202, 202, 429]
    assert "MaxQueuedJobsPerWorkspace" in results[3]["message"]
    assert response.headers["Retry-After"] == "10"
    assert queue_api.stack.job("a-2") is None
    assert sorted(queued_job_ids(queue_api)) == ["a-0", "a-1", "b-0"]


def test_a_batch_mixing_repeats_and_new_jobs_counts_only_the_new_ones(rate_api: Api) -> None:
    # Given two jobs accepted this second, of three
    for n in range(2):
        assert rate_api.post(job_body(f"a-{n}", "ws-a"), claims=claims("tenant-a")).status == 202

    # When a batch repeats one of them and brings two new ones
    jobs = [job_body("a-0", "ws-a"), job_body("a-2", "ws-a"), job_body("a-3", "ws-a")]
    response = rate_api.invoke(batch_event({"jobs": jobs}, claims=claims("tenant-a")))

    # Then the repeat is answered, the one new job that fits is accepted, and the last waits
    assert [(r["statusCode"], r["created"]) for r in response.body["results"]] == [
        (202, False),
        (202, True),
        (429, False),
    ]
    assert rate_api.stack.job("a-3") is None
    assert queued_job_ids(rate_api) == ["a-0", "a-1", "a-2"]


def counted(api: Api, tenant: str, clock: ManualClock) -> int:
    """The tenant's count of jobs in the clock's second."""
    item = api.stack.item(rate_key(tenant, clock.now // 1000))
    return int(item["jobCount"]) if item else 0


def test_a_repeat_below_the_limit_takes_no_room_from_new_jobs(rate_api: Api, clock: ManualClock) -> None:
    for n in range(2):
        assert rate_api.post(job_body(f"a-{n}", "ws-a"), claims=claims("tenant-a")).status == 202

    # A repeat is counted while it is recorded, then given back: it is not a new job
    assert rate_api.post(job_body("a-0", "ws-a"), claims=claims("tenant-a")).body["created"] is False
    assert counted(rate_api, "tenant-a", clock) == 2

    assert rate_api.post(job_body("a-2", "ws-a"), claims=claims("tenant-a")).status == 202
    assert rate_api.post(job_body("a-3", "ws-a"), claims=claims("tenant-a")).status == 429
    assert counted(rate_api, "tenant-a", clock) == 3


def test_jobs_refused_for_another_reason_take_no_room(rate_api: Api, clock: ManualClock) -> None:
    # Given tenant-a's workspace, and tenant-b sending three jobs into it (404: nothing recorded)
    assert rate_api.post(job_body("a-0", "ws-a"), claims=claims("tenant-a")).status == 202
    assert [rate_api.post(job_body(f"x-{n}", "ws-a"), claims=claims("tenant-b")).status for n in range(3)] == [404] * 3
    assert counted(rate_api, "tenant-b", clock) == 0

    # Then tenant-b still has its three jobs this second
    accepted = [rate_api.post(job_body(f"b-{n}", "ws-b"), claims=claims("tenant-b")).status for n in range(3)]
    assert accepted == [202, 202, 202]


def test_a_job_whose_record_failed_takes_no_room(
    rate_api: Api, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the job store refusing the first record (throttled): the API answers 503
    record_accepted = JobGuard.record_accepted
    failures = iter([True])

    def failing_once(self: JobGuard, message: JobMessage) -> Any:
        if next(failures, False):
            raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "slow down"}}, "TransactWriteItems")
        return record_accepted(self, message)

    monkeypatch.setattr(JobGuard, "record_accepted", failing_once)
    assert rate_api.post(job_body("a-0", "ws-a"), claims=claims("tenant-a")).status == 503

    # Then the count taken for it was given back: the tenant still has its three jobs this second
    assert counted(rate_api, "tenant-a", clock) == 0
    accepted = [rate_api.post(job_body(f"a-{n}", "ws-a"), claims=claims("tenant-a")).status for n in range(3)]
    assert accepted == [202, 202, 202]


def test_a_job_too_large_to_send_takes_nothing_of_the_tenants_second(stack: Stack) -> None:
    # Given a producer without a payload store, and a job above its inline limit
    register_workspace(stack, "ws-a", "tenant-a")
    clock = ManualClock()
    limits = quotas.JobQuotas(stack.services.dynamodb, stack.table_name, jobs_per_second_per_tenant=3, clock=clock)
    job = make_job("big-1", "ws-a", payload={"patch": "+" * 4096, "commitMessage": "big"})

    # When it is sent, it is refused as too large
    with pytest.raises(PayloadTooLargeError):
        enqueue_job(
            job,
            "tenant-a",
            guard=stack.guard,
            sqs=stack.services.sqs,
            queue_url=stack.queue_url,
            payloads=None,
            inline_limit_bytes=1024,
            quotas=limits,
        )

    # Then the tenant's second is untouched: all 3 jobs of the limit are still there to take
    item = stack.item(rate_key("tenant-a", clock.now // 1000))
    assert item is None or int(item["jobCount"]) == 0
    assert limits.take("tenant-a", 3).taken == 3
