"""Plain values out of a template: CloudFormation's coercions of numbers and booleans, GetAtt targets, and SAM's
Globals merge."""

from __future__ import annotations

from typing import Any, Final

from agent_jobs_local.template.loading import TemplateError


class NoValue:
    """AWS::NoValue: the property or list entry is removed."""


NO_VALUE: Final = NoValue()


def parameter_string(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(parameter_string(item) for item in value)
    return str(value)


def as_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TemplateError(f"{what} must be a number, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise TemplateError(f"{what} must be a number, got {value!r}") from None
    if not number.is_integer():
        raise TemplateError(f"{what} must be a whole number, got {value!r}")
    return int(number)


def as_bool(value: object, what: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise TemplateError(f"{what} must be true or false, got {value!r}")


def attribute_string(value: object) -> str:
    """A queue attribute value as SQS's API takes it: booleans lower-case, numbers as digits."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def get_att_parts(argument: object) -> tuple[str, object]:
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
            return get_att_parts(value["Fn::GetAtt"])[0]
        if "Ref" in value and isinstance(value["Ref"], str):
            return value["Ref"]
    return None


def get_att_target(value: object) -> tuple[str, str] | None:
    """(resource, attribute) of a `Fn::GetAtt`, without resolving it; None for anything else."""
    if isinstance(value, dict) and set(value) == {"Fn::GetAtt"}:
        resource, attribute = get_att_parts(value["Fn::GetAtt"])
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
