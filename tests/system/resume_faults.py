"""A worker bootstrap for the resume acceptance test: one job's commit fails (retryably) while a fault file exists, in
every worker process, so the job uses up its attempts and halts its workspace until the test removes the file.

Used as `worker_bootstrap="tests.system.resume_faults:install"` with
`bootstrap_config={"failing_job": <jobId>, "fault_file": <path>}`.
"""

from __future__ import annotations

import functools
import os
from types import ModuleType
from typing import Any


def install(handler_module: ModuleType, config: dict[str, Any]) -> None:
    from agent_jobs_local.folder_workspaces import LocalWorkspace
    from job_worker.jobs.errors import RetryableJobError
    from job_worker.jobs.git_workspace import GitWorkspace

    target, fault_file = str(config["failing_job"]), str(config["fault_file"])
    for workspace_class in (LocalWorkspace, GitWorkspace):
        original_commit = workspace_class.commit

        def commit(self: Any, *, job_id: str, _original: Any = original_commit, **kwargs: Any) -> Any:
            if job_id == target and os.path.exists(fault_file):
                raise RetryableJobError("the remote refuses pushes (injected fault)")
            return _original(self, job_id=job_id, **kwargs)

        workspace_class.commit = functools.wraps(original_commit)(commit)  # type: ignore[method-assign]
