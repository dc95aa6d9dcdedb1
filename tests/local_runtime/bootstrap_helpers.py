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


def install_slow_tests(handler_module: ModuleType, config: dict[str, Any]) -> None:
    """Worker bootstrap of the fair-share test: folder workspaces under the worker's WORKSPACES_ROOT; a run_tests job
    of a workspace whose name starts with `config["slow_prefix"]` takes `config["slow_seconds"]` (a slow suite); and a
    line `<jobId> <epoch seconds>` appended to `config["applied_log"]` each time a record's processing returns. With
    `config["running_log"]`, each slow suite also appends `start <jobId>` and `end <jobId>` there as it starts and ends
    (one whole line per write, O_APPEND: the lines of every worker process in the order they happened)."""
    import json
    import time
    from dataclasses import replace
    from pathlib import Path

    from agent_jobs_local.folder_workspaces import LocalWorkspace, LocalWorkspaceStore
    from job_worker import processing

    applied_log, prefix, seconds = str(config["applied_log"]), str(config["slow_prefix"]), float(config["slow_seconds"])
    running_log = config.get("running_log")

    def append(log: str, line: str) -> None:
        descriptor = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(descriptor, line.encode())
        finally:
            os.close(descriptor)

    app: Any = handler_module
    built = app.worker

    @functools.cache
    def worker() -> Any:
        batch_worker = built()
        return replace(
            batch_worker, workspaces=LocalWorkspaceStore(Path(batch_worker.services.settings.workspaces_root))
        )

    app.worker = worker
    original_store = LocalWorkspace.store_test_result

    def store_test_result(self: Any, job_id: str, head: str, result: dict[str, Any]) -> None:
        if self.workspace_id.startswith(prefix):
            if running_log:
                append(str(running_log), f"start {job_id}\n")
            time.sleep(seconds)
            if running_log:
                append(str(running_log), f"end {job_id}\n")
        original_store(self, job_id, head, result)

    LocalWorkspace.store_test_result = functools.wraps(original_store)(store_test_result)  # type: ignore[method-assign]
    original_process = processing.BatchWorker.process_record

    def process_record(self: Any, record: Any, context: Any) -> None:
        original_process(self, record, context)
        append(applied_log, f"{json.loads(record.body).get('jobId')} {time.time():.6f}\n")

    processing.BatchWorker.process_record = functools.wraps(original_process)(process_record)  # type: ignore[method-assign]
