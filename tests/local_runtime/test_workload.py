"""The demo's simulated agents retry what an SDK client retries: no answer at all, 5xx and 429, with the same jobId."""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from agent_jobs_local.workload import NO_ANSWER, Agents, Submissions, WorkloadConfig, _send, make_plan


class QuietHandler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve(handler: type[BaseHTTPRequestHandler]) -> tuple[ThreadingHTTPServer, str]:
    """`handler` served on a free port of 127.0.0.1 by a daemon thread: the server and its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def stop(server: ThreadingHTTPServer) -> None:
    server.shutdown()
    server.server_close()


class FlakyApi:
    """POST /jobs on 127.0.0.1 that resets the connection, then answers 503 with a non-JSON body, then 202, for each
    jobId in turn; records every body it received."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        api = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with api._lock:
                    api.bodies.append(body)
                    seen = sum(1 for b in api.bodies if b["jobId"] == body["jobId"])
                if seen == 1:  # RST instead of an answer, as a proxy or a dying server does
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                    return
                status, payload = (503, b"<html>busy</html>") if seen == 2 else (202, b'{"created": false}')
                self.send_response(status)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server, self.url = serve(Handler)


@pytest.fixture
def flaky_api() -> Iterator[FlakyApi]:
    api = FlakyApi()
    yield api
    stop(api.server)


def test_no_answer_is_reported_as_such() -> None:
    # Given a port nobody listens on
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Then sending to it is an answer of its own, not an exception that ends the agent's thread
    status, answer = _send("POST", f"http://127.0.0.1:{port}/jobs", {"jobId": "j"}, "token")
    assert status == NO_ANSWER
    assert "no answer" in answer["error"]


def test_agents_retry_a_reset_and_a_5xx_with_the_same_job(flaky_api: FlakyApi) -> None:
    # Given a planned workload without injected repeats, and an API that resets, then answers 503, then 202
    config = WorkloadConfig(
        jobs=4, workspaces=2, agents=2, crashes_per_kind=0, slow_jobs=0, raw_redeliveries=0, poison=False
    )
    plan = make_plan(config)
    plan.duplicate_sends.clear()
    plan.lost_responses.clear()
    agents = Agents(plan, flaky_api.url, sqs=None, queue_url="")  # type: ignore[arg-type]  # no raw sends planned

    # When the agents submit every job
    submissions = agents.run()

    # Then every job was accepted, in its workspace's order, after two retries each with the same body
    assert submissions.errors == []
    assert dict(submissions.accepted) == {ws: [job.job_id for job in jobs] for ws, jobs in plan.by_workspace.items()}
    assert submissions.retries_after_errors == 2 * plan.total
    for job in (job for jobs in plan.by_workspace.values() for job in jobs):
        assert [body for body in flaky_api.bodies if body["jobId"] == job.job_id] == [job.body()] * 3


def test_enqueue_p99_compares_the_first_and_the_last_fifth_of_the_requests_in_sending_order() -> None:
    submissions = Submissions()
    # 100 requests recorded out of order: the first 20 sent took 10 ms (one 50 ms), the last 20 took 30 ms
    for n in reversed(range(100)):
        seconds = 0.03 if n >= 80 else 0.01
        submissions.enqueue_latencies.append((float(n), 0.05 if n == 7 else seconds))
    first, last = submissions.enqueue_p99_ms() or (0.0, 0.0)
    assert first == pytest.approx(50)
    assert last == pytest.approx(30)
    assert Submissions().enqueue_p99_ms() is None  # too few requests to say


class QuotaApi:
    """POST /jobs:batch on 127.0.0.1 that answers the last job of each first batch 429 (a job quota), as the API does
    for the jobs beyond the tenant's jobs per second, and every other job 202; records every batch it received."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self._lock = threading.Lock()
        api = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                jobs = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["jobs"]
                job_ids = [job["jobId"] for job in jobs]
                with api._lock:
                    seen = {job_id for batch in api.batches for job_id in batch}
                    api.batches.append(job_ids)
                refused = job_ids[-1] if len(job_ids) > 1 and job_ids[-1] not in seen else None
                results = [
                    {"jobId": job_id, "statusCode": 429, "created": False, "message": "MaxJobsPerSecondPerTenant"}
                    if job_id == refused
                    else {"jobId": job_id, "statusCode": 202, "created": True}
                    for job_id in job_ids
                ]
                payload = json.dumps({"results": results}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(payload)))
                self.send_header("Retry-After", "1")
                self.end_headers()
                self.wfile.write(payload)

        self.server, self.url = serve(Handler)


@pytest.fixture
def quota_api() -> Iterator[QuotaApi]:
    api = QuotaApi()
    yield api
    stop(api.server)


def test_batch_agents_send_a_job_a_quota_refused_again(quota_api: QuotaApi) -> None:
    # Given a batch agent, and an API that answers the last job of its first batch 429
    config = WorkloadConfig(
        jobs=4,
        workspaces=2,
        agents=1,
        batch_agents=1,
        crashes_per_kind=0,
        slow_jobs=0,
        raw_redeliveries=0,
        poison=False,
    )
    plan = make_plan(config)
    plan.duplicate_sends.clear()
    plan.lost_responses.clear()
    agents = Agents(plan, quota_api.url, sqs=None, queue_url="")  # type: ignore[arg-type]  # no raw sends planned

    # When it submits every job
    submissions = agents.run()

    # Then the refused job was sent again on its own and accepted: no job is reported lost
    assert submissions.errors == []
    first, again = quota_api.batches
    assert again == first[-1:]
    assert sorted(job_id for jobs in submissions.accepted.values() for job_id in jobs) == sorted(first)
