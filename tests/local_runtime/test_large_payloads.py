"""Large payloads end to end: a 5 MiB patch POSTed over HTTP to the local API, stored in the payload bucket of the
emulator, sent as a pointer, resolved by the real worker process and committed to a registered git remote; and the
local API's own limits (the function's 413 above MAX_REQUEST_BYTES, API Gateway's 413 above its 10 MB)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import boto3
from dulwich.refs import Ref
from dulwich.repo import Repo

from agent_jobs.models import job_request_adapter, payload_hash
from agent_jobs.settings import Settings
from agent_jobs_local.api_server import MAX_PAYLOAD_BYTES
from agent_jobs_local.runtime import LocalRuntime
from agent_jobs_local.workload import create_remote, register_workspaces, remote_path

TENANT = "tenant-large"


def big_text(size: int) -> bytes:
    """Lines of text, `size` bytes or a little more, every line different (so nothing compresses to nothing)."""
    lines: list[str] = []
    total = 0
    while total < size:
        line = f"line {len(lines):08d} of a generated file: {len(lines) * 7919 % 1_000_003:07d} quick brown fox\n"
        lines.append(line)
        total += len(line)
    return "".join(lines).encode()


def new_file_patch(path: str, content: bytes) -> str:
    lines = content.decode().splitlines(keepends=True)
    header = (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n@@ -0,0 +1,{len(lines)} @@\n"
    )
    return header + "".join("+" + line for line in lines)


def post(url: str, body: bytes) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def read_job(api_url: str, job_id: str) -> Any:
    with urllib.request.urlopen(f"{api_url}/jobs/{job_id}", timeout=30) as response:
        return json.loads(response.read())


def file_on_branch(remote: Path, branch: str, path: str) -> tuple[bytes, bytes]:
    """The file's bytes in the branch head's tree, and the head commit's message."""
    with Repo(str(remote)) as repo:
        head = repo.refs[Ref(f"refs/heads/{branch}".encode())]
        commit = repo[head]
        _, blob_id = repo[commit.tree].lookup_path(repo.object_store.__getitem__, path.encode())  # type: ignore[attr-defined]
        return repo[blob_id].as_raw_string(), commit.message  # type: ignore[attr-defined]


def test_runtime_applies_a_5_mib_patch_posted_over_http_byte_for_byte(tmp_path: Path) -> None:
    # Time scale 0.25: the worker's 120 s Timeout is 30 s, room for a 5 MiB patch on a busy machine.
    with LocalRuntime(workspaces_root=tmp_path / "workspaces", time_scale=0.25, concurrency=1) as runtime:
        runtime.api.authorizer_claims = lambda headers: {"tenant_id": TENANT}
        # Given a registered git workspace and a patch that adds a file of 5 MiB of text lines
        remotes = {"ws-large": create_remote(remote_path(runtime.remotes_root, "ws-large", TENANT), "ws-large")}
        register_workspaces(runtime.api_url, remotes, github_api_url="https://api.github.com", tenant_id=TENANT)
        content = big_text(5 * 1024 * 1024)
        body = {
            "jobId": "job-large-1",
            "workspaceId": "ws-large",
            "type": "apply_patch",
            "payload": {"patch": new_file_patch("data/generated.txt", content), "commitMessage": "add generated data"},
        }
        raw = json.dumps(body).encode()
        assert len(content) >= 5 * 1024 * 1024
        assert len(raw) <= Settings.model_fields["max_request_bytes"].default

        # When it is POSTed over HTTP, and again (a client retry)
        status, accepted = post(f"{runtime.api_url}/jobs", raw)
        again_status, again = post(f"{runtime.api_url}/jobs", raw)
        assert runtime.poller.drain(timeout=180)
        job = read_job(runtime.api_url, "job-large-1")
        s3 = boto3.client("s3", endpoint_url=runtime.endpoint_url, region_name=runtime.resources.region)
        bucket = runtime.resources.payload_bucket
        objects = s3.list_objects_v2(Bucket=str(bucket), Prefix="payloads/").get("Contents", [])
        stats = runtime.poller.stats

    # Then it was accepted once, stored as one object, and SUCCEEDED
    assert status == 202, accepted
    assert (again_status, again["created"], again["messageId"]) == (202, False, accepted["messageId"])
    expected_hash = payload_hash(job_request_adapter.validate_python(body))
    assert [obj["Key"] for obj in objects] == [f"payloads/{TENANT}/ws-large/job-large-1/{expected_hash}.json"]
    assert job["status"] == "SUCCEEDED", job
    assert stats.records_deleted == 1
    assert stats.crashes == stats.timeouts == stats.handler_errors == 0
    # and the commit on the remote branch holds the file byte for byte
    data, message = file_on_branch(remotes["ws-large"], "agent/ws-large", "data/generated.txt")
    assert data == content
    assert b"Agent-Job-Id: job-large-1" in message


def test_local_api_answers_413_from_the_function_above_the_request_limit_and_like_api_gateway_above_10_mb(
    tmp_path: Path,
) -> None:
    with LocalRuntime(workspaces_root=tmp_path / "workspaces", time_scale=0.5, concurrency=1) as runtime:
        runtime.api.authorizer_claims = lambda headers: {"tenant_id": TENANT}
        sqs = boto3.client("sqs", endpoint_url=runtime.endpoint_url, region_name=runtime.resources.region)

        def job(patch_bytes: int) -> bytes:
            payload = {"patch": "x" * patch_bytes, "commitMessage": "m"}
            return json.dumps(
                {"jobId": "job-big", "workspaceId": "ws-a", "type": "apply_patch", "payload": payload}
            ).encode()

        # When bodies above the function's limit and above API Gateway's 10 MB arrive
        function_status, function_answer = post(f"{runtime.api_url}/jobs", job(6 * 1024 * 1024))
        gateway_status, gateway_answer = post(f"{runtime.api_url}/jobs", job(MAX_PAYLOAD_BYTES))
        depth = sqs.get_queue_attributes(
            QueueUrl=runtime.resources.queue_url, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]["ApproximateNumberOfMessages"]

    # Then the function says what the limit is, why and what to do; API Gateway answers its own bare 413
    assert function_status == 413
    assert "(MAX_REQUEST_BYTES)" in function_answer["message"]
    assert "6 MB" in function_answer["message"]
    assert "split a large patch" in function_answer["message"]
    assert (gateway_status, gateway_answer) == (413, {"message": "Request Entity Too Large"})
    assert depth == "0"
