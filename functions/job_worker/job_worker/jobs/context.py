from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from job_worker.jobs.workspace import Workspace

if TYPE_CHECKING:
    from agent_jobs.registration import RegisteredWorkspace
    from job_worker.jobs.sandbox import TestSandbox


@dataclass(frozen=True)
class JobContext:
    """What a job handler may touch: its workspace, the time left in the invocation, for a workspace registered as a
    git remote its registration and its token (read on demand), and the test sandbox that runs its tests."""

    workspace: Workspace
    remaining_ms: Callable[[], int]
    registration: RegisteredWorkspace | None = None
    token: Callable[[], str | None] = field(default=lambda: None)
    # Time a handler leaves unused at the end of the invocation (the worker's TIME_SAFETY_MARGIN_MS).
    safety_margin_ms: int = 0
    # The time the whole invocation had when it started (0: unknown): what a job run first would have had.
    invocation_ms: int = 0
    # The function that runs test commands (TEST_SANDBOX_FUNCTION), None when none is configured; asked for on
    # demand, so only a run_tests job loads what it takes to pack and send a checkout.
    test_sandbox: Callable[[], TestSandbox | None] = field(default=lambda: None)
    # Why a URL of the registration may not be called right now (its host resolves to a private address ...), or
    # None: checked right before each connection (`agent_jobs.tenancy.TenantBounds.host_error`).
    check_host: Callable[[str, str], str | None] = field(default=lambda url, field_name: None)
    # The PEM of the one CA a URL of the registration is verified against instead of the system's (the `sam local` git
    # server's, under `sam local` only), or None.
    trusted_ca: Callable[[str], str | None] = field(default=lambda url: None)
