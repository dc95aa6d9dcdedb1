"""Submitting a job and showing one: `enqueue`, `status job`."""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.panel import Panel

from agent_jobs_cli.api import path_id
from agent_jobs_cli.commands.wait import (
    DEFAULT_INTERVAL_SECONDS,
    DEFAULT_TIMEOUT_SECONDS,
    WAIT_CODES_HELP,
    IntervalOption,
    TimeoutOption,
    report_wait,
    wait_for_job,
)
from agent_jobs_cli.context import CliError, JsonOption, api_get, api_post, handle_errors, out, print_json, state_of
from agent_jobs_cli.render import fields_table, job_panel, styled


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
    suite: Annotated[
        str | None,
        typer.Option(
            "--suite",
            help="run_tests: a test suite of the workspace's registration; without it, its only suite (the command"
            " refuses a suite the registration lacks, whose job would halt the workspace).",
        ),
    ] = None,
    title: Annotated[str | None, typer.Option("--title", help="open_pr: the pull request title.")] = None,
    body: Annotated[str, typer.Option("--body", help="open_pr: the pull request body.")] = "",
    wait_for_it: Annotated[
        bool, typer.Option("--wait", help=f"Wait until the job settles and show it. {WAIT_CODES_HELP}")
    ] = False,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_SECONDS,
    interval: IntervalOption = DEFAULT_INTERVAL_SECONDS,
    as_json: JsonOption = False,
) -> None:
    """Submit a job. `enqueue apply_patch WS --patch-file p.diff -m MSG`, `enqueue run_tests WS [--suite unit]`,
    `enqueue open_pr WS --title T --body B`, or `enqueue --file job.json`. Repeating it with the same --job-id is
    safe: a jobId is accepted at most once. `--wait` waits until the job settles (see `agent-jobs wait`)."""
    client = state_of(ctx).api()
    if file is None and workspace and (job_type or "").replace("-", "_") == "run_tests":
        suite = chosen_suite(api_get(client, f"/workspaces/{path_id(workspace)}"), workspace, suite)
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
    answer = api_post(client, "/jobs", document)
    if wait_for_it:
        job, outcome = wait_for_job(client, str(answer.get("jobId")), timeout=timeout, interval=interval)
        report_wait(job, outcome, as_json=as_json, timeout=timeout)
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
                    ("suite", (document.get("payload") or {}).get("suite")),
                    ("sequence", answer.get("sequenceNumber")),
                    ("message", answer.get("messageId")),
                ]
            ),
            title=f"job {answer.get('jobId')} {verb}",
            expand=False,
        )
    )
    out().print(
        f"Follow it: agent-jobs status job {answer.get('jobId')}, or wait for it: agent-jobs wait {answer.get('jobId')}"
    )


def build_job(
    job_type: str | None,
    workspace: str | None,
    *,
    file: Path | None,
    job_id: str | None,
    patch_file: Path | None,
    message: str | None,
    suite: str | None,
    title: str | None,
    body: str,
) -> dict[str, Any]:
    """The job document to POST, validated with the layer's model so mistakes are named before anything is sent."""
    from agent_jobs.models import job_request_adapter

    if file is not None:
        if job_type or workspace:
            raise CliError("give either --file or TYPE WORKSPACE, not both")
        document = _job_file(file)
        if job_id:
            document["jobId"] = job_id
    else:
        if not job_type or not workspace:
            raise CliError(
                f"name the job: agent-jobs enqueue TYPE WORKSPACE (TYPE is one of {_job_types()}), or --file"
            )
        job_type = job_type.replace("-", "_")
        payload = _payload(job_type, patch_file=patch_file, message=message, suite=suite, title=title, body=body)
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


def chosen_suite(workspace: dict[str, Any], workspace_id: str, suite: str | None) -> str:
    """The run_tests suite to send: `suite` if the workspace's registration has it, else the registration's only one.
    A suite the registration lacks is refused here: its job would end DEAD and halt the workspace."""
    suites = sorted(str(name) for name in workspace.get("testCommands") or {})
    register = f"agent-jobs workspaces register {workspace_id} ... --test-command NAME=COMMAND"
    if not suites:
        raise CliError(f"workspace {workspace_id} registers no test suite; add one with {register}")
    if suite is None:
        if len(suites) > 1:
            raise CliError(
                f"workspace {workspace_id} has several test suites ({', '.join(suites)}): name one with --suite"
            )
        return suites[0]
    if suite not in suites:
        raise CliError(
            f"workspace {workspace_id} has no test suite {suite!r} (its suites: {', '.join(suites)}); a run_tests job"
            f" of it would end DEAD and halt the workspace: use --suite {suites[0]}, or register it with {register}"
        )
    return suite


def _job_types() -> str:
    from agent_jobs.models import JobType

    return ", ".join(t.value for t in JobType)


def _job_file(file: Path) -> dict[str, Any]:
    try:
        document = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise CliError(f"cannot read the job file {file}: {error}") from None
    if not isinstance(document, dict):
        raise CliError(f'{file} holds no JSON object; write {{"workspaceId", "type", "payload"}}')
    return document


def _payload(
    job_type: str, *, patch_file: Path | None, message: str | None, suite: str | None, title: str | None, body: str
) -> dict[str, Any]:
    """The payload of a job of `job_type` from the command's options."""
    from agent_jobs.models import JobType

    if job_type == JobType.APPLY_PATCH:
        if patch_file is None or not message:
            raise CliError("apply_patch needs --patch-file FILE and --message TEXT")
        try:
            diff = patch_file.read_bytes()
        except OSError as error:
            raise CliError(f"cannot read the patch {patch_file}: {error}") from None
        try:
            text = diff.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None and "\ufffe" not in text and "\uffff" not in text:
            return {"patch": text, "commitMessage": message}
        # Bytes that are not UTF-8 (a file in a legacy encoding) cannot be JSON text, and U+FFFE and U+FFFF cannot be
        # in a queue message: sent as base64.
        return {"patch": base64.b64encode(diff).decode(), "patchEncoding": "base64", "commitMessage": message}
    if job_type == JobType.RUN_TESTS:
        if not suite:
            raise CliError("run_tests needs --suite NAME, a test suite of the workspace's registration")
        return {"suite": suite}
    if job_type == JobType.OPEN_PR:
        if not title:
            raise CliError("open_pr needs --title TEXT")
        return {"title": title, "body": body}
    raise CliError(f"unknown job type {job_type!r}; use one of {_job_types()}")


@handle_errors
def status_job(ctx: typer.Context, job_id: str, as_json: JsonOption = False) -> None:
    """A job's state and history."""
    job = api_get(state_of(ctx).api(), f"/jobs/{path_id(job_id)}")
    if as_json:
        print_json(job)
    else:
        out().print(job_panel(job))
