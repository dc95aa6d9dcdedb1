"""The status API: a workspace's timeline (`GET /workspaces/{workspaceId}/jobs`) and its `lastAppliedJobId`, driven
through the Lambda handler with HTTP API events against the table of template.yaml in moto (in-process and server)."""

from __future__ import annotations

import base64
import json
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from agent_jobs.guard import AcceptOutcome, JobGuard, wire
from agent_jobs.keys import job_key
from agent_jobs.models import JobStatus, job_message
from enqueue_api import app
from tests.conftest import ManualClock, Stack, make_job, register_workspace
from tests.integration.test_batch_enqueue import batch_event
from tests.integration.test_enqueue_api import ApiResponse, job_body, use_environment
from tests.integration.test_workspace_api import REMOTES_ROOT, WorkspaceApi, _at_workspace, get_event

OWNER = {"tenant_id": "tenant-a"}
OTHER = {"tenant_id": "tenant-b"}


def timeline_event(workspace_id: str, claims: dict[str, str] | None, query: Mapping[str, str]) -> dict[str, Any]:
    """`GET /workspaces/{workspaceId}/jobs` as API Gateway sends it, with the given query parameters."""
    event = get_event(workspace_id, claims=claims)
    event = _at_workspace(event, workspace_id, "GET")
    event["routeKey"] = event["requestContext"]["routeKey"] = "GET /workspaces/{workspaceId}/jobs"
    event["rawPath"] = event["requestContext"]["http"]["path"] = f"/workspaces/{workspace_id}/jobs"
    event["rawQueryString"] = urllib.parse.urlencode(query)
    if query:
        event["queryStringParameters"] = dict(query)
    return event


class TimelineApi(WorkspaceApi):
    def __init__(self, stack: Stack) -> None:
        super().__init__(stack)
        self.clock = ManualClock()
        # A producer whose clock the test moves: acceptedAt is the order of the timeline.
        self.producer_guard = JobGuard(stack.services.dynamodb, stack.table_name, clock=self.clock)

    def timeline(self, workspace_id: str = "repo-alpha", claims: dict[str, str] | None = None, **query: str) -> Any:
        return self.invoke(timeline_event(workspace_id, OWNER if claims is None else claims, query))

    def submit(
        self, *job_ids: str, workspace_id: str = "repo-alpha", tenant: str = "tenant-a", step: float = 1
    ) -> None:
        """Record jobs as the producer does before sending them (the timeline reads the records, not the queue), the
        workspace registered for `tenant` first unless it is registered."""
        register_workspace(self.stack, workspace_id, tenant)
        for job_id in job_ids:
            self.clock.advance(step)
            message = job_message(make_job(job_id, workspace_id), tenant)
            accepted = self.producer_guard.record_accepted(message)
            if tenant != "tenant-a" and accepted.outcome is AcceptOutcome.WORKSPACE_FORBIDDEN:
                # Enqueue refuses another tenant's job for a registered workspace; such records exist only from before
                # the registration, so write one as the producer did then.
                self.stack.services.dynamodb.put_item(
                    TableName=self.stack.table_name,
                    Item=wire(
                        {
                            "pk": job_key(tenant, job_id),
                            "jobId": job_id,
                            "workspaceId": workspace_id,
                            "tenantId": tenant,
                            "type": str(message.type),
                            "payloadHash": message.payload_hash,
                            "status": "QUEUED",
                            "attempt": 0,
                            "acceptedAt": self.clock(),
                            "updatedAt": self.clock(),
                        }
                    ),
                )
                continue
            assert accepted.outcome is AcceptOutcome.NEW

    def apply(self, job_id: str, workspace_id: str = "repo-alpha", *, sequence_number: str) -> None:
        """What the worker records for a job that took effect: its claim and its completion."""
        message = job_message(make_job(job_id, workspace_id), "tenant-a")
        claim = self.stack.guard.claim(
            message, message_id=f"m-{job_id}", sequence_number=sequence_number, remaining_ms=60_000
        )
        assert claim.lease is not None
        assert self.stack.guard.complete(claim.lease, {"commit": "c" * 40})

    def all_pages(self, workspace_id: str = "repo-alpha", **query: str) -> list[list[str]]:
        pages: list[list[str]] = []
        token: str | None = None
        while True:
            extra = {"nextToken": token} if token else {}
            response = self.invoke(timeline_event(workspace_id, OWNER, {**query, **extra}))
            assert response.status == 200, response.body
            pages.append([job["jobId"] for job in response.body["jobs"]])
            token = response.body["nextToken"]
            if token is None:
                return pages


def _timeline_api(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[TimelineApi]:
    use_environment(monkeypatch, {**stack.env("EnqueueApiFunction"), "WORKSPACES_REMOTE_ROOT": REMOTES_ROOT})
    monkeypatch.setattr(app.metrics, "namespace", "AgentJobsTest")
    timeline_api = TimelineApi(stack)
    timeline_api.put(claims=OWNER)  # repo-alpha, registered by tenant-a
    yield timeline_api
    app.reset_services()


@pytest.fixture
def api(any_stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[TimelineApi]:
    """The API on moto in-process and on moto's server (the index queries cross HTTP there)."""
    yield from _timeline_api(any_stack, monkeypatch)


@pytest.fixture
def server_api(server_stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[TimelineApi]:
    """The API on moto's server only: for the many cases of input checking, which do not depend on the store."""
    yield from _timeline_api(server_stack, monkeypatch)


def token_document(token: str) -> dict[str, Any]:
    return json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))  # type: ignore[no-any-return]


def encode(document: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(document).encode()).decode().rstrip("=")


# ---- order and pagination ------------------------------------------------------------------------------------------


def test_timeline_lists_jobs_oldest_accepted_first_with_public_fields(api: TimelineApi) -> None:
    api.submit("job-c", "job-a", "job-b")

    response = api.timeline()

    assert response.status == 200
    assert [job["jobId"] for job in response.body["jobs"]] == ["job-c", "job-a", "job-b"]
    assert all(set(job) == set(app.PUBLIC_JOB_FIELDS) for job in response.body["jobs"])
    assert {job["status"] for job in response.body["jobs"]} == {JobStatus.QUEUED}
    assert response.body["nextToken"] is None


def test_timeline_pages_cover_every_job_once_in_order(api: TimelineApi) -> None:
    expected = [f"job-{n:02}" for n in range(7)]
    api.submit(*expected)

    pages = api.all_pages(limit="3")

    assert [job for page in pages for job in page] == expected
    assert [len(page) for page in pages[:3]] == [3, 3, 1]
    assert all(page == [] for page in pages[3:])  # at most an empty last page after a full one


def test_timeline_pages_through_jobs_accepted_in_the_same_millisecond(api: TimelineApi) -> None:
    # Given five jobs with the same acceptedAt (ties are possible on the producer's clock)
    api.submit("tie-1")
    api.submit("tie-2", "tie-3", "tie-4", "tie-5", step=0)

    pages = api.all_pages(limit="2")

    listed = [job for page in pages for job in page]
    assert sorted(listed) == ["tie-1", "tie-2", "tie-3", "tie-4", "tie-5"]  # each exactly once
    assert listed[0] == "tie-1"


def test_timeline_lists_a_batchs_jobs_in_the_order_the_queue_took_them_across_pages(api: TimelineApi) -> None:
    # Given a batch of ten jobs, whose jobIds sort otherwise as text (c1, c10, c2, ...)
    job_ids = [f"c{n}" for n in range(1, 11)]
    response = api.invoke(batch_event({"jobs": [job_body(job_id, "repo-alpha") for job_id in job_ids]}, claims=OWNER))
    assert [result["statusCode"] for result in response.body["results"]] == [202] * 10
    queue_order = [
        result["jobId"] for result in sorted(response.body["results"], key=lambda r: int(r["sequenceNumber"]))
    ]
    assert queue_order == job_ids  # the queue takes a batch's jobs of one workspace in the order of the request

    # When the timeline is read a few jobs at a time
    pages = api.all_pages(limit="3")

    # Then it lists them as the queue took them, which is the order they take effect in
    assert [job for page in pages for job in page] == job_ids


def test_timeline_default_limit_is_25(api: TimelineApi) -> None:
    api.submit(*(f"job-{n:02}" for n in range(27)))

    first = api.timeline()
    rest = api.timeline(nextToken=first.body["nextToken"])

    assert len(first.body["jobs"]) == 25
    assert [job["jobId"] for job in rest.body["jobs"]] == ["job-25", "job-26"]


def test_timeline_lists_only_the_callers_jobs_of_its_workspace(api: TimelineApi) -> None:
    # Given jobs of another tenant that name this workspace, between the owner's jobs, and jobs of another workspace
    api.submit("mine-1")
    api.submit("theirs-1", "theirs-2", tenant="tenant-b")
    api.submit("mine-2")
    api.submit("elsewhere-1", workspace_id="repo-beta")

    pages = api.all_pages(limit="1")

    assert [job for page in pages for job in page] == ["mine-1", "mine-2"]


def test_timeline_shows_each_jobs_state(api: TimelineApi) -> None:
    api.submit("job-1", "job-2")
    api.apply("job-1", sequence_number="00000000000000000001")

    jobs = api.timeline().body["jobs"]

    assert [(job["jobId"], job["status"]) for job in jobs] == [("job-1", "SUCCEEDED"), ("job-2", "QUEUED")]
    assert jobs[0]["result"] == {"commit": "c" * 40}


# ---- limit and nextToken -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", ["0", "101", "-1", "abc", "1.5", "2,3", "0001", "\u0661"])
def test_timeline_limit_outside_1_to_100_is_422_naming_the_rule(server_api: TimelineApi, limit: str) -> None:
    response = server_api.timeline(limit=limit)

    assert response.status == 422
    assert "from 1 to 100" in response.field_errors()["limit"]


@pytest.mark.parametrize("limit", ["1", "100"])
def test_timeline_limit_bounds_are_accepted(server_api: TimelineApi, limit: str) -> None:
    assert server_api.timeline(limit=limit).status == 200


def test_timeline_token_of_another_workspace_is_400(api: TimelineApi) -> None:
    api.put("repo-beta", claims=OWNER)
    api.submit("beta-1", "beta-2", workspace_id="repo-beta")
    token = api.timeline("repo-beta", limit="1").body["nextToken"]
    assert token

    response = api.timeline("repo-alpha", nextToken=token)

    assert response.status == 400
    assert "nextToken" in response.body["message"]
    assert "leave it out to start from the oldest job" in response.body["message"]


def _a_token(api: TimelineApi) -> str:
    api.submit("job-1", "job-2")
    token = api.timeline(limit="1").body["nextToken"]
    assert token
    return str(token)


@pytest.mark.parametrize(
    "tamper",
    [
        lambda token: token[:-3],
        lambda token: token + "!",
        lambda token: "not a token",
        lambda token: "A" * 3000,
        lambda token: encode({**token_document(token), "ws": "repo-beta"}),
        lambda token: encode({**token_document(token), "at": "12"}),
        lambda token: encode({**token_document(token), "at": True}),
        lambda token: encode({**token_document(token), "pk": 5}),
        lambda token: encode({**token_document(token), "pk": ""}),
        lambda token: encode({**token_document(token), "v": 2}),
        lambda token: encode({**token_document(token), "extra": 1}),
        lambda token: encode([token_document(token)]),
    ],
    ids=[
        "truncated",
        "not-base64url",
        "spaces",
        "too-long",
        "other-workspace",
        "string-position",
        "boolean-position",
        "number-key",
        "empty-key",
        "other-version",
        "extra-field",
        "array",
    ],
)
def test_timeline_tampered_token_is_400_never_a_server_error(server_api: TimelineApi, tamper: Any) -> None:
    response = server_api.timeline(nextToken=tamper(_a_token(server_api)))

    assert response.status == 400
    assert "the nextToken is not one this API issued for workspace 'repo-alpha'" in response.body["message"]


def test_timeline_token_is_opaque_base64url_bound_to_the_workspace(server_api: TimelineApi) -> None:
    token = _a_token(server_api)

    assert set(token) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert token_document(token)["ws"] == "repo-alpha"


# ---- tenancy -------------------------------------------------------------------------------------------------------


def test_timeline_of_another_tenants_workspace_is_404(api: TimelineApi) -> None:
    api.submit("job-1")

    response = api.timeline(claims=OTHER)

    assert response.status == 404
    assert "another tenant" not in response.body["message"]
    assert "jobs" not in response.body


def test_timeline_of_an_unknown_workspace_is_404(api: TimelineApi) -> None:
    response = api.timeline("repo-unknown")

    assert response.status == 404
    assert "PUT /workspaces/repo-unknown" in response.body["message"]


def test_timeline_malformed_workspace_id_is_422(server_api: TimelineApi) -> None:
    response = server_api.timeline("-bad")

    assert response.status == 422
    assert "workspaceId" in response.field_errors()


# ---- lastAppliedJobId ----------------------------------------------------------------------------------------------


def read(api: TimelineApi, workspace_id: str = "repo-alpha") -> ApiResponse:
    return api.read(workspace_id, claims=OWNER)


def test_last_applied_job_is_null_until_a_job_succeeds(api: TimelineApi) -> None:
    api.submit("job-1")

    response = read(api)

    assert response.status == 200
    assert response.body["lastAppliedJobId"] is None


def test_last_applied_job_is_the_newest_succeeded_job(api: TimelineApi) -> None:
    # Given two applied jobs and a later one still queued
    api.submit("job-1", "job-2", "job-3")
    api.apply("job-1", sequence_number="00000000000000000001")
    api.apply("job-2", sequence_number="00000000000000000002")

    assert read(api).body["lastAppliedJobId"] == "job-2"


def test_last_applied_job_follows_the_queue_order_when_acceptance_times_disagree(api: TimelineApi) -> None:
    # Given two jobs whose producers' clocks put them in the other order than the queue ran them
    api.submit("accepted-first", "accepted-second")
    api.apply("accepted-second", sequence_number="00000000000000000001")
    api.apply("accepted-first", sequence_number="00000000000000000002")

    assert read(api).body["lastAppliedJobId"] == "accepted-first"


def test_last_applied_job_ignores_other_tenants_jobs_in_the_workspace(api: TimelineApi) -> None:
    api.submit("job-1")
    api.apply("job-1", sequence_number="00000000000000000001")
    api.submit("theirs-1", tenant="tenant-b")
    message = job_message(make_job("theirs-1", "repo-alpha"), "tenant-b")
    claim = api.stack.guard.claim(message, message_id="m-x", sequence_number="00000000000000000009", remaining_ms=1000)
    assert claim.lease is not None
    api.stack.guard.complete(claim.lease, {})

    assert read(api).body["lastAppliedJobId"] == "job-1"


def test_last_applied_job_is_found_behind_many_newer_jobs(api: TimelineApi) -> None:
    # Given an applied job followed by more than one page (100) of queued jobs
    api.submit("applied")
    api.apply("applied", sequence_number="00000000000000000001")
    api.submit(*(f"queued-{n:03}" for n in range(120)))

    assert read(api).body["lastAppliedJobId"] == "applied"


def test_timeline_store_unavailable_is_503_with_retry_after(
    server_api: TimelineApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a store the function cannot reach (its table is gone)
    monkeypatch.setenv("TABLE_NAME", "no-such-table")
    app.reset_services()

    response = server_api.timeline()

    assert response.status == 503
    assert response.headers["Retry-After"] == "2"
    assert "retry the same request" in response.body["message"]
    # a read is told that retrying is harmless, not about jobIds or registering
    assert "reading changes nothing" in response.body["message"]
