"""The dead-letter queue: `dlq list`, `dlq show`, `dlq drop`, `dlq redrive` (AWS credentials, not the API)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from agent_jobs_cli.context import CliError, JsonOption, handle_errors, out, print_json, state_of
from agent_jobs_cli.render import fields_table, styled, when
from agent_jobs_cli.targets import Target

if TYPE_CHECKING:
    from agent_jobs_cli.deadletters import DeadLetter, DeadLetterQueue

R = TypeVar("R")


def dead_letter_queue(target: Target) -> DeadLetterQueue:
    from agent_jobs_cli.deadletters import DeadLetterQueue

    return DeadLetterQueue(target.sqs(), target.dlq_url, api_sender_id=target.api_sender_id)


def queue_max_receive_count(target: Target) -> int | None:
    """The jobs queue's redrive maxReceiveCount (None when the queue has no redrive policy)."""
    attributes = target.sqs().get_queue_attributes(QueueUrl=target.queue_url, AttributeNames=["RedrivePolicy"])
    policy = attributes.get("Attributes", {}).get("RedrivePolicy")
    if not policy:
        return None
    count = json.loads(policy).get("maxReceiveCount")
    return int(count) if count is not None else None


def aws_call(what: str, call: Callable[[], R]) -> R:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return call()
    except (ClientError, BotoCoreError) as error:
        raise CliError(f"{what} failed: {error}; check your AWS credentials and the target") from None


def listing_table(messages: list[DeadLetter], title: str) -> Table:
    table = Table("message", "workspace", "job", "sequence", "receives", "sent", title=title)
    for message in messages:
        table.add_row(
            message.message_id,
            str(message.workspace_id or "(none: drop it)"),
            str(message.job_id or "(no jobId)"),
            str(message.sequence_number or ""),
            str(message.receive_count),
            when(message.sent_at_ms),
        )
    return table


@handle_errors
def dlq_list(
    ctx: typer.Context,
    workspaces: Annotated[list[str] | None, typer.Option("--workspace", "-w", help="Only these workspaces.")] = None,
    as_json: JsonOption = False,
) -> None:
    """The DLQ's messages, each group in order (read without deleting anything)."""
    target = state_of(ctx).target
    wanted = set(workspaces or [])
    listing = aws_call(
        "reading the DLQ", lambda: dead_letter_queue(target).read(lambda m: not wanted or m.workspace_id in wanted)
    )
    if as_json:
        print_json({"messages": [m.summary() for m in listing.messages], "unseen": listing.unseen})
        return
    if listing.messages:
        out().print(listing_table(listing.messages, f"dead-letter queue: {len(listing.messages)} messages"))
    else:
        out().print("No messages in the dead-letter queue" + (" for these workspaces." if wanted else "."))
    if listing.unseen:
        out().print(
            f"[yellow]{listing.unseen} more message(s) wait behind earlier messages of their group; they show once "
            "those are redriven.[/]"
        )
    if listing.messages:
        out().print("Redrive them: agent-jobs dlq redrive --workspace WORKSPACE (or --all)")


@handle_errors
def dlq_show(ctx: typer.Context, message_id: str, as_json: JsonOption = False) -> None:
    """One DLQ message: body, attributes, group, receive count, and its job record's state."""
    from agent_jobs.guard import JobGuard

    target = state_of(ctx).target
    message = aws_call("reading the DLQ", lambda: dead_letter_queue(target).find(message_id))
    if message is None:
        raise CliError(
            f"no message {message_id} in the DLQ (a message behind earlier ones of its group shows only after they "
            "are redriven); list them with: agent-jobs dlq list"
        )
    job = None
    tenant_id = message.message_attributes.get("tenantId")
    if message.job_id and tenant_id:
        guard = JobGuard(target.dynamodb(), target.table_name)
        job = aws_call("reading the job record", lambda: guard.get_job(tenant_id, str(message.job_id)))
    try:
        body: Any = json.loads(message.body)
    except ValueError:
        body = message.body
    if as_json:
        record = None if job is None else {k: v for k, v in job.items() if k not in ("body", "leaseOwner")}
        print_json(
            {
                **message.summary(),
                "attributes": message.attributes,
                "messageAttributes": message.message_attributes,
                "body": body,
                "job": record,
            }
        )
        return
    out().print(
        Panel(
            fields_table(
                [
                    ("group", message.group_id),
                    ("workspace", message.workspace_id),
                    ("job", message.job_id or "(the body names no jobId)"),
                    ("sequence", message.sequence_number),
                    ("receives", message.receive_count),
                    ("sent", when(message.sent_at_ms)),
                    ("attributes", json.dumps(message.message_attributes) if message.message_attributes else None),
                    ("job state", styled(job.get("status")) if job else "(no job record)"),
                    ("job error", job.get("error") if job else None),
                ]
            ),
            title=f"DLQ message {message.message_id}",
            expand=False,
        )
    )
    out().print(Panel(Text(json.dumps(body, indent=2) if not isinstance(body, str) else body), title="body"))


@handle_errors
def dlq_drop(
    ctx: typer.Context,
    message_id: str,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Delete a DLQ message whose group names no workspace (empty, `ws#` alone, another scheme), after recording it
    REJECTED as msg#MESSAGE_ID. A job of a workspace is never dropped: redrive it, then resume it (--retry or
    --skip)."""
    from agent_jobs.guard import JobGuard

    target = state_of(ctx).target
    dlq = dead_letter_queue(target)
    message = aws_call("reading the DLQ", lambda: dlq.find(message_id))
    if message is None:
        raise CliError(f"no message {message_id} in the DLQ; list them with: agent-jobs dlq list")
    if message.workspace_id is not None:
        raise CliError(
            f"message {message_id} is a job of workspace {message.workspace_id}: it is not dropped. Redrive it "
            f"(agent-jobs dlq redrive --workspace {message.workspace_id}), then resume the workspace with --retry or "
            "--skip"
        )
    if not yes and not typer.confirm(
        f"Record message {message_id} (group {message.group_id!r}) REJECTED and delete it from the DLQ?", err=True
    ):
        raise CliError("nothing dropped")
    guard = JobGuard(target.dynamodb(), target.table_name)
    result = aws_call("dropping the message", lambda: dlq.drop(guard, message, reason="dropped by an operator"))
    if as_json:
        print_json(result.as_dict())
    else:
        out().print(f"[green]{result.outcome}[/] {result.message_id}: {result.detail}; deleted from the DLQ")


@handle_errors
def dlq_redrive(
    ctx: typer.Context,
    workspaces: Annotated[list[str] | None, typer.Option("--workspace", "-w", help="Redrive these workspaces.")] = None,
    redrive_all: Annotated[bool, typer.Option("--all", help="Redrive every workspace's messages.")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Park the dead-lettered jobs of the workspaces with their original SequenceNumbers and halt those workspaces;
    a resume then runs them first, before every later job, in order. Nothing is resent to the jobs queue."""
    from agent_jobs.guard import JobGuard
    from agent_jobs_cli.deadletters import RedriveOutcome, RedriveResult, registered_owners

    if bool(workspaces) == redrive_all:
        raise CliError("choose what to redrive: --workspace WORKSPACE (repeatable) or --all")
    wanted = set(workspaces or [])

    def selected(workspace_id: str | None) -> bool:
        return redrive_all or workspace_id in wanted

    target = state_of(ctx).target
    dlq = dead_letter_queue(target)
    if not yes:
        listing = aws_call("reading the DLQ", lambda: dlq.read(lambda m: selected(m.workspace_id)))
        if not listing.messages:
            out().print("Nothing to redrive: no DLQ message of the selected workspaces.")
            return
        out().print(listing_table(listing.messages, "to redrive"))
        if not typer.confirm(
            f"Park these {len(listing.messages)} message(s) and halt their workspaces until a resume?", err=True
        ):
            raise CliError("nothing redriven")

    guard = JobGuard(target.dynamodb(), target.table_name)
    max_receives = aws_call("reading the jobs queue", lambda: queue_max_receive_count(target))
    console = out()

    def report(result: RedriveResult) -> None:
        if not as_json:
            style = "green" if result.deleted else "yellow"
            console.print(
                f"[{style}]{result.outcome}[/] {result.message_id} workspace {result.workspace_id} job "
                f"{result.job_id or '-'}: {result.detail}"
            )

    results = aws_call(
        "the redrive",
        lambda: dlq.redrive(
            guard,
            select_workspace=selected,
            owner_of=registered_owners(target.dynamodb(), target.table_name),
            max_receive_count=max_receives,
            on_result=report,
        ),
    )
    refused = [r for r in results if r.outcome is RedriveOutcome.REFUSED]
    halted_workspaces = sorted(
        {str(r.workspace_id) for r in results if r.outcome in (RedriveOutcome.PARKED, RedriveOutcome.REJECTED)}
    )
    left = [r for r in results if not r.deleted]
    if as_json:
        print_json(
            {
                "results": [r.as_dict() for r in results],
                "next": [f"agent-jobs resume {w} --retry" for w in halted_workspaces],
            }
        )
    else:
        if not results:
            console.print("Nothing to redrive: no DLQ message of the selected workspaces.")
        if refused:
            console.print(
                f"{len(refused)} message(s) were not their workspace owner's: recorded, nothing halted. List them: "
                "agent-jobs refused"
            )
        for workspace_id in halted_workspaces:
            console.print(
                f"Workspace {workspace_id} is HALTED with its dead-lettered job(s) parked in order. When the cause "
                f"is fixed: agent-jobs resume {workspace_id} --retry   (or --skip)"
            )
    if left:
        raise typer.Exit(1)
