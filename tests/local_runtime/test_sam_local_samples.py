"""`make local --sam-local` without Docker: the events' workspaces registered for the events' tenant, with the first
commits their patches apply to; the address the emulator is served on for containers."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dulwich.client import get_transport_and_path
from dulwich.errors import GitProtocolError

from agent_jobs_local.runtime import LocalRuntime
from agent_jobs_local.runtime_files import LOOPBACK, container_reachable_host
from agent_jobs_local.sam_local import SAMPLE_TENANT, SAMPLE_WORKSPACES, SERVED_OVER_HTTPS, SampleWorkspaces
from job_worker.jobs.git.transport import git_config_trusting

EVENTS = Path(__file__).resolve().parents[2] / "events"


def event_jobs() -> list[dict[str, Any]]:
    """Every valid job of events/: the SQS records' bodies and the HTTP events' job bodies (not the invalid one's)."""
    jobs: list[dict[str, Any]] = []
    for path in sorted(set(EVENTS.glob("*.json")) - {EVENTS / "http_post_job_invalid.json"}):
        event = json.loads(path.read_text())
        jobs += [json.loads(record["body"]) for record in event.get("Records", [])]
        if event.get("routeKey") == "POST /jobs":
            jobs.append(json.loads(event["body"]))
    return jobs


def test_every_event_names_the_sample_tenant_and_a_sample_workspace() -> None:
    jobs = event_jobs()
    assert jobs
    assert {job["workspaceId"] for job in jobs} <= set(SAMPLE_WORKSPACES)
    for job in jobs:
        assert job.get("tenantId", SAMPLE_TENANT) == SAMPLE_TENANT
    for path in EVENTS.glob("http_*.json"):
        claims = json.loads(path.read_text())["requestContext"]["authorizer"]["jwt"]["claims"]
        assert claims["tenant_id"] == SAMPLE_TENANT, path.name
    assert json.loads((EVENTS / "sandbox_run_tests.json").read_text())["tenantId"] == SAMPLE_TENANT


def test_sam_local_registers_the_events_workspaces_with_the_files_their_patches_change(tmp_path: Path) -> None:
    # Given the local stack with --sam-local's sample workspaces, registered as the command does
    with (
        SampleWorkspaces(tmp_path / "remotes") as samples,
        LocalRuntime(
            workspaces_root=tmp_path / "workspaces",
            remotes_root=tmp_path / "remotes",
            allowed_private_hosts=samples.allowed_private_hosts,
        ) as runtime,
    ):
        statuses = samples.register(runtime.api_url)
        table = runtime.resources.table_name
        items = {
            workspace_id: runtime._clients().dynamodb.get_item(
                TableName=table, Key={"pk": {"S": f"ws#{workspace_id}"}}, ConsistentRead=True
            )["Item"]
            for workspace_id in SAMPLE_WORKSPACES
        }

    # Then every sample workspace is the sample tenant's, its remote in the tenant's folder of the remotes root
    assert statuses == dict.fromkeys(SAMPLE_WORKSPACES, 201)
    for workspace_id, item in items.items():
        assert item["tenantId"]["S"] == SAMPLE_TENANT
        assert item["remoteUrl"]["S"] == str(tmp_path / "remotes" / SAMPLE_TENANT / f"{workspace_id}.git")
    # and each patch of the events finds, in its workspace's first commit, the lines it removes or its context
    for job in event_jobs():
        if job["type"] != "apply_patch":
            continue
        files = SAMPLE_WORKSPACES[job["workspaceId"]]
        for line in job["payload"]["patch"].splitlines():
            if line.startswith(("-", " ")) and not line.startswith("---"):
                assert any(line[1:].encode() in content for content in files.values()), (job["jobId"], line)


def test_containers_reach_loopback_when_no_docker_bridge_is_here() -> None:
    assert container_reachable_host(docker="no-such-docker-command") == LOOPBACK


def test_sam_local_serves_the_sqs_events_workspaces_over_https_for_containers(tmp_path: Path) -> None:
    # Given the sample workspaces with their git server (on loopback here), and the stack given its settings
    with (
        SampleWorkspaces(tmp_path / "remotes", git_host=LOOPBACK) as samples,
        LocalRuntime(
            workspaces_root=tmp_path / "workspaces",
            remotes_root=tmp_path / "remotes",
            allowed_private_hosts=samples.allowed_private_hosts,
            sam_local_env=samples.sam_local_env,
        ) as runtime,
    ):
        statuses = samples.register(runtime.api_url)
        registrations = {
            workspace_id: runtime._clients().dynamodb.get_item(
                TableName=runtime.resources.table_name, Key={"pk": {"S": f"ws#{workspace_id}"}}, ConsistentRead=True
            )["Item"]
            for workspace_id in SAMPLE_WORKSPACES
        }
        remote_urls = {workspace_id: item["remoteUrl"]["S"] for workspace_id, item in registrations.items()}
        api_urls = {workspace_id: item["githubApiUrl"]["S"] for workspace_id, item in registrations.items()}
        assert samples.git_server is not None
        port, ca_pem = samples.git_server.port, samples.git_server.ca.certificate_pem
        # What the server answers a client that trusts its CA, and one that trusts only the system's
        untrusting, path = get_transport_and_path(f"https://{LOOPBACK}:{port}/{SAMPLE_TENANT}/repo-alpha.git")
        trusting_client, _ = get_transport_and_path(
            f"https://{LOOPBACK}:{port}/{SAMPLE_TENANT}/repo-alpha.git", config=git_config_trusting(ca_pem)
        )
        refs = trusting_client.get_refs(path.encode()).refs
        with pytest.raises(GitProtocolError, match="CERTIFICATE_VERIFY_FAILED"):
            untrusting.get_refs(path.encode())
        env_file = json.loads(
            runtime.write_env_file(tmp_path / "env.json", container_values=samples.container_values(3002)).read_text()
        )
        loopback_github = samples.github.url

    # Then the SQS events' workspaces are registered with the server's URLs as containers name it, repo-gamma (run by
    # the stack's own workers) with its folder
    assert statuses == dict.fromkeys(SAMPLE_WORKSPACES, 201)
    netloc = f"host.docker.internal:{port}"
    for workspace_id in SERVED_OVER_HTTPS:
        assert remote_urls[workspace_id] == f"https://{netloc}/{SAMPLE_TENANT}/{workspace_id}.git"
    assert remote_urls["repo-gamma"] == str(tmp_path / "remotes" / SAMPLE_TENANT / "repo-gamma.git")
    # their pull requests go to the tenant's GitHub API on that server; repo-gamma's to the fake GitHub on loopback
    for workspace_id in SERVED_OVER_HTTPS:
        assert api_urls[workspace_id] == f"https://{netloc}/{SAMPLE_TENANT}/github"
    assert api_urls["repo-gamma"] == loopback_github
    # served from the remotes' own folders, over TLS with the local CA's certificate
    assert b"refs/heads/main" in refs
    # and the env file gives the functions that declare them the server and its CA
    for function_id in ("EnqueueApiFunction", "JobWorkerFunction"):
        assert env_file[function_id]["LOCAL_GIT_SERVER"] == netloc
        assert env_file[function_id]["LOCAL_GIT_CA"] == ca_pem
    # and the worker the test sandbox where `sam local start-lambda` serves it, by the name it serves it under
    worker = env_file["JobWorkerFunction"]
    assert (worker["AWS_ENDPOINT_URL_LAMBDA"], worker["TEST_SANDBOX_FUNCTION"]) == (
        "http://host.docker.internal:3002",
        "TestSandboxFunction",
    )
    assert "AWS_ENDPOINT_URL_LAMBDA" not in env_file["EnqueueApiFunction"]
    assert runtime.model.function_properties("JobWorkerFunction")["Environment"]["Variables"][
        "TEST_SANDBOX_FUNCTION"
    ] == {"Ref": "TestSandboxFunction"}


def test_container_host_prints_where_local_sam_local_serves() -> None:
    # `sam local start-lambda --host $(python -m agent_jobs_local container-host)`: the address the stack serves on
    printed = subprocess.run(
        [sys.executable, "-m", "agent_jobs_local", "container-host"], capture_output=True, text=True, check=True
    ).stdout

    assert printed == f"{container_reachable_host()}\n"
    assert ipaddress.ip_address(printed.strip()) != ipaddress.ip_address("0.0.0.0")
