"""`agent-jobs refused`: the operator's listing of the messages the worker refused without halting a workspace
(another sender's or tenant's, a group of no workspace), read from the table with the stack's credentials."""

from __future__ import annotations

import json
from pathlib import Path

from agent_jobs.guard import JobGuard
from agent_jobs.store.codec import to_item
from tests.cli.test_dlq import connection_file, run
from tests.conftest import ManualClock, Stack, register_workspace


def test_refused_lists_the_refused_messages_newest_first_with_their_senders(
    server_stack: Stack, moto_server: str, tmp_path: Path
) -> None:
    # Given a message of no workspace, then two refused ones of acme's workspace (one naming tenant b), a moment apart
    clock = ManualClock()
    guard = JobGuard(server_stack.services.dynamodb, server_stack.table_name, clock=clock)
    register_workspace(server_stack, "ws-acme", "acme")
    guard.reject_unrouted(message_id="m-lost", group_id="ws#", reason="names no workspace", body="{}")
    for message_id, sender, tenant in (("m-1", "AIDASTRANGERSENDER001", None), ("m-2", "AROAROLE0000000000001:s", "b")):
        clock.advance(0.01)
        guard.refuse(
            message_id=message_id,
            group_id="ws#ws-acme",
            reason=f"refused {message_id}",
            body='{"jobId": "planted"}',
            sender_id=sender,
            named_tenant=tenant,
        )
    path = connection_file(tmp_path, server_stack, moto_server)

    # When the operator lists them
    listed = run(path, "refused", "--json")
    shown = run(path, "refused")

    # Then each shows with its workspace, sender and the tenant it named, newest first
    assert listed.exit_code == 0, listed.output
    refused = json.loads(listed.stdout)["refused"]
    assert [(r["messageId"], r["workspaceId"], r["senderId"], r["namedTenantId"]) for r in refused] == [
        ("m-2", "ws-acme", "AROAROLE0000000000001:s", "b"),
        ("m-1", "ws-acme", "AIDASTRANGERSENDER001", None),
        ("m-lost", None, None, None),
    ]
    assert refused[0]["error"] == "refused m-2"
    assert "AIDASTRANGERSENDER001" in shown.stdout
    assert "refused m-1" in shown.stdout
    # and the bodies stay in the records, out of the index the listing reads
    body = server_stack.services.dynamodb.get_item(TableName=server_stack.table_name, Key={"pk": {"S": "msg#m-1"}})
    assert to_item(body["Item"])["body"] == '{"jobId": "planted"}'


def test_refused_says_so_when_nothing_was_refused(server_stack: Stack, moto_server: str, tmp_path: Path) -> None:
    result = run(connection_file(tmp_path, server_stack, moto_server), "refused", "--days", "2")

    assert result.exit_code == 0, result.output
    assert "No message was refused in the last 2 day(s)." in result.stdout
