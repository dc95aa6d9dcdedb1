"""A workspace's registration: the git branch of a git remote it works on, its test commands and where its token
lives, as `PUT /workspaces/{workspaceId}` takes it and the table stores it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import SplitResult, urlsplit

from pydantic import AfterValidator, Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from agent_jobs.direct_producers import SENDER_ID_FORMS, DirectProducers
from agent_jobs.models import ID_PATTERN, CamelModel

GITHUB_API_URL = "https://api.github.com"
"""The GitHub API a workspace uses when its registration names no `githubApiUrl` (GitHub Enterprise sets one)."""

_BRANCH_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/-]*$"
_REMOTE_URL_FORMS = "an absolute local path (/srv/git/repo.git), a file:// URL or an https:// URL"
_TOKEN_PARAMETER_FORMS = "'ssm:<parameter name>' or 'secretsmanager:<secret id or ARN>'"
_SSM_PARAMETER_NAME = re.compile(r"^[A-Za-z0-9_.\-/]{1,2048}$")
_SECRET_ID = re.compile(r"^[A-Za-z0-9/_+=.@:\-]{1,2048}$")
_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def _no_control_characters(value: str, what: str) -> None:
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in value) or " " in value:
        raise PydanticCustomError("control_characters", f"{what} must not contain spaces or control characters")


def _check_remote_url(value: str) -> str:
    _no_control_characters(value, "a remote URL")
    if value.startswith("/"):
        return value
    parts = urlsplit(value)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise PydanticCustomError(
                "remote_url_file", "a file:// URL names an absolute path on this machine: file:///srv/git/repo.git"
            )
        return value
    if scheme != "https":
        raise PydanticCustomError(
            "remote_url_form", f"unsupported remote; use {_REMOTE_URL_FORMS} (ssh, http and git URLs are not accepted)"
        )
    _check_https_url(parts, "remoteUrl")
    return value


def _check_https_url(parts: SplitResult, field: str) -> None:
    if parts.username is not None or parts.password is not None:
        raise PydanticCustomError(
            "url_credentials",
            f"{field} must not carry credentials; store the token in SSM Parameter Store or Secrets Manager and "
            "name it in tokenParameter",
        )
    if not parts.hostname:
        raise PydanticCustomError("url_host", f"{field} needs a host: https://<host>/<path>")
    if parts.query or parts.fragment:
        raise PydanticCustomError("url_query", f"{field} must not have a query string or fragment")
    try:
        parts.port  # noqa: B018  # raises for a port that is not a number in 0..65535
    except ValueError:
        raise PydanticCustomError("url_port", f"{field} has an invalid port") from None


def _check_api_url(value: str) -> str:
    _no_control_characters(value, "a URL")
    parts = urlsplit(value)
    scheme = parts.scheme.lower()
    # Plain http only to this machine's loopback (a local stand-in for GitHub): a token never crosses a network.
    loopback = scheme == "http" and parts.hostname in _LOOPBACK_HOSTS
    if scheme != "https" and not loopback:
        raise PydanticCustomError(
            "api_url_form",
            "githubApiUrl must be an https:// URL, e.g. https://github.example.com/api/v3 (http only for a loopback "
            "host such as http://127.0.0.1:8080)",
        )
    _check_https_url(parts, "githubApiUrl")
    return value


def _check_branch(value: str) -> str:
    # The rules of `git check-ref-format --branch` that the pattern alone does not cover.
    if value == "HEAD":
        raise PydanticCustomError("git_branch", "'HEAD' is not a branch name")
    if ".." in value or "//" in value or value.endswith(("/", ".")):
        raise PydanticCustomError("git_branch", "a branch name has no '..' or '//' and does not end with '/' or '.'")
    for component in value.split("/"):
        if component.startswith(".") or component.endswith(".lock"):
            raise PydanticCustomError("git_branch", "no part of a branch name may start with '.' or end with '.lock'")
    return value


def _check_token_parameter(value: str) -> str:
    store, _, name = value.partition(":")
    if store == "ssm" and _SSM_PARAMETER_NAME.fullmatch(name):
        return value
    if store == "secretsmanager" and _SECRET_ID.fullmatch(name):
        return value
    raise PydanticCustomError("token_parameter", f"tokenParameter is {_TOKEN_PARAMETER_FORMS}")


def _check_argument(value: str) -> str:
    if "\x00" in value:
        raise PydanticCustomError("argv_nul", "a command argument must not contain a NUL character")
    return value


GitBranch = Annotated[str, Field(min_length=1, max_length=200, pattern=_BRANCH_PATTERN), AfterValidator(_check_branch)]
TestCommandName = Annotated[str, Field(min_length=1, max_length=64, pattern=ID_PATTERN)]
CommandArgument = Annotated[str, Field(min_length=1, max_length=1000), AfterValidator(_check_argument)]
# An argv list, run without a shell: never a shell string.
TestCommand = Annotated[list[CommandArgument], Field(min_length=1, max_length=50)]


class WorkspaceRegistration(CamelModel):
    """The body of `PUT /workspaces/{workspaceId}`: the git branch of a git remote a workspace works on."""

    remote_url: Annotated[str, Field(min_length=1, max_length=2048), AfterValidator(_check_remote_url)]
    branch: GitBranch
    base_branch: GitBranch = "main"
    test_commands: Annotated[dict[TestCommandName, TestCommand], Field(max_length=20)] = {}
    # Where the token for HTTPS pushes and the GitHub API lives; the token itself is never stored here.
    token_parameter: (
        Annotated[str, Field(min_length=1, max_length=2100), AfterValidator(_check_token_parameter)] | None
    ) = None
    github_repository: (
        Annotated[str, Field(min_length=3, max_length=200, pattern=r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")] | None
    ) = None
    github_api_url: Annotated[str, Field(min_length=1, max_length=2048), AfterValidator(_check_api_url)] | None = None
    # The SQS senders (SenderId) whose direct messages are the owner's jobs (`agent_jobs.direct_producers`). None binds
    # none (any sender allowed to SendMessage acts as the owner); an empty list admits the enqueue API's messages alone.
    direct_producers: Annotated[
        DirectProducers | None,
        Field(
            description="The SQS senders (SenderId) whose messages sent straight to the queue are this workspace's "
            f"jobs: each {SENDER_ID_FORMS}. Leave it out to bind none (any sender allowed to send to the queue acts "
            "as the owner); an empty list admits jobs submitted through the API alone."
        ),
    ] = None

    @model_validator(mode="after")
    def _base_differs_from_branch(self) -> WorkspaceRegistration:
        if self.base_branch == self.branch:
            # Raised as a ValidationError so that the error names baseBranch even when it is the default.
            error = PydanticCustomError(
                "same_branch",
                "baseBranch must differ from branch: the workspace's commits go to branch, on top of baseBranch",
            )
            raise ValidationError.from_exception_data(
                type(self).__name__, [InitErrorDetails(type=error, loc=("baseBranch",), input=self.base_branch)]
            )
        return self

    @property
    def effective_github_api_url(self) -> str:
        """The GitHub API to call: the registered one, or GitHub's."""
        return self.github_api_url or GITHUB_API_URL


MAX_TEST_COMMANDS_BYTES = 65_536
"""The most a registration's test commands may hold, in UTF-8 bytes of their arguments: a registration is stored as
one DynamoDB item (at most 400 KB, next to the workspace's halt state), and each command is within its own limits."""


def test_commands_size_error(registration: WorkspaceRegistration) -> str | None:
    """Why the registration's test commands are too large to store (MAX_TEST_COMMANDS_BYTES), or None."""
    size = sum(len(argument.encode()) for command in registration.test_commands.values() for argument in command)
    if size <= MAX_TEST_COMMANDS_BYTES:
        return None
    return (
        f"the test commands hold {size:,} bytes; the limit is {MAX_TEST_COMMANDS_BYTES:,} bytes of arguments in all "
        "(a registration is stored as one DynamoDB item, at most 400 KB): register shorter commands, e.g. a script "
        "in the repository that runs the suite"
    )


@dataclass(frozen=True)
class RegisteredWorkspace:
    """A workspace as registered: its owner, its registration and when it was first registered (epoch ms)."""

    workspace_id: str
    tenant_id: str
    registration: WorkspaceRegistration
    registered_at: int
