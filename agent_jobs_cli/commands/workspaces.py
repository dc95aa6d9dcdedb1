"""A workspace's state and timeline, following it live, and deciding a halt: `status workspace`, `jobs`, `watch`,
`halted`, `resume`."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from typing import Annotated, Any, Final

import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from agent_jobs_cli.api import ApiClient, ApiError, path_id
from agent_jobs_cli.context import (
    CliError,
    JsonOption,
    api_get,
    api_pages,
    api_post,
    explain,
    handle_errors,
    out,
    print_json,
    state_of,
)
from agent_jobs_cli.render import job_panel, jobs_table, styled, workspace_panel

PENDING_STATUSES: Final = frozenset({"QUEUED", "IN_FLIGHT", "FAILED"})
WideOption = Annotated[
    bool,
    typer.Option(
        "--wide", help="Add each job's attempts, last change and full 20-digit SequenceNumber (wider than 80)."
    ),
]


@handle_errors
def status_workspace(ctx: typer.Context, workspace_id: str, as_json: JsonOption = False) -> None:
    """A workspace's registration and state (ACTIVE, HALTED, RESUMING)."""
    workspace = api_get(state_of(ctx).api(), f"/workspaces/{path_id(workspace_id)}")
    if as_json:
        print_json(workspace)
        return
    out().print(workspace_panel(workspace))
    if workspace.get("state") == "HALTED":
        out().print(f"Resume it: agent-jobs resume {workspace_id} --retry   (or --skip the halting job)")


def workspace_jobs(client: ApiClient, workspace_id: str, page_size: int | None = None) -> list[dict[str, Any]]:
    return api_pages(client, f"/workspaces/{path_id(workspace_id)}/jobs", "jobs", {"limit": page_size})


@handle_errors
def jobs(
    ctx: typer.Context,
    workspace_id: Annotated[str, typer.Argument(metavar="WORKSPACE")],
    page_size: Annotated[int | None, typer.Option("--page-size", min=1, help="Jobs per API call.")] = None,
    wide: WideOption = False,
    as_json: JsonOption = False,
) -> None:
    """A workspace's timeline: every job, oldest accepted first, a line each (--wide: with attempts, times and the
    full SequenceNumbers; --json has every field)."""
    timeline = workspace_jobs(state_of(ctx).api(), workspace_id, page_size)
    if as_json:
        print_json({"workspaceId": workspace_id, "jobs": timeline})
    else:
        out().print(jobs_table(timeline, title=f"workspace {workspace_id}: {len(timeline)} jobs", wide=wide))


def workspace_or_none(client: ApiClient, workspace_id: str) -> dict[str, Any] | None:
    """The workspace's status view; None while it is neither registered nor halted (the API answers 404)."""
    try:
        answer: dict[str, Any] = client.get(f"/workspaces/{path_id(workspace_id)}")
    except ApiError as error:
        if error.status == 404:
            return None
        raise CliError(explain(error, "GET", f"/workspaces/{workspace_id}")) from None
    return answer


def is_idle(workspace: dict[str, Any] | None, timeline: list[dict[str, Any]]) -> bool:
    """Nothing left to happen without an operator: no job waiting or running, and no resume in progress."""
    if workspace is not None and workspace.get("state") == "RESUMING":
        return False
    return not any(job.get("status") in PENDING_STATUSES for job in timeline)


@handle_errors
def watch(
    ctx: typer.Context,
    workspace_id: Annotated[str, typer.Argument(metavar="WORKSPACE")],
    interval: Annotated[float, typer.Option("--interval", min=0.1, help="Seconds between polls.")] = 2.0,
    until_idle: Annotated[
        bool, typer.Option("--until-idle", help="Stop once no job is waiting or running (exit 0).")
    ] = False,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="Give up after this many seconds (exit 1).")
    ] = None,
    wide: WideOption = False,
    as_json: JsonOption = False,
) -> None:
    """Follow a workspace and its timeline live until Ctrl-C (or --until-idle)."""
    client = state_of(ctx).api()
    deadline = None if timeout is None else time.monotonic() + timeout

    def snapshot() -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        return workspace_or_none(client, workspace_id), workspace_jobs(client, workspace_id)

    def view(workspace: dict[str, Any] | None, timeline: list[dict[str, Any]]) -> Group:
        header = workspace_panel(workspace) if workspace else Text(f"workspace {workspace_id} (not registered)")
        counts: dict[str, int] = {}
        for job in timeline:
            counts[str(job.get("status"))] = counts.get(str(job.get("status")), 0) + 1
        summary = Text("  ".join(f"{name} {count}" for name, count in sorted(counts.items())) or "no jobs yet")
        return Group(header, jobs_table(timeline, wide=wide), summary)

    def emit() -> Callable[[dict[str, Any] | None, list[dict[str, Any]]], None]:
        last: list[Any] = [None]

        def changed_lines(workspace: dict[str, Any] | None, timeline: list[dict[str, Any]]) -> None:
            document = {"workspace": workspace, "jobs": timeline}
            if document != last[0]:  # one JSON line per change, for scripts that follow it
                typer.echo(json.dumps(document, sort_keys=True, default=str))
            last[0] = document

        return changed_lines

    def poll(show: Callable[[dict[str, Any] | None, list[dict[str, Any]]], None]) -> None:
        while True:
            workspace, timeline = snapshot()
            show(workspace, timeline)
            if until_idle and is_idle(workspace, timeline):
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise CliError(f"workspace {workspace_id} still has jobs waiting or running after {timeout} s")
            time.sleep(interval)

    try:
        if as_json:
            poll(emit())
        else:
            with Live(console=out(), auto_refresh=False, transient=False) as live:
                poll(lambda workspace, timeline: live.update(view(workspace, timeline), refresh=True))
    except KeyboardInterrupt:
        return


@handle_errors
def halted(ctx: typer.Context, as_json: JsonOption = False) -> None:
    """Your tenant's halted (and resuming) workspaces."""
    workspaces = api_pages(state_of(ctx).api(operator=True), "/workspaces", "workspaces", {"state": "HALTED"})
    if as_json:
        print_json({"workspaces": workspaces})
        return
    if not workspaces:
        out().print("No halted workspaces.")
        return
    table = Table("workspace", "state", "halting job", "reason", title="halted workspaces")
    for workspace in workspaces:
        table.add_row(
            str(workspace.get("workspaceId")),
            styled(workspace.get("state")),
            str(workspace.get("haltingJobId") or ""),
            str(workspace.get("haltReason") or ""),
        )
    out().print(table)
    out().print("Inspect one: agent-jobs status workspace WORKSPACE; then agent-jobs resume WORKSPACE --retry|--skip")


@handle_errors
def resume(
    ctx: typer.Context,
    workspace_id: Annotated[str, typer.Argument(metavar="WORKSPACE")],
    retry: Annotated[bool, typer.Option("--retry", help="Run the halting job again, then the parked jobs.")] = False,
    skip: Annotated[
        bool, typer.Option("--skip", help="Mark the halting job SKIPPED, then run the parked jobs.")
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Resume a halted workspace: decide its halting job (--retry or --skip); its parked jobs then run in order. On a
    RESUMING workspace, repeat the resume under way (its decision and job), which sends its drain marker again."""
    if retry and skip:
        raise CliError("choose one decision: --retry (run the halting job again) or --skip (never run it)")
    chosen = "retry" if retry else "skip" if skip else None
    client = state_of(ctx).api(operator=True)
    workspace = api_get(client, f"/workspaces/{path_id(workspace_id)}")
    repeat = workspace.get("state") == "RESUMING"
    if repeat:
        # A resume whose drain marker was never sent (the API answered 503) stays RESUMING and parks every new job
        # until the same request is sent again: the workspace shows which one it was.
        last = workspace.get("lastResume") or {}
        decision, halting_job_id = last.get("decision"), last.get("haltingJobId")
        if not decision or not halting_job_id:
            raise CliError(f"workspace {workspace_id} is RESUMING but shows no resume to repeat; watch it instead")
        if chosen is not None and chosen != decision:
            raise CliError(
                f"workspace {workspace_id} is RESUMING from a {decision} of job {halting_job_id}; that decision is"
                f" made: run agent-jobs resume {workspace_id} without --{chosen} to send its drain marker again"
            )
    else:
        if workspace.get("state") != "HALTED":
            raise CliError(
                f"workspace {workspace_id} is {workspace.get('state')}, not HALTED: there is nothing to resume"
            )
        if chosen is None:
            raise CliError("choose one decision: --retry (run the halting job again) or --skip (never run it)")
        decision, halting_job_id = chosen, workspace.get("haltingJobId")
        if not halting_job_id:
            raise CliError(f"workspace {workspace_id} is HALTED but names no halting job; inspect it in the table")
    if not as_json:
        out().print(workspace_panel(workspace))
        halting = None
        # A rejected message may have no job record to show; the workspace's halt reason says why it halted.
        with contextlib.suppress(ApiError):
            halting = client.get(f"/jobs/{path_id(str(halting_job_id))}")
        if isinstance(halting, dict):
            out().print(job_panel(halting))
    question = (
        f"repeat the {decision} of job {halting_job_id} (send the drain marker of workspace {workspace_id} again)?"
        if repeat
        else f"{decision} job {halting_job_id} and resume workspace {workspace_id}?"
    )
    if not yes and not typer.confirm(question, err=True):
        raise CliError("not resumed")
    answer = api_post(
        client,
        f"/workspaces/{path_id(workspace_id)}/resume",
        {"decision": decision, "haltingJobId": halting_job_id},
    )
    if as_json:
        print_json(answer)
        return
    if repeat:
        out().print(f"Resume of {workspace_id} repeated ({decision} of job {halting_job_id}): drain marker sent.")
    elif answer.get("state") == "HALTED":
        # Another job halted the workspace while it was halted: nothing runs until that one is decided too.
        following = answer.get("haltingJobId")
        out().print(f"Job {halting_job_id}: {decision} decided. {workspace_id} is still HALTED by job {following}.")
        out().print(f"Decide it next: agent-jobs resume {workspace_id} --retry|--skip")
        return
    else:
        out().print(f"Workspace {workspace_id} is {answer.get('state')}: {decision} of job {halting_job_id} accepted.")
    out().print(f"Follow it: agent-jobs watch {workspace_id} --until-idle")
