"""Registering a workspace: `workspaces register WORKSPACE --remote-url ... --branch ...`, the body of
`PUT /workspaces/{workspaceId}`.

The command's options are made from the registration model (`agent_jobs.registration.WorkspaceRegistration`), one
per field, so a field added to the model is an option here without a change: text, whole numbers and switches as
such, `testCommands` as repeated `--test-command NAME=COMMAND`, anything else as JSON. `FIELD_HELP` words the known
ones. The API stays the judge of the body: the command sends what it was given and shows the API's refusal in its
own words, so it also fits an API of another version than this checkout.
"""

from __future__ import annotations

import inspect
import json
import shlex
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final, Literal, Union, get_args, get_origin

import typer
from pydantic import BaseModel

from agent_jobs.registration import WorkspaceRegistration
from agent_jobs_cli.api import ApiError, path_id
from agent_jobs_cli.context import CliError, explain, handle_errors, out, print_json, state_of
from agent_jobs_cli.render import workspace_panel

TEST_COMMANDS_FIELD: Final = "test_commands"
FIELD_HELP: Final[Mapping[str, str]] = {
    "remote_url": "The git remote: an absolute path (a relative one is made absolute), a file:// or an https:// URL."
    " Under `make local`, a folder in the remotes root's folder of your tenant (<remotes>/<tenantId>/repo.git).",
    "branch": "The branch the workspace's commits go to (not the base branch).",
    "base_branch": "The branch the workspace starts from and its pull requests target (the API's default: main).",
    TEST_COMMANDS_FIELD: "A test suite run_tests names: NAME=COMMAND, the command split into words as a shell would"
    " and run without a shell (--test-command unit='python -m pytest -q'). Repeat it for more suites.",
    "token_parameter": "Where the token for HTTPS pushes and the GitHub API lives: ssm:/agent-jobs/<tenantId>/NAME or"
    " secretsmanager:agent-jobs/<tenantId>/NAME (never the token itself).",
    "github_repository": "owner/repo: where open_pr opens the pull request.",
    "github_api_url": "The GitHub API open_pr calls (the API's default: https://api.github.com); `make local` prints"
    " the one of its GitHub stand-in.",
}

Kind = Literal["text", "number", "switch", "test_commands", "json"]


@dataclass(frozen=True)
class RegistrationOption:
    """One field of the registration as an option of the command."""

    name: str  # the model's field: remote_url
    alias: str  # the body's: remoteUrl
    required: bool
    kind: Kind

    @property
    def flag(self) -> str:
        return "--test-command" if self.kind == "test_commands" else "--" + self.name.replace("_", "-")

    @property
    def parameter(self) -> str:
        """The command function's parameter (prefixed: a field may be named like one of the command's own)."""
        return f"field_{self.name}"

    def annotation(self) -> Any:
        described = FIELD_HELP.get(self.name) or f"The registration's {self.alias}" + (
            " (JSON)." if self.kind == "json" else "."
        )
        metavar = {"test_commands": "NAME=COMMAND", "json": "JSON"}.get(self.kind)
        option = typer.Option(self.flag, metavar=metavar, help=described + (" Required." if self.required else ""))
        value_type: Any = {"number": int | None, "switch": bool | None, "test_commands": list[str] | None}.get(
            self.kind, str | None
        )
        return Annotated[value_type, option]

    def body_value(self, given: Any) -> Any:
        """The value of the body's field for what the command was given."""
        if self.kind == "test_commands":
            return test_commands(given)
        if self.kind == "json":
            try:
                return json.loads(given)
            except ValueError as error:
                raise CliError(f"{self.flag} takes JSON ({error})") from None
        if self.name == "remote_url" and "://" not in given and not given.startswith("/"):
            # A remote folder on this machine, named from where the command runs.
            return str(Path(given).expanduser().resolve())
        return given


def registration_options(model: type[BaseModel] = WorkspaceRegistration) -> list[RegistrationOption]:
    """An option per field of the registration `model`, in the model's order."""
    options = []
    for name, field in model.model_fields.items():
        kind: Kind = "test_commands" if name == TEST_COMMANDS_FIELD else _kind_of(field.annotation)
        options.append(RegistrationOption(name, field.alias or name, field.is_required(), kind))
    return options


def _kind_of(annotation: Any) -> Kind:
    origin = get_origin(annotation)
    if origin is Annotated:
        return _kind_of(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        kinds = {_kind_of(arg) for arg in get_args(annotation) if arg is not type(None)}
        return kinds.pop() if len(kinds) == 1 else "json"
    if origin is Literal and all(isinstance(arg, str) for arg in get_args(annotation)):
        return "text"
    # bool before int: a bool is an int to Python.
    return {str: "text", bool: "switch", int: "number"}.get(annotation, "json")  # type: ignore[return-value]


def test_commands(given: list[str]) -> dict[str, list[str]]:
    """`NAME=COMMAND` values as the registration's testCommands (name -> argv)."""
    commands: dict[str, list[str]] = {}
    for value in given:
        name, separator, command = value.partition("=")
        if not separator or not name.strip():
            raise CliError(
                f"--test-command takes NAME=COMMAND, e.g. --test-command unit='python -m pytest -q'; got {value!r}"
            )
        try:
            argv = shlex.split(command)
        except ValueError as error:
            raise CliError(f"--test-command {name}: cannot split {command!r} into words ({error})") from None
        if not argv:
            raise CliError(f"--test-command {name} has no command: write {name}=COMMAND")
        if name.strip() in commands:
            raise CliError(f"--test-command {name.strip()} is given twice: name each suite once")
        commands[name.strip()] = argv
    return commands


def registration_body(options: list[RegistrationOption], given: Mapping[str, Any], file: Path | None) -> dict[str, Any]:
    """The body to PUT: the JSON of `file` (when given), each option given over it; a required field missing from
    both is named before anything is sent."""
    body: dict[str, Any] = {}
    if file is not None:
        try:
            loaded = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise CliError(f"cannot read the registration file {file}: {error}") from None
        if not isinstance(loaded, dict):
            raise CliError(f"{file} holds no JSON object; write the body of PUT /workspaces/{{workspaceId}}")
        body.update(loaded)
    for option in options:
        value = given.get(option.parameter)
        if value is not None and value != []:
            body[option.alias] = option.body_value(value)
    missing = [f"{option.flag} ({option.alias})" for option in options if option.required and option.alias not in body]
    if missing:
        raise CliError(f"a registration needs {' and '.join(missing)}")
    return body


def _register(
    ctx: typer.Context,
    workspace_id: str,
    file: Path | None,
    as_json: bool,
    options: list[RegistrationOption],
    given: Mapping[str, Any],
) -> None:
    body = registration_body(options, given, file)
    path = f"/workspaces/{path_id(workspace_id)}"
    try:
        status, answer = state_of(ctx).api().request("PUT", path, body=body)
    except ApiError as error:
        raise CliError(explain(error, "PUT", path)) from None
    if as_json:
        print_json(answer)
        return
    verb = "registered" if status == 201 else "registration updated"
    out().print(workspace_panel(answer, title=f"workspace {workspace_id} {verb}"))
    out().print(
        f"Submit a job: agent-jobs enqueue apply_patch {workspace_id} --patch-file change.diff -m MESSAGE --wait"
    )


def register_command() -> Callable[..., None]:
    """`workspaces register`: a function whose signature typer reads, with an option per registration field."""
    options = registration_options()

    def register(ctx: typer.Context, workspace_id: str, file: Path | None, as_json: bool, **given: Any) -> None:
        _register(ctx, workspace_id, file, as_json, options, given)

    parameter = inspect.Parameter
    fixed = [
        parameter("ctx", parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context),
        parameter(
            "workspace_id",
            parameter.POSITIONAL_OR_KEYWORD,
            annotation=Annotated[str, typer.Argument(metavar="WORKSPACE", help="The workspace id.")],
        ),
    ]
    fields = [
        parameter(option.parameter, parameter.KEYWORD_ONLY, annotation=option.annotation(), default=None)
        for option in options
    ]
    trailing = [
        parameter(
            "file",
            parameter.KEYWORD_ONLY,
            annotation=Annotated[
                Path | None,
                typer.Option(
                    "--file",
                    help="A registration as JSON (the body of PUT /workspaces/{id}); options"
                    " given override its fields.",
                ),
            ],
            default=None,
        ),
        parameter(
            "as_json",
            parameter.KEYWORD_ONLY,
            annotation=Annotated[bool, typer.Option("--json", help="Print JSON (for scripts) instead of tables.")],
            default=False,
        ),
    ]
    register.__signature__ = inspect.Signature([*fixed, *fields, *trailing])  # type: ignore[attr-defined]
    register.__doc__ = (
        "Register a workspace (or replace its registration): the git branch of a git remote it works on, its test"
        " suites and its GitHub repository. `workspaces register WS --remote-url /srv/git/repo.git --branch agent/ws"
        " --test-command unit='python -m pytest -q'`."
    )
    return handle_errors(register)
