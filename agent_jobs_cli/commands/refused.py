"""`refused`: the messages the worker refused without halting a workspace (AWS credentials on the table, not the API).

A message that is not its workspace owner's (a SenderId the owner did not bind in `directProducers`, another tenant
named) and one whose group names no workspace are recorded under `msg#<messageId>`, counted (MessagesRefused,
MessagesWithoutWorkspace) and acknowledged: nothing ran and nothing halted. This lists those records, newest first, so
the operator sees who sent what (a producer of the owner's that is not bound yet, or a sender acting as another
tenant). They expire with the table's TTL.
"""

from __future__ import annotations

from typing import Annotated, Final

import typer
from rich.table import Table

from agent_jobs.keys import workspace_id_from_group
from agent_jobs_cli.commands.dlq import aws_call
from agent_jobs_cli.context import JsonOption, handle_errors, out, print_json, state_of
from agent_jobs_cli.render import when

DAY_MS: Final = 86_400_000
LISTED_FIELDS: Final = ("messageId", "acceptedAt", "groupId", "senderId", "namedTenantId", "error")


@handle_errors
def refused(
    ctx: typer.Context,
    days: Annotated[int, typer.Option("--days", min=1, max=400, help="How many days back.")] = 7,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000, help="At most this many, newest first.")] = 100,
    as_json: JsonOption = False,
) -> None:
    """Messages refused without a halt, newest first: a sender the workspace owner did not bind, another tenant
    named, or a group that names no workspace."""
    from agent_jobs.guard import JobGuard

    target = state_of(ctx).target
    guard = JobGuard(target.dynamodb(), target.table_name)
    since = guard.now() - days * DAY_MS
    items = aws_call("reading the refused messages", lambda: guard.refused_messages(since_ms=since, limit=limit))
    records = [{name: item.get(name) for name in LISTED_FIELDS} for item in items]
    for record in records:
        record["workspaceId"] = workspace_id_from_group(record.get("groupId"))
    if as_json:
        print_json({"refused": records})
        return
    if not records:
        out().print(f"No message was refused in the last {days} day(s).")
        return
    table = Table("message", "refused", "workspace", "sender", "names tenant", "reason", title="refused messages")
    for record in records:
        table.add_row(
            str(record["messageId"]),
            when(record["acceptedAt"]),
            str(record["workspaceId"] or f"(group {record['groupId']!r})"),
            str(record["senderId"] or ""),
            str(record["namedTenantId"] or ""),
            str(record["error"] or ""),
        )
    out().print(table)
