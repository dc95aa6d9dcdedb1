"""The whole system on this machine: emulator, resources from template.yaml, the HTTP API, the worker's event source.

    with LocalRuntime(workspaces_root=Path("/tmp/ws"), time_scale=0.05) as runtime:
        urllib.request.urlopen(f"{runtime.api_url}/jobs", data=...)
        runtime.poller.drain(timeout=60)

`start()` starts moto's server (`emulator.Emulator`) unless `endpoint_url` names an emulator or account to use
instead; creates the queues and table from the template (`template.provision`); computes each function's environment
from the template against those resources; serves the producer function's HTTP API in this process
(`api_server.LocalApiServer`; each request is an invocation in one of up to `api_concurrency` warm execution
environments of the producer, processes laid out as `sam local` lays them out, as Lambda scales a function out behind
API Gateway); and starts the worker's SQS event
source (`poller.EventSourcePoller`), whose invocations run in their own processes. The functions no event feeds (the
test sandbox the worker invokes) are served by a local Lambda Invoke endpoint (`lambda_endpoint.LocalLambdaEndpoint`):
the worker gets its URL as AWS_ENDPOINT_URL_LAMBDA, and each invocation runs in a new bubblewrap sandbox.

`time_scale` makes time pass faster for a demo or a test, consistently: the worker's Timeout (the invocation deadline
and the context's remaining time), the jobs queue's VisibilityTimeout (set on the queue, rounded, at least 1 s), and
the functions' duration settings listed in `SCALED_DURATION_SETTINGS` are all multiplied by it. Nothing else changes.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import boto3

from agent_jobs_local.api_server import LocalApiServer, http_api_routes
from agent_jobs_local.emulator import Emulator
from agent_jobs_local.execution_environment import EnvironmentPool, FunctionSpec, lambda_environment
from agent_jobs_local.lambda_endpoint import LocalLambdaEndpoint
from agent_jobs_local.poller import EventSourcePoller
from agent_jobs_local.template import (
    DEFAULT_LOCAL_STACK_NAME,
    DEFAULT_REGION,
    DEFAULT_TEMPLATE_PATH,
    AwsClients,
    ProvisionedResources,
    TemplateModel,
    provision,
)

# Environment variables that are durations: scaled by time_scale (integers, rounded, never below 0).
SCALED_DURATION_SETTINGS: Final = ("TIME_SAFETY_MARGIN_MS", "BACKOFF_BASE_SECONDS", "BACKOFF_MAX_SECONDS")
CONTAINER_HOST: Final = "host.docker.internal"
_LOOPBACK_HOSTS: Final = ("127.0.0.1", "localhost", "0.0.0.0")
_FAKE_CREDENTIALS: Final = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
# How many requests the local HTTP API runs at once when the producer has no ReservedConcurrentExecutions.
DEFAULT_API_CONCURRENCY: Final = 4


def scale_durations(environment: Mapping[str, str], time_scale: float) -> dict[str, str]:
    """`environment` with the `SCALED_DURATION_SETTINGS` it has multiplied by `time_scale`."""
    scaled = dict(environment)
    if time_scale != 1:
        for name in SCALED_DURATION_SETTINGS:
            if name in scaled:
                scaled[name] = str(max(0, round(float(scaled[name]) * time_scale)))
    return scaled


def container_endpoint(endpoint_url: str) -> str:
    """The emulator's URL as a container reaches the host (127.0.0.1 -> host.docker.internal)."""
    for host in _LOOPBACK_HOSTS:
        endpoint_url = endpoint_url.replace(f"//{host}:", f"//{CONTAINER_HOST}:").replace(
            f"//{host}/", f"//{CONTAINER_HOST}/"
        )
        if endpoint_url.endswith(f"//{host}"):
            endpoint_url = endpoint_url.removesuffix(host) + CONTAINER_HOST
    return endpoint_url


class LocalRuntime:
    """The system, run locally as Lambda, API Gateway and the SQS event source would run it (see the module docstring).

    Keyword arguments: `template_path` (default the project's template.yaml), `stack_name`, `parameter_overrides`
    (template parameters, validated as CloudFormation would), `endpoint_url` (None: start an emulator), `time_scale`,
    `workspaces_root` (the worker's WORKSPACES_ROOT; default a new temporary folder), `api_port` (0: a free port),
    `worker_bootstrap` and `bootstrap_config` (passed to `EventSourcePoller`), `concurrency` (default the template's
    MaximumConcurrency), `api_concurrency` (how many requests the HTTP API runs at once; default the producer's
    ReservedConcurrentExecutions, else `DEFAULT_API_CONCURRENCY`), `api_bootstrap` and `api_bootstrap_config` (the
    same hook for the producer's environments), `extra_worker_env` (added to the worker's
    environment last), `region`, `emulator_log` (where the emulator's output goes), `bwrap` (the bubblewrap binary of
    the test sandbox; default AGENT_JOBS_BWRAP, else `bwrap` on PATH), `remotes_root` (both functions'
    WORKSPACES_REMOTE_ROOT: a tenant's file-system remotes lie under `<remotes_root>/<tenantId>/`; default `remotes`
    beside a given `workspaces_root`, else a new temporary folder) and `allowed_private_hosts` (both functions'
    ALLOWED_PRIVATE_HOSTS: host:port
    entries, such as a fake GitHub's on 127.0.0.1, that registrations may name although they are not public).

    After `start()`: `api_url`, `endpoint_url`, `resources` (`ProvisionedResources`), `model` (the `TemplateModel`
    for the provisioned account), `function_env` (function id -> environment), `poller`, `api`, `lambda_endpoint`
    (None when every function has an event source). `stop()` stops everything in reverse order and restores this
    process's environment (given no credentials, the runtime sets fake ones for the emulator).
    """

    def __init__(
        self,
        template_path: Path = DEFAULT_TEMPLATE_PATH,
        *,
        stack_name: str = DEFAULT_LOCAL_STACK_NAME,
        parameter_overrides: Mapping[str, object] | None = None,
        endpoint_url: str | None = None,
        time_scale: float = 1.0,
        workspaces_root: Path | None = None,
        api_port: int = 0,
        worker_bootstrap: str | None = None,
        bootstrap_config: Mapping[str, Any] | None = None,
        concurrency: int | None = None,
        api_concurrency: int | None = None,
        api_bootstrap: str | None = None,
        api_bootstrap_config: Mapping[str, Any] | None = None,
        extra_worker_env: Mapping[str, str] | None = None,
        region: str = DEFAULT_REGION,
        emulator_log: Path | None = None,
        bwrap: str | None = None,
        remotes_root: Path | None = None,
        allowed_private_hosts: Sequence[str] = (),
    ) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be positive, got {time_scale}")
        self.template_path = Path(template_path).resolve()
        self.stack_name = stack_name
        self.parameter_overrides = dict(parameter_overrides or {})
        self.time_scale = time_scale
        self.workspaces_root = Path(workspaces_root or tempfile.mkdtemp(prefix="agent-jobs-workspaces-")).resolve()
        if remotes_root is None:
            remotes_root = (
                Path(workspaces_root).parent / "remotes"
                if workspaces_root
                else Path(tempfile.mkdtemp(prefix="agent-jobs-remotes-"))
            )
        self.remotes_root = Path(remotes_root).resolve()
        self.allowed_private_hosts = tuple(allowed_private_hosts)
        self.api_port = api_port
        self.worker_bootstrap = worker_bootstrap
        self.bootstrap_config = dict(bootstrap_config) if bootstrap_config is not None else None
        self.concurrency = concurrency
        self.api_concurrency = api_concurrency
        self.api_bootstrap = api_bootstrap
        self.api_bootstrap_config = dict(api_bootstrap_config) if api_bootstrap_config is not None else None
        self.extra_worker_env = dict(extra_worker_env or {})
        self.region = region
        self.emulator_log = emulator_log
        self.bwrap = bwrap
        self._given_endpoint = endpoint_url
        self._emulator: Emulator | None = None
        self._endpoint_url: str | None = endpoint_url
        self._model: TemplateModel | None = None
        self._resources: ProvisionedResources | None = None
        self._function_env: dict[str, dict[str, str]] = {}
        self._api: LocalApiServer | None = None
        self._api_environments: EnvironmentPool | None = None
        self._saved_environ: dict[str, str | None] = {}
        self._poller: EventSourcePoller | None = None
        self._lambda_endpoint: LocalLambdaEndpoint | None = None

    # --- lifecycle ---------------------------------------------------------------------------------------------

    def start(self) -> LocalRuntime:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        if self._given_endpoint is None:
            self._emulator = Emulator(log_path=self.emulator_log).start()
            self._endpoint_url = self._emulator.url
        model = TemplateModel.from_path(
            self.template_path,
            stack_name=self.stack_name,
            parameter_overrides=self.parameter_overrides,
            region=self.region,
        )
        if self._endpoint_url is not None and boto3.Session().get_credentials() is None:
            # The event source's clients in this process sign their calls too; an emulator accepts any key.
            self._set_environ(_FAKE_CREDENTIALS)
        resources = provision(self._clients(), model)
        if (resources.account_id, resources.region) != (model.account_id, model.region):
            model = model.for_account(account_id=resources.account_id, region=resources.region)
        self._model, self._resources = model, resources
        self._scale_visibility_timeout()

        if model.directly_invoked_functions():
            self._lambda_endpoint = LocalLambdaEndpoint(
                model, template_dir=self.template_path.parent, references=resources.references, bwrap=self.bwrap
            ).start()

        worker_id = model.worker.function.function_id
        for function_id in model.resources_of_type("AWS::Serverless::Function"):
            environment = scale_durations(
                model.function_environment(function_id, resources.references), self.time_scale
            )
            # The local stand-ins: file-system remotes under remotes_root, and the hosts (a fake GitHub) allowed.
            environment["WORKSPACES_REMOTE_ROOT"] = str(self.remotes_root)
            environment["ALLOWED_PRIVATE_HOSTS"] = ",".join(self.allowed_private_hosts)
            if function_id == worker_id:
                environment["WORKSPACES_ROOT"] = str(self.workspaces_root)
                if self._lambda_endpoint is not None:
                    # boto3 prefers the service's own endpoint variable to AWS_ENDPOINT_URL (the emulator).
                    environment["AWS_ENDPOINT_URL_LAMBDA"] = self._lambda_endpoint.url
                environment.update(self.extra_worker_env)
            self._function_env[function_id] = environment

        producer_id = http_api_routes(model)[0].function_id
        self._api_environments = self._producer_environments(producer_id)
        self._api = LocalApiServer(model, self._api_environments, function_id=producer_id, port=self.api_port).start()

        self._poller = EventSourcePoller(
            model=model,
            queue_url=resources.queue_url,
            queue_arn=resources.queue_arn,
            region=resources.region,
            function_env=self._function_env[worker_id],
            endpoint_url=self._endpoint_url,
            time_scale=self.time_scale,
            concurrency=self.concurrency,
            worker_bootstrap=self.worker_bootstrap,
            bootstrap_config=self.bootstrap_config,
            template_dir=self.template_path.parent,
        ).start()

    def stop(self) -> None:
        """Stop the pollers (in-flight invocations finish), the API, restore the environment, stop the emulator."""
        if self._poller is not None:
            self._poller.stop()
        if self._api is not None:
            self._api.stop()
        if self._api_environments is not None:
            self._api_environments.close()
            self._api_environments = None
        if self._lambda_endpoint is not None:
            self._lambda_endpoint.stop()
        for name, value in self._saved_environ.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved_environ = {}
        if self._emulator is not None:
            self._emulator.stop()
            self._emulator = None

    def __enter__(self) -> LocalRuntime:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    # --- parts -------------------------------------------------------------------------------------------------

    def _clients(self) -> AwsClients:
        key: str | None = None
        if self._endpoint_url is not None and boto3.Session().get_credentials() is None:
            key = "testing"  # an emulator accepts any signature, but boto3 signs nothing without credentials
        session = boto3.Session(region_name=self.region, aws_access_key_id=key, aws_secret_access_key=key)
        return AwsClients.from_session(session, endpoint_url=self._endpoint_url)

    def _scale_visibility_timeout(self) -> None:
        """The jobs queue's VisibilityTimeout, scaled like the worker's Timeout (set even at scale 1, so a queue
        left scaled by an earlier run on a long-lived emulator gets the template's value back)."""
        model, resources = self.model, self.resources
        attributes = model.queue_attributes(model.jobs_queue_id, resources.references)
        if "VisibilityTimeout" not in attributes:
            return
        seconds = max(1, round(float(attributes["VisibilityTimeout"]) * self.time_scale))
        self._clients().sqs.set_queue_attributes(
            QueueUrl=resources.queue_url, Attributes={"VisibilityTimeout": str(seconds)}
        )

    def _set_environ(self, values: Mapping[str, str]) -> None:
        for name, value in values.items():
            self._saved_environ.setdefault(name, os.environ.get(name))
            os.environ[name] = value

    def _producer_environments(self, function_id: str) -> EnvironmentPool:
        """The producer's execution environments: its CodeUri first on `sys.path`, its layers next, its environment
        (with the emulator as AWS_ENDPOINT_URL), up to `api_concurrency` of them serving requests at once."""
        model = self.model
        settings = model.function_settings(function_id)
        base = self.template_path.parent
        code_dir = (base / settings.code_uri).resolve()
        layers = [
            self._layer_dir(model, layer, base) for layer in model.function_properties(function_id).get("Layers") or []
        ]
        environment = lambda_environment(
            self._function_env[function_id],
            function_id=function_id,
            handler=settings.handler,
            code_dir=code_dir,
            region=self.resources.region,
            timeout_seconds=settings.timeout_seconds,
            memory_size_mb=settings.memory_size_mb,
            endpoint_url=self._endpoint_url,
        )
        spec = FunctionSpec(
            function_id=function_id,
            code_dir=code_dir,
            handler=settings.handler,
            environment=environment,
            layer_dirs=tuple(layer for layer in layers if layer is not None),
            memory_size_mb=settings.memory_size_mb,
            bootstrap=self.api_bootstrap,
            bootstrap_config=self.api_bootstrap_config,
        )
        concurrency = self.api_concurrency or settings.reserved_concurrency or DEFAULT_API_CONCURRENCY
        return EnvironmentPool(spec, timeout_seconds=settings.timeout_seconds, max_environments=concurrency)

    @staticmethod
    def _layer_dir(model: TemplateModel, layer: object, base: Path) -> Path | None:
        logical_id = layer.get("Ref") if isinstance(layer, dict) else None
        spec = model.resources.get(logical_id) if isinstance(logical_id, str) else None
        if not spec or spec.get("Type") != "AWS::Serverless::LayerVersion":
            return None
        content = (spec.get("Properties") or {}).get("ContentUri")
        return (base / content).resolve() if isinstance(content, str) else None

    # --- what callers use --------------------------------------------------------------------------------------

    def _require(self, value: Any, what: str) -> Any:
        if value is None:
            raise RuntimeError(f"the local runtime is not started: {what} is known after start()")
        return value

    @property
    def api_url(self) -> str:
        api: LocalApiServer = self._require(self._api, "api_url")
        return api.url

    @property
    def api(self) -> LocalApiServer:
        api: LocalApiServer = self._require(self._api, "api")
        return api

    @property
    def endpoint_url(self) -> str | None:
        """The emulator's URL (or the endpoint given); None when using AWS itself."""
        return self._endpoint_url

    @property
    def emulator(self) -> Emulator | None:
        return self._emulator

    @property
    def model(self) -> TemplateModel:
        model: TemplateModel = self._require(self._model, "model")
        return model

    @property
    def resources(self) -> ProvisionedResources:
        resources: ProvisionedResources = self._require(self._resources, "resources")
        return resources

    @property
    def function_env(self) -> dict[str, dict[str, str]]:
        """Each function's environment as the runtime gives it (template values, scaled; the worker's with
        WORKSPACES_ROOT and extra_worker_env). AWS_ENDPOINT_URL is added where the function runs."""
        self._require(self._resources, "function_env")
        return {function_id: dict(environment) for function_id, environment in self._function_env.items()}

    @property
    def lambda_endpoint(self) -> LocalLambdaEndpoint | None:
        """The local Lambda Invoke endpoint of the directly invoked functions (the test sandbox)."""
        return self._lambda_endpoint

    @property
    def poller(self) -> EventSourcePoller:
        poller: EventSourcePoller = self._require(self._poller, "poller")
        return poller

    def write_connection_file(self, path: Path) -> Path:
        """Write the connection file the `agent-jobs` command line reads for this runtime (JSON): `apiUrl`,
        `endpointUrl` (the emulator), `region`, `tableName`, `queueUrl`, `deadLetterQueueUrl`."""
        resources = self.resources
        document = {
            "apiUrl": self.api_url,
            "endpointUrl": self.endpoint_url,
            "region": resources.region,
            "tableName": resources.table_name,
            "queueUrl": resources.queue_url,
            "deadLetterQueueUrl": resources.dlq_url,
        }
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        return path

    def write_env_file(self, path: Path, endpoint_for_containers: str | None = None) -> Path:
        """Write a `sam local invoke --env-vars` / `sam local start-api --env-vars` file for these resources:
        `{"EnqueueApiFunction": {"TABLE_NAME": ..., "QUEUE_URL": ..., "AWS_ENDPOINT_URL": ...}, "JobWorkerFunction":
        {...}}`, with the template's (unscaled) values, since `sam local` runs the functions with their real Timeout.

        A function named by reference (the worker's TEST_SANDBOX_FUNCTION) has the name this runtime serves it under;
        a function without environment variables (the test sandbox) is left out.
        AWS_ENDPOINT_URL is `endpoint_for_containers`, default the emulator's URL with its loopback host replaced by
        host.docker.internal (how a function's container reaches this machine). SAM only applies variables the
        template declares for the function, which is why template.yaml declares AWS_ENDPOINT_URL through its
        EndpointUrl parameter: run `sam local ... --env-vars <file> --parameter-overrides EndpointUrl=<endpoint>`
        (any non-empty value declares it; the file's value is the one used).
        """
        model, resources = self.model, self.resources
        endpoint = endpoint_for_containers
        if endpoint is None and self._endpoint_url is not None:
            endpoint = container_endpoint(self._endpoint_url)
        document: dict[str, dict[str, str]] = {}
        for function_id in model.resources_of_type("AWS::Serverless::Function"):
            environment = model.function_environment(function_id, resources.references)
            if not environment:
                continue  # SAM applies only variables the template declares: the test sandbox declares none
            if endpoint is not None:
                environment["AWS_ENDPOINT_URL"] = endpoint
            document[function_id] = environment
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return path


__all__ = ["SCALED_DURATION_SETTINGS", "LocalRuntime", "container_endpoint", "scale_durations"]
