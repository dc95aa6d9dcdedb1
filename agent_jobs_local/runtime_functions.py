"""The functions as the local runtime runs them: each function's environment (the template's, against the
provisioned resources, with durations scaled and the local stand-ins added) and the producer's pool of execution
environments."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from agent_jobs_local.execution_environment import EnvironmentPool, FunctionSpec, lambda_environment
from agent_jobs_local.template import ProvisionedResources, TemplateModel

# Environment variables that are durations: scaled by time_scale (whole units, as the settings read them).
SCALED_DURATION_SETTINGS: Final = ("TIME_SAFETY_MARGIN_MS", "BACKOFF_BASE_SECONDS", "BACKOFF_MAX_SECONDS")
# How many requests the local HTTP API runs at once when the producer has no ReservedConcurrentExecutions.
DEFAULT_API_CONCURRENCY: Final = 4


def scale_durations(environment: Mapping[str, str], time_scale: float) -> dict[str, str]:
    """`environment` with the `SCALED_DURATION_SETTINGS` it has multiplied by `time_scale`, rounded to whole units;
    a duration that was not zero stays at least one unit. Rounded down to zero, a backoff of 2 s at a time scale below
    0.25 would make every deferred or retried record visible again at once: its deferrals spent in a moment, its
    tenant run over its share, its retries run back to back, a system other than the one deployed."""
    scaled = dict(environment)
    if time_scale != 1:
        for name in SCALED_DURATION_SETTINGS:
            if name in scaled:
                duration = float(scaled[name])
                scaled[name] = str(max(1, round(duration * time_scale)) if duration > 0 else 0)
    return scaled


def function_environments(
    model: TemplateModel,
    resources: ProvisionedResources,
    *,
    time_scale: float,
    remotes_root: Path,
    allowed_private_hosts: Sequence[str],
    workspaces_root: Path,
    lambda_url: str | None,
    extra_worker_env: Mapping[str, str],
    sam_local_env: Mapping[str, str] | None = None,
) -> dict[str, dict[str, str]]:
    """Function id -> environment: the template's values against `resources`, durations scaled; every function's
    WORKSPACES_REMOTE_ROOT and ALLOWED_PRIVATE_HOSTS, and `sam_local_env` where the template declares the variable (with
    EndpointUrl); the access key of each function with a role SAM generates (`principals.function_access_key`); the
    worker's WORKSPACES_ROOT, the local Lambda endpoint
    (`lambda_url`, when one serves the directly invoked functions) and `extra_worker_env`, last."""
    worker_id = model.worker.function.function_id
    roles = model.generated_resources()
    environments: dict[str, dict[str, str]] = {}
    for function_id in model.resources_of_type("AWS::Serverless::Function"):
        environment = scale_durations(model.function_environment(function_id, resources.references), time_scale)
        # The local stand-ins: file-system remotes under remotes_root, and the hosts (a fake GitHub) allowed.
        environment["WORKSPACES_REMOTE_ROOT"] = str(remotes_root)
        environment["ALLOWED_PRIVATE_HOSTS"] = ",".join(allowed_private_hosts)
        declared = (model.function_properties(function_id).get("Environment") or {}).get("Variables") or {}
        environment.update({name: value for name, value in (sam_local_env or {}).items() if name in declared})
        if f"{function_id}Role" in roles:
            # The function signs with a key of its own, as it would with its role: the emulator stamps its messages
            # with that key's principal, the RoleId `!GetAtt <FunctionId>Role.RoleId` resolves to (`principals`).
            key = model.function_access_key(function_id)
            environment.update({"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": key})
        if function_id == worker_id:
            environment["WORKSPACES_ROOT"] = str(workspaces_root)
            if lambda_url is not None:
                # boto3 prefers the service's own endpoint variable to AWS_ENDPOINT_URL (the emulator).
                environment["AWS_ENDPOINT_URL_LAMBDA"] = lambda_url
            environment.update(extra_worker_env)
        environments[function_id] = environment
    return environments


def producer_environments(
    model: TemplateModel,
    function_id: str,
    *,
    template_dir: Path,
    function_env: Mapping[str, str],
    region: str,
    endpoint_url: str | None,
    bootstrap: str | None,
    bootstrap_config: Mapping[str, Any] | None,
    concurrency: int | None,
) -> EnvironmentPool:
    """The producer's execution environments: its CodeUri first on `sys.path`, its layers next, its environment
    (with the emulator as AWS_ENDPOINT_URL), up to `concurrency` of them serving requests at once (default its
    ReservedConcurrentExecutions, else `DEFAULT_API_CONCURRENCY`)."""
    settings = model.function_settings(function_id)
    code_dir = (template_dir / settings.code_uri).resolve()
    layers = [
        _layer_dir(model, layer, template_dir) for layer in model.function_properties(function_id).get("Layers") or []
    ]
    environment = lambda_environment(
        function_env,
        function_id=function_id,
        handler=settings.handler,
        code_dir=code_dir,
        region=region,
        timeout_seconds=settings.timeout_seconds,
        memory_size_mb=settings.memory_size_mb,
        endpoint_url=endpoint_url,
    )
    spec = FunctionSpec(
        function_id=function_id,
        code_dir=code_dir,
        handler=settings.handler,
        environment=environment,
        layer_dirs=tuple(layer for layer in layers if layer is not None),
        memory_size_mb=settings.memory_size_mb,
        bootstrap=bootstrap,
        bootstrap_config=bootstrap_config,
    )
    environments = concurrency or settings.reserved_concurrency or DEFAULT_API_CONCURRENCY
    return EnvironmentPool(spec, timeout_seconds=settings.timeout_seconds, max_environments=environments)


def _layer_dir(model: TemplateModel, layer: object, base: Path) -> Path | None:
    logical_id = layer.get("Ref") if isinstance(layer, dict) else None
    spec = model.resources.get(logical_id) if isinstance(logical_id, str) else None
    if not spec or spec.get("Type") != "AWS::Serverless::LayerVersion":
        return None
    content = (spec.get("Properties") or {}).get("ContentUri")
    return (base / content).resolve() if isinstance(content, str) else None
