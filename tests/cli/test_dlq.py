"""The dead-letter queue tooling: messages moved to the DLQ by the queue's own redrive (received maxReceiveCount
times without a delete, as SQS and moto's server do), read without deleting, and redriven by parking them with their
original SequenceNumbers, so the workspace halts and a resume runs them first, in order."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import boto3
from typer.testing import CliRunner

from agent_jobs.keys import workspace_group_id
from agent_jobs.models import JobStatus, ResumeDecision, WorkspaceState
from agent_jobs.producer import enqueue_job
from agent_jobs_cli.deadletters import DeadLetterQueue, RedriveOutcome
from agent_jobs_cli.main import app
from agent_jobs_local.demo import remote_branches
from tests.cli.conftest import CliHarness, job_item, table_items
from tests.conftest import Stack, make_job, make_message, register_workspace


def max_receive_count(sqs: Any, queue_url: str) -> int:
    policy = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["RedrivePolicy"])["Attributes"]
    return int(json.loads(policy["RedrivePolicy"])["maxReceiveCount"])


def depth(sqs: Any, url: str) -> int:
    attributes = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return sum(int(value) for value in attributes.values())


def dead_letter_head(sqs: Any, queue_url: str, dlq_url: str) -> None:
    """Receive the queue's head message without deleting it until the queue itself moves it to the DLQ (on the receive
    after maxReceiveCount, as moto's server does); the next message of its group is then handed out, as SQS does."""
    before = depth(sqs, dlq_url)
    for _ in range(max_receive_count(sqs, queue_url) + 3):
        sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=1, VisibilityTimeout=0, WaitTimeSeconds=0)
        if depth(sqs, dlq_url) > before:
            return
    raise AssertionError("the queue did not dead-letter its head message")


def connection_file(tmp_path: Path, stack: Stack, endpoint_url: str) -> Path:
    path = tmp_path / "local.json"
    path.write_text(
        json.dumps(
            {
                "apiUrl": "http://127.0.0.1:9",  # the dlq commands do not call the API
                "endpointUrl": endpoint_url,
                "region": "us-east-1",
                "tableName": stack.table_name,
                "queueUrl": stack.queue_url,
                "deadLetterQueueUrl": stack.dlq_url,
            }
        )
    )
    return path


def run(path: Path, *args: str, input: str | None = None) -> Any:
    return CliRunner().invoke(app, ["--connection-file", str(path), *args], input=input, env={"COLUMNS": "200"})


def enqueue(stack: Stack, *job_ids: str, workspace_id: str = "ws-d") -> list[str]:
    """Accept jobs as the API does (its workspace registered first); returns their SequenceNumbers."""
    register_workspace(stack, workspace_id, "tenant-1")
    return [
        str(
            enqueue_job(
                make_job(job_id, workspace_id),
                "tenant-1",
                guard=stack.guard,
                sqs=stack.services.sqs,
                queue_url=stack.queue_url,
            ).sequence_number
        )
        for job_id in job_ids
    ]


def test_dlq_list_and_show_read_every_message_without_deleting_or_hiding(
    server_stack: Stack, moto_server: str, tmp_path: Path
):
    # Given one dead-lettered message of a workspace, then two of another (the third of those still queued)
    sqs = server_stack.services.sqs
    other = enqueue(server_stack, "e-1", workspace_id="ws-e")
    sequence = enqueue(server_stack, "d-1", "d-2", "d-3", workspace_id="ws-d")
    for _ in range(3):
        dead_letter_head(sqs, server_stack.queue_url, server_stack.dlq_url)
    path = connection_file(tmp_path, server_stack, moto_server)

    # When the DLQ is listed twice, and one workspace's messages alone
    first = run(path, "dlq", "list", "--json")
    second = run(path, "dlq", "list", "--json")
    only_d = run(path, "dlq", "list", "--workspace", "ws-d", "--json")

    # Then every message shows each time (nothing deleted, nothing left hidden), each group in order
    assert first.exit_code == 0, first.output
    listed = json.loads(first.stdout)["messages"]
    assert [(m["workspaceId"], m["jobId"]) for m in listed] == [("ws-e", "e-1"), ("ws-d", "d-1"), ("ws-d", "d-2")]
    assert [m["sequenceNumber"] for m in listed] == [*other, *sequence[:2]]
    assert [m["jobId"] for m in json.loads(second.stdout)["messages"]] == ["e-1", "d-1", "d-2"]
    assert [m["jobId"] for m in json.loads(only_d.stdout)["messages"]] == ["d-1", "d-2"]
    assert depth(sqs, server_stack.dlq_url) == 3
    assert "d-2" in run(path, "dlq", "list").stdout

    # and one message shows with its body, group, receive count and its job record's state
    shown = run(path, "dlq", "show", listed[1]["messageId"], "--json")
    assert shown.exit_code == 0, shown.output
    document = json.loads(shown.stdout)
    assert document["groupId"] == workspace_group_id("ws-d")
    assert document["body"]["jobId"] == "d-1"
    assert document["receiveCount"] >= max_receive_count(sqs, server_stack.queue_url)
    assert document["job"]["status"] == "QUEUED"
    assert "QUEUED" in run(path, "dlq", "show", listed[1]["messageId"]).stdout
    missing = run(path, "dlq", "show", "no-such-message")
    assert missing.exit_code == 1
    assert "agent-jobs dlq list" in missing.stderr


def test_dlq_redrive_parks_each_message_with_its_original_sequence_number_in_group_order(
    server_stack: Stack, moto_server: str, tmp_path: Path
):
    # Given the first two jobs of a workspace dead-lettered by the queue, the third still queued
    sqs = server_stack.services.sqs
    sequence = enqueue(server_stack, "r-1", "r-2", "r-3", workspace_id="ws-r")
    dead_letter_head(sqs, server_stack.queue_url, server_stack.dlq_url)
    dead_letter_head(sqs, server_stack.queue_url, server_stack.dlq_url)
    path = connection_file(tmp_path, server_stack, moto_server)

    # When the operator redrives the workspace
    result = run(path, "dlq", "redrive", "--workspace", "ws-r", "--yes", "--json")

    # Then both are PARKED at their original SequenceNumbers, the workspace HALTED by the first, the DLQ empty
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [(r["jobId"], r["outcome"]) for r in document["results"]] == [("r-1", "PARKED"), ("r-2", "PARKED")]
    assert document["next"] == ["agent-jobs resume ws-r --retry"]
    for job_id, sequence_number in zip(("r-1", "r-2"), sequence, strict=False):
        job = server_stack.job(job_id)
        assert job["status"] == JobStatus.PARKED
        assert job["sequenceNumber"] == sequence_number
        assert job["parkedReason"] == "dead-lettered by the queue after 10 receives; redriven"
        assert json.loads(job["body"])["jobId"] == job_id
    workspace = server_stack.workspace("ws-r")
    assert workspace["state"] == WorkspaceState.HALTED
    assert workspace["haltingJobId"] == "r-1"
    assert depth(sqs, server_stack.dlq_url) == 0
    assert server_stack.job("r-3")["status"] == JobStatus.QUEUED  # the live queue is not touched


def test_dlq_redrive_rejects_a_body_that_is_not_a_job_and_deletes_a_job_that_took_effect(
    server_stack: Stack, moto_server: str, tmp_path: Path
):
    # Given a DLQ holding a message that is no job (workspace ws-bad) and the copy of a job that already SUCCEEDED
    sqs = server_stack.services.sqs
    bad = sqs.send_message(
        QueueUrl=server_stack.dlq_url,
        MessageBody='{"jobId": "bad-1", "not": "a job"}',
        MessageGroupId=workspace_group_id("ws-bad"),
        MessageDeduplicationId="bad-1",
    )
    enqueue(server_stack, "done-1", workspace_id="ws-done")
    dead_letter_head(sqs, server_stack.queue_url, server_stack.dlq_url)
    lease = server_stack.guard.claim(
        make_message("done-1", "ws-done"), message_id="m", sequence_number=None, remaining_ms=60_000
    ).lease
    assert lease is not None
    assert server_stack.guard.complete(lease, {"ok": True})
    path = connection_file(tmp_path, server_stack, moto_server)

    # When everything is redriven
    result = run(path, "dlq", "redrive", "--all", "--yes", "--json")

    # Then the bad message is REJECTED (its workspace halted), the done job only deleted, the DLQ empty
    assert result.exit_code == 0, result.output
    outcomes = {r["workspaceId"]: r["outcome"] for r in json.loads(result.stdout)["results"]}
    assert outcomes == {"ws-bad": RedriveOutcome.REJECTED, "ws-done": RedriveOutcome.ALREADY_DONE}
    # (it names no tenant, so its jobId keys no job of any tenant: it is recorded under its message id)
    assert server_stack.item(f"msg#{bad['MessageId']}")["status"] == JobStatus.REJECTED
    assert server_stack.job("bad-1") is None
    assert server_stack.workspace("ws-bad")["state"] == WorkspaceState.HALTED
    assert server_stack.workspace("ws-done")["state"] == "ACTIVE"  # nothing halted a workspace whose job took effect
    assert depth(sqs, server_stack.dlq_url) == 0


def test_dlq_redrive_takes_the_sequence_number_from_the_message_when_the_job_has_no_record(
    server_stack: Stack, moto_server: str, tmp_path: Path
):
    # Given a job message sent to the queue by another producer (no job record), dead-lettered by the queue
    sqs = server_stack.services.sqs
    message = make_message("raw-1", "ws-raw")
    sent = sqs.send_message(
        QueueUrl=server_stack.queue_url,
        MessageBody=message.model_dump_json(by_alias=True),
        MessageGroupId=workspace_group_id("ws-raw"),
        MessageDeduplicationId="raw-1",
        MessageAttributes={"tenantId": {"DataType": "String", "StringValue": "tenant-1"}},
    )
    dead_letter_head(sqs, server_stack.queue_url, server_stack.dlq_url)
    path = connection_file(tmp_path, server_stack, moto_server)

    # When the operator looks first and declines, then redrives
    declined = run(path, "dlq", "redrive", "--workspace", "ws-raw", input="n\n")
    assert declined.exit_code == 1
    assert "raw-1" in declined.stdout
    assert depth(sqs, server_stack.dlq_url) == 1
    assert server_stack.job("raw-1") is None
    accepted = run(path, "dlq", "redrive", "--workspace", "ws-raw", input="y\n")

    # Then the job is PARKED with the message's own SequenceNumber, owned by the message's tenant
    assert accepted.exit_code == 0, accepted.output
    job = server_stack.job("raw-1")
    assert (job["status"], job["sequenceNumber"], job["tenantId"]) == ("PARKED", sent["SequenceNumber"], "tenant-1")
    assert server_stack.workspace("ws-raw")["haltingJobId"] == "raw-1"


def test_dlq_redrive_leaves_a_leased_job_and_everything_behind_it_in_its_group(
    server_stack: Stack, moto_server: str, tmp_path: Path
):
    # Given two dead-lettered jobs of a workspace, the first held by a worker's live lease
    sqs = server_stack.services.sqs
    enqueue(server_stack, "l-1", "l-2", workspace_id="ws-l")
    dead_letter_head(sqs, server_stack.queue_url, server_stack.dlq_url)
    dead_letter_head(sqs, server_stack.queue_url, server_stack.dlq_url)
    claim = server_stack.guard.claim(
        make_message("l-1", "ws-l"), message_id="m", sequence_number=None, remaining_ms=600_000
    )
    assert claim.claimed
    path = connection_file(tmp_path, server_stack, moto_server)

    # When the workspace is redriven
    result = run(path, "dlq", "redrive", "--workspace", "ws-l", "--yes")

    # Then nothing is parked or deleted: the leased job is left, the job behind it waits in order; exit code 1
    assert result.exit_code == 1
    assert "LEFT" in result.stdout
    assert "STOPPED" in result.stdout
    assert server_stack.job("l-2")["status"] == JobStatus.QUEUED
    assert server_stack.workspace("ws-l")["state"] == "ACTIVE"  # not halted
    assert depth(sqs, server_stack.dlq_url) == 2
    # and both are visible again for the next run
    assert [m.job_id for m in DeadLetterQueue(sqs, server_stack.dlq_url).read().messages] == ["l-1", "l-2"]


def test_dlq_redrive_without_a_selection_says_what_to_choose(server_stack: Stack, moto_server: str, tmp_path: Path):
    result = run(connection_file(tmp_path, server_stack, moto_server), "dlq", "redrive", "--yes")
    assert result.exit_code == 1
    assert "--workspace WORKSPACE (repeatable) or --all" in result.stderr


def test_dlq_acceptance_queue_dead_letters_redrive_halts_parks_and_resume_applies_all_once_in_order(
    fresh_cli: CliHarness,
):
    """Needs POST /workspaces/{id}/resume (the resume API) and its drain of parked jobs for the last step."""
    cli, runtime = fresh_cli, fresh_cli.runtime
    remotes = cli.register("ws-dl")
    sqs = boto3.client("sqs", endpoint_url=runtime.endpoint_url, region_name=runtime.resources.region)
    queue_url, dlq_url = runtime.resources.queue_url, runtime.resources.dlq_url

    # Given the worker stopped, three jobs accepted, and the head dead-lettered by the queue's own redrive
    runtime.poller.stop()
    for job_id in ("dl-1", "dl-2", "dl-3"):
        assert cli.enqueue_patch("ws-dl", job_id).exit_code == 0
    original_sequence = job_item(runtime, "dl-1")["sequenceNumber"]
    dead_letter_head(sqs, queue_url, dlq_url)
    # and one more job accepted after that
    assert cli.enqueue_patch("ws-dl", "dl-4").exit_code == 0
    listed = cli.run_json("dlq", "list", "--workspace", "ws-dl")
    assert [m["jobId"] for m in listed["messages"]] == ["dl-1"]

    # When the operator redrives the workspace
    redriven = cli.run("dlq", "redrive", "--workspace", "ws-dl", "--yes")
    assert redriven.exit_code == 0, redriven.output
    assert "agent-jobs resume ws-dl --retry" in redriven.stdout

    # Then the workspace is HALTED by dl-1, parked with its original SequenceNumber; the DLQ is empty
    workspace = cli.run_json("status", "workspace", "ws-dl")
    assert (workspace["state"], workspace["haltingJobId"]) == ("HALTED", "dl-1")
    parked = job_item(runtime, "dl-1")
    assert (parked["status"], parked["sequenceNumber"]) == ("PARKED", original_sequence)
    assert depth(sqs, dlq_url) == 0

    # When the worker runs again, the later jobs are PARKED behind the halt, not applied
    runtime.poller.start()
    assert runtime.poller.drain(timeout=60)
    timeline = cli.run_json("jobs", "ws-dl")["jobs"]
    assert [(j["jobId"], j["status"]) for j in timeline] == [
        ("dl-1", "PARKED"),
        ("dl-2", "PARKED"),
        ("dl-3", "PARKED"),
        ("dl-4", "PARKED"),
    ]
    branch = remote_branches(remotes, cli.root / "reader-cache")
    assert branch("ws-dl") == []  # the halt held: nothing took effect

    # When the operator resumes with a retry of the halting job
    resumed = cli.run("resume", "ws-dl", "--retry", "--yes")
    assert resumed.exit_code == 0, resumed.output
    watched = cli.run("watch", "ws-dl", "--until-idle", "--interval", "0.2", "--timeout", "120")
    assert watched.exit_code == 0, watched.output

    # Then every job took effect exactly once, in acceptance order, and the workspace is ACTIVE again
    assert {j["jobId"]: j["status"] for j in cli.run_json("jobs", "ws-dl")["jobs"]} == dict.fromkeys(
        ("dl-1", "dl-2", "dl-3", "dl-4"), "SUCCEEDED"
    )
    assert branch("ws-dl") == ["dl-1", "dl-2", "dl-3", "dl-4"]
    assert cli.run_json("status", "workspace", "ws-dl")["state"] == "ACTIVE"
    assert not [item for item in table_items(runtime) if item.get("status") == "DEAD"]


def test_dlq_shows_drops_and_redrives_messages_of_no_workspace_and_bodies_too_large_for_a_record(
    server_stack: Stack, moto_server: str, tmp_path: Path
):
    # Given a DLQ holding a message of group 'ws#' (no workspace), one of a foreign group, and a 1 MiB body of
    # three-byte characters in a workspace's group, as the queue's own redrive would leave them
    sqs = server_stack.services.sqs
    sent = {
        group: sqs.send_message(
            QueueUrl=server_stack.dlq_url, MessageBody=body, MessageGroupId=group, MessageDeduplicationId=dedup
        )["MessageId"]
        for group, body, dedup in [
            ("ws#", '{"jobId": "lost-1"}', "n-1"),
            ("orders-7", "not json", "n-2"),
            (workspace_group_id("ws-big"), "€" * 349_000, "n-3"),
        ]
    }
    path = connection_file(tmp_path, server_stack, moto_server)

    # When the operator lists, shows and drops one, and tries to drop the workspace's
    listed = json.loads(run(path, "dlq", "list", "--json").stdout)["messages"]
    shown = run(path, "dlq", "show", sent["ws#"], "--json")
    dropped = run(path, "dlq", "drop", sent["ws#"], "--yes", "--json")
    refused = run(path, "dlq", "drop", sent[workspace_group_id("ws-big")], "--yes")

    # Then the listing shows the two without a workspace, the drop records it REJECTED before deleting it, and a job
    # of a workspace is not dropped: the refusal says to redrive it
    assert {m["messageId"]: m["workspaceId"] for m in listed} == {
        sent["ws#"]: None,
        sent["orders-7"]: None,
        sent[workspace_group_id("ws-big")]: "ws-big",
    }
    assert json.loads(shown.stdout)["body"] == {"jobId": "lost-1"}
    assert dropped.exit_code == 0, dropped.output
    assert json.loads(dropped.stdout)["outcome"] == RedriveOutcome.NO_WORKSPACE
    record = server_stack.item(f"msg#{sent['ws#']}")
    assert (record["status"], record["groupId"]) == (JobStatus.REJECTED, "ws#")
    assert "names no workspace" in record["error"]
    assert refused.exit_code == 1
    assert "agent-jobs dlq redrive --workspace ws-big" in refused.stderr
    assert depth(sqs, server_stack.dlq_url) == 2

    # And a redrive of everything settles the other two: the foreign group's recorded without halting anything, the
    # 1 MiB body REJECTED with its workspace halted, its record cut to what an item holds with the body's size and hash
    redriven = run(path, "dlq", "redrive", "--all", "--yes", "--json")
    assert redriven.exit_code == 0, redriven.output
    outcomes = {r["messageId"]: r["outcome"] for r in json.loads(redriven.stdout)["results"]}
    assert outcomes == {
        sent["orders-7"]: RedriveOutcome.NO_WORKSPACE,
        sent[workspace_group_id("ws-big")]: RedriveOutcome.REJECTED,
    }
    assert server_stack.item(f"msg#{sent['orders-7']}")["status"] == JobStatus.REJECTED
    big = server_stack.item(f"msg#{sent[workspace_group_id('ws-big')]}")
    assert big["status"] == JobStatus.REJECTED
    assert int(big["bodyBytes"]) == 3 * 349_000
    assert big["bodySha256"] == hashlib.sha256(("€" * 349_000).encode()).hexdigest()
    assert len(big["body"].encode()) <= 300_000
    assert server_stack.workspace("ws-big")["state"] == WorkspaceState.HALTED
    assert depth(sqs, server_stack.dlq_url) == 0


def test_dlq_redrive_binds_a_job_to_its_workspace_owner_never_to_the_tenant_its_message_names(
    server_stack: Stack, moto_server: str, tmp_path: Path
):
    # Given acme's workspace, and in the DLQ a valid job for it whose body and attribute name mallory
    register_workspace(server_stack, "ws-acme", "acme")
    message = make_message("planted-1", "ws-acme", tenant_id="mallory")
    sent = server_stack.services.sqs.send_message(
        QueueUrl=server_stack.dlq_url,
        MessageBody=message.model_dump_json(by_alias=True),
        MessageGroupId=workspace_group_id("ws-acme"),
        MessageDeduplicationId="planted-1",
        MessageAttributes={"tenantId": {"DataType": "String", "StringValue": "mallory"}},
    )
    path = connection_file(tmp_path, server_stack, moto_server)

    # When the operator redrives everything
    result = run(path, "dlq", "redrive", "--all", "--yes", "--json")

    # Then it is refused under its message id, saying why, and parked for nobody: mallory has no job in acme's
    # workspace, the jobId stays free for acme, and acme's workspace runs on
    assert result.exit_code == 0, result.output
    assert [r["outcome"] for r in json.loads(result.stdout)["results"]] == [RedriveOutcome.REFUSED]
    record = server_stack.item(f"msg#{sent['MessageId']}")
    assert (record["status"], record["namedTenantId"], "tenantId" in record) == (JobStatus.REJECTED, "mallory", False)
    assert "belongs to another tenant" in record["error"]
    assert server_stack.job("planted-1", "mallory") is None
    assert server_stack.job("planted-1", "acme") is None
    assert server_stack.workspace("ws-acme")["state"] == WorkspaceState.ACTIVE


def test_redrive_deletes_a_bad_message_whose_rejection_an_operator_already_decided(tmp_path, server_stack, moto_server):
    # Given a message that is no job, rejected by the worker on a delivery whose delete was lost (its workspace
    # halted), skipped by the operator, and then dead-lettered by the queue after more deliveries
    register_workspace(server_stack, "ws-bad", "tenant-1")
    sqs = server_stack.services.sqs
    bad = sqs.send_message(
        QueueUrl=server_stack.dlq_url,
        MessageBody='{"jobId": "bad-1", "not": "a job"}',
        MessageGroupId=workspace_group_id("ws-bad"),
        MessageDeduplicationId="bad-1",
    )
    guard = server_stack.guard
    assert guard.reject(
        message_id=bad["MessageId"],
        job_id=None,
        workspace_id="ws-bad",
        tenant_id="tenant-1",
        reason="not a valid job message",
        body='{"jobId": "bad-1", "not": "a job"}',
    )
    decided = guard.begin_resume(
        "ws-bad",
        tenant_id="tenant-1",
        halting_job_id=f"msg#{bad['MessageId']}",
        decision=ResumeDecision.SKIP,
        operator="op",
    )
    assert decided.outcome == "ACTIVE"
    path = connection_file(tmp_path, server_stack, moto_server)

    # When the operator redrives the DLQ
    result = run(path, "dlq", "redrive", "--all", "--yes", "--json")

    # Then the message is deleted as already settled (its rejection is on record): the DLQ empties, nothing halts again
    assert result.exit_code == 0, result.output
    assert [r["outcome"] for r in json.loads(result.stdout)["results"]] == [RedriveOutcome.ALREADY_SETTLED]
    assert depth(sqs, server_stack.dlq_url) == 0
    assert server_stack.item(f"msg#{bad['MessageId']}")["status"] == JobStatus.SKIPPED
    assert server_stack.workspace("ws-bad")["state"] == WorkspaceState.ACTIVE


def test_redrive_leaves_a_bad_message_whose_rejection_cannot_be_recorded(tmp_path, server_stack, moto_server):
    # Given a bad message whose message id is already the key of another message's rejection record (no record of
    # its own can be written: this stands for any write that keeps failing)
    sqs = server_stack.services.sqs
    bad = sqs.send_message(
        QueueUrl=server_stack.dlq_url,
        MessageBody='{"not": "a job"}',
        MessageGroupId=workspace_group_id("ws-bad"),
        MessageDeduplicationId="bad-2",
    )
    server_stack.services.dynamodb.put_item(
        TableName=server_stack.table_name,
        Item={"pk": {"S": f"msg#{bad['MessageId']}"}, "status": {"S": "SKIPPED"}, "messageId": {"S": "another"}},
    )
    path = connection_file(tmp_path, server_stack, moto_server)

    # When the operator redrives the DLQ, then the message stays, and the command says so
    result = run(path, "dlq", "redrive", "--all", "--yes", "--json")
    assert result.exit_code == 1, result.output
    assert [r["outcome"] for r in json.loads(result.stdout)["results"]] == [RedriveOutcome.LEFT]
    assert depth(sqs, server_stack.dlq_url) == 1
