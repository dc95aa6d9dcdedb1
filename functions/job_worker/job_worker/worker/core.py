"""The worker's state: what every phase of a batch shares (clients, workspaces, logger, metrics, tracer)."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from aws_lambda_powertools import Logger, Metrics, Tracer

from agent_jobs.services import Services
from job_worker.jobs.workspace import JobWorkspaceStore


@dataclass
class WorkerCore:
    """One per process; each phase of a batch (`worker.batch.BatchWorker` and the classes below it) adds its part."""

    services: Services
    workspaces: JobWorkspaceStore
    logger: Logger
    metrics: Metrics
    jitter: Callable[[float], float] = field(default=lambda bound: random.uniform(bound / 2, bound))
    tracer: Tracer = field(default_factory=Tracer)
    _emit_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    # The time the current invocation had when it started (one invocation at a time per environment).
    _invocation_ms: int = field(default=0, init=False, repr=False)
