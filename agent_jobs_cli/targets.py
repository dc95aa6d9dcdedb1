"""Where the CLI acts: the local runtime (its connection file) or a deployed stack (its CloudFormation Outputs)."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient
    from mypy_boto3_sqs.client import SQSClient

DEFAULT_CONNECTION_FILE: Final = Path(".agent-jobs/local.json")


def _project_root() -> Path | None:
    """The project this package is installed from (`pip install -e .`); None when installed elsewhere."""
    folder = Path(__file__).resolve().parents[1]
    return folder if (folder / "template.yaml").is_file() else None


PROJECT_ROOT: Final = _project_root()
CONNECTION_FILE_ENV: Final = "AGENT_JOBS_CONNECTION_FILE"
# The stack Outputs the CLI needs (template.yaml declares them).
STACK_OUTPUTS: Final = {
    "api_url": "ApiUrl",
    "queue_url": "QueueUrl",
    "dlq_url": "DeadLetterQueueUrl",
    "table_name": "TableName",
}
# Outputs the CLI uses when a stack has them (an older stack lacks them): the SenderId of the API's messages, which
# the dead-letter redrive needs for a workspace that binds its direct producers.
OPTIONAL_STACK_OUTPUTS: Final = {"api_sender_id": "ApiSenderId"}
_CLIENT_CONFIG: Final = Config(retries={"mode": "standard", "max_attempts": 5}, connect_timeout=5, read_timeout=30)


class TargetError(Exception):
    """The CLI cannot tell where to act; the message says what to do."""


@dataclass(frozen=True)
class Target:
    """The API and the AWS resources of one Agent Jobs system. `local` is True for the local runtime, where tokens
    can be minted from the local development key and the AWS endpoint is the emulator."""

    api_url: str
    region: str
    table_name: str
    queue_url: str
    dlq_url: str
    endpoint_url: str | None = None
    local: bool = False
    stack_name: str | None = None
    # The enqueue API's role unique id (its messages' SenderId is `<this>:<function name>`); None when unknown.
    api_sender_id: str | None = None

    def session(self) -> boto3.Session:
        key: str | None = None
        if self.endpoint_url is not None and boto3.Session().get_credentials() is None:
            key = "testing"  # an emulator accepts any signature, but boto3 signs nothing without credentials
        return boto3.Session(region_name=self.region, aws_access_key_id=key, aws_secret_access_key=key)

    def sqs(self) -> SQSClient:
        return self.session().client("sqs", endpoint_url=self.endpoint_url, config=_CLIENT_CONFIG)

    def dynamodb(self) -> DynamoDBClient:
        return self.session().client("dynamodb", endpoint_url=self.endpoint_url, config=_CLIENT_CONFIG)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def connection_file_path(
    explicit: Path | None = None, *, cwd: Path | None = None, project_root: Path | None = PROJECT_ROOT
) -> Path:
    """The local runtime's connection file: `explicit` (--connection-file), else AGENT_JOBS_CONNECTION_FILE, else the
    first `.agent-jobs/local.json` in `cwd` (default the current folder) or a folder above it, else the one in
    `project_root` (the project this CLI is installed from, where `make local` writes it). A file found by looking
    (not named) is used only if the user owns it and its folder and no other user may write them: a file planted in
    a shared folder above (/tmp) would send the API calls, and the token given, elsewhere. Raises TargetError naming
    where it looked when none is found."""
    if explicit is not None:
        return explicit
    named = os.environ.get(CONNECTION_FILE_ENV)
    if named:
        return Path(named).expanduser()
    start = (cwd or Path.cwd()).resolve()
    folders = [start, *start.parents]
    if project_root is not None and project_root not in folders:
        folders.append(project_root)
    refused: list[str] = []
    for folder in folders:
        candidate = folder / DEFAULT_CONNECTION_FILE
        if not candidate.is_file():
            continue
        problem = _not_trusted(candidate)
        if problem is None:
            return candidate
        refused.append(f"{candidate} ({problem})")
    looked = f"{start / DEFAULT_CONNECTION_FILE} and the folders above it"
    if project_root is not None:
        looked += f", and {project_root / DEFAULT_CONNECTION_FILE}"
    skipped = f"; skipped {', '.join(refused)}" if refused else ""
    raise TargetError(
        f"no local runtime connection file (looked for {looked}{skipped}): start the local runtime with `make local` "
        f"(it writes the file), pass --connection-file FILE or set {CONNECTION_FILE_ENV}, or pass --stack-name NAME "
        "to act on a deployed stack"
    )


def _not_trusted(path: Path) -> str | None:
    """Why a connection file found by looking may not be used (someone else could have written it), or None."""
    for entry in (path, path.parent):
        status = entry.lstat()
        if stat.S_ISLNK(status.st_mode):
            return f"{entry} is a symbolic link"
        if status.st_uid != os.getuid():
            return f"{entry} belongs to another user"
        if status.st_mode & stat.S_IWOTH:
            return f"every user may write {entry}"
    return None


def load_local_target(path: Path) -> Target:
    """The local runtime named by its connection file (written by `make local`)."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TargetError(
            f"no local runtime connection file at {path}: start the local runtime with `make local` (it writes "
            "the file), or pass --stack-name NAME to act on a deployed stack"
        ) from None
    except (OSError, json.JSONDecodeError) as error:
        raise TargetError(f"cannot read the connection file {path} ({error}); restart `make local`") from None
    required = ("apiUrl", "region", "tableName", "queueUrl", "deadLetterQueueUrl")
    missing = [name for name in required if not isinstance(document, dict) or not document.get(name)]
    if missing:
        raise TargetError(f"the connection file {path} lacks {', '.join(missing)}; restart `make local`")
    return Target(
        api_url=str(document["apiUrl"]).rstrip("/"),
        region=str(document["region"]),
        table_name=str(document["tableName"]),
        queue_url=str(document["queueUrl"]),
        dlq_url=str(document["deadLetterQueueUrl"]),
        endpoint_url=document.get("endpointUrl") or None,
        local=True,
        api_sender_id=document.get("apiSenderId") or None,
    )


def load_stack_target(stack_name: str, region: str | None, session: boto3.Session | None = None) -> Target:
    """A deployed stack, from its CloudFormation Outputs (needs cloudformation:DescribeStacks)."""
    session = session or boto3.Session(region_name=region)
    region = region or session.region_name
    if not region:
        raise TargetError(f"no AWS region for stack {stack_name!r}: pass --region or set AWS_REGION")
    client: Any = session.client("cloudformation", region_name=region, config=_CLIENT_CONFIG)
    try:
        stacks = client.describe_stacks(StackName=stack_name)["Stacks"]
    except ClientError as error:
        message = error.response.get("Error", {}).get("Message", str(error))
        raise TargetError(
            f"cannot read stack {stack_name!r} in {region}: {message}; check the stack name, the region and your "
            "AWS credentials (cloudformation:DescribeStacks)"
        ) from None
    except BotoCoreError as error:
        raise TargetError(f"cannot reach CloudFormation in {region}: {error}; check your AWS credentials") from None
    outputs = {entry["OutputKey"]: entry["OutputValue"] for entry in (stacks[0].get("Outputs") or [])}
    missing = [key for key in STACK_OUTPUTS.values() if key not in outputs]
    if missing:
        raise TargetError(
            f"stack {stack_name!r} has no output {', '.join(missing)}; deploy this version of template.yaml "
            "(`make deploy`)"
        )
    values = {field: outputs[key] for field, key in STACK_OUTPUTS.items()}
    values.update({field: outputs[key] for field, key in OPTIONAL_STACK_OUTPUTS.items() if outputs.get(key)})
    values["api_url"] = values["api_url"].rstrip("/")
    return Target(region=region, stack_name=stack_name, **values)
