"""Fault injection for the local runtime: crash or stall a worker at a chosen point of a chosen job, once.

Installed in each worker process by the event-source poller (`worker_bootstrap="agent_jobs_local.faults:install"`),
after the handler module is imported. It wraps the guard and the workspaces at class level (the folder workspace and
the git workspace, whose side effect is the push), so the deployed code has no hooks of its own. A crash is
`os._exit`: the process dies mid-invocation as a killed Lambda would, nothing after that point runs, and the poller
deletes nothing from the batch. Each fault fires at most once per job across all worker processes (an O_EXCL marker
file), and the markers are the record of what was injected.
"""

from __future__ import annotations

import functools
import os
import sys
import time
import warnings
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from types import ModuleType
from typing import IO, Any, TextIO

CRASH_EXIT_CODE = 137  # what a SIGKILLed process reports


class Fault(StrEnum):
    CRASH_BEFORE_CLAIM = "crash_before_claim"
    CRASH_AFTER_CLAIM = "crash_after_claim"
    CRASH_AFTER_SIDE_EFFECT = "crash_after_side_effect"
    CRASH_AFTER_COMPLETE = "crash_after_complete"  # completed in the table, but never acknowledged to the queue
    SLOW = "slow"  # outlives the invocation's Timeout (and its lease); killed, delivered again after the visibility


def fire_once(marker_dir: Path, fault: Fault, job_id: str) -> bool:
    """True the first time (in any process) this fault is asked for this job."""
    try:
        descriptor = os.open(marker_dir / f"{fault}--{job_id}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(descriptor)
    return True


def fired(marker_dir: Path) -> dict[Fault, list[str]]:
    """The faults that fired, by kind, with their jobIds."""
    result: dict[Fault, list[str]] = {fault: [] for fault in Fault}
    for marker in marker_dir.glob("*--*"):
        kind, job_id = marker.name.split("--", 1)
        result[Fault(kind)].append(job_id)
    return result


def log_warnings_to(log: IO[str]) -> None:
    """Python warnings (Powertools warns of an invocation that publishes no metric) go to `log`, as a Lambda
    function's go to its log group, instead of printing over the progress."""

    def show(  # noqa: PLR0917 - the signature of warnings.showwarning
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        log.write(warnings.formatwarning(message, category, filename, lineno, line))

    warnings.showwarning = show


def log_to_file(handler_module: ModuleType, config: dict[str, Any]) -> None:
    """A bootstrap hook: the function's Powertools logs, EMF metrics and warnings go to
    `<log_dir>/<name>-<pid>.log` (one file per process), as a Lambda function's go to its log group, instead of
    printing over the progress. `config`: {"log_dir": str, "name": str}."""
    log = open(Path(config["log_dir"]) / f"{config['name']}-{os.getpid()}.log", "a", buffering=1)  # noqa: SIM115
    sys.stdout = log
    handler_module.logger.registered_handler.setStream(log)
    log_warnings_to(log)


def install(handler_module: ModuleType, config: dict[str, Any]) -> None:
    """Wrap JobGuard.claim/complete, LocalWorkspace.commit and GitWorkspace.commit in this worker process according
    to `config`: {"plan": {jobId: fault}, "marker_dir": str, "slow_seconds": float, "log_dir": str | None}."""
    from agent_jobs.guard import ClaimOutcome, JobGuard
    from agent_jobs_local.folder_workspaces import LocalWorkspace
    from job_worker.jobs.git_workspace import GitWorkspace

    plan = {job_id: Fault(kind) for job_id, kind in config.get("plan", {}).items()}
    marker_dir = Path(config["marker_dir"])
    slow_seconds = float(config.get("slow_seconds", 0))
    if config.get("log_dir"):
        log_to_file(handler_module, {"log_dir": config["log_dir"], "name": "worker"})

    def due(job_id: str, fault: Fault) -> bool:
        return plan.get(job_id) is fault and fire_once(marker_dir, fault, job_id)

    def crash() -> None:
        sys.stdout.flush()
        os._exit(CRASH_EXIT_CODE)

    original_claim = JobGuard.claim
    original_complete = JobGuard.complete

    @functools.wraps(original_claim)
    def claim(self: JobGuard, message: Any, **kwargs: Any) -> Any:
        if due(message.job_id, Fault.CRASH_BEFORE_CLAIM):
            crash()
        result = original_claim(self, message, **kwargs)
        if result.outcome is ClaimOutcome.CLAIMED and due(message.job_id, Fault.CRASH_AFTER_CLAIM):
            crash()
        return result

    @functools.wraps(original_complete)
    def complete(self: JobGuard, lease: Any, result: Any) -> bool:
        completed = original_complete(self, lease, result)
        if completed and due(lease.job_id, Fault.CRASH_AFTER_COMPLETE):
            crash()
        return completed

    def at_commit(original_commit: Callable[..., Any]) -> Callable[..., Any]:
        """The workspace's commit, slow before it or crashing right after its side effect (the ledger line written,
        or the branch pushed to the remote)."""

        @functools.wraps(original_commit)
        def commit(self: Any, *, job_id: str, **kwargs: Any) -> Any:
            if due(job_id, Fault.SLOW):
                time.sleep(slow_seconds)
            made = original_commit(self, job_id=job_id, **kwargs)
            if due(job_id, Fault.CRASH_AFTER_SIDE_EFFECT):
                crash()
            return made

        return commit

    JobGuard.claim = claim  # type: ignore[method-assign,assignment]
    JobGuard.complete = complete  # type: ignore[method-assign,assignment]
    LocalWorkspace.commit = at_commit(LocalWorkspace.commit)  # type: ignore[method-assign]
    GitWorkspace.commit = at_commit(GitWorkspace.commit)  # type: ignore[method-assign]
