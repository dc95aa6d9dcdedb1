"""The serverless functions of the template: their settings with Globals merged, names, environments, and the SQS
event source that feeds the worker."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent_jobs_local.principals import function_access_key, principal_id
from agent_jobs_local.template.intrinsics import IntrinsicResolver
from agent_jobs_local.template.loading import References, TemplateError
from agent_jobs_local.template.values import as_int, get_att_resource, merge_globals, parameter_string


@dataclass(frozen=True)
class SqsEventSource:
    """The worker's SQS event source as Lambda runs it."""

    function_id: str
    queue_id: str
    batch_size: int
    maximum_concurrency: int | None
    function_response_types: tuple[str, ...]
    maximum_batching_window_seconds: int


@dataclass(frozen=True)
class FunctionSettings:
    """A function's resolved configuration (Globals merged in), without its environment (see `function_environment`,
    which needs the provisioned resources)."""

    function_id: str
    code_uri: str
    handler: str
    runtime: str
    architectures: tuple[str, ...]
    timeout_seconds: int
    memory_size_mb: int
    reserved_concurrency: int | None
    # TenancyConfig.TenantIsolationMode (PER_TENANT: every invocation names its tenant, and an execution environment
    # never serves two tenants); None when the function has no TenancyConfig.
    tenant_isolation_mode: str | None = None
    ephemeral_storage_mb: int = 512


@dataclass(frozen=True)
class WorkerSettings:
    """What the local runtime needs to run the worker as Lambda would: its function and its event source."""

    function: FunctionSettings
    event_source: SqsEventSource

    @property
    def timeout_seconds(self) -> int:
        return self.function.timeout_seconds

    @property
    def batch_size(self) -> int:
        return self.event_source.batch_size

    @property
    def maximum_concurrency(self) -> int | None:
        return self.event_source.maximum_concurrency

    @property
    def function_response_types(self) -> tuple[str, ...]:
        return self.event_source.function_response_types


class FunctionReader(IntrinsicResolver):
    """The template's AWS::Serverless::Function resources, and the worker among them."""

    def function_properties(self, function_id: str) -> dict[str, Any]:
        """A serverless function's properties with Globals.Function merged in, unresolved."""
        own = self.resource(function_id, "AWS::Serverless::Function").get("Properties") or {}
        global_properties = (self.template.get("Globals") or {}).get("Function") or {}
        merged: dict[str, Any] = merge_globals(copy.deepcopy(global_properties), copy.deepcopy(own))
        return merged

    def function_settings(self, function_id: str) -> FunctionSettings:
        properties = self.function_properties(function_id)
        reserved = self.resolve(properties.get("ReservedConcurrentExecutions"))
        mode = (self.resolve(properties.get("TenancyConfig")) or {}).get("TenantIsolationMode")
        storage = self.resolve(properties.get("EphemeralStorage")) or {}
        return FunctionSettings(
            function_id=function_id,
            code_uri=str(self.resolve(properties.get("CodeUri", "."))),
            handler=str(self.resolve(properties.get("Handler", ""))),
            runtime=str(self.resolve(properties.get("Runtime", ""))),
            architectures=tuple(self.resolve(properties.get("Architectures", ["x86_64"]))),
            timeout_seconds=as_int(self.resolve(properties.get("Timeout", 3)), f"{function_id} Timeout"),
            memory_size_mb=as_int(self.resolve(properties.get("MemorySize", 128)), f"{function_id} MemorySize"),
            reserved_concurrency=None if reserved is None else as_int(reserved, f"{function_id} reserved concurrency"),
            tenant_isolation_mode=None if mode is None else str(mode),
            ephemeral_storage_mb=as_int(self.resolve(storage.get("Size", 512)), f"{function_id} EphemeralStorage"),
        )

    def function_name(self, function_id: str) -> str:
        """FunctionName resolved for this stack; without one, a stable `<stack>-<id>` name (CloudFormation would add a
        random suffix), within Lambda's 64 characters. The local runtime serves the function under this name."""
        properties = self.function_properties(function_id)
        if "FunctionName" in properties:
            return str(self.resolve(properties["FunctionName"]))
        return f"{self.stack_name}-{function_id}"[:64]

    def function_arn(self, function_id: str) -> str:
        return f"arn:{self.partition}:lambda:{self.region}:{self.account_id}:function:{self.function_name(function_id)}"

    def directly_invoked_functions(self) -> list[str]:
        """The functions no event source or API feeds (no Events): other functions invoke them through Lambda's
        Invoke call."""
        return [
            function_id
            for function_id in self.resources_of_type("AWS::Serverless::Function")
            if not self.function_properties(function_id).get("Events")
        ]

    def generated_resources(self) -> dict[str, dict[str, str]]:
        """The execution role SAM generates for each function that names no Role (`<FunctionId>Role`): its name, ARN
        and RoleId. Locally the function signs with its own access key (`principals.function_access_key`) and its
        RoleId is the SenderId the emulator gives that key, so `!GetAtt <FunctionId>Role.RoleId` names the function's
        messages as SQS would."""
        roles: dict[str, dict[str, str]] = {}
        for function_id in self.resources_of_type("AWS::Serverless::Function"):
            if "Role" in self.function_properties(function_id):
                continue
            name = f"{self.stack_name}-{function_id}Role"[:64]
            roles[f"{function_id}Role"] = {
                "Ref": name,
                "Arn": f"arn:{self.partition}:iam::{self.account_id}:role/{name}",
                "RoleId": principal_id(self.function_access_key(function_id)),
            }
        return roles

    def function_access_key(self, function_id: str) -> str:
        """The access key id the function signs its calls to a local emulator with (`principals`)."""
        return function_access_key(self.stack_name, function_id)

    def function_own_environment(self, function_id: str, references: References | None = None) -> dict[str, str]:
        """The environment variables the function declares itself, resolved; without those of Globals.Function."""
        own = self.resource(function_id, "AWS::Serverless::Function").get("Properties") or {}
        variables = (own.get("Environment") or {}).get("Variables") or {}
        resolved = self.resolve(variables, references) or {}
        return {name: parameter_string(value) for name, value in resolved.items()}

    def function_environment(self, function_id: str, references: References | None = None) -> dict[str, str]:
        """The function's environment variables (Globals merged), resolved against `references`."""
        variables = (self.function_properties(function_id).get("Environment") or {}).get("Variables") or {}
        resolved = self.resolve(variables, references) or {}
        return {name: parameter_string(value) for name, value in resolved.items()}

    def function_environment_variable(
        self, function_id: str, name: str, references: References | None = None
    ) -> str | None:
        """One environment variable of the function (Globals merged), or None when it is not set."""
        variables = (self.function_properties(function_id).get("Environment") or {}).get("Variables") or {}
        if name not in variables:
            return None
        return parameter_string(self.resolve(variables[name], references))

    def sqs_event_sources(self) -> list[SqsEventSource]:
        sources: list[SqsEventSource] = []
        for function_id in self.resources_of_type("AWS::Serverless::Function"):
            events: Mapping[str, Any] = self.function_properties(function_id).get("Events") or {}
            for event_name, event in events.items():
                if event.get("Type") != "SQS":
                    continue
                properties = event.get("Properties") or {}
                queue_id = get_att_resource(properties.get("Queue"))
                if queue_id is None:
                    raise TemplateError(f"{function_id} event {event_name}: Queue is not a !GetAtt of a queue")
                maximum = self.resolve((properties.get("ScalingConfig") or {}).get("MaximumConcurrency"))
                what = f"{function_id} event {event_name}"
                sources.append(
                    SqsEventSource(
                        function_id=function_id,
                        queue_id=queue_id,
                        batch_size=as_int(self.resolve(properties.get("BatchSize", 10)), f"{what} BatchSize"),
                        maximum_concurrency=None if maximum is None else as_int(maximum, f"{what} MaximumConcurrency"),
                        function_response_types=tuple(self.resolve(properties.get("FunctionResponseTypes", []))),
                        maximum_batching_window_seconds=as_int(
                            self.resolve(properties.get("MaximumBatchingWindowInSeconds", 0)), f"{what} batching window"
                        ),
                    )
                )
        return sources

    @property
    def worker(self) -> WorkerSettings:
        """The one function fed by an SQS queue, with its event source."""
        sources = self.sqs_event_sources()
        if len(sources) != 1:
            raise TemplateError(f"expected exactly one SQS event source, found {len(sources)}")
        return WorkerSettings(function=self.function_settings(sources[0].function_id), event_source=sources[0])

    def worker_environment(self, references: References | None = None) -> dict[str, str]:
        return self.function_environment(self.worker.function.function_id, references)
