"""The whole system locally: jobs POSTed over HTTP to the local API, run by the real worker through the local SQS event
source, against the emulator the runtime starts. Time is scaled down; every setting still comes from template.yaml."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path
from typing import Any

import boto3
import pytest

from agent_jobs_local.auth import dev_signing_key, mint_token, public_key_pem
from agent_jobs_local.demo import demo_concurrency, remote_branches
from agent_jobs_local.runtime import LocalRuntime, container_endpoint, scale_durations
from agent_jobs_local.runtime_files import container_reachable_host
from agent_jobs_local.template import TemplateModel
from agent_jobs_local.workload import create_remote, register_workspaces, remote_path
from tests.conftest import make_job

PATCH = "--- a/f\n+++ b/f\n@@ -0,0 +1 @@\n+x\n"


def submit(api_url: str, job_id: str, workspace_id: str) -> None:
    job = make_job(job_id, workspace_id, payload={"patch": PATCH, "commitMessage": f"change for {job_id}"})
    request = urllib.request.Request(
        f"{api_url}/jobs",
        data=job.model_dump_json(by_alias=True).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {mint_token('default')}"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 202


def register(api_url: str, remotes_root: Path, workspace_ids: list[str]) -> dict[str, Path]:
    """Bare git remotes for the workspaces, registered through the API (PUT /workspaces/{workspaceId})."""
    remotes = {ws: create_remote(remote_path(remotes_root, ws), ws) for ws in workspace_ids}
    register_workspaces(api_url, remotes, github_api_url="https://api.github.com")
    return remotes


def read_job(api_url: str, job_id: str) -> Any:
    request = urllib.request.Request(f"{api_url}/jobs/{job_id}", headers={"Authorization": mint_token("default")})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_runtime_applies_jobs_from_http_in_submission_order_per_workspace(tmp_path: Path) -> None:
    workspaces_root = tmp_path / "workspaces"
    with LocalRuntime(workspaces_root=workspaces_root, time_scale=0.05, concurrency=4) as runtime:
        # Given the runtime's settings, all from template.yaml, scaled by 0.05
        model = runtime.model
        queue_attributes = boto3.client(
            "sqs", endpoint_url=runtime.endpoint_url, region_name=runtime.resources.region
        ).get_queue_attributes(QueueUrl=runtime.resources.queue_url, AttributeNames=["VisibilityTimeout"])
        visibility = int(model.queue_attributes(model.jobs_queue_id, runtime.resources.references)["VisibilityTimeout"])
        assert queue_attributes["Attributes"]["VisibilityTimeout"] == str(round(visibility * 0.05))
        assert runtime.poller.invocation_timeout_seconds == model.worker.timeout_seconds * 0.05
        assert runtime.poller.batch_size == model.worker.batch_size
        worker_env = runtime.function_env["JobWorkerFunction"]
        assert worker_env["WORKSPACES_ROOT"] == str(workspaces_root.resolve())
        template_margin = model.function_environment_variable("JobWorkerFunction", "TIME_SAFETY_MARGIN_MS")
        assert worker_env["TIME_SAFETY_MARGIN_MS"] == str(round(int(str(template_margin)) * 0.05))

        # When agents submit 5 jobs to each of 4 registered workspaces, interleaved, over HTTP
        submitted: dict[str, list[str]] = {f"ws-{w}": [] for w in range(4)}
        remotes = register(runtime.api_url, runtime.remotes_root, list(submitted))
        for n in range(5):
            for workspace_id, jobs in submitted.items():
                job_id = f"job-{workspace_id}-{n}"
                submit(runtime.api_url, job_id, workspace_id)
                jobs.append(job_id)
        assert runtime.poller.drain(timeout=60)

        # Then every job succeeded, each workspace's branch has its jobs once each, in submission order
        statuses = {
            job_id: read_job(runtime.api_url, job_id)["status"] for jobs in submitted.values() for job_id in jobs
        }
        stats = runtime.poller.stats

    assert set(statuses.values()) == {"SUCCEEDED"}
    branch = remote_branches(remotes, tmp_path / "reader-cache")
    for workspace_id, jobs in submitted.items():
        assert branch(workspace_id) == jobs
    assert stats.records_deleted == 20
    assert 1 <= stats.max_concurrent_invocations <= 4
    assert stats.crashes == stats.timeouts == stats.handler_errors == 0


def test_runtime_worker_crash_after_the_side_effect_still_applies_the_job_once(tmp_path: Path) -> None:
    # Given a worker that dies (os._exit) once, right after job-a-2's commit, before recording or acknowledging it
    workspaces_root, marker = tmp_path / "workspaces", tmp_path / "crashed"
    with LocalRuntime(
        workspaces_root=workspaces_root,
        time_scale=0.01,
        concurrency=1,  # one environment: the invocation after the crash is this poller's next one
        worker_bootstrap="tests.local_runtime.bootstrap_helpers:install",
        bootstrap_config={"crash_after_commit_of": "job-a-2", "marker": str(marker)},
    ) as runtime:
        # When jobs of two workspaces are submitted and run
        submitted = {"ws-a": ["job-a-1", "job-a-2", "job-a-3"], "ws-b": ["job-b-1", "job-b-2"]}
        remotes = register(runtime.api_url, runtime.remotes_root, list(submitted))
        for workspace_id, jobs in submitted.items():
            for job_id in jobs:
                submit(runtime.api_url, job_id, workspace_id)
        assert runtime.poller.drain(timeout=60)
        crashed_job = read_job(runtime.api_url, "job-a-2")
        stats, log = runtime.poller.stats, runtime.poller.invocation_log()

    # Then the crash happened once and deleted nothing of its batch; the next invocation was a cold start
    assert marker.exists()
    assert stats.crashes == 1
    crash = next(entry for entry in log if entry.outcome == "crash")
    assert crash.deleted == 0
    assert log[log.index(crash) + 1].cold_start
    assert stats.cold_starts == 2
    # and the job took effect exactly once: SUCCEEDED on its second attempt, one commit, order kept
    assert crashed_job["status"] == "SUCCEEDED"
    assert crashed_job["attempt"] == 2
    branch = remote_branches(remotes, tmp_path / "reader-cache")
    for workspace_id, jobs in submitted.items():
        assert branch(workspace_id) == jobs


def test_runtime_writes_a_sam_local_env_file(tmp_path: Path) -> None:
    with LocalRuntime(workspaces_root=tmp_path / "ws", time_scale=0.5) as runtime:
        path = runtime.write_env_file(tmp_path / "env.json")
        document = json.loads(path.read_text())
        resources, endpoint = runtime.resources, runtime.endpoint_url

    assert set(document) == {"EnqueueApiFunction", "JobWorkerFunction"}
    for environment in document.values():
        assert environment["TABLE_NAME"] == resources.table_name
        assert environment["QUEUE_URL"] == resources.queue_url
        assert environment["AWS_ENDPOINT_URL"] == container_endpoint(str(endpoint))
        assert environment["AWS_ENDPOINT_URL"].startswith("http://host.docker.internal:")
    # sam local runs the functions with their real Timeout, so the file has the template's unscaled values
    assert document["JobWorkerFunction"]["TIME_SAFETY_MARGIN_MS"] == "10000"
    assert "WORKSPACES_ROOT" not in document["JobWorkerFunction"]
    # the producer verifies bearer tokens itself under `sam local start-api`: against the development key's public half
    assert document["EnqueueApiFunction"]["LOCAL_JWT_PUBLIC_KEY"] == public_key_pem(dev_signing_key().public_key)
    assert "PRIVATE KEY" not in path.read_text()
    assert "LOCAL_JWT_PUBLIC_KEY" not in document["JobWorkerFunction"]


def test_runtime_serves_the_emulator_where_containers_reach_it(tmp_path: Path) -> None:
    # Given the address a container reaches this machine by (the docker bridge's on Linux; loopback without one)
    host = container_reachable_host()

    with LocalRuntime(workspaces_root=tmp_path / "ws", listen_host=host) as runtime:
        path = runtime.write_env_file(tmp_path / "env.json")
        endpoint = str(runtime.endpoint_url)
        with urllib.request.urlopen(f"{endpoint}/moto-api/data.json", timeout=10) as answer:
            status = answer.status

    assert endpoint.startswith(f"http://{host}:")
    assert status == 200
    # containers name it host.docker.internal (`--add-host host.docker.internal:host-gateway` on Linux)
    port = endpoint.rsplit(":", 1)[1]
    for environment in json.loads(path.read_text()).values():
        assert environment["AWS_ENDPOINT_URL"] == f"http://host.docker.internal:{port}"


def test_runtime_scales_only_the_duration_settings() -> None:
    environment = {"TIME_SAFETY_MARGIN_MS": "10000", "BACKOFF_BASE_SECONDS": "2", "BACKOFF_MAX_SECONDS": "300"}
    environment |= {"MAX_ATTEMPTS": "3"}

    assert scale_durations(environment, 0.01) == {
        "TIME_SAFETY_MARGIN_MS": "100",
        "BACKOFF_BASE_SECONDS": "1",  # never rounded to nothing: a backoff of 0 s would be another system
        "BACKOFF_MAX_SECONDS": "3",
        "MAX_ATTEMPTS": "3",
    }
    assert scale_durations(environment, 1) == environment
    assert container_endpoint("http://127.0.0.1:5000") == "http://host.docker.internal:5000"


def test_demo_runs_at_most_three_environments_per_cpu() -> None:
    # Given the template (MaximumConcurrency 20) and copies with a lower limit
    model = TemplateModel.from_path(stack_name="demo")
    lower = TemplateModel.from_path(stack_name="demo", parameter_overrides={"WorkerMaximumConcurrency": 4})

    # Then the demo's concurrency is the template's, capped at 3 per CPU of the machine it runs on
    assert model.worker.maximum_concurrency == 20
    assert demo_concurrency(model, cpus=2) == 6
    assert demo_concurrency(model, cpus=16) == 20
    assert demo_concurrency(lower, cpus=2) == 4


def test_runtime_runs_in_a_shell_without_aws_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a shell with no AWS credentials at all (a newcomer's machine running `make demo`)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    assert boto3.Session().get_credentials() is None

    # When the runtime runs a job from the HTTP API through the worker's event source
    with LocalRuntime(workspaces_root=tmp_path / "workspaces", time_scale=0.05, concurrency=1) as runtime:
        remotes = register(runtime.api_url, runtime.remotes_root, ["ws-a"])
        submit(runtime.api_url, "job-a-1", "ws-a")
        assert runtime.poller.drain(timeout=60)
        status = read_job(runtime.api_url, "job-a-1")["status"]
        stats = runtime.poller.stats

    # Then the event source's own clients could sign their calls to the emulator, and the job ran
    assert status == "SUCCEEDED"
    assert stats.records_deleted == 1
    assert remote_branches(remotes, tmp_path / "reader-cache")("ws-a") == ["job-a-1"]
    # and the shell's environment is as it was
    assert "AWS_ACCESS_KEY_ID" not in os.environ
