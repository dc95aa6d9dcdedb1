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
the functions' duration settings listed in `SCALED_DURATION_SETTINGS` (rounded, a nonzero one at least 1) are all
multiplied by it. Nothing else changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import boto3

from agent_jobs_local.api_server import LocalApiServer, http_api_routes
from agent_jobs_local.auth import dev_signing_key, public_key_pem
from agent_jobs_local.emulator import DEFAULT_HOST, Emulator
from agent_jobs_local.execution_environment import EnvironmentPool
from agent_jobs_local.lambda_endpoint import LocalLambdaEndpoint
from agent_jobs_local.poller import EventSourcePoller
from agent_jobs_local.runtime_aws import (
    FAKE_CREDENTIALS,
    EnvironOverrides,
    aws_clients,
    provision_for_account,
    scale_visibility_timeout,
)
from agent_jobs_local.runtime_files import (
    CONTAINER_HOST,
    container_endpoint,
    local_folders,
    write_connection_file,
    write_env_file,
)
from agent_jobs_local.runtime_functions import (
    DEFAULT_API_CONCURRENCY,
    SCALED_DURATION_SETTINGS,
    function_environments,
    producer_environments,
    scale_durations,
)
from agent_jobs_local.template import (
    DEFAULT_LOCAL_STACK_NAME,
    DEFAULT_REGION,
    DEFAULT_TEMPLATE_PATH,
    AwsClients,
    ProvisionedResources,
    TemplateModel,
)


class LocalRuntime:
    """The system, run locally as Lambda, API Gateway and the SQS event source would run it (see the module docstring).

    Keyword arguments: `template_path` (default the project's template.yaml), `stack_name`, `parameter_overrides`
    (template parameters, validated as CloudFormation would), `endpoint_url` (None: start an emulator), `time_scale`,
    `workspaces_root` (the worker's WORKSPACES_ROOT; default a new temporary folder), `api_port` (0: a free port),
    `worker_bootstrap` and `bootstrap_config` (passed to `EventSourcePoller`), `concurrency` (default the template's
    MaximumConcurrency), `api_concurrency` (how many requests the HTTP API runs at once; default the producer's
    ReservedConcurrentExecutions, else `DEFAULT_API_CONCURRENCY`), `api_bootstrap` and `api_bootstrap_config` (the
    same hook for the producer's environments), `extra_worker_env` (added to the worker's
    environment last), `region`, `emulator_log` (where the emulator's output goes), `listen_host` (where the emulator
    listens: loopback, unless `sam local`'s containers must reach it, see `runtime_files.container_reachable_host`),
    `bwrap` (the bubblewrap binary of the test sandbox; default AGENT_JOBS_BWRAP, else `bwrap` on PATH), `remotes_root`
    (both functions'
    WORKSPACES_REMOTE_ROOT: a tenant's file-system remotes lie under `<remotes_root>/<tenantId>/`; default `remotes`
    beside a given `workspaces_root`, else a new temporary folder) and `allowed_private_hosts` (both functions'
    ALLOWED_PRIVATE_HOSTS: host:port
    entries, such as a fake GitHub's on 127.0.0.1, that registrations may name although they are not public) and
    `sam_local_env` (the values of variables the template declares only for `sam local`, such as the sample
    workspaces' git server, LOCAL_GIT_SERVER and LOCAL_GIT_CA: every function that declares one gets it, and so does
    the env file) and `local_env` (the same for this machine's functions alone, never the env file: `make local`'s
    GitHub stand-in on loopback, which no container reaches).

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
        listen_host: str = DEFAULT_HOST,
        bwrap: str | None = None,
        remotes_root: Path | None = None,
        allowed_private_hosts: Sequence[str] = (),
        sam_local_env: Mapping[str, str] | None = None,
        local_env: Mapping[str, str] | None = None,
    ) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be positive, got {time_scale}")
        self.template_path = Path(template_path).resolve()
        self.stack_name = stack_name
        self.parameter_overrides = dict(parameter_overrides or {})
        self.time_scale = time_scale
        self.workspaces_root, self.remotes_root = local_folders(workspaces_root, remotes_root)
        self.allowed_private_hosts = tuple(allowed_private_hosts)
        self.sam_local_env = dict(sam_local_env or {})
        self.local_env = dict(local_env or {})
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
        self.listen_host = listen_host
        self.bwrap = bwrap
        self._given_endpoint = endpoint_url
        self._emulator: Emulator | None = None
        self._endpoint_url: str | None = endpoint_url
        self._model: TemplateModel | None = None
        self._resources: ProvisionedResources | None = None
        self._function_env: dict[str, dict[str, str]] = {}
        self._api: LocalApiServer | None = None
        self._api_environments: EnvironmentPool | None = None
        self._environ = EnvironOverrides()
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
            self._emulator = Emulator(host=self.listen_host, log_path=self.emulator_log).start()
            self._endpoint_url = self._emulator.url
        model = TemplateModel.from_path(
            self.template_path,
            stack_name=self.stack_name,
            parameter_overrides=self.parameter_overrides,
            region=self.region,
        )
        if self._endpoint_url is not None and boto3.Session().get_credentials() is None:
            # The event source's clients in this process sign their calls too; an emulator accepts any key.
            self._environ.set(FAKE_CREDENTIALS)
        model, resources = provision_for_account(self._clients(), model)
        self._model, self._resources = model, resources
        scale_visibility_timeout(self._clients(), model, resources, self.time_scale)

        if model.directly_invoked_functions():
            self._lambda_endpoint = LocalLambdaEndpoint(
                model, template_dir=self.template_path.parent, references=resources.references, bwrap=self.bwrap
            ).start()

        self._function_env = function_environments(
            model,
            resources,
            time_scale=self.time_scale,
            remotes_root=self.remotes_root,
            allowed_private_hosts=self.allowed_private_hosts,
            workspaces_root=self.workspaces_root,
            lambda_url=self._lambda_endpoint.url if self._lambda_endpoint is not None else None,
            extra_worker_env=self.extra_worker_env,
            sam_local_env={**self.sam_local_env, **self.local_env},
        )

        producer_id = http_api_routes(model)[0].function_id
        self._api_environments = producer_environments(
            model,
            producer_id,
            template_dir=self.template_path.parent,
            function_env=self._function_env[producer_id],
            region=resources.region,
            endpoint_url=self._endpoint_url,
            bootstrap=self.api_bootstrap,
            bootstrap_config=self.api_bootstrap_config,
            concurrency=self.api_concurrency,
        )
        self._api = LocalApiServer(model, self._api_environments, function_id=producer_id, port=self.api_port).start()

        self._poller = EventSourcePoller(
            model=model,
            queue_url=resources.queue_url,
            queue_arn=resources.queue_arn,
            region=resources.region,
            function_env=self._function_env[model.worker.function.function_id],
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
        self._environ.restore()
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
        return aws_clients(self.region, self._endpoint_url)

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
        `endpointUrl` (the emulator), `region`, `tableName`, `queueUrl`, `deadLetterQueueUrl`, `apiSenderId` (the
        worker's API_SENDER_ID: the SenderId of the API's messages)."""
        worker_env = self.function_env.get(self.model.worker.function.function_id, {})
        return write_connection_file(
            path,
            api_url=self.api_url,
            endpoint_url=self.endpoint_url,
            resources=self.resources,
            api_sender_id=worker_env.get("API_SENDER_ID"),
        )

    def write_env_file(
        self,
        path: Path,
        endpoint_for_containers: str | None = None,
        container_values: Mapping[str, str] | None = None,
    ) -> Path:
        """Write a `sam local invoke --env-vars` / `sam local start-api --env-vars` file for these resources (see
        `runtime_files.write_env_file`). AWS_ENDPOINT_URL is `endpoint_for_containers`, default the emulator's URL
        with its host replaced by host.docker.internal (how a function's container reaches this machine); the
        producer's LOCAL_JWT_PUBLIC_KEY is the development key's public half (tokens of `agent_jobs_local token`);
        WORKSPACES_REMOTE_ROOT is this stack's, against which its registrations were checked; `sam_local_env` (the
        sample workspaces' git server and its CA) as the stack's own functions have it; `container_values` last (for
        the containers only, such as where `sam local start-lambda` serves the test sandbox)."""
        endpoint = endpoint_for_containers
        if endpoint is None and self._endpoint_url is not None:
            endpoint = container_endpoint(self._endpoint_url, (self.listen_host,))
        local_values = {
            "LOCAL_JWT_PUBLIC_KEY": public_key_pem(dev_signing_key().public_key),
            "WORKSPACES_REMOTE_ROOT": str(self.remotes_root),
            **self.sam_local_env,
            **(container_values or {}),
        }
        return write_env_file(path, self.model, self.resources, endpoint, local_values)


__all__ = [
    "CONTAINER_HOST",
    "DEFAULT_API_CONCURRENCY",
    "SCALED_DURATION_SETTINGS",
    "LocalRuntime",
    "container_endpoint",
    "scale_durations",
]
