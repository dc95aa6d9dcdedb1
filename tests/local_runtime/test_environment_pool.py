"""Execution environments shared by concurrent callers, as Lambda scales a function out: real processes, real HTTP.

The functions here meet at a rendezvous: each invocation leaves a file in a shared folder and waits (up to a few
seconds) until `expected` files are there, answering whether they all came. Invocations run one at a time never meet;
invocations that really run at once do.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from agent_jobs_local.api_server import LocalApiServer
from agent_jobs_local.auth import mint_token
from agent_jobs_local.execution_environment import (
    EnvironmentPool,
    FunctionSpec,
    InvocationResult,
    Outcome,
    lambda_environment,
)
from tests.conftest import Stack

FUNCTION = """
import json, os, time, uuid
from pathlib import Path

def handler(event, context):
    if "body" in event:  # through the HTTP API: the request's body is the instruction
        event = json.loads(event["body"])
    if event.get("crash"):
        os._exit(3)
    time.sleep(event.get("sleep", 0))
    met = False
    if "rendezvous" in event:
        folder = Path(event["rendezvous"])
        (folder / uuid.uuid4().hex).touch()
        deadline = time.monotonic() + event.get("wait", 5)
        while time.monotonic() < deadline and not met:
            met = len(list(folder.iterdir())) >= event["expected"]
            time.sleep(0.02)
    answer = {"pid": os.getpid(), "met": met}
    return {"statusCode": 200, "body": json.dumps(answer)} if "rawPath" in event else answer
"""


def pool_of(tmp_path: Path, *, max_environments: int, timeout_seconds: float = 10) -> EnvironmentPool:
    code_dir = tmp_path / "function"
    code_dir.mkdir(exist_ok=True)
    (code_dir / "rendezvous.py").write_text(FUNCTION)
    environment = lambda_environment(
        {},
        function_id="Rendezvous",
        handler="rendezvous.handler",
        code_dir=code_dir,
        region="us-east-1",
        timeout_seconds=timeout_seconds,
        memory_size_mb=128,
        endpoint_url=None,
    )
    spec = FunctionSpec(
        function_id="Rendezvous", code_dir=code_dir, handler="rendezvous.handler", environment=environment
    )
    return EnvironmentPool(spec, timeout_seconds=timeout_seconds, max_environments=max_environments)


@pytest.fixture
def make_pool(tmp_path: Path) -> Iterator[Callable[..., EnvironmentPool]]:
    pools: list[EnvironmentPool] = []

    def make(**options: Any) -> EnvironmentPool:
        pools.append(pool_of(tmp_path, **options))
        return pools[-1]

    yield make
    for pool in pools:
        pool.close()


def all_at_once(count: int, call: Callable[[], Any]) -> list[Any]:
    with ThreadPoolExecutor(count) as executor:
        return list(executor.map(lambda _: call(), range(count)))


def test_pool_runs_invocations_at_once_each_in_its_own_environment(
    make_pool: Callable[..., EnvironmentPool], tmp_path: Path
) -> None:
    pool = make_pool(max_environments=3)
    meeting = tmp_path / "meeting"
    meeting.mkdir()
    event = {"rendezvous": str(meeting), "expected": 3, "wait": 20}

    results: list[InvocationResult] = all_at_once(3, lambda: pool.invoke(event))

    assert [result.outcome for result in results] == [Outcome.OK] * 3
    assert all(result.response["met"] for result in results), "the three invocations never ran at the same time"
    assert len({result.response["pid"] for result in results}) == 3
    assert pool.cold_starts == 3


def test_pool_never_runs_more_environments_than_its_limit(
    make_pool: Callable[..., EnvironmentPool], tmp_path: Path
) -> None:
    pool = make_pool(max_environments=2)
    meeting = tmp_path / "meeting"
    meeting.mkdir()
    # Three could meet only if a third environment ran beside the first two: they wait briefly and report not met.
    event = {"rendezvous": str(meeting), "expected": 3, "wait": 1}

    results: list[InvocationResult] = all_at_once(4, lambda: pool.invoke(event))

    assert [result.outcome for result in results] == [Outcome.OK] * 4
    assert len({result.response["pid"] for result in results}) == 2
    assert pool.cold_starts == 2
    # The first invocation waited in vain: while it waited, only the other environment's could arrive. (Its
    # partner may meet three when its cold start outlasts the first one's wait on a busy machine.) Three
    # environments at once would let every invocation meet.
    assert [result.response["met"] for result in results].count(False) >= 1


def test_pool_replaces_an_environment_that_timed_out_or_crashed(make_pool: Callable[..., EnvironmentPool]) -> None:
    pool = make_pool(max_environments=1, timeout_seconds=1)
    warm = pool.invoke({})
    assert warm.outcome is Outcome.OK

    timed_out = pool.invoke({"sleep": 30})
    after_timeout = pool.invoke({})
    crashed = pool.invoke({"crash": True})
    after_crash = pool.invoke({})

    assert timed_out.outcome is Outcome.TIMEOUT
    assert "Task timed out" in str(timed_out.error)
    assert crashed.outcome is Outcome.CRASH
    assert after_timeout.outcome is after_crash.outcome is Outcome.OK
    pids = [warm.response["pid"], after_timeout.response["pid"], after_crash.response["pid"]]
    assert len(set(pids)) == 3, "a killed environment was handed out again"
    assert pool.cold_starts == 3  # the first, then one after the timeout and one after the crash


def test_a_closed_pool_refuses_invocations(make_pool: Callable[..., EnvironmentPool]) -> None:
    pool = make_pool(max_environments=1)
    assert pool.invoke({}).outcome is Outcome.OK
    pool.close()
    with pytest.raises(RuntimeError, match="shut down"):
        pool.invoke({})


def post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"{url}/jobs",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {mint_token('default')}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_http_api_serves_requests_at_once_as_lambda_scales_out(
    server_stack: Stack, make_pool: Callable[..., EnvironmentPool], tmp_path: Path
) -> None:
    meeting = tmp_path / "meeting"
    meeting.mkdir()
    pool = make_pool(max_environments=3)
    body = {"rendezvous": str(meeting), "expected": 3, "wait": 20}
    with LocalApiServer(server_stack.model, pool) as server:
        answers = all_at_once(3, lambda: post(server.url, body))

    assert [status for status, _ in answers] == [200] * 3
    assert all(answer["met"] for _, answer in answers), "the API ran its requests one at a time"


def test_http_api_answers_500_when_an_environment_times_out_or_crashes(
    server_stack: Stack, make_pool: Callable[..., EnvironmentPool]
) -> None:
    pool = make_pool(max_environments=2, timeout_seconds=1)
    with LocalApiServer(server_stack.model, pool) as server:
        answers = [post(server.url, {"sleep": 30}), post(server.url, {"crash": True}), post(server.url, {})]

    assert answers[0] == answers[1] == (500, {"message": "Internal Server Error"})
    assert answers[2][0] == 200
