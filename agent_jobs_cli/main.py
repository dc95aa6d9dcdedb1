"""`agent-jobs`: the operator's command line for Agent Jobs.

By default it acts on the local runtime (`make local` writes `.agent-jobs/local.json`); `--stack-name NAME` acts on a
deployed stack instead (its CloudFormation Outputs). API calls carry a bearer token: `--token` or AGENT_JOBS_TOKEN;
against the local runtime, when none is given, one is minted for `--tenant` from the local development key.
The `dlq` commands use your AWS credentials on the queue and table directly, not the API.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final, NoReturn, ParamSpec, TypeVar

import typer
from pydantic import ValidationError
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from agent_jobs_cli.api import ApiClient, ApiError, path_id
from agent_jobs_cli.targets import Target, TargetError, connection_file_path, load_local_target, load_stack_target

if TYPE_CHECKING:
    from agent_jobs_cli.deadletters import DeadLetter, DeadLetterQueue

OPERATOR_SCOPE: Final = "agent-jobs/operator"  # enqueue_api.app.OPERATOR_SCOPE (a test keeps them equal)
PENDING_STATUSES: Final = frozenset({"QUEUED", "IN_FLIGHT", "FAILED"})
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

P = ParamSpec("P")
R = TypeVar("R")

app = typer.Typer(
    name="agent-jobs",
    help=__doc__,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
status_app = typer.Typer(help="Show one job or one workspace.", no_args_is_help=True)
dlq_app = typer.Typer(help="The dead-letter queue: list, show, redrive and drop (AWS credentials, not the API).")
app.add_typer(status_app, name="status")
app.add_typer(dlq_app, name="dlq", no_args_is_help=True)

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON (for scripts) instead of tables.")]


class CliError(Exception):
    """A failure the user can act on: printed as `error: <message>`, exit code 1."""


@dataclass
class CliState:
    stack_name: str | None
    region: str | None
    token: str | None
    tenant: str
    connection_file: Path | None
    _target: Target | None = None

    @property
    def target(self) -> Target:
        if self._target is None:
            try:
                if self.stack_name:
                    self._target = load_stack_target(self.stack_name, self.region)
                else:
                    self._target = load_local_target(connection_file_path(self.connection_file))
            except TargetError as error:
                raise CliError(str(error)) from None
        return self._target

    def api(self, *, operator: bool = False) -> ApiClient:
        return ApiClient(self.target.api_url, token=self.api_token(operator=operator))

    def api_token(self, *, operator: bool) -> str:
        if self.token:
            return self.token
        if not self.target.local:
            raise CliError(
                "no token: pass --token or set AGENT_JOBS_TOKEN to a token for your tenant"
                + (f" with the '{OPERATOR_SCOPE}' scope" if operator else "")
            )
        return mint_local_token(self.tenant, operator=operator)


def mint_local_token(tenant: str, *, operator: bool, ttl_seconds: int = 3600) -> str:
    """A token from the local development key (agent_jobs_local.auth), imported only when needed."""
    try:
        auth: Any = importlib.import_module("agent_jobs_local.auth")
    except ImportError:
        raise CliError("this checkout cannot mint local tokens (no agent_jobs_local.auth); pass --token") from None
    scopes = (OPERATOR_SCOPE,) if operator else ()
    return str(auth.mint_token(tenant, scopes=scopes, ttl_seconds=ttl_seconds))


def out() -> Console:
    return Console(highlight=False, soft_wrap=False)


def err() -> Console:
    return Console(stderr=True, highlight=False)


def fail(message: str) -> NoReturn:
    err().print(f"[bold red]error:[/] {message}")
    raise typer.Exit(1)


def print_json(document: Any) -> None:
    typer.echo(json.dumps(document, indent=2, sort_keys=True, default=str))


def explain(error: ApiError, method: str, path: str) -> str:
    if error.status == 0:
        return f"{error.message}; is the local runtime running (`make local`), or is --stack-name right?"
    if error.status == 401:
        return f"the API refused the token ({error.message}); pass a valid --token or set AGENT_JOBS_TOKEN"
    if error.status == 404 and error.message == "Not Found":  # API Gateway's answer when no route matches
        route = path.split("?", maxsplit=1)[0]
        return f"the API has no route {method} {route}; deploy (or run) a version of Agent Jobs that has it"
    detail = ""
    if isinstance(error.body, dict) and isinstance(error.body.get("errors"), list):
        detail = "".join(f"\n  {e.get('field')}: {e.get('message')}" for e in error.body["errors"])
    return f"{method} {path} answered {error.status}: {error.message}{detail}"


def handle_errors(command: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except CliError as error:
            fail(str(error))

    return wrapper


def api_get(client: ApiClient, path: str, query: dict[str, str | int | None] | None = None) -> Any:
    try:
        return client.get(path, query)
    except ApiError as error:
        raise CliError(explain(error, "GET", path)) from None


def api_post(client: ApiClient, path: str, body: Any) -> Any:
    try:
        return client.post(path, body)
    except ApiError as error:
        raise CliError(explain(error, "POST", path)) from None


def api_pages(client: ApiClient, path: str, key: str, query: dict[str, str | int | None] | None = None) -> list[Any]:
    try:
        return list(client.pages(path, key, query))
    except ApiError as error:
        raise CliError(explain(error, "GET", path)) from None


def state_of(ctx: typer.Context) -> CliState:
    state = ctx.find_object(CliState)
    if state is None:  # only when a command is invoked without the app's callback (never from the command line)
        raise CliError("internal: no CLI state")
    return state


# ---- rendering -----------------------------------------------------------------------------------------------------


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
        if value is None or value == "":
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


def workspace_panel(workspace: dict[str, Any]) -> Panel:
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
        ]
    )
    return Panel(facts, title=f"workspace {workspace.get('workspaceId')}", expand=False)


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


# ---- the app -------------------------------------------------------------------------------------------------------


@app.callback()
def main_options(
    ctx: typer.Context,
    stack_name: Annotated[
        str | None,
        typer.Option("--stack-name", envvar="AGENT_JOBS_STACK_NAME", help="Act on this deployed stack."),
    ] = None,
    region: Annotated[
        str | None, typer.Option("--region", envvar="AGENT_JOBS_REGION", help="The stack's region.")
    ] = None,
    token: Annotated[
        str | None, typer.Option("--token", envvar="AGENT_JOBS_TOKEN", help="Bearer token for the API.")
    ] = None,
    tenant: Annotated[
        str, typer.Option("--tenant", envvar="AGENT_JOBS_TENANT", help="Tenant of a minted local token.")
    ] = "default",
    connection_file: Annotated[
        Path | None,
        typer.Option("--connection-file", help="The local runtime's connection file [.agent-jobs/local.json]."),
    ] = None,
) -> None:
    """Operate Agent Jobs: enqueue and inspect jobs, watch workspaces, resume halted ones, redrive the DLQ."""
    ctx.obj = CliState(stack_name, region, token, tenant, connection_file)


@app.command()
@handle_errors
def enqueue(
    ctx: typer.Context,
    job_type: Annotated[
        str | None, typer.Argument(metavar="[TYPE]", help="apply_patch, run_tests or open_pr (not with --file).")
    ] = None,
    workspace: Annotated[str | None, typer.Argument(metavar="[WORKSPACE]", help="The workspace id.")] = None,
    file: Annotated[
        Path | None, typer.Option("--file", help="A job as JSON: {jobId?, workspaceId, type, payload}.")
    ] = None,
    job_id: Annotated[str | None, typer.Option("--job-id", help="Default: a new unique id.")] = None,
    patch_file: Annotated[Path | None, typer.Option("--patch-file", help="apply_patch: the diff.")] = None,
    message: Annotated[str | None, typer.Option("--message", "-m", help="apply_patch: the commit message.")] = None,
    suite: Annotated[str, typer.Option("--suite", help="run_tests: a registered test command.")] = "default",
    title: Annotated[str | None, typer.Option("--title", help="open_pr: the pull request title.")] = None,
    body: Annotated[str, typer.Option("--body", help="open_pr: the pull request body.")] = "",
    as_json: JsonOption = False,
) -> None:
    """Submit a job. `enqueue apply_patch WS --patch-file p.diff -m MSG`, `enqueue run_tests WS --suite unit`,
    `enqueue open_pr WS --title T --body B`, or `enqueue --file job.json`. Repeating it with the same --job-id is
    safe: a jobId is accepted at most once."""
    document = build_job(
        job_type,
        workspace,
        file=file,
        job_id=job_id,
        patch_file=patch_file,
        message=message,
        suite=suite,
        title=title,
        body=body,
    )
    answer = api_post(state_of(ctx).api(), "/jobs", document)
    if as_json:
        print_json(answer)
        return
    verb = "accepted" if answer.get("created", True) else "already accepted (same payload)"
    out().print(
        Panel(
            fields_table(
                [
                    ("status", styled(answer.get("status"))),
                    ("workspace", document["workspaceId"]),
                    ("type", document["type"]),
                    ("sequence", answer.get("sequenceNumber")),
                    ("message", answer.get("messageId")),
                ]
            ),
            title=f"job {answer.get('jobId')} {verb}",
            expand=False,
        )
    )
    out().print(f"Follow it: agent-jobs status job {answer.get('jobId')}")


def build_job(
    job_type: str | None,
    workspace: str | None,
    *,
    file: Path | None,
    job_id: str | None,
    patch_file: Path | None,
    message: str | None,
    suite: str,
    title: str | None,
    body: str,
) -> dict[str, Any]:
    """The job document to POST, validated with the layer's model so mistakes are named before anything is sent."""
    from agent_jobs.models import JobType, job_request_adapter

    if file is not None:
        if job_type or workspace:
            raise CliError("give either --file or TYPE WORKSPACE, not both")
        try:
            document = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise CliError(f"cannot read the job file {file}: {error}") from None
        if not isinstance(document, dict):
            raise CliError(f'{file} holds no JSON object; write {{"workspaceId", "type", "payload"}}')
        if job_id:
            document["jobId"] = job_id
    else:
        types = ", ".join(t.value for t in JobType)
        if not job_type or not workspace:
            raise CliError(f"name the job: agent-jobs enqueue TYPE WORKSPACE (TYPE is one of {types}), or --file")
        job_type = job_type.replace("-", "_")
        if job_type == JobType.APPLY_PATCH:
            if patch_file is None or not message:
                raise CliError("apply_patch needs --patch-file FILE and --message TEXT")
            try:
                patch = patch_file.read_text(encoding="utf-8")
            except OSError as error:
                raise CliError(f"cannot read the patch {patch_file}: {error}") from None
            payload: dict[str, Any] = {"patch": patch, "commitMessage": message}
        elif job_type == JobType.RUN_TESTS:
            payload = {"suite": suite}
        elif job_type == JobType.OPEN_PR:
            if not title:
                raise CliError("open_pr needs --title TEXT")
            payload = {"title": title, "body": body}
        else:
            raise CliError(f"unknown job type {job_type!r}; use one of {types}")
        document = {"jobId": job_id, "workspaceId": workspace, "type": job_type, "payload": payload}
    if not document.get("jobId"):
        document["jobId"] = f"job-{uuid.uuid4().hex}"
    try:
        job_request_adapter.validate_python(document)
    except ValidationError as error:
        problems = "".join(
            f"\n  {'.'.join(str(p) for p in e['loc'][1:] or e['loc'])}: {e['msg']}"
            for e in error.errors(include_url=False)
        )
        raise CliError(f"the job is invalid; fix these and try again:{problems}") from None
    return document


@status_app.command("job")
@handle_errors
def status_job(ctx: typer.Context, job_id: str, as_json: JsonOption = False) -> None:
    """A job's state and history."""
    job = api_get(state_of(ctx).api(), f"/jobs/{path_id(job_id)}")
    if as_json:
        print_json(job)
    else:
        out().print(job_panel(job))


@status_app.command("workspace")
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


@app.command()
@handle_errors
def jobs(
    ctx: typer.Context,
    workspace_id: Annotated[str, typer.Argument(metavar="WORKSPACE")],
    page_size: Annotated[int | None, typer.Option("--page-size", min=1, help="Jobs per API call.")] = None,
    as_json: JsonOption = False,
) -> None:
    """A workspace's timeline: every job, oldest accepted first."""
    timeline = workspace_jobs(state_of(ctx).api(), workspace_id, page_size)
    if as_json:
        print_json({"workspaceId": workspace_id, "jobs": timeline})
    else:
        out().print(jobs_table(timeline, title=f"workspace {workspace_id}: {len(timeline)} jobs"))


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


@app.command()
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
        return Group(header, jobs_table(timeline), summary)

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


@app.command()
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


@app.command()
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


@app.command()
@handle_errors
def token(
    tenant: Annotated[str, typer.Option("--tenant", help="The token's tenant_id claim.")],
    operator: Annotated[bool, typer.Option("--operator", help=f"Add the '{OPERATOR_SCOPE}' scope.")] = False,
    ttl_seconds: Annotated[int, typer.Option("--ttl", min=60, help="Lifetime in seconds.")] = 3600,
) -> None:
    """Mint a token from the local development key (local runtime only): export AGENT_JOBS_TOKEN=$(agent-jobs token
    --tenant T --operator)."""
    typer.echo(mint_local_token(tenant, operator=operator, ttl_seconds=ttl_seconds))


# ---- dead-letter queue ---------------------------------------------------------------------------------------------


def dead_letter_queue(target: Target) -> DeadLetterQueue:
    from agent_jobs_cli.deadletters import DeadLetterQueue

    return DeadLetterQueue(target.sqs(), target.dlq_url)


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


@dlq_app.command("list")
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


@dlq_app.command("show")
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


@dlq_app.command("drop")
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


@dlq_app.command("redrive")
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
        for workspace_id in halted_workspaces:
            console.print(
                f"Workspace {workspace_id} is HALTED with its dead-lettered job(s) parked in order. When the cause "
                f"is fixed: agent-jobs resume {workspace_id} --retry   (or --skip)"
            )
    if left:
        raise typer.Exit(1)


@app.command()
@handle_errors
def plan(
    workspaces: Annotated[int, typer.Option("--workspaces", help="Workspaces (message groups) with jobs.")],
    rate: Annotated[float, typer.Option("--rate", help="Jobs per second, all workspaces together.")],
    job_seconds: Annotated[float, typer.Option("--job-seconds", help="Mean duration of one job, in seconds.")],
    job_p99_seconds: Annotated[
        float | None, typer.Option("--job-p99-seconds", help="p99 job duration (default: every job takes the mean).")
    ] = None,
    memory_mb: Annotated[
        int | None, typer.Option("--memory-mb", help="Worker memory (default: template.yaml's).")
    ] = None,
    batch_size: Annotated[
        int | None, typer.Option("--batch-size", help="WorkerBatchSize (default: template.yaml's).")
    ] = None,
    max_concurrency: Annotated[
        int | None, typer.Option("--max-concurrency", help="WorkerMaximumConcurrency (default: template.yaml's).")
    ] = None,
    large_payload_share: Annotated[
        float, typer.Option("--large-payload-share", help="Share of jobs whose payload goes to S3, 0 to 1.")
    ] = 0.0,
    as_json: JsonOption = False,
) -> None:
    """Estimate Lambda concurrency, queueing delay per workspace and the cost per million jobs (no AWS calls)."""
    from agent_jobs_cli.plan import PRICES, Deployment, PlanInput, estimate

    deployment = Deployment.from_template(
        memory_mb=memory_mb, batch_size=batch_size, maximum_concurrency=max_concurrency
    )
    inputs = PlanInput(
        workspaces=workspaces,
        rate=rate,
        job_seconds=job_seconds,
        job_p99_seconds=job_p99_seconds,
        large_payload_share=large_payload_share,
        deployment=deployment,
    )
    problems = inputs.problems()
    if problems:
        raise CliError("; ".join(problems))
    result = estimate(inputs)
    if as_json:
        print_json(result.as_dict())
        return
    console = out()

    def seconds(value: float) -> str:
        return "unbounded (saturated)" if value == float("inf") else f"{value:.2f} s"

    summary = Table("estimate", "value", title="capacity", show_header=False)
    summary.add_row("jobs per second per workspace", f"{result.rate_per_workspace:.4g}")
    summary.add_row("utilisation of each workspace", f"{result.utilisation:.1%}")
    summary.add_row("mean Lambda concurrency needed (Little's law)", f"{result.mean_concurrency_demand:.2f}")
    summary.add_row(
        "concurrency to provision (p99 busy workspaces)",
        f"{result.lambda_concurrency_needed} (runs at most min(workspaces, MaximumConcurrency) = "
        f"{result.concurrency_cap})",
    )
    summary.add_row(f"mean wait per workspace ({result.queue_model})", seconds(result.mean_wait_seconds))
    summary.add_row("extra wait for a free invocation", seconds(result.concurrency_wait_seconds))
    summary.add_row("records per invocation", f"{result.records_per_invocation:.2f}")
    console.print(summary)
    costs = Table("service", "item", "units per job", "USD per million jobs", title="cost per million jobs")
    for line in result.cost_lines:
        costs.add_row(line.service, line.item, f"{line.units_per_job:.4g}", f"{line.usd_per_million_jobs:.2f}")
    costs.add_row("total", "", "", f"{result.usd_per_million_jobs:.2f}", style="bold")
    console.print(costs)
    console.print(
        f"At {rate:g} jobs/s: {result.monthly_jobs:,.0f} jobs a month, about ${result.monthly_usd:,.2f} a month "
        f"(of which ${result.fixed_monthly_usd:.2f} is idle polling)."
    )
    for warning in result.warnings:
        console.print(f"[bold red]warning:[/] {warning}")
    console.print("Assumptions:")
    for assumption in result.assumptions:
        console.print(f"  - {assumption}")
    # One line per price: the source URLs must stay whole to be usable.
    console.print("us-east-1 list prices:")
    for price in PRICES.values():
        console.print(
            f"  - {price.service}, {price.item}: ${price.usd * 1_000_000:.6g} per million ({price.unit}); "
            f"{price.source} "
            f"(page dated {price.page_date or 'nowhere on the page'}, read on {price.read_on})",
            soft_wrap=True,
        )


def main() -> None:
    app(prog_name="agent-jobs")
