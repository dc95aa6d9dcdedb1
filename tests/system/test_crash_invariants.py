"""Crashes and dead-lettering against the real worker on the local runtime (moto's server, the API over HTTP, worker
processes fed by the event-source poller, registered git remotes): a job that kills its invocation on every delivery
must not make a job of another workspace that shared its batches DEAD, and jobs the queue dead-lettered without the
worker ever seeing them must stop the jobs behind them instead of letting them apply out of order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import pytest

from agent_jobs.guard import JobGuard
from agent_jobs_cli.deadletters import DeadLetterQueue, RedriveOutcome, registered_owners
from agent_jobs_local.demo import remote_branches
from agent_jobs_local.runtime import LocalRuntime
from agent_jobs_local.workload import create_remote, register_workspaces, remote_path
from tests.system.test_resume import TENANT, call, submit, wait_until

# The smallest redrive policy the template allows, so that a message reaches its last deliveries in a few cycles.
MAX_RECEIVE_COUNT = 5


def runtime_with(tmp_path: Path, time_scale: float = 0.02, **faults: Any) -> LocalRuntime:
    return LocalRuntime(
        workspaces_root=tmp_path / "workspaces",
        time_scale=time_scale,
        concurrency=2,
        parameter_overrides={"MaxReceiveCount": MAX_RECEIVE_COUNT},
        worker_bootstrap="tests.system.crash_faults:install",
        bootstrap_config=faults,
    )


def register(runtime: LocalRuntime, workspaces: list[str]) -> dict[str, Path]:
    remotes = {ws: create_remote(remote_path(runtime.remotes_root, ws, TENANT), ws) for ws in workspaces}
    register_workspaces(runtime.api_url, remotes, github_api_url="https://api.github.com", tenant_id=TENANT)
    return remotes


# A crash kills the invocation at once: b-00, half a second long, is in flight. A hang lasts until the Timeout (6 s at
# time scale 0.05): ws-b's jobs, 1.5 s each, run one after another meanwhile, and the one in flight then dies with it.
CO_BATCHED = {
    "crash_after_claim": (0.02, {"b-00": 0.5}),
    "hang_after_claim": (0.05, {f"b-{n:02d}": 1.5 for n in range(4)}),
}


@pytest.mark.parametrize("fault", list(CO_BATCHED))
def test_a_job_that_kills_every_invocation_halts_only_its_own_workspace(tmp_path: Path, fault: str) -> None:
    # Given x-00, which kills (or times out) its worker on every claim, sent with the jobs of ws-b so that they share
    # batches (the worker runs their groups at once), with a job of ws-b in flight each time x-00 kills the invocation
    b_jobs = [f"b-{n:02d}" for n in range(4)]
    time_scale, slow = CO_BATCHED[fault]
    with runtime_with(tmp_path, time_scale, **{fault: ["x-00"]}, slow_commit_seconds=slow) as runtime:
        api = runtime.api_url
        remotes = register(runtime, ["ws-x", "ws-b"])
        submit(api, "x-00", "ws-x")
        for job_id in b_jobs:
            submit(api, job_id, "ws-b")

        # When the worker keeps getting them until x-00 is settled
        def settled() -> bool:
            return call("GET", f"{api}/jobs/x-00")[1].get("status") == "DEAD" and all(
                call("GET", f"{api}/jobs/{job_id}")[1].get("status") in ("SUCCEEDED", "DEAD", "PARKED")
                for job_id in b_jobs
            )

        wait_until("x-00 is DEAD and ws-b's jobs are settled", settled, timeout=360)
        records = {job_id: call("GET", f"{api}/jobs/{job_id}")[1] for job_id in ["x-00", *b_jobs]}
        workspaces = {ws: call("GET", f"{api}/workspaces/{ws}")[1] for ws in ("ws-x", "ws-b")}
        stats = runtime.poller.stats

    # Then x-00 halted its own workspace, and every job of ws-b took effect once, in order
    assert stats.crashes + stats.timeouts >= 2, "x-00 never killed an invocation it shared with ws-b"
    assert records["x-00"]["status"] == "DEAD"
    statuses = {job_id: (records[job_id]["status"], records[job_id].get("error")) for job_id in b_jobs}
    assert [status for status, _ in statuses.values()] == ["SUCCEEDED"] * len(b_jobs), statuses
    assert workspaces["ws-b"]["state"] == "ACTIVE", workspaces["ws-b"]
    assert workspaces["ws-x"]["state"] == "HALTED"
    assert workspaces["ws-x"]["haltingJobId"] == "x-00"
    branch = remote_branches(remotes, tmp_path / "reader-cache")
    assert branch("ws-b") == b_jobs
    assert branch("ws-x") == []


def test_jobs_dead_lettered_unseen_stop_the_jobs_behind_them_until_redriven_and_resumed_in_order(
    tmp_path: Path,
) -> None:
    # Given a-00..a-04, every delivery of which dies before the handler runs, so the queue dead-letters them
    missing = [f"a-{n:02d}" for n in range(5)]
    behind = ["a-05", "a-06"]
    with runtime_with(tmp_path, die_before_handler=missing) as runtime:
        api, resources = runtime.api_url, runtime.resources
        remotes = register(runtime, ["ws-a"])
        for job_id in missing:
            submit(api, job_id, "ws-a")
        sqs = boto3.client("sqs", endpoint_url=runtime.endpoint_url, region_name=resources.region)

        def dead_lettered() -> int:
            attributes = sqs.get_queue_attributes(
                QueueUrl=resources.dlq_url, AttributeNames=["ApproximateNumberOfMessages"]
            )["Attributes"]
            return int(attributes["ApproximateNumberOfMessages"])

        wait_until("the queue dead-lettered a-00..a-04", lambda: dead_lettered() == len(missing), timeout=240)

        # When the jobs behind them arrive
        for job_id in behind:
            submit(api, job_id, "ws-a")
        wait_until(
            "a-05 and a-06 are settled",
            lambda: all(call("GET", f"{api}/jobs/{j}")[1].get("status") != "QUEUED" for j in behind),
            timeout=120,
        )
        assert runtime.poller.drain(timeout=60)

        # Then none of them was applied: the workspace is HALTED by the first missing job, naming every one
        workspace = call("GET", f"{api}/workspaces/ws-a")[1]
        statuses = {j: call("GET", f"{api}/jobs/{j}")[1].get("status") for j in missing + behind}
        assert workspace["state"] == "HALTED", workspace
        assert workspace["haltingJobId"] == "a-00"
        assert all(job_id in workspace["haltReason"] for job_id in missing), workspace["haltReason"]
        assert {statuses[j] for j in behind} == {"PARKED"}, statuses
        branch = remote_branches(remotes, tmp_path / "reader-cache")
        assert branch("ws-a") == []

        # And after the operator redrives the dead letters and retries each missing job, all seven apply in order
        dynamodb = boto3.client("dynamodb", endpoint_url=runtime.endpoint_url, region_name=resources.region)
        guard = JobGuard(dynamodb, resources.table_name)
        redriven = DeadLetterQueue(sqs, resources.dlq_url).redrive(
            guard, select_workspace=lambda w: w == "ws-a", owner_of=registered_owners(dynamodb, resources.table_name)
        )
        assert [(r.job_id, r.outcome) for r in redriven] == [(j, RedriveOutcome.PARKED) for j in missing]
        for job_id in missing:
            status, resumed = call(
                "POST", f"{api}/workspaces/ws-a/resume", {"decision": "retry", "haltingJobId": job_id}
            )
            assert status in (200, 202), resumed
        assert runtime.poller.drain(timeout=120)
        wait_until("ws-a is ACTIVE", lambda: call("GET", f"{api}/workspaces/ws-a")[1]["state"] == "ACTIVE", timeout=60)
        final = {j: call("GET", f"{api}/jobs/{j}")[1].get("status") for j in missing + behind}

    assert set(final.values()) == {"SUCCEEDED"}, final
    assert remote_branches(remotes, tmp_path / "reader-cache-after")("ws-a") == missing + behind
