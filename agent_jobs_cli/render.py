"""Jobs and workspaces as rich tables and panels."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterable
from typing import Any, Final

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

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
            ("error", job.get("error")),
            ("result", json.dumps(job["result"]) if job.get("result") else None),
        ]
    )
    history = Table("at", "status", "detail", box=None, header_style="dim")
    for entry in job.get("history") or []:
        detail = entry.get("error") or entry.get("reason") or entry.get("messageId") or ""
        history.add_row(when(entry.get("at")), styled(entry.get("status")), str(detail))
    return Panel(Group(facts, Text(""), history), title=f"job {job.get('jobId')}", expand=False)


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


def jobs_table(jobs: list[dict[str, Any]], title: str | None = None) -> Table:
    table = Table(title=title)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("job", overflow="fold")
    table.add_column("type", no_wrap=True)
    table.add_column("status", no_wrap=True, min_width=9)
    table.add_column("attempt", justify="right", no_wrap=True)
    table.add_column("sequence", overflow="fold")
    table.add_column("updated", no_wrap=True)
    table.add_column("error", overflow="fold")
    for index, job in enumerate(jobs, start=1):
        table.add_row(
            str(index),
            str(job.get("jobId")),
            str(job.get("type") or ""),
            styled(job.get("status")),
            str(job.get("attempt") if job.get("attempt") is not None else ""),
            str(job.get("sequenceNumber") or ""),
            when(job.get("updatedAt")),
            str(job.get("error") or "")[:80],
        )
    return table
