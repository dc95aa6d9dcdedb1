"""Acceptance test of halt, park and resume on the local runtime (moto's server, the API over HTTP, worker processes fed
by the event-source poller, each workspace a registered git remote): a workspace halted by a job that fails until a
fault is cleared keeps receiving jobs while halted and while it resumes; afterwards every one of its jobs took effect
exactly once in the queue's acceptance order, and the other workspaces never waited for it."""

from __future__ import annotations

import functools
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent_jobs_local.auth import OPERATOR_SCOPE, mint_token
from agent_jobs_local.demo import remote_branches
from agent_jobs_local.runtime import LocalRuntime
from agent_jobs_local.workload import create_remote, register_workspaces, remote_path
from tests.conftest import make_job

TENANT = "tenant-1"


@functools.cache
def operator_token() -> str:
    return mint_token(TENANT, scopes=[OPERATOR_SCOPE], ttl_seconds=3600)


def call(method: str, url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """A request of the tenant's operator: a real token of the local development key, verified by the local API."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"content-type": "application/json", "authorization": f"Bearer {operator_token()}"}
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def submit(api_url: str, job_id: str, workspace_id: str) -> None:
    status, answer = call("POST", f"{api_url}/jobs", make_job(job_id, workspace_id).model_dump(by_alias=True))
    assert status == 202, answer


def wait_until(what: str, predicate: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.2)


def test_resume_applies_every_job_of_the_halted_workspace_once_in_order_and_others_never_wait(tmp_path: Path) -> None:
    fault = tmp_path / "remote-refuses-pushes"
    fault.touch()
    with LocalRuntime(
        workspaces_root=tmp_path / "workspaces",
        time_scale=0.02,
        concurrency=3,
        worker_bootstrap="tests.system.resume_faults:install",
        bootstrap_config={"failing_job": "a-00", "fault_file": str(fault)},
        # a small drain per marker, so the drain takes several markers while new jobs arrive
        extra_worker_env={"DRAIN_JOBS_PER_MARKER": "3"},
    ) as runtime:
        api = runtime.api_url
        workspaces = ["ws-a", "ws-b", "ws-c"]
        remotes = {ws: create_remote(remote_path(runtime.remotes_root, ws, TENANT), ws) for ws in workspaces}
        register_workspaces(api, remotes, github_api_url="https://api.github.com", tenant_id=TENANT)

        def job(job_id: str) -> Any:
            return call("GET", f"{api}/jobs/{job_id}")[1]

        def workspace(workspace_id: str) -> Any:
            return call("GET", f"{api}/workspaces/{workspace_id}")[1]

        # Given ws-a halted by a-00 (its pushes fail until the fault is cleared), jobs of ws-a behind it, and jobs
        # of ws-b and ws-c sent interleaved with them
        others: list[str] = []
        a_before: list[str] = []
        for n in range(6):
            a_before.append(f"a-{n:02d}")
            submit(api, a_before[-1], "ws-a")
            for ws in ("ws-b", "ws-c"):
                others.append(f"{ws[-1]}-{n:02d}")
                submit(api, others[-1], ws)
        wait_until("ws-a is HALTED by a-00", lambda: workspace("ws-a")["state"] == "HALTED")
        assert workspace("ws-a")["haltingJobId"] == "a-00"
        halted_by = job("a-00")
        assert halted_by["status"] == "DEAD"

        # When more jobs arrive for ws-a and the others while ws-a is halted
        a_halted = [f"a-{n:02d}" for n in range(6, 9)]
        for n, job_id in enumerate(a_halted, start=6):
            submit(api, job_id, "ws-a")
            for ws in ("ws-b", "ws-c"):
                others.append(f"{ws[-1]}-{n:02d}")
                submit(api, others[-1], ws)
        wait_until("ws-a's jobs are parked", lambda: all(job(j)["status"] == "PARKED" for j in a_before[1:] + a_halted))
        wait_until("the other workspaces are done", lambda: all(job(j)["status"] == "SUCCEEDED" for j in others))
        others_done = list(others)
        resume_requested_at = int(time.time() * 1000)
        status, listed = call("GET", f"{api}/workspaces?state=HALTED")
        assert status == 200
        assert [(w["workspaceId"], w["state"], w["haltingJobId"]) for w in listed["workspaces"]] == [
            ("ws-a", "HALTED", "a-00")
        ]

        # and the operator clears the fault and resumes ws-a with a retry of a-00, while agents keep sending jobs
        fault.unlink()
        status, resumed = call("POST", f"{api}/workspaces/ws-a/resume", {"decision": "retry", "haltingJobId": "a-00"})
        assert status == 202, resumed
        assert resumed["state"] == "RESUMING"
        a_during = [f"a-{n:02d}" for n in range(9, 15)]
        for n, job_id in enumerate(a_during, start=9):
            submit(api, job_id, "ws-a")
            for ws in ("ws-b", "ws-c"):
                others.append(f"{ws[-1]}-{n:02d}")
                submit(api, others[-1], ws)
        assert runtime.poller.drain(timeout=180)
        wait_until("ws-a is ACTIVE", lambda: workspace("ws-a")["state"] == "ACTIVE", timeout=60)

        a_jobs = a_before + a_halted + a_during
        records = {job_id: job(job_id) for job_id in a_jobs + others}
        status, listed_after = call("GET", f"{api}/workspaces?state=HALTED")
        stats = runtime.poller.stats

    # Then every job of ws-a took effect exactly once, in the queue's acceptance (SequenceNumber) order, with the jobs
    # sent during the resume after the parked ones
    branch = remote_branches(remotes, tmp_path / "reader-cache")
    accepted_order = sorted(a_jobs, key=lambda job_id: int(records[job_id]["sequenceNumber"]))
    assert branch("ws-a") == accepted_order == a_jobs
    assert {records[job_id]["status"] for job_id in a_jobs} == {"SUCCEEDED"}
    parked_during_halt = a_before[1:] + a_halted
    assert all("PARKED" in [h["status"] for h in records[j]["history"]] for j in parked_during_halt)
    # a job's attempt counts every claim of its life: the claims that used up its attempts, then the retry's one
    assert records["a-00"]["attempt"] == halted_by["attempt"] + 1
    assert [h["status"] for h in records["a-00"]["history"]].count("DEAD") == 1
    # and the other workspaces did not wait for ws-a: their jobs sent before the resume had all finished before it
    # was requested, and every one of theirs took effect once, in order
    assert all(records[job_id]["finishedAt"] < resume_requested_at for job_id in others_done)
    for ws in ("ws-b", "ws-c"):
        theirs = [job_id for job_id in others if job_id.startswith(ws[-1])]
        assert branch(ws) == theirs
    assert {records[job_id]["status"] for job_id in others} == {"SUCCEEDED"}
    assert listed_after["workspaces"] == []
    assert stats.crashes == stats.handler_errors == 0
