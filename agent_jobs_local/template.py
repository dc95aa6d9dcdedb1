"""template.yaml as data: load it, resolve what local tooling needs, and create its queues and table.

Everything local (tests, the local runtime) reads its settings from here, so nothing keeps a second copy of what is
deployed. The resolver covers the intrinsic functions this project's template can use; anything it cannot resolve
(an attribute of a resource that was not provisioned, `Fn::ImportValue`, `Fn::Cidr`) raises `TemplateError` rather
than guessing.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeAlias

import boto3
import yaml

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient
    from mypy_boto3_s3.client import S3Client
    from mypy_boto3_sqs.client import SQSClient
    from mypy_boto3_sts.client import STSClient

DEFAULT_TEMPLATE_PATH: Final = Path(__file__).resolve().parent.parent / "template.yaml"
DEFAULT_LOCAL_STACK_NAME: Final = "agent-jobs-local"
# moto's default account; provision() asks STS for the real one when it has an STS client.
DEFAULT_ACCOUNT_ID: Final = "123456789012"
DEFAULT_REGION: Final = "us-east-1"

Template: TypeAlias = dict[str, Any]
References: TypeAlias = Mapping[str, Mapping[str, str]]
"""Values of provisioned resources by logical id: {"JobsQueue": {"Ref": url, "Arn": arn, "QueueName": name}}."""


class TemplateError(ValueError):
    """The template cannot be read, resolved or provisioned as asked; the message says which part and why."""


# --- Loading -------------------------------------------------------------------------------------------------------

_SHORT_FORMS: Final = {
    "Ref": "Ref",
    "Condition": "Condition",
    **{
        name: f"Fn::{name}"
        for name in (
            "And",
            "Base64",
            "Cidr",
            "Equals",
            "FindInMap",
            "GetAZs",
            "GetAtt",
            "If",
            "ImportValue",
            "Join",
            "Not",
            "Or",
            "Select",
            "Split",
            "Sub",
        )
    },
}


class CloudFormationLoader(yaml.SafeLoader):
    """YAML as CloudFormation reads it: short-form tags become long-form dicts, dates stay strings."""


# CloudFormation keeps `AWSTemplateFormatVersion: 2010-09-09` a string; YAML 1.1 would make it a date.
CloudFormationLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _construct_short_form(loader: CloudFormationLoader, tag_suffix: str, node: yaml.Node) -> dict[str, Any]:
    name = _SHORT_FORMS.get(tag_suffix)
    if name is None:
        raise yaml.constructor.ConstructorError(
            None, None, f"unknown CloudFormation tag !{tag_suffix}", node.start_mark
        )
    value: Any
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
        if name == "Fn::GetAtt":
            # `!GetAtt Resource.Attribute`; the attribute itself may contain dots (Endpoint.Address).
            resource, _, attribute = str(value).partition(".")
            value = [resource, attribute]
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    elif isinstance(node, yaml.MappingNode):
        value = loader.construct_mapping(node, deep=True)
    else:  # pragma: no cover - yaml has no other node kinds
        raise yaml.constructor.ConstructorError(None, None, f"unexpected node for !{tag_suffix}", node.start_mark)
    return {name: value}


CloudFormationLoader.add_multi_constructor("!", _construct_short_form)


def load_template(path: Path = DEFAULT_TEMPLATE_PATH) -> Template:
    """template.yaml as a dict, with every short-form tag (`!Ref X`) in its long form (`{"Ref": "X"}`)."""
    with path.open(encoding="utf-8") as stream:
        template = yaml.load(stream, Loader=CloudFormationLoader)  # a SafeLoader subclass
    if not isinstance(template, dict) or not isinstance(template.get("Resources"), dict):
        raise TemplateError(f"{path} is not a CloudFormation template: it has no Resources mapping")
    return template


# --- Resolving -----------------------------------------------------------------------------------------------------


class _NoValue:
    """AWS::NoValue: the property or list entry is removed."""


_NO_VALUE: Final = _NoValue()
_SUB_VARIABLE: Final = re.compile(r"\$\{([^}]*)\}")
_LIST_PARAMETER_TYPES: Final = ("CommaDelimitedList", "List<")


def _parameter_string(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(_parameter_string(item) for item in value)
    return str(value)


def _as_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TemplateError(f"{what} must be a number, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise TemplateError(f"{what} must be a number, got {value!r}") from None
    if not number.is_integer():
        raise TemplateError(f"{what} must be a whole number, got {value!r}")
    return int(number)


def _as_bool(value: object, what: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise TemplateError(f"{what} must be true or false, got {value!r}")


def _attribute_string(value: object) -> str:
    """A queue attribute value as SQS's API takes it: booleans lower-case, numbers as digits."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _get_att_target(argument: object) -> tuple[str, object]:
    if isinstance(argument, str):
        resource, _, attribute = argument.partition(".")
        return resource, attribute
    if isinstance(argument, list) and len(argument) == 2 and isinstance(argument[0], str):
        return argument[0], argument[1]
    raise TemplateError(f"Fn::GetAtt takes [resource, attribute], got {argument!r}")


def get_att_resource(value: object) -> str | None:
    """The logical id a `Fn::GetAtt` (or `Ref`) points at, without resolving it; None for anything else."""
    if isinstance(value, dict) and len(value) == 1:
        if "Fn::GetAtt" in value:
            return _get_att_target(value["Fn::GetAtt"])[0]
        if "Ref" in value and isinstance(value["Ref"], str):
            return value["Ref"]
    return None


def get_att_target(value: object) -> tuple[str, str] | None:
    """(resource, attribute) of a `Fn::GetAtt`, without resolving it; None for anything else."""
    if isinstance(value, dict) and set(value) == {"Fn::GetAtt"}:
        resource, attribute = _get_att_target(value["Fn::GetAtt"])
        return resource, str(attribute)
    return None


def merge_globals(global_value: Any, own_value: Any) -> Any:
    """SAM's Globals rule: maps merge (the resource's keys win), lists are the globals' entries then the resource's,
    anything else is the resource's own value."""
    if isinstance(global_value, dict) and isinstance(own_value, dict):
        merged = dict(global_value)
        for key, value in own_value.items():
            merged[key] = merge_globals(global_value[key], value) if key in global_value else value
        return merged
    if isinstance(global_value, list) and isinstance(own_value, list):
        return [*global_value, *own_value]
    return own_value


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


# CloudFormation property -> CreateQueue attribute (same names), and the properties that are not attributes.
_QUEUE_ATTRIBUTE_PROPERTIES: Final = frozenset(
    {
        "ContentBasedDeduplication",
        "DeduplicationScope",
        "DelaySeconds",
        "FifoQueue",
        "FifoThroughputLimit",
        "KmsDataKeyReusePeriodSeconds",
        "KmsMasterKeyId",
        "MaximumMessageSize",
        "MessageRetentionPeriod",
        "ReceiveMessageWaitTimeSeconds",
        "RedriveAllowPolicy",
        "RedrivePolicy",
        "SqsManagedSseEnabled",
        "VisibilityTimeout",
    }
)
_QUEUE_JSON_ATTRIBUTES: Final = frozenset({"RedrivePolicy", "RedriveAllowPolicy"})
_QUEUE_OTHER_PROPERTIES: Final = frozenset({"QueueName", "Tags"})

# CloudFormation table properties that CreateTable takes under the same name and shape.
_TABLE_CREATE_PROPERTIES: Final = frozenset(
    {
        "AttributeDefinitions",
        "BillingMode",
        "DeletionProtectionEnabled",
        "KeySchema",
        "LocalSecondaryIndexes",
        "OnDemandThroughput",
        "ProvisionedThroughput",
        "TableClass",
        "Tags",
        "WarmThroughput",
    }
)
# Applied after CreateTable (TTL, PITR), named (TableName), or reshaped (indexes, streams, SSE).
_TABLE_OTHER_PROPERTIES: Final = frozenset(
    {
        "GlobalSecondaryIndexes",
        "PointInTimeRecoverySpecification",
        "SSESpecification",
        "StreamSpecification",
        "TableName",
        "TimeToLiveSpecification",
        # CloudWatch Contributor Insights has no local effect.
        "ContributorInsightsSpecification",
    }
)


class TemplateModel:
    """template.yaml with its parameters resolved (defaults, or overrides validated as CloudFormation would) and a
    resolver for the intrinsic functions, for one stack name, region and account."""

    def __init__(
        self,
        template: Mapping[str, Any],
        *,
        stack_name: str = DEFAULT_LOCAL_STACK_NAME,
        parameter_overrides: Mapping[str, object] | None = None,
        region: str = DEFAULT_REGION,
        account_id: str = DEFAULT_ACCOUNT_ID,
    ) -> None:
        self.template: Template = copy.deepcopy(dict(template))
        self.stack_name = stack_name
        self.region = region
        self.account_id = account_id
        self._overrides = dict(parameter_overrides or {})
        self.parameters: dict[str, str] = self._resolve_parameters(self._overrides)
        self._conditions: dict[str, bool] = {}

    @classmethod
    def from_path(cls, path: Path = DEFAULT_TEMPLATE_PATH, **kwargs: Any) -> TemplateModel:
        return cls(load_template(path), **kwargs)

    def for_account(self, *, account_id: str, region: str) -> TemplateModel:
        """The same template and parameters for another account and region."""
        return TemplateModel(
            self.template,
            stack_name=self.stack_name,
            parameter_overrides=self._overrides,
            region=region,
            account_id=account_id,
        )

    # Parameters and pseudo parameters ---------------------------------------------------------------------------

    def _resolve_parameters(self, overrides: Mapping[str, object]) -> dict[str, str]:
        declared: Mapping[str, Any] = self.template.get("Parameters") or {}
        unknown = sorted(set(overrides) - set(declared))
        if unknown:
            raise TemplateError(f"parameter overrides name no template parameter: {', '.join(unknown)}")
        values: dict[str, str] = {}
        for name, spec in declared.items():
            raw = overrides.get(name, spec.get("Default"))
            if raw is None:
                raise TemplateError(f"parameter {name} has no Default: pass it in parameter_overrides")
            value = _parameter_string(raw)
            self._validate_parameter(name, spec, value)
            values[name] = value
        return values

    @staticmethod
    def _validate_parameter(name: str, spec: Mapping[str, Any], value: str) -> None:
        allowed = spec.get("AllowedValues")
        if allowed is not None and value not in [_parameter_string(v) for v in allowed]:
            raise TemplateError(f"parameter {name}={value!r} is not one of its AllowedValues {allowed}")
        if spec.get("Type") == "Number":
            try:
                number = float(value)
            except ValueError:
                raise TemplateError(f"parameter {name}={value!r} must be a number") from None
            if "MinValue" in spec and number < float(spec["MinValue"]):
                raise TemplateError(f"parameter {name}={value} is below its MinValue {spec['MinValue']}")
            if "MaxValue" in spec and number > float(spec["MaxValue"]):
                raise TemplateError(f"parameter {name}={value} is above its MaxValue {spec['MaxValue']}")
        pattern = spec.get("AllowedPattern")
        if pattern is not None and not re.fullmatch(pattern, value):
            raise TemplateError(f"parameter {name}={value!r} does not match its AllowedPattern {pattern}")

    @property
    def partition(self) -> str:
        if self.region.startswith("cn-"):
            return "aws-cn"
        if self.region.startswith("us-gov-"):
            return "aws-us-gov"
        return "aws"

    def _pseudo_parameter(self, name: str) -> Any:
        pseudo: dict[str, Any] = {
            "AWS::AccountId": self.account_id,
            "AWS::NoValue": _NO_VALUE,
            "AWS::NotificationARNs": [],
            "AWS::Partition": self.partition,
            "AWS::Region": self.region,
            "AWS::StackId": (
                f"arn:{self.partition}:cloudformation:{self.region}:{self.account_id}:stack/{self.stack_name}/local"
            ),
            "AWS::StackName": self.stack_name,
            "AWS::URLSuffix": "amazonaws.com.cn" if self.partition == "aws-cn" else "amazonaws.com",
        }
        if name not in pseudo:
            raise TemplateError(f"unknown pseudo parameter {name}")
        return pseudo[name]

    # Intrinsic functions ----------------------------------------------------------------------------------------

    def resolve(self, value: Any, references: References | None = None) -> Any:
        """`value` with every intrinsic function evaluated. `references` gives the Ref and GetAtt values of
        resources (see `ProvisionedResources.references`); a reference to anything else raises TemplateError."""
        refs: References = references or {}
        resolved = self._resolve(value, refs)
        return None if resolved is _NO_VALUE else resolved

    def _resolve(self, value: Any, refs: References) -> Any:
        if isinstance(value, list):
            items = [self._resolve(item, refs) for item in value]
            return [item for item in items if item is not _NO_VALUE]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            ((key, argument),) = value.items()
            if key == "Ref":
                return self._ref(argument, refs)
            if key.startswith("Fn::"):
                return self._function(key, argument, refs)
        resolved = {key: self._resolve(item, refs) for key, item in value.items()}
        return {key: item for key, item in resolved.items() if item is not _NO_VALUE}

    def _ref(self, name: object, refs: References) -> Any:
        if not isinstance(name, str):
            raise TemplateError(f"Ref takes a name, got {name!r}")
        if name in self.parameters:
            spec = self.template["Parameters"][name]
            if str(spec.get("Type", "")).startswith(_LIST_PARAMETER_TYPES):
                return self.parameters[name].split(",")
            return self.parameters[name]
        if name.startswith("AWS::"):
            return self._pseudo_parameter(name)
        return self._resource_value(name, "Ref", refs)

    def _resource_value(self, resource: str, attribute: str, refs: References) -> str:
        if resource not in self.template["Resources"]:
            raise TemplateError(f"{resource} is neither a parameter nor a resource of the template")
        try:
            return refs[resource][attribute]
        except KeyError:
            what = f"Ref {resource}" if attribute == "Ref" else f"{resource}.{attribute}"
            raise TemplateError(f"{what} is not known here: provision the resource and pass its references") from None

    def _function(self, name: str, argument: Any, refs: References) -> Any:
        match name:
            case "Fn::GetAtt":
                resource, attribute = _get_att_target(argument)
                return self._resource_value(resource, str(self._resolve(attribute, refs)), refs)
            case "Fn::Sub":
                return self._sub(argument, refs)
            case "Fn::Join":
                delimiter, items = argument
                return str(delimiter).join(_parameter_string(item) for item in self._resolve(items, refs))
            case "Fn::Select":
                index, items = argument
                return self._resolve(items, refs)[_as_int(self._resolve(index, refs), "Fn::Select index")]
            case "Fn::Split":
                delimiter, text = argument
                return str(self._resolve(text, refs)).split(delimiter)
            case "Fn::If":
                condition, when_true, when_false = argument
                return self._resolve(when_true if self.condition(condition) else when_false, refs)
            case "Fn::Equals" | "Fn::Not" | "Fn::And" | "Fn::Or":
                return self._evaluate_condition({name: argument})
            case "Fn::FindInMap":
                mapping, top, second = (str(self._resolve(part, refs)) for part in argument[:3])
                try:
                    return self._resolve(self.template["Mappings"][mapping][top][second], refs)
                except KeyError:
                    raise TemplateError(f"Fn::FindInMap {mapping}/{top}/{second} is not in Mappings") from None
            case "Fn::GetAZs":
                return [f"{self.region}{zone}" for zone in "abc"]
            case "Fn::Base64":
                return base64.b64encode(str(self._resolve(argument, refs)).encode()).decode()
            case _:
                raise TemplateError(f"{name} cannot be resolved locally")

    def _sub(self, argument: Any, refs: References) -> str:
        if isinstance(argument, list):
            text, variables = argument[0], {k: self._resolve(v, refs) for k, v in argument[1].items()}
        else:
            text, variables = argument, {}

        def substitute(match: re.Match[str]) -> str:
            expression = match.group(1)
            if expression.startswith("!"):
                return "${" + expression[1:] + "}"
            if expression in variables:
                return _parameter_string(variables[expression])
            if "." in expression and not expression.startswith("AWS::"):
                resource, _, attribute = expression.partition(".")
                return self._resource_value(resource, attribute, refs)
            return _parameter_string(self._ref(expression, refs))

        return _SUB_VARIABLE.sub(substitute, str(text))

    def condition(self, name: str) -> bool:
        """A named condition of the template's Conditions section."""
        if name not in self._conditions:
            conditions: Mapping[str, Any] = self.template.get("Conditions") or {}
            if name not in conditions:
                raise TemplateError(f"condition {name} is not in the template's Conditions")
            self._conditions[name] = self._evaluate_condition(conditions[name])
        return self._conditions[name]

    def _evaluate_condition(self, expression: Any) -> bool:
        if not isinstance(expression, dict) or len(expression) != 1:
            raise TemplateError(f"not a condition: {expression!r}")
        ((name, argument),) = expression.items()
        match name:
            case "Condition":
                return self.condition(argument)
            case "Fn::Equals":
                left, right = (_parameter_string(self._resolve(side, {})) for side in argument)
                return left == right
            case "Fn::Not":
                return not self._evaluate_condition(argument[0])
            case "Fn::And":
                return all(self._evaluate_condition(part) for part in argument)
            case "Fn::Or":
                return any(self._evaluate_condition(part) for part in argument)
            case _:
                raise TemplateError(f"{name} is not a condition function")

    # Resources --------------------------------------------------------------------------------------------------

    @property
    def resources(self) -> dict[str, Any]:
        resources: dict[str, Any] = self.template["Resources"]
        return resources

    def resource(self, logical_id: str, resource_type: str | None = None) -> dict[str, Any]:
        try:
            resource: dict[str, Any] = self.resources[logical_id]
        except KeyError:
            raise TemplateError(f"the template has no resource {logical_id}") from None
        if resource_type is not None and resource.get("Type") != resource_type:
            raise TemplateError(f"{logical_id} is a {resource.get('Type')}, not a {resource_type}")
        return resource

    def properties(self, logical_id: str) -> dict[str, Any]:
        properties: dict[str, Any] = self.resource(logical_id).get("Properties") or {}
        return properties

    def resources_of_type(self, resource_type: str) -> list[str]:
        return [logical_id for logical_id, spec in self.resources.items() if spec.get("Type") == resource_type]

    def _single(self, resource_type: str) -> str:
        found = self.resources_of_type(resource_type)
        if len(found) != 1:
            raise TemplateError(f"expected exactly one {resource_type}, found {len(found)}: {found}")
        return found[0]

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
            timeout_seconds=_as_int(self.resolve(properties.get("Timeout", 3)), f"{function_id} Timeout"),
            memory_size_mb=_as_int(self.resolve(properties.get("MemorySize", 128)), f"{function_id} MemorySize"),
            reserved_concurrency=None if reserved is None else _as_int(reserved, f"{function_id} reserved concurrency"),
            tenant_isolation_mode=None if mode is None else str(mode),
            ephemeral_storage_mb=_as_int(self.resolve(storage.get("Size", 512)), f"{function_id} EphemeralStorage"),
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

    def function_own_environment(self, function_id: str, references: References | None = None) -> dict[str, str]:
        """The environment variables the function declares itself, resolved; without those of Globals.Function."""
        own = self.resource(function_id, "AWS::Serverless::Function").get("Properties") or {}
        variables = (own.get("Environment") or {}).get("Variables") or {}
        resolved = self.resolve(variables, references) or {}
        return {name: _parameter_string(value) for name, value in resolved.items()}

    def function_environment(self, function_id: str, references: References | None = None) -> dict[str, str]:
        """The function's environment variables (Globals merged), resolved against `references`."""
        variables = (self.function_properties(function_id).get("Environment") or {}).get("Variables") or {}
        resolved = self.resolve(variables, references) or {}
        return {name: _parameter_string(value) for name, value in resolved.items()}

    def function_environment_variable(
        self, function_id: str, name: str, references: References | None = None
    ) -> str | None:
        """One environment variable of the function (Globals merged), or None when it is not set."""
        variables = (self.function_properties(function_id).get("Environment") or {}).get("Variables") or {}
        if name not in variables:
            return None
        return _parameter_string(self.resolve(variables[name], references))

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
                        batch_size=_as_int(self.resolve(properties.get("BatchSize", 10)), f"{what} BatchSize"),
                        maximum_concurrency=None if maximum is None else _as_int(maximum, f"{what} MaximumConcurrency"),
                        function_response_types=tuple(self.resolve(properties.get("FunctionResponseTypes", []))),
                        maximum_batching_window_seconds=_as_int(
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

    @property
    def jobs_queue_id(self) -> str:
        """The queue the worker consumes."""
        return self.worker.event_source.queue_id

    @property
    def dead_letter_queue_id(self) -> str:
        """The jobs queue's redrive target."""
        redrive = self.properties(self.jobs_queue_id).get("RedrivePolicy") or {}
        queue_id = get_att_resource(redrive.get("deadLetterTargetArn"))
        if queue_id is None:
            raise TemplateError(f"{self.jobs_queue_id} has no RedrivePolicy with a !GetAtt deadLetterTargetArn")
        return queue_id

    @property
    def table_id(self) -> str:
        return self._single("AWS::DynamoDB::Table")

    # Queues -----------------------------------------------------------------------------------------------------

    def queue_name(self, queue_id: str) -> str:
        """QueueName resolved for this stack; without one, a stable `<stack>-<id>` name (CloudFormation would add a
        random suffix)."""
        properties = self.resource(queue_id, "AWS::SQS::Queue").get("Properties") or {}
        if "QueueName" in properties:
            return str(self.resolve(properties["QueueName"]))
        fifo = _as_bool(self.resolve(properties.get("FifoQueue", False)), f"{queue_id} FifoQueue")
        suffix = ".fifo" if fifo else ""
        return f"{self.stack_name}-{queue_id}"[: 80 - len(suffix)] + suffix

    def queue_attributes(self, queue_id: str, references: References | None = None) -> dict[str, str]:
        """The queue's properties as CreateQueue `Attributes` (string values, policies as JSON). A RedrivePolicy needs
        the dead-letter queue's Arn in `references`."""
        properties = self.resource(queue_id, "AWS::SQS::Queue").get("Properties") or {}
        unknown = sorted(set(properties) - _QUEUE_ATTRIBUTE_PROPERTIES - _QUEUE_OTHER_PROPERTIES)
        if unknown:
            raise TemplateError(f"{queue_id}: no CreateQueue attribute for {', '.join(unknown)}")
        attributes: dict[str, str] = {}
        for name in sorted(set(properties) & _QUEUE_ATTRIBUTE_PROPERTIES):
            value = self.resolve(properties[name], references)
            if value is None:
                continue
            if name in _QUEUE_JSON_ATTRIBUTES:
                if name == "RedrivePolicy" and "maxReceiveCount" in value:
                    value = {**value, "maxReceiveCount": _as_int(value["maxReceiveCount"], "maxReceiveCount")}
                attributes[name] = json.dumps(value, separators=(",", ":"))
            else:
                attributes[name] = _attribute_string(value)
        return attributes

    def queue_tags(self, queue_id: str) -> dict[str, str]:
        tags = self.resolve(self.properties(queue_id).get("Tags") or [])
        return {str(tag["Key"]): str(tag["Value"]) for tag in tags}

    def redrive_max_receive_count(self) -> int:
        redrive = self.properties(self.jobs_queue_id).get("RedrivePolicy") or {}
        return _as_int(self.resolve(redrive.get("maxReceiveCount")), f"{self.jobs_queue_id} maxReceiveCount")

    # Table ------------------------------------------------------------------------------------------------------

    def table_name(self, table_id: str | None = None) -> str:
        """TableName resolved for this stack; without one, `<stack>-<id>` (CloudFormation would add a suffix)."""
        table_id = table_id or self.table_id
        properties = self.resource(table_id, "AWS::DynamoDB::Table").get("Properties") or {}
        if "TableName" in properties:
            return str(self.resolve(properties["TableName"]))
        return f"{self.stack_name}-{table_id}"

    def table_create_kwargs(self, table_id: str | None = None) -> dict[str, Any]:
        """CreateTable keyword arguments from the table's properties (TTL and PITR are separate calls)."""
        table_id = table_id or self.table_id
        properties = self.resolve(self.resource(table_id, "AWS::DynamoDB::Table").get("Properties") or {})
        unknown = sorted(set(properties) - _TABLE_CREATE_PROPERTIES - _TABLE_OTHER_PROPERTIES)
        if unknown:
            raise TemplateError(f"{table_id}: no CreateTable argument for {', '.join(unknown)}")
        kwargs: dict[str, Any] = {"TableName": self.table_name(table_id)}
        kwargs.update({name: properties[name] for name in sorted(set(properties) & _TABLE_CREATE_PROPERTIES)})
        if "GlobalSecondaryIndexes" in properties:
            # Contributor Insights is per index in CloudFormation, a separate API call in DynamoDB.
            kwargs["GlobalSecondaryIndexes"] = [
                {key: value for key, value in index.items() if key != "ContributorInsightsSpecification"}
                for index in properties["GlobalSecondaryIndexes"]
            ]
        if "StreamSpecification" in properties:
            kwargs["StreamSpecification"] = {"StreamEnabled": True, **properties["StreamSpecification"]}
        if "SSESpecification" in properties:
            sse = properties["SSESpecification"]
            kwargs["SSESpecification"] = {
                "Enabled": _as_bool(sse.get("SSEEnabled", False), f"{table_id} SSEEnabled"),
                **({"SSEType": sse["SSEType"]} if "SSEType" in sse else {}),
                **({"KMSMasterKeyId": sse["KMSMasterKeyId"]} if "KMSMasterKeyId" in sse else {}),
            }
        return kwargs

    def table_time_to_live(self, table_id: str | None = None) -> dict[str, Any] | None:
        """UpdateTimeToLive's TimeToLiveSpecification, or None when the table has no TTL."""
        spec = self.resolve(self.properties(table_id or self.table_id).get("TimeToLiveSpecification"))
        if spec is None:
            return None
        return {"AttributeName": str(spec["AttributeName"]), "Enabled": _as_bool(spec["Enabled"], "TTL Enabled")}

    def table_point_in_time_recovery(self, table_id: str | None = None) -> dict[str, Any] | None:
        """UpdateContinuousBackups' PointInTimeRecoverySpecification, or None when the template sets none."""
        spec = self.resolve(self.properties(table_id or self.table_id).get("PointInTimeRecoverySpecification"))
        if spec is None:
            return None
        enabled = _as_bool(spec.get("PointInTimeRecoveryEnabled", False), "PointInTimeRecoveryEnabled")
        result: dict[str, Any] = {"PointInTimeRecoveryEnabled": enabled}
        if "RecoveryPeriodInDays" in spec:
            result["RecoveryPeriodInDays"] = _as_int(spec["RecoveryPeriodInDays"], "RecoveryPeriodInDays")
        return result

    # Bucket -----------------------------------------------------------------------------------------------------

    @property
    def payload_bucket_id(self) -> str | None:
        """The template's S3 bucket (large payloads), if it has one."""
        buckets = self.resources_of_type("AWS::S3::Bucket")
        if len(buckets) > 1:
            raise TemplateError(f"several AWS::S3::Bucket resources {buckets}: expected at most one")
        return buckets[0] if buckets else None

    def bucket_name(self, bucket_id: str) -> str:
        """BucketName resolved for this stack; without one, a stable lower-case `<stack>-<id>` name (CloudFormation
        would add a random suffix), within S3's 63 characters."""
        properties = self.resource(bucket_id, "AWS::S3::Bucket").get("Properties") or {}
        if "BucketName" in properties:
            return str(self.resolve(properties["BucketName"]))
        name = re.sub(r"[^a-z0-9.-]+", "-", f"{self.stack_name}-{bucket_id}".lower()).strip("-.")
        return name[:63].rstrip("-.")

    def bucket_configuration(self, bucket_id: str) -> dict[str, Any]:
        """The bucket's properties as the S3 API calls' arguments: `ServerSideEncryptionConfiguration`,
        `PublicAccessBlockConfiguration`, `OwnershipControls` and `LifecycleConfiguration` (CloudFormation's
        lifecycle shape translated: ExpirationInDays -> Expiration.Days, Prefix -> Filter.Prefix)."""
        properties = self.resolve(self.resource(bucket_id, "AWS::S3::Bucket").get("Properties") or {})
        unknown = sorted(set(properties) - _BUCKET_PROPERTIES)
        if unknown:
            raise TemplateError(f"{bucket_id}: provisioning does not know {', '.join(unknown)}")
        configuration: dict[str, Any] = {}
        if "BucketEncryption" in properties:
            # CloudFormation's ServerSideEncryptionByDefault is the API's ApplyServerSideEncryptionByDefault.
            rules = [
                {
                    ("ApplyServerSideEncryptionByDefault" if k == "ServerSideEncryptionByDefault" else k): v
                    for k, v in rule.items()
                }
                for rule in properties["BucketEncryption"]["ServerSideEncryptionConfiguration"]
            ]
            configuration["ServerSideEncryptionConfiguration"] = {"Rules": rules}
        if "PublicAccessBlockConfiguration" in properties:
            configuration["PublicAccessBlockConfiguration"] = {
                name: _as_bool(value, name) for name, value in properties["PublicAccessBlockConfiguration"].items()
            }
        if "OwnershipControls" in properties:
            configuration["OwnershipControls"] = properties["OwnershipControls"]
        if "LifecycleConfiguration" in properties:
            configuration["LifecycleConfiguration"] = {
                "Rules": [_lifecycle_rule(rule) for rule in properties["LifecycleConfiguration"]["Rules"]]
            }
        return configuration

    def bucket_policy(self, bucket_id: str, references: References) -> dict[str, Any] | None:
        """The PolicyDocument of the AWS::S3::BucketPolicy on `bucket_id`, resolved, for a local emulator: without the
        statements that deny requests without TLS (an emulator on loopback speaks plain HTTP, so they would deny
        everything; tests assert them on the template). None when nothing is left."""
        for policy_id in self.resources_of_type("AWS::S3::BucketPolicy"):
            properties = self.properties(policy_id)
            if get_att_resource(properties.get("Bucket")) == bucket_id:
                document: dict[str, Any] = self.resolve(properties["PolicyDocument"], references)
                statements = [s for s in document.get("Statement", []) if not _denies_plain_http(s)]
                return {**document, "Statement": statements} if statements else None
        return None


_BUCKET_PROPERTIES: Final = frozenset(
    {"BucketName", "BucketEncryption", "PublicAccessBlockConfiguration", "OwnershipControls", "LifecycleConfiguration"}
)


def _denies_plain_http(statement: Mapping[str, Any]) -> bool:
    secure = (statement.get("Condition") or {}).get("Bool", {}).get("aws:SecureTransport")
    return statement.get("Effect") == "Deny" and str(secure).lower() == "false"


def _lifecycle_rule(rule: Mapping[str, Any]) -> dict[str, Any]:
    translated: dict[str, Any] = {
        "ID": rule["Id"],
        "Status": rule["Status"],
        "Filter": {"Prefix": rule.get("Prefix", "")},
    }
    if "ExpirationInDays" in rule:
        translated["Expiration"] = {"Days": _as_int(rule["ExpirationInDays"], "ExpirationInDays")}
    if "AbortIncompleteMultipartUpload" in rule:
        days = _as_int(rule["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"], "DaysAfterInitiation")
        translated["AbortIncompleteMultipartUpload"] = {"DaysAfterInitiation": days}
    return translated


# --- Provisioning --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AwsClients:
    """The clients `provision` uses. `sts` is optional: without it the template's account id is assumed."""

    sqs: SQSClient
    dynamodb: DynamoDBClient
    sts: STSClient | None = None
    s3: S3Client | None = None  # needed when the template has a bucket

    @classmethod
    def from_session(cls, session: boto3.session.Session, *, endpoint_url: str | None = None) -> AwsClients:
        """Clients of `session`; boto3 also honours AWS_ENDPOINT_URL, so moto's server needs no argument."""
        return cls(
            sqs=session.client("sqs", endpoint_url=endpoint_url),
            dynamodb=session.client("dynamodb", endpoint_url=endpoint_url),
            sts=session.client("sts", endpoint_url=endpoint_url),
            s3=session.client("s3", endpoint_url=endpoint_url),
        )


@dataclass(frozen=True)
class ProvisionedResources:
    """What `provision` created, plus `references` for resolving Ref/GetAtt of these resources
    (e.g. `TemplateModel.function_environment(function_id, resources.references)`)."""

    queue_url: str
    queue_arn: str
    queue_name: str
    dlq_url: str
    dlq_arn: str
    dlq_name: str
    table_name: str
    table_arn: str
    region: str
    account_id: str
    references: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    payload_bucket: str | None = None


def _queue_arn(sqs: SQSClient, queue_url: str) -> str:
    return sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]


def _create_queue(sqs: SQSClient, model: TemplateModel, queue_id: str, references: References) -> tuple[str, str]:
    name = model.queue_name(queue_id)
    tags = model.queue_tags(queue_id)
    attributes = model.queue_attributes(queue_id, references)
    if tags:
        url = sqs.create_queue(QueueName=name, Attributes=attributes, tags=tags)["QueueUrl"]  # type: ignore[arg-type]
    else:
        url = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]  # type: ignore[arg-type]
    return url, _queue_arn(sqs, url)


def _create_table(dynamodb: DynamoDBClient, model: TemplateModel) -> tuple[str, str]:
    kwargs = model.table_create_kwargs()
    name = str(kwargs["TableName"])
    # Provisioned before (a long-lived moto server): keep it.
    with contextlib.suppress(dynamodb.exceptions.ResourceInUseException):
        dynamodb.create_table(**kwargs)
    dynamodb.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 60})
    arn = dynamodb.describe_table(TableName=name)["Table"]["TableArn"]

    ttl = model.table_time_to_live()
    if ttl is not None:
        current = dynamodb.describe_time_to_live(TableName=name).get("TimeToLiveDescription", {})
        # DynamoDB rejects enabling TTL that is already enabled, so a second provision must not ask again.
        already = (
            current.get("TimeToLiveStatus") in ("ENABLED", "ENABLING")
            and current.get("AttributeName") == ttl["AttributeName"]
        )
        if already != ttl["Enabled"]:
            dynamodb.update_time_to_live(TableName=name, TimeToLiveSpecification=ttl)  # type: ignore[arg-type]

    pitr = model.table_point_in_time_recovery()
    if pitr is not None:
        dynamodb.update_continuous_backups(TableName=name, PointInTimeRecoverySpecification=pitr)  # type: ignore[arg-type]
    return name, arn


def _create_bucket(s3: S3Client, model: TemplateModel, bucket_id: str, references: References) -> str:
    name = model.bucket_name(bucket_id)
    region = s3.meta.region_name
    # Provisioned before (a long-lived moto server): keep it.
    with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
        if region in (None, "us-east-1"):
            s3.create_bucket(Bucket=name)
        else:
            s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": region})  # type: ignore[typeddict-item]
    configuration = model.bucket_configuration(bucket_id)
    if "ServerSideEncryptionConfiguration" in configuration:
        s3.put_bucket_encryption(
            Bucket=name, ServerSideEncryptionConfiguration=configuration["ServerSideEncryptionConfiguration"]
        )
    if "PublicAccessBlockConfiguration" in configuration:
        s3.put_public_access_block(
            Bucket=name, PublicAccessBlockConfiguration=configuration["PublicAccessBlockConfiguration"]
        )
    if "OwnershipControls" in configuration:
        s3.put_bucket_ownership_controls(Bucket=name, OwnershipControls=configuration["OwnershipControls"])
    if "LifecycleConfiguration" in configuration:
        s3.put_bucket_lifecycle_configuration(
            Bucket=name, LifecycleConfiguration=configuration["LifecycleConfiguration"]
        )
    policy = model.bucket_policy(bucket_id, references)
    if policy is not None:
        s3.put_bucket_policy(Bucket=name, Policy=json.dumps(policy))
    return name


def provision(
    aws: boto3.session.Session | AwsClients,
    template: TemplateModel | Mapping[str, Any] | None = None,
    stack_name: str | None = None,
    *,
    parameter_overrides: Mapping[str, object] | None = None,
) -> ProvisionedResources:
    """Create the template's dead-letter queue, jobs queue (redrive to it), table and payload bucket (encryption,
    public access block, ownership, lifecycle and bucket policy), from the template's own properties: every queue
    attribute, table and bucket setting is passed, nothing is kept here by hand.

    `template` is a loaded template (default: the repository's template.yaml) or a `TemplateModel`; a model brings its
    own stack name and parameters, so `stack_name`/`parameter_overrides` must then be left out. The account and region
    come from the clients (STS when there is an STS client), so ARNs built with `${AWS::AccountId}` match.

    Provisioning twice with the same stack name reuses what exists. Against moto 5.2.5 (in-process and server) every
    attribute the template sets is accepted, with these differences from SQS that tests must not rely on:
    RedriveAllowPolicy is accepted but not stored (GetQueueAttributes rejects its name); deduplication is per queue
    whatever DeduplicationScope says, and only against messages still in the queue (a deleted message's
    deduplication id can be sent again at once); FifoThroughputLimit is stored, not enforced. Nothing is dropped.
    """
    clients = aws if isinstance(aws, AwsClients) else AwsClients.from_session(aws)
    if isinstance(template, TemplateModel):
        if stack_name is not None or parameter_overrides is not None:
            raise TemplateError("a TemplateModel brings its own stack name and parameters: pass neither")
        model = template
    else:
        model = TemplateModel(
            load_template() if template is None else template,
            stack_name=stack_name or DEFAULT_LOCAL_STACK_NAME,
            parameter_overrides=parameter_overrides,
        )

    region = clients.sqs.meta.region_name or model.region
    account_id = clients.sts.get_caller_identity()["Account"] if clients.sts is not None else model.account_id
    if (region, account_id) != (model.region, model.account_id):
        model = model.for_account(account_id=account_id, region=region)

    references: dict[str, dict[str, str]] = {}
    dlq_id, queue_id, table_id = model.dead_letter_queue_id, model.jobs_queue_id, model.table_id

    dlq_url, dlq_arn = _create_queue(clients.sqs, model, dlq_id, references)
    references[dlq_id] = {"Ref": dlq_url, "Arn": dlq_arn, "QueueName": model.queue_name(dlq_id), "QueueUrl": dlq_url}

    queue_url, queue_arn = _create_queue(clients.sqs, model, queue_id, references)
    references[queue_id] = {
        "Ref": queue_url,
        "Arn": queue_arn,
        "QueueName": model.queue_name(queue_id),
        "QueueUrl": queue_url,
    }

    table_name, table_arn = _create_table(clients.dynamodb, model)
    references[table_id] = {"Ref": table_name, "Arn": table_arn}

    bucket_id, bucket_name = model.payload_bucket_id, None
    if bucket_id is not None:
        if clients.s3 is None:
            raise TemplateError(f"the template has the bucket {bucket_id}: pass AwsClients with an S3 client")
        bucket_name = model.bucket_name(bucket_id)
        references[bucket_id] = {"Ref": bucket_name, "Arn": f"arn:{model.partition}:s3:::{bucket_name}"}
        _create_bucket(clients.s3, model, bucket_id, references)

    # Functions are not created here, but a function's environment may name another (`!Ref TestSandboxFunction`):
    # the names are the ones the local runtime serves them under.
    for function_id in model.resources_of_type("AWS::Serverless::Function"):
        references[function_id] = {"Ref": model.function_name(function_id), "Arn": model.function_arn(function_id)}

    return ProvisionedResources(
        queue_url=queue_url,
        queue_arn=queue_arn,
        queue_name=model.queue_name(queue_id),
        dlq_url=dlq_url,
        dlq_arn=dlq_arn,
        dlq_name=model.queue_name(dlq_id),
        table_name=table_name,
        table_arn=table_arn,
        region=region,
        account_id=account_id,
        references=references,
        payload_bucket=bucket_name,
    )


__all__ = [
    "DEFAULT_TEMPLATE_PATH",
    "AwsClients",
    "CloudFormationLoader",
    "FunctionSettings",
    "ProvisionedResources",
    "SqsEventSource",
    "TemplateError",
    "TemplateModel",
    "WorkerSettings",
    "get_att_resource",
    "get_att_target",
    "load_template",
    "merge_globals",
    "provision",
]
