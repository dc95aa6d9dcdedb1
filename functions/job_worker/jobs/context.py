from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from jobs.workspace import Workspace


@dataclass(frozen=True)
class JobContext:
    """What a job handler may touch: its workspace, and the time left in the invocation."""

    workspace: Workspace
    remaining_ms: Callable[[], int]
