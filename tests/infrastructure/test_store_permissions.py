"""Every DynamoDB action the store's operations call is granted to the function that calls them.

moto checks no IAM policy, so a store operation that starts calling another DynamoDB action (a BatchGetItem to read
several items consistently) passes every test against the emulator and is refused with AccessDeniedException in a
deployed stack. The actions are recorded here, without AWS, from each function's operations, with reads that find
what they look for so that every branch that reads further is taken.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from agent_jobs.models import ResumeDecision
from agent_jobs.store import JobGuard
from agent_jobs.store.codec import Item, wire
from agent_jobs_local.template import Template, load_template
from tests.core.test_store_requests import DRAINED, LEASE, MESSAGE, PARK, PARKED

PENDING: Item = {"pk": "job#t1#j0", "jobId": "j0", "tenantId": "t1", "pendingWorkspace": "w1", "queueSeq": "1"}
HALTED: Item = {"pk": "ws#w1", "workspaceId": "w1", "tenantId": "t1", "state": "HALTED", "haltingJobId": "j1"}
HALTING: Item = {"pk": "job#t1#j1", "jobId": "j1", "tenantId": "t1", "workspaceId": "w1", "status": "DEAD"}


class ActionRecording:
    """A DynamoDB client that records the IAM action of each call and what it acts on (`table`, or `index/<name>` for
    a Query of an index); reads find one item, writes succeed."""

    def __init__(self) -> None:
        self.actions: set[tuple[str, str]] = set()

    def __getattr__(self, name: str) -> Callable[..., dict[str, Any]]:
        action = "dynamodb:" + "".join(part.capitalize() for part in name.split("_"))
        answers: dict[str, dict[str, Any]] = {
            "query": {"Items": [wire(PENDING)]},
            "get_item": {"Item": wire(HALTED)},
            "batch_get_item": {"Responses": {"jobs": [wire({**PENDING, "status": "QUEUED"})]}},
        }

        def call(**request: Any) -> dict[str, Any]:
            if name == "transact_write_items":
                # IAM authorizes a transaction's items, each by its own action (there is no TransactWriteItems one)
                kinds = {kind for item in request["TransactItems"] for kind in item}
                self.actions.update((f"dynamodb:{kind}Item", "table") for kind in kinds)
                return {}
            index = request.get("IndexName")
            self.actions.add((action, f"index/{index}" if index else "table"))
            if name == "get_item" and request["Key"]["pk"]["S"].startswith("job#"):
                return {"Item": wire(HALTING)}
            return answers.get(name, {})

        return call


WORKER: dict[str, Callable[[JobGuard], object]] = {
    "claim": lambda g: g.claim(MESSAGE, message_id="m1", sequence_number="5", remaining_ms=100),
    "jobs ahead": lambda g: g.jobs_ahead(
        "w1", tenant_id="t1", job_id="j1", sequence_number="5", sent_at=1, unplaced_grace_ms=30_000
    ),
    "release a claim": lambda g: g.release(LEASE, reason="waits for j0"),
    "complete": lambda g: g.complete(LEASE, {"seconds": 1.5}),
    "still holds a lease": lambda g: g.holds(LEASE),
    "fail": lambda g: g.fail(LEASE, "error", permanent=True, body="b"),
    "fail a drained job": lambda g: g.fail(DRAINED, "error"),
    "park": lambda g: g.park(MESSAGE, **PARK, halt_workspace=True, lease=LEASE),  # type: ignore[arg-type]
    "reject": lambda g: g.reject(message_id="m1", job_id="j1", workspace_id="w1", tenant_id="t1", reason="r", body="b"),
    "halt": lambda g: g.halt_workspace("w1", tenant_id="t1", job_id="j1", reason="r"),
    "drain": lambda g: g.claim_parked(PARKED, resume_id="r1", remaining_ms=100),
    "release the drain": lambda g: g.release_drain("w1", "j1", drained_seq="1"),
    "list parked": lambda g: g.list_parked("w1", after_seq=None, expected=0),
    "activate": lambda g: g.activate("w1", "r1"),
}
API: dict[str, Callable[[JobGuard], object]] = {
    "accept": lambda g: g.record_accepted(MESSAGE),
    "accept a batch": lambda g: g.record_accepted_batch([MESSAGE, MESSAGE.model_copy(update={"job_id": "j2"})]),
    "record sent": lambda g: g.record_sent("t1", "j1", "m1", "5"),
    "record sent batch": lambda g: g.record_sent_batch([("t1", "j1", "m1", "5")]),
    "read a job": lambda g: g.get_job("t1", "j1"),
    "resume": lambda g: g.begin_resume(
        "w1", tenant_id="t1", halting_job_id="j1", decision=ResumeDecision.SKIP, operator="op"
    ),
    "list halted": lambda g: g.list_halted("t1"),
    "workspace jobs": lambda g: g.workspace_jobs("w1", "t1", limit=5, attributes=["jobId"]),
    "last succeeded": lambda g: g.last_succeeded_job("w1", "t1"),
}


def granted(template: Template, function_id: str) -> set[tuple[str, str]]:
    """The DynamoDB actions of the function's policies, each with what it is granted on: `table` (the table's ARN) or
    `index/<name>` (`index/*`: every index)."""
    pairs: set[tuple[str, str]] = set()
    for policy in template["Resources"][function_id]["Properties"]["Policies"]:
        for statement in policy["Statement"]:
            resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            for resource in resources:
                if resource == {"Fn::GetAtt": ["JobsTable", "Arn"]}:
                    target = "table"
                else:
                    target = re.sub(r"^\$\{JobsTable\.Arn\}/", "", resource.get("Fn::Sub", ""))
                pairs.update((action, target) for action in statement["Action"] if action.startswith("dynamodb:"))
    return pairs


def refused(calls: set[tuple[str, str]], allowed: set[tuple[str, str]]) -> list[tuple[str, str]]:
    return sorted(
        (action, target)
        for action, target in calls
        if (action, target) not in allowed and not (target.startswith("index/") and (action, "index/*") in allowed)
    )


@pytest.mark.parametrize(("function_id", "operations"), [("JobWorkerFunction", WORKER), ("EnqueueApiFunction", API)])
def test_every_dynamodb_action_a_function_calls_is_granted(
    function_id: str, operations: dict[str, Callable[[JobGuard], object]]
) -> None:
    allowed = granted(load_template(), function_id)
    for name, operation in operations.items():
        client = ActionRecording()
        operation(JobGuard(client, "jobs"))  # type: ignore[arg-type]
        assert client.actions, name
        assert refused(client.actions, allowed) == [], name
