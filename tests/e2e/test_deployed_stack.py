"""Against a deployed stack: set AGENT_JOBS_STACK_NAME (and AWS credentials) and AGENT_JOBS_TOKEN (a bearer token
from the stack's JwtIssuer for a tenant) to run; skipped otherwise."""

from __future__ import annotations

import json
import os
import time
import urllib.request
import uuid
from typing import Any

import boto3
import pytest

STACK = os.environ.get("AGENT_JOBS_STACK_NAME")
TOKEN = os.environ.get("AGENT_JOBS_TOKEN")
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def outputs() -> dict[str, str]:
    if not STACK:
        pytest.skip("set AGENT_JOBS_STACK_NAME to a deployed stack (and AWS credentials) to run the e2e tests")
    if not TOKEN:
        pytest.skip("set AGENT_JOBS_TOKEN to a bearer token of the stack's JwtIssuer to run the e2e tests")
    stack = boto3.client("cloudformation").describe_stacks(StackName=STACK)["Stacks"][0]
    return {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}


def call(
    method: str, url: str, body: dict[str, Any] | None = None, token: str | None = TOKEN
) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"content-type": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def test_deployed_job_is_accepted_applied_and_idempotent(outputs: dict[str, str]):
    api = outputs["ApiUrl"].rstrip("/")
    job = {
        "jobId": f"e2e-{uuid.uuid4().hex[:12]}",
        "workspaceId": "e2e-workspace",
        "type": "apply_patch",
        "payload": {"patch": "--- a/e2e.txt\n+++ b/e2e.txt\n@@ -0,0 +1 @@\n+e2e\n", "commitMessage": "e2e"},
    }
    status, accepted = call("POST", f"{api}/jobs", job)
    assert status == 202, accepted
    assert call("POST", f"{api}/jobs", job)[1]["messageId"] == accepted["messageId"]
    deadline = time.monotonic() + 180
    state: dict[str, Any] = {}
    while time.monotonic() < deadline:
        state = call("GET", f"{api}/jobs/{job['jobId']}")[1]
        if state.get("status") in ("SUCCEEDED", "DEAD", "REJECTED"):
            break
        time.sleep(3)
    assert state.get("status") == "SUCCEEDED", state


def test_deployed_api_refuses_a_request_without_a_token(outputs: dict[str, str]):
    status, answer = call("GET", f"{outputs['ApiUrl'].rstrip('/')}/jobs/e2e-none", token=None)
    assert (status, answer) == (401, {"message": "Unauthorized"})
