"""Producers that send straight to the jobs queue, against the local runtime (moto's server, the API over HTTP, worker
processes fed by the event-source poller, registered git remotes): the documented Node.js example with
`@aws-sdk/client-sqs` from the npm registry (installed here, never committed), its boto3 and layer examples, and
raw `send_message` calls of every kind the wire format documents. Each message ends as the documentation says, on
its first delivery; a halted workspace parks the direct producers' later jobs and a resume drains them in order."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import boto3
import pytest

from agent_jobs.models import job_message
from agent_jobs_local.demo import remote_branches
from agent_jobs_local.runtime import LocalRuntime
from agent_jobs_local.workload import create_remote, register_workspaces, remote_path
from tests.conftest import make_job
from tests.documentation import doc_text
from tests.system.test_resume import TENANT, call, wait_until

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
OTHER_TENANT = "acme"
MINE = ["ws-node", "ws-boto", "ws-layer", "ws-nohash", "ws-wrong", "ws-v2", "ws-big", "ws-halt", "ws-bound"]


def patch_of(job_id: str) -> dict[str, str]:
    return {"patch": f"--- a/f.txt\n+++ b/f.txt\n@@ -0,0 +1 @@\n+{job_id}\n", "commitMessage": f"change {job_id}"}


def job_document(job_id: str, workspace_id: str, **fields: Any) -> dict[str, Any]:
    """A job as a direct producer writes it (the issue's pattern): no payloadHash, nothing the model defaults."""
    return {
        "jobId": job_id,
        "workspaceId": workspace_id,
        "tenantId": TENANT,
        "type": "apply_patch",
        "payload": patch_of(job_id),
        **fields,
    }


class Direct:
    """The local runtime as a direct producer and an operator see it."""

    def __init__(self, runtime: LocalRuntime, remotes: dict[str, Path], cache: Path) -> None:
        self.runtime = runtime
        self.api = runtime.api_url
        resources = runtime.resources
        self.queue_url, self.dlq_url, self.table = resources.queue_url, resources.dlq_url, resources.table_name
        session = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1")
        self.sqs = session.client("sqs", endpoint_url=runtime.endpoint_url)
        self.dynamodb = session.resource("dynamodb", endpoint_url=runtime.endpoint_url).Table(self.table)
        self.branch = remote_branches(remotes, cache)

    def env(self) -> dict[str, str]:
        """What a producer process needs to reach the local queue and table."""
        return {
            **os.environ,
            "JOBS_QUEUE_URL": self.queue_url,
            "JOBS_TABLE": self.table,
            "AWS_ENDPOINT_URL": str(self.runtime.endpoint_url),
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
        }

    def send(self, body: str, group: str, dedup: str, tenant: str | None = TENANT) -> str:
        attributes: dict[str, Any] = {"tenantId": {"DataType": "String", "StringValue": tenant}} if tenant else {}
        sent = self.sqs.send_message(
            QueueUrl=self.queue_url,
            MessageBody=body,
            MessageGroupId=group,
            MessageDeduplicationId=dedup,
            MessageAttributes=attributes,
        )
        return str(sent["MessageId"])

    def job(self, job_id: str) -> Any:
        return call("GET", f"{self.api}/jobs/{job_id}")[1]

    def workspace(self, workspace_id: str) -> Any:
        return call("GET", f"{self.api}/workspaces/{workspace_id}")[1]

    def item(self, pk: str) -> Any:
        return self.dynamodb.get_item(Key={"pk": pk}, ConsistentRead=True).get("Item")

    def depth(self, url: str) -> int:
        attributes = self.sqs.get_queue_attributes(
            QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        )["Attributes"]
        return sum(int(value) for value in attributes.values())

    def wait_for(
        self, what: str, predicate: Callable[[], bool], timeout: float = 120, show: Sequence[str] = ()
    ) -> None:
        """`wait_until`, and on a timeout the records of the jobs named in `show`, to say what they did instead."""
        try:
            wait_until(what, predicate, timeout=timeout)
        except AssertionError as error:
            records = {job_id: {k: self.job(job_id).get(k) for k in ("status", "error", "history")} for job_id in show}
            raise AssertionError(f"{error}: {records}") from None

    def statuses(self, job_ids: list[str]) -> list[str | None]:
        return [self.job(job_id).get("status") for job_id in job_ids]


@pytest.fixture(scope="module")
def direct(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Direct]:
    root = tmp_path_factory.mktemp("direct")
    with LocalRuntime(workspaces_root=root / "workspaces", time_scale=0.02, concurrency=2) as runtime:
        remotes: dict[str, Path] = {}
        for tenant, workspaces in ((TENANT, MINE), (OTHER_TENANT, ["ws-acme"])):
            created = {ws: create_remote(remote_path(runtime.remotes_root, ws, tenant), ws) for ws in workspaces}
            register_workspaces(runtime.api_url, created, github_api_url="https://api.github.com", tenant_id=tenant)
            remotes.update(created)
        yield Direct(runtime, remotes, root / "reader-cache")


@pytest.fixture(scope="module")
def node_producer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/node with its locked dependencies installed from the npm registry (npm ci), outside the repository."""
    npm = shutil.which("npm")
    assert npm, "npm (with Node.js 18+) is needed for the Node.js producer example"
    assert shutil.which("node"), "Node.js 18+ is needed for the Node.js producer example"
    folder = tmp_path_factory.mktemp("node-producer")
    for name in ("package.json", "package-lock.json", "produce.mjs"):
        shutil.copy(EXAMPLES / "node" / name, folder / name)
    installed = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr
    return folder


def run_producer(command: list[str], jobs: list[dict[str, Any]], folder: Path, env: dict[str, str]) -> list[Any]:
    jobs_file = folder / "jobs.json"
    jobs_file.write_text(json.dumps(jobs))
    done = subprocess.run(
        [*command, str(jobs_file)], cwd=folder, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


# ---- 1. the Node.js producer ---------------------------------------------------------------------------------------


def test_node_producer_jobs_are_applied_once_in_order_with_status_and_history(
    direct: Direct, node_producer: Path
) -> None:
    # Given five jobs of a registered workspace, sent by the documented Node.js example, each sent twice in a row
    job_ids = [f"n-{n:02d}" for n in range(1, 6)]
    jobs = [job_document(job_id, "ws-node") for job_id in job_ids]
    node = [shutil.which("node") or "node", "produce.mjs"]
    sent = run_producer(node, [job for job in jobs for _ in range(2)], node_producer, direct.env())

    # When the workers take them, and the producer (after a crash, say) sends all of them once more
    direct.wait_for("the Node.js jobs succeeded", lambda: direct.statuses(job_ids) == ["SUCCEEDED"] * 5)
    resent = run_producer(node, jobs, node_producer, direct.env())
    direct.wait_for("the resends are settled", lambda: direct.depth(direct.queue_url) == 0)

    # Then each job took effect once, in the order sent, and reads as a job sent through the API does
    assert direct.branch("ws-node") == job_ids
    first_sends = {line["jobId"]: line for line in sent[::2]}
    # (a resend is the same message while SQS remembers its deduplication id, else a new one the worker absorbs)
    canonical = {
        job_id: job_message(make_job(job_id, "ws-node", payload=patch_of(job_id)), TENANT) for job_id in job_ids
    }
    for job_id in job_ids:
        record = direct.job(job_id)
        assert record["status"] == "SUCCEEDED"
        assert direct.item(f"job#{TENANT}#{job_id}")["payloadHash"] == canonical[job_id].payload_hash
        assert (record["messageId"], record["sequenceNumber"]) == (
            first_sends[job_id]["messageId"],
            first_sends[job_id]["sequenceNumber"],
        )
        assert [entry["status"] for entry in record["history"]] == ["IN_FLIGHT", "SUCCEEDED"]
    assert [int(first_sends[j]["sequenceNumber"]) for j in job_ids] == sorted(
        int(first_sends[j]["sequenceNumber"]) for j in job_ids
    )
    assert len(resent) == 5
    assert direct.workspace("ws-node")["state"] == "ACTIVE"
    assert direct.depth(direct.dlq_url) == 0


def test_the_docs_show_the_examples_as_they_are_tested() -> None:
    page = doc_text("docs/producers.md")
    for example in ("node/produce.mjs", "python/produce_boto3.py", "python/produce_with_layer.py"):
        code = (EXAMPLES / example).read_text()
        assert code in page, f"docs/producers.md does not show examples/{example} as it is"


# ---- 2. the Python producers, and every kind of message the wire format documents ---------------------------------


def test_boto3_and_layer_producers_are_applied(direct: Direct, tmp_path: Path) -> None:
    boto_jobs = [job_document(f"b-{n}", "ws-boto") for n in (1, 2, 3)]
    layer_jobs = [{k: v for k, v in job_document(f"l-{n}", "ws-layer").items() if k != "tenantId"} for n in (1, 2)]
    env = {**direct.env(), "PYTHONPATH": str(ROOT / "layers" / "shared")}

    run_producer([sys.executable, str(EXAMPLES / "python" / "produce_boto3.py")], boto_jobs, tmp_path, env)
    accepted = run_producer(
        [sys.executable, str(EXAMPLES / "python" / "produce_with_layer.py"), TENANT], layer_jobs, tmp_path, env
    )

    assert [answer["status"] for answer in accepted] == ["QUEUED", "QUEUED"]
    direct.wait_for(
        "the Python producers' jobs succeeded",
        lambda: direct.statuses(["b-1", "b-2", "b-3", "l-1", "l-2"]) == ["SUCCEEDED"] * 5,
    )
    assert direct.branch("ws-boto") == ["b-1", "b-2", "b-3"]
    assert direct.branch("ws-layer") == ["l-1", "l-2"]
    # the layer records a job QUEUED before sending it; a direct send is recorded at its claim
    assert [e["status"] for e in direct.job("l-1")["history"]][:1] == ["QUEUED"]
    assert [e["status"] for e in direct.job("b-1")["history"]] == ["IN_FLIGHT", "SUCCEEDED"]


def test_each_kind_of_direct_message_ends_as_documented_on_its_first_delivery(direct: Direct) -> None:
    # Given one message of each kind, each in its own workspace (a rejection halts its workspace)
    def hash_dedup(job_id: str) -> str:
        return hashlib.sha256(f"{job_id}:apply_patch".encode()).hexdigest()

    # (a commit message of 349,000 three-byte characters: 1 MiB of UTF-8, and far over the 10,000 it may have)
    poison = json.dumps(
        job_document("big-1", "ws-big", payload={"patch": "x", "commitMessage": "€" * 349_000}), ensure_ascii=False
    )
    assert 1_000_000 < len(poison.encode()) <= 1_048_576
    direct.send(json.dumps(job_document("nohash-1", "ws-nohash")), "ws#ws-nohash", hash_dedup("nohash-1"))
    direct.send(
        json.dumps(job_document("wrong-1", "ws-wrong", payloadHash="0" * 64)), "ws#ws-wrong", hash_dedup("wrong-1")
    )
    foreign = direct.send(json.dumps(job_document("planted-1", "ws-acme")), "ws#ws-acme", hash_dedup("planted-1"))
    unrouted = direct.send(json.dumps(job_document("lost-1", "ws-nohash")), "ws#", hash_dedup("lost-1"))
    direct.send(json.dumps(job_document("v2-1", "ws-v2", v=2)), "ws#ws-v2", hash_dedup("v2-1"))
    big = direct.send(poison, "ws#ws-big", hash_dedup("big-1"))

    # When the workers take them
    direct.wait_for("every message is settled", lambda: direct.depth(direct.queue_url) == 0)

    # Then: without payloadHash it is applied, the hash derived
    assert direct.job("nohash-1")["status"] == "SUCCEEDED"
    assert direct.branch("ws-nohash") == ["nohash-1"]
    # a wrong hash, another schema version, a body too large for a record: REJECTED with the reason, each halting
    # its own workspace, recorded on the first delivery (one history entry, nothing dead-lettered)
    expected = {
        "wrong-1": ("ws-wrong", "payloadHash does not match the payload"),
        "v2-1": ("ws-v2", "unsupported message version 2"),
    }
    for job_id, (workspace_id, reason) in expected.items():
        record = direct.job(job_id)
        assert (record["status"], [e["status"] for e in record["history"]]) == ("REJECTED", ["REJECTED"])
        assert reason in record["error"]
        assert direct.workspace(workspace_id)["state"] == "HALTED"
    big_record = direct.item(f"msg#{big}") or direct.item(f"job#{TENANT}#big-1")
    assert big_record["status"] == "REJECTED"
    assert [e["status"] for e in big_record["history"]] == ["REJECTED"]
    assert int(big_record["bodyBytes"]) == len(poison.encode())
    assert big_record["bodySha256"] == hashlib.sha256(poison.encode()).hexdigest()
    assert len(big_record["body"].encode()) <= 300_000
    assert direct.workspace("ws-big")["state"] == "HALTED"
    # another tenant's workspace: refused under the message's id (the jobId stays acme's), acme's workspace running on
    planted = direct.item(f"msg#{foreign}")
    assert planted["status"] == "REJECTED"
    assert "belongs to another tenant" in planted["error"]
    assert direct.item(f"job#{OTHER_TENANT}#planted-1") is None
    assert direct.item("ws#ws-acme")["state"] == "ACTIVE"
    # a group that names no workspace: REJECTED under its message id, nothing halted, nothing applied
    lost = direct.item(f"msg#{unrouted}")
    assert (lost["status"], lost["groupId"], "workspaceId" in lost) == ("REJECTED", "ws#", False)
    assert "names no workspace" in lost["error"]
    assert direct.workspace("ws-nohash")["state"] == "ACTIVE"
    assert direct.depth(direct.dlq_url) == 0


# ---- 3. a halted workspace parks direct producers' later jobs; a resume drains them in order -----------------------


def test_a_halted_workspace_parks_later_direct_jobs_and_a_resume_drains_them_in_order(direct: Direct) -> None:
    # Given a poison message (a wrong hash) and four valid jobs behind it, all sent directly, without payloadHash
    # (h-03 is 900 KB of three-byte characters: more than a record holds, so its parked body is kept as a pointer)
    later = [f"h-{n:02d}" for n in range(1, 5)]
    direct.send(json.dumps(job_document("h-00", "ws-halt", payloadHash="f" * 64)), "ws#ws-halt", "h-00")
    lines = "".join(f"+{'€' * 100}\n" for _ in range(3000))
    large = {"patch": f"--- a/f.txt\n+++ b/f.txt\n@@ -0,0 +1,3000 @@\n{lines}", "commitMessage": "change h-03"}
    for job_id in later:
        document = job_document(job_id, "ws-halt", **({"payload": large} if job_id == "h-03" else {}))
        direct.send(json.dumps(document, ensure_ascii=False), "ws#ws-halt", job_id)

    # When the workers take them
    direct.wait_for("the later jobs are parked", lambda: direct.statuses(later) == ["PARKED"] * 4)

    # Then only the poison is REJECTED; the valid ones are parked, never rejected, and nothing was applied
    assert direct.job("h-00")["status"] == "REJECTED"
    parked_large = direct.item(f"job#{TENANT}#h-03")
    assert int(parked_large["bodyBytes"]) < 2_000
    assert "payloadRef" in json.loads(parked_large["body"])
    workspace = direct.workspace("ws-halt")
    assert (workspace["state"], workspace["haltingJobId"]) == ("HALTED", "h-00")
    assert direct.branch("ws-halt") == []

    # And a resume that skips the poison drains them, once each, in the order sent
    status, resumed = call(
        "POST", f"{direct.api}/workspaces/ws-halt/resume", {"decision": "skip", "haltingJobId": "h-00"}
    )
    assert status == 202, resumed
    direct.wait_for("the parked jobs succeeded", lambda: direct.statuses(later) == ["SUCCEEDED"] * 4, show=later)
    direct.wait_for("ws-halt is ACTIVE", lambda: direct.workspace("ws-halt")["state"] == "ACTIVE")
    assert direct.branch("ws-halt") == later
    assert direct.job("h-00")["status"] == "SKIPPED"
    assert all("PARKED" in [e["status"] for e in direct.job(j)["history"]] for j in later)


# ---- 4. a workspace bound to the API alone: the local API's jobs run, a direct producer's are refused ---------------


def test_a_workspace_bound_to_the_api_alone_runs_its_jobs_and_refuses_direct_ones(direct: Direct) -> None:
    # Given ws-bound registered again with no direct producer bound (the API's messages alone)
    status, registered = call("GET", f"{direct.api}/workspaces/ws-bound")
    assert status == 200, registered
    fields = ("remoteUrl", "branch", "baseBranch", "testCommands", "githubRepository", "githubApiUrl")
    body = {name: registered[name] for name in fields if registered.get(name) is not None}
    status, answer = call("PUT", f"{direct.api}/workspaces/ws-bound", {**body, "directProducers": []})
    assert (status, answer["directProducers"]) == (200, []), answer

    # When a direct producer sends a job for it, then the tenant submits one through the local API
    refused = direct.send(json.dumps(job_document("bound-direct", "ws-bound")), "ws#ws-bound", "bound-direct")
    job = {name: value for name, value in job_document("bound-api", "ws-bound").items() if name != "tenantId"}
    status, answer = call("POST", f"{direct.api}/jobs", job)
    assert status == 202, answer

    # Then the API's job runs (the worker knows the local API's SenderId), the direct one is refused, nothing halted
    direct.wait_for("the API's job succeeded", lambda: direct.job("bound-api").get("status") == "SUCCEEDED")
    assert direct.item(f"msg#{refused}")["status"] == "REJECTED"
    assert "is not one of the direct producers bound to workspace ws-bound" in direct.item(f"msg#{refused}")["error"]
    assert direct.item(f"job#{TENANT}#bound-direct") is None
    assert direct.workspace("ws-bound")["state"] == "ACTIVE"
    assert direct.branch("ws-bound") == ["bound-api"]
