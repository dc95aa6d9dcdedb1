"""Test sandbox function: runs one workspace's registered test command on a checkout, and nothing else.

The worker invokes it synchronously, per tenant (Lambda's PER_TENANT isolation: an execution environment never serves
two tenants). It holds no data-plane permission and none of the worker's settings; the test command also gets a
scrubbed environment, a fresh folder that is removed afterwards, and every process it leaves behind is killed.

Event: {"v": 1, "jobId", "workspaceId", "tenantId", "commit", "argv": [...], "timeoutSeconds", "outputLimitBytes",
"archive": {"inline", "sha256"} | {"url", "sha256", "size"}}.
Response: {"outcome", "exitCode", "durationSeconds", "outputTail", "truncated"} for a run, whatever the tests' outcome,
with "limitReached" (what filled up and what to do) when the tests ended with /tmp full; {"error", "permanent"} for a
request that cannot be run. Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol

from test_sandbox.archive import ArchiveLimits, extract_archive, load_archive
from test_sandbox.runner import (
    SandboxRequestError,
    adopt_orphans,
    descendants,
    hide_own_environment,
    kill_leftovers,
    run_test_command,
)

EVENT_VERSION = 1
# Time kept back from the invocation's own deadline: to kill the tests, clean up and answer before Lambda stops us.
HEADROOM_SECONDS = 5.0
MAX_OUTPUT_LIMIT_BYTES = 1024 * 1024  # well inside a synchronous invocation's 6 MB response
# Less free space than this in the work folder's file system when the tests end: they filled it.
FULL_BELOW_BYTES = 1024 * 1024
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


class InvocationContext(Protocol):
    def get_remaining_time_in_millis(self) -> int: ...


def lambda_handler(event: dict[str, Any], context: InvocationContext | None) -> dict[str, Any]:
    try:
        request = _parse(event)
    except SandboxRequestError as error:
        return _refused(event, error)
    timeout = float(request["timeoutSeconds"])
    if context is not None:
        timeout = min(timeout, context.get_remaining_time_in_millis() / 1000 - HEADROOM_SECONDS)
    if timeout <= 0:
        return _refused(event, SandboxRequestError("no time left in this invocation to run the tests", permanent=False))
    work = Path(tempfile.mkdtemp(prefix="sandbox-", dir=os.environ.get("SANDBOX_WORK_ROOT") or None))
    hide_own_environment()
    spared = descendants()
    adopt_orphans(True)
    try:
        source, home, scratch = work / "src", work / "home", work / "tmp"
        for folder in (source, home, scratch):
            folder.mkdir()
        limits = ArchiveLimits.from_environment()
        extract_archive(load_archive(request["archive"], limits), source, limits)
        run = run_test_command(
            request["argv"],
            cwd=source,
            timeout_seconds=timeout,
            environment={"HOME": str(home), "TMPDIR": str(scratch)},
            output_limit_bytes=request["outputLimitBytes"],
        )
        full = storage_full(work)  # before the folder goes, with what the tests wrote in it
    except SandboxRequestError as error:
        return _refused(event, error)
    finally:
        killed = kill_leftovers(spared=spared, whole_uid=_whole_uid())
        adopt_orphans(False)
        _remove(work)
        if killed:
            _log(event, leftoverProcessesKilled=len(killed))
    response = {
        "outcome": run.outcome,
        "exitCode": run.exit_code,
        "durationSeconds": round(run.duration_seconds, 3),
        "outputTail": run.output_tail,
        "truncated": run.truncated,
    }
    if full is not None:
        response["limitReached"] = full
    _log(event, outcome=run.outcome, exitCode=run.exit_code, durationSeconds=response["durationSeconds"])
    return response


def storage_full(folder: Path) -> str | None:
    """What to say when the file system of `folder` (this function's /tmp) is full: the tests' writes failed there
    with "No space left on device", and the message names the setting that sizes it. None when there is room."""
    try:
        disk = os.statvfs(folder)
    except OSError:
        return None
    if disk.f_bavail * disk.f_frsize >= FULL_BELOW_BYTES:
        return None
    size_mb = round(disk.f_blocks * disk.f_frsize / (1024 * 1024))
    return (
        f"/tmp was full when the tests ended: they used all {size_mb} MB of the function's ephemeral storage"
        " (its EphemeralStorage, SandboxEphemeralStorage in template.yaml): make the tests write less to disk, or raise"
        " SandboxEphemeralStorage"
    )


def _whole_uid() -> bool:
    """Kill every leftover process of this uid, not only this process's descendants: in Lambda (the runtime API is
    set) and wherever SANDBOX_KILL_WHOLE_UID=1 says the uid is the sandbox's alone. Never by default elsewhere: run
    in a developer's shell, it would kill the developer's own processes."""
    setting = os.environ.get("SANDBOX_KILL_WHOLE_UID")
    if setting is not None:
        return setting == "1"
    return "AWS_LAMBDA_RUNTIME_API" in os.environ


def _parse(event: Any) -> dict[str, Any]:
    if not isinstance(event, dict):
        raise SandboxRequestError("the event must be a JSON object")
    if event.get("v") != EVENT_VERSION:
        raise SandboxRequestError(f'unsupported event version {event.get("v")!r}; this sandbox speaks "v": 1')
    argv = event.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(arg, str) and arg for arg in argv):
        raise SandboxRequestError('"argv" must be a non-empty list of non-empty strings (the registered test command)')
    timeout = event.get("timeoutSeconds")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout) or timeout <= 0:
        raise SandboxRequestError('"timeoutSeconds" must be a positive number')
    limit = event.get("outputLimitBytes")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_OUTPUT_LIMIT_BYTES:
        raise SandboxRequestError(f'"outputLimitBytes" must be an integer from 1 to {MAX_OUTPUT_LIMIT_BYTES}')
    commit = event.get("commit")
    if not isinstance(commit, str) or not _COMMIT.fullmatch(commit):
        raise SandboxRequestError('"commit" must be a 40-digit lowercase hex commit id')
    return event


def _refused(event: Any, error: SandboxRequestError) -> dict[str, Any]:
    _log(event, error=str(error), permanent=error.permanent)
    return {"error": str(error), "permanent": error.permanent}


def _remove(folder: Path) -> None:
    """Remove the work folder even where the tests took away their own write or search permission."""

    def make_writable_and_retry(function: Any, path: str, _: Any) -> None:
        parent = os.path.dirname(path)
        for target in (parent, path):
            try:
                os.chmod(target, stat.S_IRWXU)
            except OSError:
                continue
        with contextlib.suppress(OSError):
            function(path)

    if sys.version_info >= (3, 12):
        shutil.rmtree(folder, onexc=make_writable_and_retry)
    else:
        shutil.rmtree(folder, onerror=make_writable_and_retry)


def _log(event: Any, **fields: Any) -> None:
    """One JSON line per invocation: which job it ran and how it ended (never its environment or output)."""
    ids = (
        {key: event.get(key) for key in ("jobId", "workspaceId", "tenantId", "commit")}
        if isinstance(event, dict)
        else {}
    )
    print(json.dumps({"time": time.time(), **ids, **fields}, default=str), file=sys.stderr, flush=True)
