"""Reading template.yaml: cfn-lint's decoder parses it (short-form tags become their long forms), and the result is made
plain Python data so nothing downstream sees the decoder's node types."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, TypeAlias

import yaml

DEFAULT_TEMPLATE_PATH: Final = Path(__file__).resolve().parent.parent.parent / "template.yaml"
DEFAULT_LOCAL_STACK_NAME: Final = "agent-jobs-local"
# moto's default account; provision() asks STS for the real one when it has an STS client.
DEFAULT_ACCOUNT_ID: Final = "123456789012"
DEFAULT_REGION: Final = "us-east-1"

Template: TypeAlias = dict[str, Any]
References: TypeAlias = Mapping[str, Mapping[str, str]]
"""Values of provisioned resources by logical id: {"JobsQueue": {"Ref": url, "Arn": arn, "QueueName": name}}."""

# The short-form tags CloudFormation defines. cfn-lint's decoder turns any `!Name` into `Fn::Name`, so a misspelt tag
# is caught here rather than surfacing later as a function nobody can resolve.
SHORT_FORM_TAGS: Final = frozenset(
    {
        "Ref",
        "Condition",
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
    }
)


class TemplateError(ValueError):
    """The template cannot be read, resolved or provisioned as asked; the message says which part and why."""


def load_template(path: Path = DEFAULT_TEMPLATE_PATH) -> Template:
    """template.yaml as a dict, with every short-form tag (`!Ref X`) in its long form (`{"Ref": "X"}`)."""
    # cfn-lint imports its whole rule set on first use (about a second): only pay for it when a template is read.
    from cfnlint.decode import decode_str  # type: ignore[import-untyped]

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise TemplateError(f"cannot read the template {path}: {error}") from None
    _reject_unknown_tags(text, path)
    decoded, problems = decode_str(text)
    if problems:
        raise TemplateError(f"{path} cannot be parsed: " + "; ".join(str(problem.message) for problem in problems))
    template = _plain(decoded)
    if not isinstance(template, dict) or not isinstance(template.get("Resources"), dict):
        raise TemplateError(f"{path} is not a CloudFormation template: it has no Resources mapping")
    return template


def _reject_unknown_tags(text: str, path: Path) -> None:
    # libyaml's scanner when PyYAML has it, as cfn-lint's decoder uses: several times faster on this template.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        tokens = list(yaml.scan(text, Loader=loader))
    except yaml.YAMLError:
        return  # the decoder reports the syntax error with its position
    for token in tokens:
        if isinstance(token, yaml.TagToken):
            handle, suffix = token.value
            if handle == "!" and suffix not in SHORT_FORM_TAGS:
                line = token.start_mark.line + 1
                raise TemplateError(f"{path} line {line}: unknown CloudFormation tag !{suffix}")


def _plain(value: Any) -> Any:
    """The decoder's nodes as builtin dicts, lists and strings. A YAML date stays the text CloudFormation reads
    (`AWSTemplateFormatVersion: 2010-09-09` is a string there, not a date)."""
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, str):
        return str(value)
    if isinstance(value, datetime.date):  # datetime.datetime is a date too
        return value.isoformat()
    return value
