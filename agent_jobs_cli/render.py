"""Jobs and workspaces as rich tables and panels."""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterable
from typing import Any, Final

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from agent_jobs_cli.results import output_text, printable, result_cell, result_fields

STATUS_STYLES: Final = {
    "SUCCEEDED": "green",
    "SKIPPED": "green",
    "QUEUED": "cyan",
    "IN_FLIGHT": "yellow",
    "FAILED": "yellow",
    "PARKED": "magenta",
    "DEAD": "bold red",
    "REJECTED": "bold red",
    "ACTIVE": "green",
    "HALTED": "bold red",
    "RESUMING": "yellow",
}


def styled(value: Any) -> Text:
    text = "" if value is None else str(value)
    return Text(text, style=STATUS_STYLES.get(text, ""))


def when(epoch_ms: Any) -> str:
    if not isinstance(epoch_ms, int | float):
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch_ms / 1000)) + "Z"


def fields_table(pairs: Iterable[tuple[str, Any]]) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for name, value in pairs:
        if value is None or value == "" or (isinstance(value, Text) and not value.plain):
            continue
        table.add_row(name, value if isinstance(value, Text) else Text(str(value)))
    return table


def job_panel(job: dict[str, Any]) -> Panel:
    facts = fields_table(
        [
            ("status", styled(job.get("status"))),
            ("workspace", job.get("workspaceId")),
            ("type", job.get("type")),
            ("attempt", job.get("attempt")),
            ("failures", job.get("failures")),
            ("sequence", job.get("sequenceNumber")),
            ("accepted", when(job.get("acceptedAt"))),
            ("updated", when(job.get("updatedAt"))),
            ("finished", when(job.get("finishedAt"))),
            ("error", printable(str(job["error"])) if job.get("error") else None),
            *result_fields(job.get("result")),
        ]
    )
    history = Table("at", "status", "detail", box=None, header_style="dim")
    for entry in job.get("history") or []:
        detail = entry.get("error") or entry.get("reason") or entry.get("messageId") or ""
        history.add_row(when(entry.get("at")), styled(entry.get("status")), printable(str(detail)))
    output = output_text(job.get("result"))
    parts: list[RenderableType] = [facts, Text(""), *([output, Text("")] if output is not None else []), history]
    return Panel(Group(*parts), title=f"job {job.get('jobId')}", expand=False)


def last_resume_text(last: Any) -> str | None:
    """`retry of job J by B at T`, or None when the workspace shows no resume."""
    if not isinstance(last, dict) or not last.get("decision"):
        return None
    text = f"{last.get('decision')} of job {last.get('haltingJobId')}"
    if last.get("by"):
        text += f" by {last.get('by')}"
    return text + (f" at {when(last.get('at'))}" if last.get("at") else "")


def workspace_panel(workspace: dict[str, Any], title: str | None = None) -> Panel:
    facts = fields_table(
        [
            ("state", styled(workspace.get("state"))),
            ("tenant", workspace.get("tenantId")),
            ("halting job", workspace.get("haltingJobId")),
            ("halt reason", workspace.get("haltReason")),
            ("last applied", workspace.get("lastAppliedJobId")),
            ("last resume", last_resume_text(workspace.get("lastResume"))),
            ("remote", workspace.get("remoteUrl")),
            ("branch", workspace.get("branch")),
            ("base branch", workspace.get("baseBranch")),
            ("test suites", test_suites_text(workspace.get("testCommands"))),
            ("GitHub", workspace.get("githubRepository")),
            ("GitHub API", workspace.get("githubApiUrl")),
            ("token", workspace.get("tokenParameter")),
        ]
    )
    return Panel(facts, title=title or f"workspace {workspace.get('workspaceId')}", expand=False)


def test_suites_text(commands: Any) -> str | None:
    """`unit: python -m pytest -q` per registered suite, one a line (the argv quoted as a shell would need)."""
    if not isinstance(commands, dict) or not commands:
        return None
    return "\n".join(
        f"{name}: {shlex.join(str(a) for a in argv) if isinstance(argv, list) else argv}"
        for name, argv in commands.items()
    )


def jobs_table(jobs: list[dict[str, Any]], title: str | None = None, *, wide: bool = False) -> Table:
    """The timeline, a row a job, one line a row at 80 columns: its position (`#`, the order the jobs take effect
    in), id, type, status and what came of it (the error of a failed job, cut short to fit). `wide` adds the
    attempts, the time of the last change and the queue's full 20-digit SequenceNumber."""
    table = Table(title=title, box=None, pad_edge=False, header_style="bold")
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("job", no_wrap=True)
    table.add_column("type", no_wrap=True)
    table.add_column("status", no_wrap=True, min_width=9)
    if wide:
        table.add_column("attempt", justify="right", no_wrap=True)
        table.add_column("updated", no_wrap=True)
        table.add_column("sequence", no_wrap=True)
    table.add_column("result")
    for index, job in enumerate(jobs, start=1):
        columns: list[Any] = [str(index), str(job.get("jobId")), str(job.get("type") or ""), styled(job.get("status"))]
        if wide:
            attempt = job.get("attempt")
            columns += [
                str(attempt if attempt is not None else ""),
                when(job.get("updatedAt")),
                str(job.get("sequenceNumber") or ""),
            ]
        table.add_row(*columns, result_cell(job))
    return table
