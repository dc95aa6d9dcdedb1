"""Worker function: consumes the FIFO jobs queue and reports partial batch failures."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger, Metrics, Tracer

from agent_jobs.patch_limits import PatchLimits
from agent_jobs.services import build_services
from agent_jobs.tenancy import TenantBounds
from agent_jobs.workspaces import WorkspaceRegistry
from job_worker.jobs.limits import GitLimits
from job_worker.jobs.registered import RegisteredWorkspaceStore
from job_worker.processing import BatchWorker

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
    from aws_lambda_powertools.utilities.typing import LambdaContext

logger = Logger()
tracer = Tracer()
metrics = Metrics()


@functools.cache
def worker() -> BatchWorker:
    """Built on the first invocation and reused while the execution environment is warm."""
    services = build_services()
    registry = WorkspaceRegistry(services.dynamodb, services.settings.table_name)
    return BatchWorker(
        services=services,
        # Registered git workspaces; their warm bare caches live under WORKSPACES_ROOT (/tmp in Lambda).
        workspaces=RegisteredWorkspaceStore(
            registry,
            Path(services.settings.workspaces_root),
            # Tokens, file-system remotes and hosts only within the workspace owner's bounds.
            bounds=TenantBounds.from_settings(services.settings),
            # What one job may bring: MAX_BLOB_BYTES, MAX_FETCH_BYTES, MAX_CHECKOUT_BYTES.
            limits=GitLimits.from_settings(services.settings),
            # The warm caches in all: WORKSPACE_CACHE_BYTES, or what EPHEMERAL_STORAGE_MB leaves beside a job.
            cache_budget_bytes=services.settings.cache_budget_bytes,
            # Patches within PATCH_MAX_BYTES, PATCH_MAX_HUNKS and PATCH_SEARCH_WINDOW_LINES.
            patch_limits=PatchLimits.from_settings(services.settings),
        ),
        logger=logger,
        metrics=metrics,
        tracer=tracer,
    )


@logger.inject_lambda_context
@tracer.capture_lambda_handler(capture_response=False)
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    return worker().handle(event, context)
