"""The local HTTP API: real HTTP requests, served by the producer's real handler through API Gateway's event shape, on
the queue and table of template.yaml in the emulator."""

from __future__ import annotations

import base64
import json
import logging
import socket
import struct
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agent_jobs_local.api_server import HttpRoute, LocalApiServer, http_api_routes
from agent_jobs_local.auth import mint_token
from enqueue_api import app
from tests.conftest import Stack, register_workspace

EVENTS = Path(__file__).resolve().parents[2] / "events"
PATCH = "--- a/f\n+++ b/f\n@@ -0,0 +1 @@\n+x\n"


def job_body(job_id: str, workspace_id: str = "ws-a") -> dict[str, Any]:
    return {
        "jobId": job_id,
        "workspaceId": workspace_id,
        "type": "apply_patch",
        "payload": {"patch": PATCH, "commitMessage": f"change for {job_id}"},
    }


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: Any


@dataclass
class Api:
    server: LocalApiServer
    events: list[dict[str, Any]] = field(default_factory=list)
    # Sent as the Authorization header unless a request names its own (the API's authorizer needs one).
    token: str = field(default_factory=lambda: mint_token("default"))

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> Answer:
        headers = {"Authorization": f"Bearer {self.token}", **(headers or {})}
        request = urllib.request.Request(f"{self.server.url}{path}", data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, raw, response_headers = response.status, response.read(), response.headers
        except urllib.error.HTTPError as error:
            status, raw, response_headers = error.code, error.read(), error.headers
        return Answer(status, {k.lower(): v for k, v in response_headers.items()}, json.loads(raw) if raw else None)

    def post_job(self, body: Any, **headers: str) -> Answer:
        return self.request("POST", "/jobs", json.dumps(body).encode(), {"Content-Type": "application/json", **headers})


@pytest.fixture
def api(server_stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    """The producer's handler, with the environment template.yaml gives it, behind a LocalApiServer; every event it
    receives is kept."""
    for name, value in server_stack.env("EnqueueApiFunction").items():
        monkeypatch.setenv(name, value)
    app.reset_services()
    # A warm environment: these tests check what the server hands the handler and makes of its answer, and a cold
    # build of the clients on a busy machine must not run a refused request past the function's Timeout.
    app.services()
    register_workspace(server_stack, "ws-a", "default")  # the jobs' workspace, registered by the token's tenant
    events: list[dict[str, Any]] = []

    def handler(event: dict[str, Any], context: Any) -> Any:
        events.append(json.loads(json.dumps(event)))
        return app.lambda_handler(event, context)

    server = LocalApiServer(server_stack.model, handler).start()
    try:
        yield Api(server, events)
    finally:
        server.stop()
        app.reset_services()


def key_shape(value: Any) -> Any:
    """The keys at each level of a JSON document, values ignored (the headers' names are data, not shape)."""
    if isinstance(value, dict):
        return {key: (None if key in ("headers",) else key_shape(item)) for key, item in value.items()}
    return None


def test_api_server_routes_come_from_the_template(server_stack: Stack) -> None:
    routes = http_api_routes(server_stack.model)
    assert {route.route_key for route in routes} == {
        "POST /jobs",
        "POST /jobs:batch",
        "GET /jobs/{jobId}",
        "PUT /workspaces/{workspaceId}",
        "GET /workspaces/{workspaceId}",
        "GET /workspaces/{workspaceId}/jobs",
        "GET /openapi.json",
        "POST /workspaces/{workspaceId}/resume",
        "GET /workspaces",
    }
    assert {route.function_id for route in routes} == {"EnqueueApiFunction"}


def test_api_server_post_job_batch_takes_the_route_with_a_colon(api: Api, server_stack: Stack) -> None:
    body = {"jobs": [job_body("job-b1"), job_body("job-b2")]}

    answer = api.request("POST", "/jobs:batch", json.dumps(body).encode(), {"Content-Type": "application/json"})

    assert answer.status == 200
    assert [(r["jobId"], r["statusCode"]) for r in answer.body["results"]] == [("job-b1", 202), ("job-b2", 202)]
    assert (api.events[-1]["routeKey"], api.events[-1]["rawPath"]) == ("POST /jobs:batch", "/jobs:batch")
    records = server_stack.receive()["Records"]
    assert [json.loads(r["body"])["jobId"] for r in records] == ["job-b1", "job-b2"]


def test_api_server_post_job_is_accepted_and_queued(api: Api, server_stack: Stack) -> None:
    answer = api.post_job(job_body("job-http-1"))

    assert answer.status == 202
    assert answer.headers["location"] == "/jobs/job-http-1"
    assert answer.headers["content-type"] == "application/json"
    assert answer.body["jobId"] == "job-http-1"
    records = server_stack.receive()["Records"]
    assert [json.loads(r["body"])["jobId"] for r in records] == ["job-http-1"]
    assert records[0]["attributes"]["MessageGroupId"] == "ws#ws-a"


def test_api_server_get_job_reads_it_back(api: Api) -> None:
    api.post_job(job_body("job-http-2"))

    answer = api.request("GET", "/jobs/job-http-2")

    assert answer.status == 200
    assert answer.body["jobId"] == "job-http-2"
    assert answer.body["status"] == "QUEUED"
    assert api.events[-1]["pathParameters"] == {"jobId": "job-http-2"}
    assert api.events[-1]["routeKey"] == "GET /jobs/{jobId}"


def test_api_server_malformed_json_is_the_handlers_400(api: Api, server_stack: Stack) -> None:
    answer = api.request("POST", "/jobs", b'{"jobId": ', {"Content-Type": "application/json"})

    assert answer.status == 400
    assert answer.body["message"].startswith("the request body is not valid JSON")
    assert server_stack.queue_depth() == 0


@pytest.mark.parametrize(("method", "path"), [("GET", "/nothing-here"), ("DELETE", "/jobs"), ("GET", "/jobs/a/b")])
def test_api_server_unknown_route_is_404(api: Api, method: str, path: str) -> None:
    answer = api.request(method, path)

    assert answer.status == 404
    assert answer.body == {"message": "Not Found"}
    assert api.events == []


def test_api_server_events_have_api_gateways_shape(api: Api) -> None:
    # Given the sample events of `sam local invoke -e`, shaped as API Gateway sends them
    sample_post = json.loads((EVENTS / "http_post_job.json").read_text())
    sample_get = json.loads((EVENTS / "http_get_job.json").read_text())

    # When the same requests arrive over HTTP
    client_headers = {"User-Agent": "agent-jobs-client/1.0", "Accept": "application/json"}
    api.post_job(job_body("job-shape"), **client_headers)
    api.request("GET", "/jobs/job-shape", headers=client_headers)
    post_event, get_event = api.events

    # Then the events have the same keys at every level
    assert key_shape(post_event) == key_shape(sample_post)
    assert key_shape(get_event) == key_shape(sample_get)
    # (urllib also sends Accept-Encoding; Connection is hop-by-hop, which a proxy such as API Gateway drops)
    assert set(post_event["headers"]) - {"accept-encoding"} == set(sample_post["headers"])
    assert set(get_event["headers"]) - {"accept-encoding"} == set(sample_get["headers"])
    assert post_event["requestContext"]["http"]["userAgent"] == "agent-jobs-client/1.0"
    assert post_event["requestContext"]["stage"] == "$default"
    assert post_event["isBase64Encoded"] is False
    assert json.loads(post_event["body"])["jobId"] == "job-shape"


def test_api_server_event_carries_query_cookies_and_repeated_headers(api: Api) -> None:
    api.request(
        "GET",
        "/jobs/job-q?b=2&a=1&a=3",
        headers={"Cookie": "session=abc; theme=dark", "X-Agent": "one"},
    )

    event = api.events[-1]
    assert event["rawPath"] == "/jobs/job-q"
    assert event["rawQueryString"] == "b=2&a=1&a=3"
    assert event["queryStringParameters"] == {"a": "1,3", "b": "2"}
    assert event["cookies"] == ["session=abc", "theme=dark"]
    assert "cookie" not in event["headers"]
    assert event["headers"]["x-agent"] == "one"
    assert all(name == name.lower() for name in event["headers"])


def test_api_server_binary_body_is_base64_encoded(api: Api) -> None:
    payload = bytes(range(256))

    answer = api.request("POST", "/jobs", payload, {"Content-Type": "application/octet-stream"})

    event = api.events[-1]
    assert event["isBase64Encoded"] is True
    assert base64.b64decode(event["body"]) == payload
    assert answer.status == 415


def test_api_server_authorizer_hook_gives_the_claims_to_the_handler(server_stack: Stack, api: Api) -> None:
    # Given an authorizer that verified a token for tenant-x
    api.server.authorizer_claims = lambda headers: {"tenant_id": "tenant-x"} if "authorization" in headers else None
    register_workspace(server_stack, "ws-x", "tenant-x")

    answer = api.post_job(job_body("job-claims", "ws-x"), Authorization="Bearer token")

    assert answer.status == 202
    assert api.events[-1]["requestContext"]["authorizer"] == {
        "jwt": {"claims": {"tenant_id": "tenant-x"}, "scopes": None}
    }
    assert server_stack.job("job-claims")["tenantId"] == "tenant-x"


def test_api_server_handler_exception_is_api_gateways_500(server_stack: Stack) -> None:
    def broken(event: dict[str, Any], context: Any) -> dict[str, Any]:
        raise RuntimeError("boom")

    with LocalApiServer(server_stack.model, broken) as server:
        request = urllib.request.Request(
            f"{server.url}/jobs", data=b"{}", method="POST", headers={"Authorization": mint_token("default")}
        )
        with pytest.raises(urllib.error.HTTPError) as raised:
            urllib.request.urlopen(request, timeout=10)

    assert raised.value.code == 500
    assert json.loads(raised.value.read()) == {"message": "Internal Server Error"}


def test_api_server_answers_a_response_as_api_gateway_writes_it(server_stack: Stack) -> None:
    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        return {
            "statusCode": 201,
            "headers": {"X-Remaining-Ms": str(context.get_remaining_time_in_millis())},
            "cookies": ["a=1; Path=/", "b=2"],
            "body": base64.b64encode(b"\x00\x01raw").decode(),
            "isBase64Encoded": True,
        }

    with LocalApiServer(server_stack.model, handler) as server:
        request = urllib.request.Request(
            f"{server.url}/jobs", data=b"{}", method="POST", headers={"Authorization": mint_token("default")}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            status, body, headers = response.status, response.read(), response.headers

    assert status == 201
    assert body == b"\x00\x01raw"
    assert headers.get_all("Set-Cookie") == ["a=1; Path=/", "b=2"]
    timeout_ms = server_stack.model.function_settings("EnqueueApiFunction").timeout_seconds * 1000
    assert 0 < int(headers["X-Remaining-Ms"]) <= timeout_ms


def test_api_server_route_matching_prefers_the_most_specific() -> None:
    exact = HttpRoute("F", "a", "GET", "/jobs/latest")
    variable = HttpRoute("F", "b", "GET", "/jobs/{jobId}")
    greedy = HttpRoute("F", "c", "ANY", "/{proxy+}")
    ordered = sorted([greedy, variable, exact], key=HttpRoute.specificity, reverse=True)

    assert ordered == [exact, variable, greedy]
    assert variable.match("GET", "/jobs/j-1") == {"jobId": "j-1"}
    assert variable.match("POST", "/jobs/j-1") is None
    assert greedy.match("DELETE", "/a/b/c") == {"proxy": "a/b/c"}


class _Records(logging.Handler):
    """The records of one logger, with an event set at the first."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.first = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.first.set()


def test_api_server_logs_a_client_that_hung_up_in_one_line(
    server_stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    invoked, release = threading.Event(), threading.Event()

    def slow(event: dict[str, Any], context: Any) -> dict[str, Any]:
        invoked.set()
        release.wait(30)
        return {"statusCode": 202, "body": "{}"}

    records = _Records()
    server_logger = logging.getLogger("agent_jobs_local.api_server")
    server_logger.addHandler(records)
    try:
        with LocalApiServer(server_stack.model, slow) as server:
            # Given a request whose client hangs up (a reset, as a killed curl's) while the function runs
            client = socket.create_connection((server.host, server.port), timeout=10)
            client.sendall(
                f"POST /jobs HTTP/1.1\r\nHost: x\r\nAuthorization: {mint_token('default')}\r\n"
                "Content-Length: 2\r\n\r\n{}".encode()
            )
            assert invoked.wait(30)
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
            release.set()
            # When the server writes the answer
            assert records.first.wait(30), "no log line about the client that hung up"
    finally:
        server_logger.removeHandler(records)

    # Then the log says so in one line, and no traceback is printed
    (record,) = records.records
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert message.startswith("client 127.0.0.1 hung up before the answer to POST /jobs was written")
    assert "\n" not in message
    assert record.exc_info is None
    assert "Traceback" not in capsys.readouterr().err
