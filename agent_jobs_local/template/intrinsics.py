"""The intrinsic functions: template parameters (defaults, or overrides validated as CloudFormation would), pseudo
parameters, conditions, and Ref/GetAtt of provisioned resources, for one stack name, region and account."""

from __future__ import annotations

import base64
import copy
import re
from collections.abc import Mapping
from typing import Any, Final

from agent_jobs_local.template.loading import (
    DEFAULT_ACCOUNT_ID,
    DEFAULT_LOCAL_STACK_NAME,
    DEFAULT_REGION,
    References,
    Template,
    TemplateError,
)
from agent_jobs_local.template.values import NO_VALUE, as_int, get_att_parts, parameter_string

_SUB_VARIABLE: Final = re.compile(r"\$\{([^}]*)\}")
_LIST_PARAMETER_TYPES: Final = ("CommaDelimitedList", "List<")


class IntrinsicResolver:
    """A template with its parameters resolved, and the resolver of its intrinsic functions and resources."""

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
            value = parameter_string(raw)
            self._validate_parameter(name, spec, value)
            values[name] = value
        return values

    @staticmethod
    def _validate_parameter(name: str, spec: Mapping[str, Any], value: str) -> None:
        allowed = spec.get("AllowedValues")
        if allowed is not None and value not in [parameter_string(v) for v in allowed]:
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
            "AWS::NoValue": NO_VALUE,
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
        return None if resolved is NO_VALUE else resolved

    def _resolve(self, value: Any, refs: References) -> Any:
        if isinstance(value, list):
            items = [self._resolve(item, refs) for item in value]
            return [item for item in items if item is not NO_VALUE]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            ((key, argument),) = value.items()
            if key == "Ref":
                return self._ref(argument, refs)
            if key.startswith("Fn::"):
                return self._function(key, argument, refs)
        resolved = {key: self._resolve(item, refs) for key, item in value.items()}
        return {key: item for key, item in resolved.items() if item is not NO_VALUE}

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

    def generated_resources(self) -> dict[str, dict[str, str]]:
        """Resources the SAM transform generates (not in the template's Resources) with their local values, by
        logical id; `references` may override them."""
        return {}

    def _resource_value(self, resource: str, attribute: str, refs: References) -> str:
        values: Mapping[str, str] | None = refs.get(resource)
        if resource not in self.template["Resources"]:
            generated = self.generated_resources().get(resource)
            if generated is None:
                raise TemplateError(f"{resource} is neither a parameter nor a resource of the template")
            values = {**generated, **(values or {})}
        try:
            return (values or {})[attribute]
        except KeyError:
            what = f"Ref {resource}" if attribute == "Ref" else f"{resource}.{attribute}"
            raise TemplateError(f"{what} is not known here: provision the resource and pass its references") from None

    def _function(self, name: str, argument: Any, refs: References) -> Any:
        match name:
            case "Fn::GetAtt":
                resource, attribute = get_att_parts(argument)
                return self._resource_value(resource, str(self._resolve(attribute, refs)), refs)
            case "Fn::Sub":
                return self._sub(argument, refs)
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
            case _:
                return self._value_function(name, argument, refs)

    def _value_function(self, name: str, argument: Any, refs: References) -> Any:
        """The functions that only reshape resolved values: strings and lists."""
        match name:
            case "Fn::Join":
                delimiter, items = argument
                return str(delimiter).join(parameter_string(item) for item in self._resolve(items, refs))
            case "Fn::Select":
                index, items = argument
                return self._resolve(items, refs)[as_int(self._resolve(index, refs), "Fn::Select index")]
            case "Fn::Split":
                delimiter, text = argument
                return str(self._resolve(text, refs)).split(delimiter)
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
                return parameter_string(variables[expression])
            if "." in expression and not expression.startswith("AWS::"):
                resource, _, attribute = expression.partition(".")
                return self._resource_value(resource, attribute, refs)
            return parameter_string(self._ref(expression, refs))

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
                left, right = (parameter_string(self._resolve(side, {})) for side in argument)
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
