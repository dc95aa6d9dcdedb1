"""A worker bootstrap for the crash-invariant tests: faults that fire on every delivery, not once.

Used as `worker_bootstrap="tests.system.crash_faults:install"` with a `bootstrap_config` of:
- "crash_after_claim": jobIds whose every claim kills the worker process (as an out-of-memory kill would), so the
  invocation dies with every job it had in flight;
- "hang_after_claim": jobIds whose every claim is followed by a wait longer than any Timeout, so the invocation
  times out with every job it had in flight;
- "die_before_handler": jobIds; an invocation whose batch holds one of them dies before the handler runs (an init
  crash), so the worker never sees the record;
- "slow_commit_seconds": {jobId: seconds} to sleep before the commit of that job, so that it is in flight when
  another job of its batch kills the invocation.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from types import ModuleType
from typing import Any

CRASH_EXIT_CODE = 137


def _crash() -> None:
    sys.stdout.flush()
    os._exit(CRASH_EXIT_CODE)


def _job_id(body: str) -> str | None:
    try:
        job_id = json.loads(body).get("jobId")
    except (ValueError, AttributeError):
        return None
    return job_id if isinstance(job_id, str) else None


def install(handler_module: ModuleType, config: dict[str, Any]) -> None:
    from agent_jobs.guard import ClaimOutcome, JobGuard
    from agent_jobs_local.folder_workspaces import LocalWorkspace
    from job_worker.jobs.git_workspace import GitWorkspace

    crash_after_claim = set(config.get("crash_after_claim", ()))
    hang_after_claim = set(config.get("hang_after_claim", ()))
    die_before_handler = set(config.get("die_before_handler", ()))
    slow = {str(job_id): float(seconds) for job_id, seconds in config.get("slow_commit_seconds", {}).items()}

    original_claim = JobGuard.claim

    @functools.wraps(original_claim)
    def claim(self: JobGuard, message: Any, **kwargs: Any) -> Any:
        result = original_claim(self, message, **kwargs)
        if result.outcome is ClaimOutcome.CLAIMED and message.job_id in crash_after_claim:
            _crash()
        if result.outcome is ClaimOutcome.CLAIMED and message.job_id in hang_after_claim:
            time.sleep(3600)  # the local runtime kills the environment at the function's Timeout
        return result

    JobGuard.claim = claim  # type: ignore[method-assign,assignment]

    for workspace_class in (LocalWorkspace, GitWorkspace):
        original_commit = workspace_class.commit

        def commit(self: Any, *, job_id: str, _original: Any = original_commit, **kwargs: Any) -> Any:
            if job_id in slow:
                time.sleep(slow[job_id])
            return _original(self, job_id=job_id, **kwargs)

        workspace_class.commit = functools.wraps(original_commit)(commit)  # type: ignore[method-assign]

    original_handler = handler_module.lambda_handler

    @functools.wraps(original_handler)
    def handler(event: dict[str, Any], context: Any) -> Any:
        if any(_job_id(str(record.get("body", ""))) in die_before_handler for record in event.get("Records") or ()):
            _crash()
        return original_handler(event, context)

    handler_module.lambda_handler = handler  # type: ignore[attr-defined]
