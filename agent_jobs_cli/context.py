"""What every command shares: the target and its API client, the token, errors the user can act on, and output."""

from __future__ import annotations

import functools
import importlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final, NoReturn, ParamSpec, TypeVar

import typer
from rich.console import Console

from agent_jobs_cli.api import ApiClient, ApiError
from agent_jobs_cli.targets import Target, TargetError, connection_file_path, load_local_target, load_stack_target

OPERATOR_SCOPE: Final = "agent-jobs/operator"  # enqueue_api.app.OPERATOR_SCOPE (a test keeps them equal)

# How the API says a workspace is not registered (nor the caller's): "... register it with PUT /workspaces/WS".
_UNREGISTERED: Final = re.compile(r"PUT /workspaces/([A-Za-z0-9][A-Za-z0-9._-]*)")

P = ParamSpec("P")
R = TypeVar("R")

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON (for scripts) instead of tables.")]


class CliError(Exception):
    """A failure the user can act on: printed as `error: <message>`, exit code 1."""


@dataclass
class CliState:
    stack_name: str | None
    region: str | None
    token: str | None
    tenant: str
    connection_file: Path | None
    _target: Target | None = None

    @property
    def target(self) -> Target:
        if self._target is None:
            try:
                if self.stack_name:
                    self._target = load_stack_target(self.stack_name, self.region)
                else:
                    self._target = load_local_target(connection_file_path(self.connection_file))
            except TargetError as error:
                raise CliError(str(error)) from None
        return self._target

    def api(self, *, operator: bool = False) -> ApiClient:
        return ApiClient(self.target.api_url, token=self.api_token(operator=operator))

    def api_token(self, *, operator: bool) -> str:
        if self.token:
            return self.token
        if not self.target.local:
            raise CliError(
                "no token: pass --token or set AGENT_JOBS_TOKEN to a token for your tenant"
                + (f" with the '{OPERATOR_SCOPE}' scope" if operator else "")
            )
        return mint_local_token(self.tenant, operator=operator)


def mint_local_token(tenant: str, *, operator: bool, ttl_seconds: int = 3600) -> str:
    """A token from the local development key (agent_jobs_local.auth), imported only when needed."""
    try:
        auth: Any = importlib.import_module("agent_jobs_local.auth")
    except ImportError:
        raise CliError("this checkout cannot mint local tokens (no agent_jobs_local.auth); pass --token") from None
    scopes = (OPERATOR_SCOPE,) if operator else ()
    return str(auth.mint_token(tenant, scopes=scopes, ttl_seconds=ttl_seconds))


def out() -> Console:
    return Console(highlight=False, soft_wrap=False)


def err() -> Console:
    return Console(stderr=True, highlight=False)


def fail(message: str) -> NoReturn:
    err().print(f"[bold red]error:[/] {message}")
    raise typer.Exit(1)


def print_json(document: Any) -> None:
    typer.echo(json.dumps(document, indent=2, sort_keys=True, default=str))


def explain(error: ApiError, method: str, path: str) -> str:
    if error.status == 0:
        return f"{error.message}; is the local runtime running (`make local`), or is --stack-name right?"
    if error.status == 401:
        return f"the API refused the token ({error.message}); pass a valid --token or set AGENT_JOBS_TOKEN"
    if error.status == 404 and error.message == "Not Found":  # API Gateway's answer when no route matches
        route = path.split("?", maxsplit=1)[0]
        return f"the API has no route {method} {route}; deploy (or run) a version of Agent Jobs that has it"
    detail = ""
    if isinstance(error.body, dict) and isinstance(error.body.get("errors"), list):
        detail = "".join(f"\n  {e.get('field')}: {e.get('message')}" for e in error.body["errors"])
    unregistered = _UNREGISTERED.search(error.message)
    if unregistered:
        # The API names its route; this command line has one for it.
        detail += (
            f"\nRegister it: agent-jobs workspaces register {unregistered.group(1)} --remote-url REMOTE --branch BRANCH"
            " [--test-command NAME=COMMAND] (agent-jobs workspaces register --help)"
        )
    return f"{method} {path} answered {error.status}: {error.message}{detail}"


def handle_errors(command: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except CliError as error:
            fail(str(error))

    return wrapper


def api_get(client: ApiClient, path: str, query: dict[str, str | int | None] | None = None) -> Any:
    try:
        return client.get(path, query)
    except ApiError as error:
        raise CliError(explain(error, "GET", path)) from None


def api_post(client: ApiClient, path: str, body: Any) -> Any:
    try:
        return client.post(path, body)
    except ApiError as error:
        raise CliError(explain(error, "POST", path)) from None


def api_pages(client: ApiClient, path: str, key: str, query: dict[str, str | int | None] | None = None) -> list[Any]:
    try:
        return list(client.pages(path, key, query))
    except ApiError as error:
        raise CliError(explain(error, "GET", path)) from None


def state_of(ctx: typer.Context) -> CliState:
    state = ctx.find_object(CliState)
    if state is None:  # only when a command is invoked without the app's callback (never from the command line)
        raise CliError("internal: no CLI state")
    return state


def run_alias(app: typer.Typer, argv: Sequence[str] | None, *, prog_name: str, obj: object = None) -> int:
    """Run `app` as `python -m ...` runs it and return its exit status instead of leaving the interpreter (tests call
    these entry points in-process)."""
    try:
        app(args=None if argv is None else list(argv), prog_name=prog_name, obj=obj)
    except SystemExit as stopped:
        code = stopped.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0
