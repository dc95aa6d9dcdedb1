"""What the worker's event source mapping reads from the template before it polls: that the event source can run as
Lambda runs it, how many pollers it gets, and the worker function's `FunctionSpec` (code, handler, layers,
environment)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from agent_jobs_local.execution_environment import FunctionSpec, lambda_environment

if TYPE_CHECKING:
    from agent_jobs_local.template import TemplateModel

PROJECT_ROOT: Final = Path(__file__).resolve().parent.parent
REPORT_BATCH_ITEM_FAILURES: Final = "ReportBatchItemFailures"
# Lambda starts five pollers for an SQS event source without a MaximumConcurrency.
DEFAULT_CONCURRENCY: Final = 5


class EventSourceError(ValueError):
    """The template's event source cannot be run as Lambda would; the message says what to change."""


def check_event_source(model: TemplateModel, queue_arn: str) -> None:
    """EventSourceError unless the worker's event source reports batch item failures and consumes `queue_arn`."""
    worker = model.worker
    source, function = worker.event_source, worker.function
    if REPORT_BATCH_ITEM_FAILURES not in source.function_response_types:
        raise EventSourceError(
            f"{function.function_id}'s SQS event source has FunctionResponseTypes "
            f"{list(source.function_response_types)}; add {REPORT_BATCH_ITEM_FAILURES} to run it: without it "
            "Lambda ignores batchItemFailures and deletes or retries whole batches"
        )
    expected_queue = model.queue_name(source.queue_id)
    if queue_arn.rsplit(":", 1)[-1] != expected_queue:
        raise EventSourceError(
            f"{function.function_id} consumes {source.queue_id} ({expected_queue}), not {queue_arn}: pass the "
            "queue the template's event source names"
        )


def template_concurrency(model: TemplateModel) -> int:
    """The worker's concurrency the template allows: MaximumConcurrency and ReservedConcurrentExecutions."""
    worker = model.worker
    limits = [n for n in (worker.maximum_concurrency, worker.function.reserved_concurrency) if n is not None]
    return min(limits) if limits else DEFAULT_CONCURRENCY


def layer_dirs(model: TemplateModel, function_id: str, base: Path) -> list[Path]:
    """The folders of the function's Layers that are layers of the template (their ContentUri, against `base`)."""
    layers = model.function_properties(function_id).get("Layers") or []
    folders: list[Path] = []
    for layer in layers:
        logical_id = layer.get("Ref") if isinstance(layer, dict) else None
        spec = model.resources.get(logical_id) if isinstance(logical_id, str) else None
        if not spec or spec.get("Type") != "AWS::Serverless::LayerVersion":
            continue  # a layer from outside the template (an ARN) has no local source
        content = (spec.get("Properties") or {}).get("ContentUri")
        if isinstance(content, str):
            folder = (base / content).resolve()
            if not folder.is_dir():
                raise EventSourceError(f"layer {logical_id} ContentUri {content} is not a folder ({folder})")
            folders.append(folder)
    return folders


def worker_function_spec(
    model: TemplateModel,
    function_env: Mapping[str, str],
    *,
    region: str,
    endpoint_url: str | None,
    timeout_seconds: float,
    worker_bootstrap: str | None,
    bootstrap_config: Mapping[str, Any] | None,
    layer_paths: Sequence[Path] | None,
    template_dir: Path | None,
) -> FunctionSpec:
    """The worker function as its execution environments run it (see `EventSourcePoller` for the arguments), its
    invocations limited to `timeout_seconds`; EventSourceError when its CodeUri or a layer's ContentUri is no folder."""
    function = model.worker.function
    base = (template_dir or PROJECT_ROOT).resolve()
    code_dir = (base / function.code_uri).resolve()
    if not code_dir.is_dir():
        raise EventSourceError(f"{function.function_id} CodeUri {function.code_uri} is not a folder ({code_dir})")
    layers = (
        [Path(p).resolve() for p in layer_paths]
        if layer_paths is not None
        else layer_dirs(model, function.function_id, base)
    )
    environment = lambda_environment(
        function_env,
        function_id=function.function_id,
        handler=function.handler,
        code_dir=code_dir,
        region=region,
        timeout_seconds=timeout_seconds,
        memory_size_mb=function.memory_size_mb,
        endpoint_url=endpoint_url,
    )
    spec = FunctionSpec(
        function_id=function.function_id,
        code_dir=code_dir,
        handler=function.handler,
        environment=environment,
        layer_dirs=tuple(layers),
        memory_size_mb=function.memory_size_mb,
        bootstrap=worker_bootstrap,
        bootstrap_config=dict(bootstrap_config) if bootstrap_config is not None else None,
    )
    spec.module_name  # noqa: B018 - refuse a malformed Handler now, not in every environment
    return spec
