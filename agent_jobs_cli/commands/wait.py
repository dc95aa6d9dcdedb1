"""Waiting for a job to settle: `wait JOBID` and `enqueue ... --wait`.

The wait ends at the first state in which nothing more happens to the job without an operator, and the exit code
says which (`WaitOutcome`): SUCCEEDED; DEAD or REJECTED (it halted its workspace); PARKED while its workspace is
HALTED (it runs once an operator resumes the workspace; while the workspace is RESUMING the drain runs it, so the wait
goes on); SKIPPED (an operator decided it never runs). QUEUED, IN_FLIGHT and FAILED (to be delivered again) are
waited on until the timeout.
"""

from __future__ import annotations

import time
from enum import IntEnum
from typing import Annotated, Any, Final

import typer

from agent_jobs_cli.api import ApiClient, path_id
from agent_jobs_cli.context import JsonOption, api_get, err, handle_errors, out, print_json, state_of
from agent_jobs_cli.render import job_panel

DEFAULT_TIMEOUT_SECONDS: Final = 600.0
DEFAULT_INTERVAL_SECONDS: Final = 1.0


class WaitOutcome(IntEnum):
    """How a wait ended, as its exit code (1 stays an error of the command, 2 a usage error)."""

    SUCCEEDED = 0
    FAILED = 3  # DEAD or REJECTED: it did not take effect and halted its workspace
    PARKED = 4  # behind a halt of its workspace: it runs once an operator resumes the workspace
    SKIPPED = 5  # an operator decided it never runs
    TIMED_OUT = 6  # still QUEUED, IN_FLIGHT or FAILED when the timeout passed


WAIT_CODES_HELP: Final = (
    "Exit codes: 0 SUCCEEDED; 3 DEAD or REJECTED (its workspace is halted); 4 PARKED behind a halted workspace"
    " (resume it); 5 SKIPPED; 6 not settled when the timeout passed; 1 an error."
)
TimeoutOption = Annotated[
    float, typer.Option("--timeout", min=0, help="Seconds to wait for the job to settle (exit 6 after).")
]
IntervalOption = Annotated[float, typer.Option("--interval", min=0.1, help="Seconds between polls.")]


def settled_outcome(job: dict[str, Any], workspace_state: str | None) -> WaitOutcome | None:
    """How the wait ends for `job` (its workspace in `workspace_state`, read only for a PARKED job), or None while
    the job has more to do without an operator."""
    status = job.get("status")
    if status == "SUCCEEDED":
        return WaitOutcome.SUCCEEDED
    if status in ("DEAD", "REJECTED"):
        return WaitOutcome.FAILED
    if status == "SKIPPED":
        return WaitOutcome.SKIPPED
    if status == "PARKED" and workspace_state == "HALTED":
        return WaitOutcome.PARKED
    return None


def wait_for_job(
    client: ApiClient, job_id: str, *, timeout: float, interval: float
) -> tuple[dict[str, Any], WaitOutcome]:
    """Poll the job until it settles or `timeout` seconds pass; the job as last read and how the wait ended."""
    deadline = time.monotonic() + timeout
    while True:
        job: dict[str, Any] = api_get(client, f"/jobs/{path_id(job_id)}")
        workspace_state = None
        if job.get("status") == "PARKED" and job.get("workspaceId"):
            workspace = api_get(client, f"/workspaces/{path_id(str(job['workspaceId']))}")
            workspace_state = workspace.get("state")
        outcome = settled_outcome(job, workspace_state)
        if outcome is not None:
            return job, outcome
        if time.monotonic() >= deadline:
            return job, WaitOutcome.TIMED_OUT
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))


def report_wait(job: dict[str, Any], outcome: WaitOutcome, *, as_json: bool, timeout: float) -> None:
    """Print the job (a panel, or JSON) and what its state means, then exit with the outcome's code."""
    if as_json:
        print_json(job)
    else:
        out().print(job_panel(job))
    workspace, job_id = job.get("workspaceId"), job.get("jobId")
    explanation = {
        WaitOutcome.FAILED: f"job {job_id} is {job.get('status')}: workspace {workspace} is halted until an operator"
        f" decides it: agent-jobs resume {workspace} --retry|--skip",
        WaitOutcome.PARKED: f"job {job_id} is PARKED behind the halt of workspace {workspace}: it runs once the"
        f" workspace is resumed (agent-jobs status workspace {workspace})",
        WaitOutcome.SKIPPED: f"job {job_id} was SKIPPED by an operator: it never takes effect",
        WaitOutcome.TIMED_OUT: f"job {job_id} is still {job.get('status')} after {timeout:g} s; wait longer with"
        f" agent-jobs wait {job_id} --timeout SECONDS",
    }.get(outcome)
    if explanation:
        err().print(explanation, soft_wrap=True, highlight=False, markup=False)
    raise typer.Exit(int(outcome))


@handle_errors
def wait(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(metavar="JOBID")],
    timeout: TimeoutOption = DEFAULT_TIMEOUT_SECONDS,
    interval: IntervalOption = DEFAULT_INTERVAL_SECONDS,
    as_json: JsonOption = False,
) -> None:
    job, outcome = wait_for_job(state_of(ctx).api(), job_id, timeout=timeout, interval=interval)
    report_wait(job, outcome, as_json=as_json, timeout=timeout)


wait.__doc__ = (
    "Wait until a job settles, then show it: SUCCEEDED, DEAD or REJECTED, SKIPPED, or PARKED while its workspace is"
    f" HALTED (while it is RESUMING, the drain runs the job: the wait goes on). {WAIT_CODES_HELP}"
)
