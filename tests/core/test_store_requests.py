"""Every request the store builds uses each placeholder it declares.

DynamoDB refuses a request whose ExpressionAttributeValues or ExpressionAttributeNames hold a placeholder that no
expression of the request uses (ValidationException "Value provided in ExpressionAttributeValues unused in
expressions"), in a transaction's items too. moto does not check this, so the integration tests cannot see it: the
requests are recorded here, without AWS, for every write and read of the store and every resume decision.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from agent_jobs.core.outcomes import ResumeOutcome
from agent_jobs.models import JobMessage, JobType, ResumeDecision
from agent_jobs.store import JobGuard
from agent_jobs.store.codec import Item, wire
from agent_jobs.store.results import Lease

EXPRESSIONS = (
    "ConditionExpression",
    "UpdateExpression",
    "KeyConditionExpression",
    "FilterExpression",
    "ProjectionExpression",
)


class Recording:
    """A DynamoDB client that records each request and answers as if every condition held (reads from `items`)."""

    def __init__(self, items: dict[str, Item] | None = None) -> None:
        self.requests: list[dict[str, Any]] = []
        self._items = items or {}

    def transact_write_items(self, **request: Any) -> dict[str, Any]:
        self.requests.extend(next(iter(item.values())) for item in request["TransactItems"])
        return {}

    def update_item(self, **request: Any) -> dict[str, Any]:
        self.requests.append(request)
        return {}

    def put_item(self, **request: Any) -> dict[str, Any]:
        self.requests.append(request)
        return {}

    def query(self, **request: Any) -> dict[str, Any]:
        self.requests.append(request)
        return {"Items": []}

    def get_item(self, **request: Any) -> dict[str, Any]:
        item = self._items.get(request["Key"]["pk"]["S"])
        return {"Item": wire(item)} if item else {}

    def batch_get_item(self, **request: Any) -> dict[str, Any]:
        return {"Responses": {}}


def unused(request: dict[str, Any]) -> list[str]:
    used = " ".join(request.get(name, "") for name in EXPRESSIONS)
    declared = [*request.get("ExpressionAttributeValues", {}), *request.get("ExpressionAttributeNames", {})]
    return [name for name in declared if not re.search(re.escape(name) + r"(?![A-Za-z0-9_])", used)]


def undeclared(request: dict[str, Any]) -> list[str]:
    """The placeholders an expression uses that the request does not declare (DynamoDB refuses those too)."""
    used = set(re.findall(r"[:#][A-Za-z0-9_]+", " ".join(request.get(name, "") for name in EXPRESSIONS)))
    declared = {*request.get("ExpressionAttributeValues", {}), *request.get("ExpressionAttributeNames", {})}
    return sorted(used - declared)


MESSAGE = JobMessage(
    job_id="j1", workspace_id="w1", tenant_id="t1", type=JobType.RUN_TESTS, payload={}, payload_hash="0" * 64
)
LEASE = Lease("j1", "w1", "t1", "owner", 10**13)
DRAINED = Lease("j1", "w1", "t1", "owner", 10**13, resume_id="r1", parked_seq="1")
PARKED = {"jobId": "j1", "tenantId": "t1", "workspaceId": "w1", "parkedSeq": "1"}
PARK = {"message_id": "m1", "sequence_number": "5", "body": "b", "reason": "r"}

OPERATIONS: dict[str, Callable[[JobGuard], object]] = {
    "record_accepted": lambda g: g.record_accepted(MESSAGE),
    "record_sent": lambda g: g.record_sent("t1", "j1", "m1", "5"),
    "record_accepted_batch": lambda g: g.record_accepted_batch([MESSAGE, MESSAGE.model_copy(update={"job_id": "j2"})]),
    "record_sent_batch": lambda g: g.record_sent_batch([("t1", "j1", "m1", "5"), ("t1", "j2", "m2", None)]),
    "claim alone": lambda g: g.claim(MESSAGE, message_id="m1", sequence_number="5", remaining_ms=100),
    "claim shared": lambda g: g.claim(MESSAGE, message_id="m1", sequence_number="5", remaining_ms=100, alone=False),
    "claim near the limit": lambda g: g.claim(
        MESSAGE, message_id="m1", sequence_number="5", remaining_ms=100, near_delivery_limit=True
    ),
    "complete": lambda g: g.complete(LEASE, {"seconds": 1.5}),
    "fail, attempts left": lambda g: g.fail(LEASE, "error"),
    "fail for good": lambda g: g.fail(LEASE, "error", permanent=True, body="b"),
    "fail a drained job": lambda g: g.fail(DRAINED, "error"),
    "park behind a halt": lambda g: g.park(MESSAGE, **PARK),  # type: ignore[arg-type]
    "park and halt": lambda g: g.park(MESSAGE, **PARK, halt_workspace=True),  # type: ignore[arg-type]
    "park under its lease": lambda g: g.park(MESSAGE, **PARK, halt_workspace=True, lease=LEASE),  # type: ignore[arg-type]
    "park behind missing jobs": lambda g: g.park(MESSAGE, **PARK, missing=[{"jobId": "j0"}]),  # type: ignore[arg-type]
    "reject": lambda g: g.reject(message_id="m1", job_id="j1", workspace_id="w1", tenant_id="t1", reason="r", body="b"),
    "reject without a job": lambda g: g.reject(
        message_id="m1", job_id=None, workspace_id="w1", tenant_id=None, reason="r", body="b"
    ),
    "reject unrouted": lambda g: g.reject_unrouted(message_id="m1", group_id="g", reason="r", body="b"),
    "halt": lambda g: g.halt_workspace("w1", tenant_id="t1", job_id="j1", reason="r"),
    "drain": lambda g: g.claim_parked(PARKED, resume_id="r1", remaining_ms=100),
    "drain again": lambda g: g.claim_parked(PARKED, resume_id="r1", remaining_ms=100, reclaim=True),
    "release the drain": lambda g: g.release_drain("w1", "j1", drained_seq="1"),
    "activate": lambda g: g.activate("w1", "r1"),
    "jobs ahead": lambda g: g.jobs_ahead(
        "w1", tenant_id="t1", job_id="j1", sequence_number="5", sent_at=1, unplaced_grace_ms=30_000
    ),
    "release a claim": lambda g: g.release(LEASE, reason="waits for j0"),
    "list parked": lambda g: g.list_parked("w1", after_seq=None, expected=0),
    "list halted": lambda g: g.list_halted("t1"),
    "workspace jobs": lambda g: g.workspace_jobs("w1", "t1", limit=5, attributes=["jobId", "status"]),
    "last succeeded": lambda g: g.last_succeeded_job("w1", "t1"),
}


@pytest.mark.parametrize("operation", OPERATIONS)
def test_every_request_uses_what_it_declares(operation: str) -> None:
    # A registration of the job's tenant, for the enqueue's ownership check (read, not written)
    registered = {"ws#w1": {"pk": "ws#w1", "tenantId": "t1", "remoteUrl": "https://git.example/r.git"}}
    client = Recording(registered if operation == "record_accepted" else None)
    OPERATIONS[operation](JobGuard(client, "jobs"))  # type: ignore[arg-type]
    assert client.requests, "the operation sent a request"
    assert [unused(request) for request in client.requests] == [[] for _ in client.requests]
    assert [undeclared(request) for request in client.requests] == [[] for _ in client.requests]


@pytest.mark.parametrize("status", ["DEAD", "PARKED", "REJECTED", "QUEUED"])
@pytest.mark.parametrize("decision", list(ResumeDecision))
@pytest.mark.parametrize(
    ("undecided", "parked", "draining"), [(None, 0, None), ({"j1", "j9"}, 1, None), (None, 2, None), (None, 0, "j5")]
)
def test_every_resume_request_uses_what_it_declares(
    status: str, decision: ResumeDecision, undecided: set[str] | None, parked: int, draining: str | None
) -> None:
    workspace: Item = {"pk": "ws#w1", "workspaceId": "w1", "tenantId": "t1", "state": "HALTED", "haltingJobId": "j1"}
    workspace.update({"parkedCount": parked, "undecidedJobIds": undecided, "drainingJobId": draining})
    halting = {
        "jobId": "j1",
        "tenantId": "t1",
        "workspaceId": "w1",
        "status": status,
        "body": "b",
        "sequenceNumber": "3",
    }
    other = {"jobId": "j9", "tenantId": "t1", "status": "DEAD", "sequenceNumber": "9"}
    items = {"ws#w1": {k: v for k, v in workspace.items() if v}, "job#t1#j1": halting, "job#t1#j9": other}
    client = Recording(items)
    result = JobGuard(client, "jobs").begin_resume(  # type: ignore[arg-type]
        "w1", tenant_id="t1", halting_job_id="j1", decision=decision, operator="op"
    )
    # Only a refused retry writes nothing; every decision writes
    assert bool(client.requests) is (result.outcome is not ResumeOutcome.RETRY_REFUSED), result.outcome
    assert [unused(request) for request in client.requests] == [[] for _ in client.requests]
    assert [undeclared(request) for request in client.requests] == [[] for _ in client.requests]
