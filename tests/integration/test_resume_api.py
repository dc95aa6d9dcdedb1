"""The producer API's resume routes (`POST /workspaces/{workspaceId}/resume`, `GET /workspaces?state=HALTED`) driven
through the Lambda handler with HTTP API (payload 2.0) events, against the table and queue of template.yaml in moto
(in-process and moto's server)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from agent_jobs import resume as resume_module
from agent_jobs.guard import FailOutcome
from agent_jobs.models import DrainMarker, JobStatus, WorkspaceState
from enqueue_api import app
from tests.conftest import Stack, enqueue, make_job, make_message
from tests.integration.test_enqueue_api import Api, ApiResponse, _with_claims, load_event, use_environment
from tests.integration.test_workspace_api import get_event as workspace_get_event

OPERATOR = {"tenant_id": "tenant-1", "scope": "agent-jobs/operator", "sub": "alice"}
AGENT = {"tenant_id": "tenant-1", "scope": "agent-jobs/submit"}


def resume_event(workspace_id: str, body: Any, *, claims: dict[str, str] | None = OPERATOR) -> dict[str, Any]:
    """events/http_post_job.json turned into `POST /workspaces/{workspaceId}/resume`."""
    event = load_event("http_post_job.json")
    event["requestContext"]["requestId"] = uuid.uuid4().hex
    event["routeKey"] = event["requestContext"]["routeKey"] = "POST /workspaces/{workspaceId}/resume"
    event["rawPath"] = event["requestContext"]["http"]["path"] = f"/workspaces/{workspace_id}/resume"
    event["pathParameters"] = {"workspaceId": workspace_id}
    text = json.dumps(body)
    event["headers"]["content-length"] = str(len(text.encode()))
    event["body"] = text
    return _with_claims(event, claims)


def list_event(query: dict[str, str], *, claims: dict[str, str] | None = AGENT) -> dict[str, Any]:
    """events/http_get_job.json turned into `GET /workspaces?...`."""
    event = load_event("http_get_job.json")
    event["requestContext"]["requestId"] = uuid.uuid4().hex
    event["routeKey"] = event["requestContext"]["routeKey"] = "GET /workspaces"
    event["rawPath"] = event["requestContext"]["http"]["path"] = "/workspaces"
    event["rawQueryString"] = "&".join(f"{k}={v}" for k, v in query.items())
    event["queryStringParameters"] = query
    event.pop("pathParameters", None)
    return _with_claims(event, claims)


class ResumeApi(Api):
    def resume(self, workspace_id: str, decision: str, halting: str, **kwargs: Any) -> ApiResponse:
        return self.invoke(resume_event(workspace_id, {"decision": decision, "haltingJobId": halting}, **kwargs))

    def halted(self, query: dict[str, str] | None = None, **kwargs: Any) -> ApiResponse:
        return self.invoke(list_event({"state": "HALTED", **(query or {})}, **kwargs))


@pytest.fixture
def api(any_stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[ResumeApi]:
    use_environment(monkeypatch, any_stack.env("EnqueueApiFunction"))
    monkeypatch.setattr(app.metrics, "namespace", "AgentJobsTest")
    yield ResumeApi(any_stack)
    app.reset_services()


def halt(stack: Stack, job_id: str, workspace_id: str = "ws-a", tenant_id: str = "tenant-1") -> None:
    """`job_id` DEAD (its body kept) and its workspace halted by it."""
    message = make_message(job_id, workspace_id, tenant_id=tenant_id)
    claim = stack.guard.claim(message, message_id=f"m-{job_id}", sequence_number="100", remaining_ms=60_000)
    assert claim.lease is not None
    body = message.model_dump_json(by_alias=True)
    assert stack.guard.fail(claim.lease, "patch does not apply", permanent=True, body=body) is FailOutcome.DEAD


def park_behind(stack: Stack, job_id: str, workspace_id: str = "ws-a") -> None:
    message = make_message(job_id, workspace_id)
    body = message.model_dump_json(by_alias=True)
    assert stack.guard.park(message, message_id=f"m-{job_id}", sequence_number="200", body=body, reason="halted")


def queued_markers(stack: Stack) -> list[DrainMarker]:
    messages = stack.services.sqs.receive_message(
        QueueUrl=stack.queue_url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], WaitTimeSeconds=0
    ).get("Messages", [])
    return [DrainMarker.model_validate_json(m["Body"]) for m in messages]


def test_resume_retry_is_202_resuming_and_sends_one_drain_marker(api: ResumeApi):
    halt(api.stack, "d1")
    park_behind(api.stack, "p1")
    response = api.resume("ws-a", "retry", "d1")
    assert response.status == 202
    assert response.body["state"] == "RESUMING"
    assert response.body["workspaceId"] == "ws-a"
    assert response.body["haltingJobId"] is None
    assert response.headers["Location"] == "/workspaces/ws-a"
    workspace = api.stack.workspace("ws-a")
    assert [(m.workspace_id, m.resume_id, m.round) for m in queued_markers(api.stack)] == [
        ("ws-a", workspace["resumeId"], 0)
    ]
    assert api.stack.job("d1")["status"] == JobStatus.PARKED
    assert api.stack.job("d1")["history"][-1]["by"] == "alice"  # the token's subject


def test_resume_skip_with_nothing_parked_is_202_active_without_a_marker(api: ResumeApi):
    halt(api.stack, "d1")
    response = api.resume("ws-a", "skip", "d1")
    assert response.status == 202
    assert response.body["state"] == "ACTIVE"
    assert queued_markers(api.stack) == []
    assert api.stack.job("d1")["status"] == JobStatus.SKIPPED


def test_resume_repeated_is_202_and_the_same_resume(api: ResumeApi):
    halt(api.stack, "d1")
    first = api.resume("ws-a", "retry", "d1")
    resume_id = api.stack.workspace("ws-a")["resumeId"]
    again = api.resume("ws-a", "retry", "d1")
    assert (first.status, again.status) == (202, 202)
    assert api.stack.workspace("ws-a")["resumeId"] == resume_id
    assert api.stack.workspace("ws-a")["parkedCount"] == 1


def test_resume_conflicts_are_409_and_change_nothing(api: ResumeApi):
    # Given ws-a halted by d1, ws-r halted by a rejected message
    halt(api.stack, "d1")
    assert api.stack.guard.reject(
        message_id="m-r", job_id="r1", workspace_id="ws-r", tenant_id="tenant-1", reason="bad", body="{"
    )
    before = api.stack.workspace("ws-a")

    changed = api.resume("ws-a", "retry", "d0")
    assert changed.status == 409
    assert "d1" in changed.body["message"]
    assert changed.body["workspace"]["haltingJobId"] == "d1"
    rejected = api.resume("ws-r", "retry", "r1")
    assert rejected.status == 409
    assert "skip" in rejected.body["message"]
    assert api.stack.workspace("ws-a") == before
    assert api.stack.workspace("ws-r")["state"] == WorkspaceState.HALTED

    assert api.resume("ws-a", "skip", "d1").status == 202
    not_halted = api.resume("ws-a", "retry", "d1")
    assert not_halted.status == 409
    assert "ACTIVE" in not_halted.body["message"]


def test_resume_without_operator_scope_is_403_and_for_another_tenant_404(api: ResumeApi):
    halt(api.stack, "d1")
    assert api.resume("ws-a", "retry", "d1", claims=AGENT).status == 403
    other = {"tenant_id": "tenant-2", "scope": "agent-jobs/operator"}
    refused = api.resume("ws-a", "retry", "d1", claims=other)
    unknown = api.resume("ws-zz", "retry", "d1", claims=other)
    assert (refused.status, unknown.status) == (404, 404)
    assert refused.body["message"] == unknown.body["message"].replace("ws-zz", "ws-a")
    assert api.stack.workspace("ws-a")["state"] == WorkspaceState.HALTED
    assert queued_markers(api.stack) == []


def test_resume_unknown_workspace_is_404(api: ResumeApi):
    assert api.resume("ws-nowhere", "skip", "x").status == 404


@pytest.mark.parametrize(
    "body",
    [{"decision": "later", "haltingJobId": "d1"}, {"decision": "retry"}, {"decision": "retry", "haltingJobId": ""}],
)
def test_resume_bad_request_is_422(api: ResumeApi, body: dict[str, Any]):
    halt(api.stack, "d1")
    response = api.invoke(resume_event("ws-a", body))
    assert response.status == 422
    assert api.stack.workspace("ws-a")["state"] == WorkspaceState.HALTED


def test_list_halted_shows_the_callers_halted_and_resuming_workspaces(api: ResumeApi):
    halt(api.stack, "d1", "ws-a")
    halt(api.stack, "d2", "ws-b")
    halt(api.stack, "d3", "ws-c")
    halt(api.stack, "o1", "ws-other", tenant_id="tenant-2")
    assert api.resume("ws-b", "retry", "d2").status == 202
    assert api.resume("ws-c", "skip", "d3").status == 202

    response = api.halted()
    assert response.status == 200
    assert {(w["workspaceId"], w["state"], w["haltingJobId"]) for w in response.body["workspaces"]} == {
        ("ws-a", "HALTED", "d1"),
        ("ws-b", "RESUMING", None),
    }
    assert response.body["nextToken"] is None

    first = api.halted({"limit": "1"})
    assert len(first.body["workspaces"]) == 1
    token = first.body["nextToken"]
    assert token
    rest = api.halted({"limit": "1", "nextToken": token})
    seen = {w["workspaceId"] for w in first.body["workspaces"] + rest.body["workspaces"]}
    assert seen == {"ws-a", "ws-b"}
    # a page token does not open another tenant's list
    assert api.halted({"nextToken": token}, claims={"tenant_id": "tenant-2"}).status == 400


def test_every_answer_showing_a_workspace_names_the_last_applied_job_as_reading_it_does(api: ResumeApi):
    # Given t1..t6 applied on ws-a, then d1 DEAD halting it
    enqueue(api.stack, *(make_job(f"t{n}", "ws-a") for n in range(1, 7)), tenant_id="tenant-1")
    for n in range(1, 7):
        claim = api.stack.guard.claim(
            make_message(f"t{n}", "ws-a"),
            message_id=f"m-t{n}",
            sequence_number=api.stack.job(f"t{n}", "tenant-1")["sequenceNumber"],  # the copy at the job's place
            remaining_ms=60_000,
        )
        assert claim.lease is not None
        assert api.stack.guard.complete(claim.lease, {"commit": "c" * 40})
    halt(api.stack, "d1")
    read = api.invoke(workspace_get_event("ws-a", claims=OPERATOR))
    assert (read.status, read.body["lastAppliedJobId"]) == (200, "t6")

    # When the operator lists the halted workspaces, decides a job that does not halt it, then skips d1
    (listed,) = api.halted().body["workspaces"]
    refused = api.resume("ws-a", "skip", "t6")
    resumed = api.resume("ws-a", "skip", "d1")

    # Then every answer names the job that reading the workspace names
    assert (refused.status, resumed.status) == (409, 202)
    assert resumed.body["lastAppliedJobId"] == "t6"
    assert refused.body["workspace"]["lastAppliedJobId"] == "t6"
    assert listed["lastAppliedJobId"] == "t6"
    assert api.invoke(workspace_get_event("ws-a", claims=OPERATOR)).body == resumed.body


@pytest.mark.parametrize("query", [{"state": "ACTIVE"}, {"state": "HALTED", "limit": "0"}])
def test_list_halted_bad_query_is_422(api: ResumeApi, query: dict[str, str]):
    response = api.invoke(list_event({"state": "HALTED", **query}))
    assert response.status == 422


def test_list_halted_token_it_did_not_issue_is_400_as_on_every_listing(api: ResumeApi):
    response = api.invoke(list_event({"state": "HALTED", "nextToken": "%%%"}))
    assert response.status == 400
    assert "the nextToken is not one this API issued for your list of halted workspaces" in response.body["message"]


def test_resume_whose_marker_was_not_sent_can_be_repeated_from_what_the_api_shows(
    api: ResumeApi, monkeypatch: pytest.MonkeyPatch
):
    # Given a resume whose transaction succeeded and whose drain marker could not be sent
    halt(api.stack, "d1")
    park_behind(api.stack, "p1")
    real_send, queue_down = resume_module.send_drain_marker, {"now": True}

    def send(*args: Any, **kwargs: Any) -> str:
        if queue_down["now"]:
            raise ClientError({"Error": {"Code": "ServiceUnavailable", "Message": "down"}}, "SendMessage")
        return real_send(*args, **kwargs)

    monkeypatch.setattr(resume_module, "send_drain_marker", send)
    assert api.resume("ws-a", "retry", "d1").status == 503
    queue_down["now"] = False

    # When an operator repeats the resume from what the API shows of the workspace
    (view,) = api.halted().body["workspaces"]
    assert view["state"] == "RESUMING"
    assert view["haltingJobId"] is None  # the resume cleared the halt; lastResume names the decision under way
    assert (view["lastResume"]["decision"], view["lastResume"]["haltingJobId"]) == ("retry", "d1")
    assert view["lastResume"]["by"] == "alice"
    again = api.resume("ws-a", view["lastResume"]["decision"], view["lastResume"]["haltingJobId"])

    # Then the marker is sent
    assert again.status == 202
    assert [marker.workspace_id for marker in queued_markers(api.stack)] == ["ws-a"]


def test_resume_with_another_undecided_halting_job_is_202_halted_by_it_and_sends_no_marker(api: ResumeApi):
    # Given ws-a halted by d1, p1 parked, and a message rejected while ws-a was halted (first halt wins: d1 stays)
    halt(api.stack, "d1")
    park_behind(api.stack, "p1")
    assert api.stack.guard.reject(
        message_id="m-x", job_id=None, workspace_id="ws-a", tenant_id="tenant-1", reason="bad", body="{"
    )

    # When the operator retries d1
    response = api.resume("ws-a", "retry", "d1")

    # Then d1 is decided, and the answer shows the workspace still HALTED by the rejected message: nothing drains
    assert response.status == 202
    assert (response.body["state"], response.body["haltingJobId"]) == ("HALTED", "msg#m-x")
    assert (response.body["lastResume"]["decision"], response.body["lastResume"]["haltingJobId"]) == ("retry", "d1")
    assert queued_markers(api.stack) == []
    assert api.stack.job("d1")["status"] == JobStatus.PARKED
    # and repeating d1's decision says what to decide next
    repeated = api.resume("ws-a", "retry", "d1")
    assert repeated.status == 409
    assert "decide that job next" in repeated.body["message"]
    # and once the message is skipped, the resume begins and its marker is sent
    last = api.resume("ws-a", "skip", "msg#m-x")
    assert (last.status, last.body["state"]) == (202, "RESUMING")
    assert [marker.workspace_id for marker in queued_markers(api.stack)] == ["ws-a"]
