"""A worker bootstrap for the local runtime's tests: crash the worker process once, right after a chosen job's
commit, so the side effect has happened but nothing was recorded or acknowledged.

Used as `worker_bootstrap="tests.local_runtime.bootstrap_helpers:install"` with
`bootstrap_config={"crash_after_commit_of": <jobId>, "marker": <path>}`. The marker file is created with O_EXCL, so
the crash happens once across every worker process, and its presence says it happened.
"""

from __future__ import annotations

import functools
import os
import sys
from types import ModuleType
from typing import Any

CRASH_EXIT_CODE = 1


def crash_once(marker: str) -> bool:
    """True for the first caller in any process."""
    try:
        descriptor = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(descriptor)
    return True


def install(handler_module: ModuleType, config: dict[str, Any]) -> None:
    from agent_jobs_local.folder_workspaces import LocalWorkspace
    from job_worker.jobs.git_workspace import GitWorkspace

    target, marker = str(config["crash_after_commit_of"]), str(config["marker"])
    for workspace_class in (LocalWorkspace, GitWorkspace):
        original_commit = workspace_class.commit

        def commit(self: Any, *, job_id: str, _original: Any = original_commit, **kwargs: Any) -> Any:
            made = _original(self, job_id=job_id, **kwargs)
            if job_id == target and crash_once(marker):
                sys.stdout.flush()
                os._exit(CRASH_EXIT_CODE)
            return made

        workspace_class.commit = functools.wraps(original_commit)(commit)  # type: ignore[method-assign]
