"""The local runtime's folders and the files it writes for other tools: the connection file the `agent-jobs` command
line reads, and the `--env-vars` file of `sam local invoke` / `sam local start-api` (with the emulator as a container
reaches it)."""

from __future__ import annotations

import ipaddress
import json
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from agent_jobs_local.template import ProvisionedResources, TemplateModel

CONTAINER_HOST: Final = "host.docker.internal"
LOOPBACK: Final = "127.0.0.1"
_LOOPBACK_HOSTS: Final = ("127.0.0.1", "localhost", "0.0.0.0")


def local_folders(workspaces_root: Path | None, remotes_root: Path | None) -> tuple[Path, Path]:
    """The worker's WORKSPACES_ROOT and both functions' WORKSPACES_REMOTE_ROOT, resolved: the ones given; else a new
    temporary folder, and for the remotes `remotes` beside a given `workspaces_root`."""
    workspaces = Path(workspaces_root or tempfile.mkdtemp(prefix="agent-jobs-workspaces-")).resolve()
    if remotes_root is None:
        remotes_root = (
            Path(workspaces_root).parent / "remotes"
            if workspaces_root
            else Path(tempfile.mkdtemp(prefix="agent-jobs-remotes-"))
        )
    return workspaces, Path(remotes_root).resolve()


def container_reachable_host(docker: str = "docker") -> str:
    """The address to serve on so that `sam local`'s containers reach it as host.docker.internal, and no wider.

    On Linux a container given `--add-host host.docker.internal:host-gateway` reaches this machine at the gateway of
    Docker's default bridge (docker0), not at 127.0.0.1: that address, when this machine has it. Docker Desktop (macOS,
    Windows) forwards host.docker.internal to this machine's loopback, and the bridge is not here: 127.0.0.1."""
    docker_path = shutil.which(docker)
    if docker_path is None:
        return LOOPBACK
    try:
        inspected = subprocess.run(
            [
                docker_path,
                "network",
                "inspect",
                "bridge",
                "--format",
                "{{range .IPAM.Config}}{{.Gateway}} {{.Subnet}} {{end}}",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return LOOPBACK
    for entry in inspected.stdout.split() if inspected.returncode == 0 else []:
        # The gateway, or (older daemons leave it out of the default bridge's configuration) the subnet's first address.
        try:
            address = ipaddress.ip_address(entry) if "/" not in entry else next(ipaddress.ip_network(entry).hosts())
        except (ValueError, StopIteration):
            continue
        if address.version == 4 and _is_local_address(str(address)):
            return str(address)
    return LOOPBACK


def _is_local_address(address: str) -> bool:
    """Whether this machine has `address` (a server can listen on it)."""
    with socket.socket() as probe:
        try:
            probe.bind((address, 0))
        except OSError:
            return False
    return True


def container_endpoint(endpoint_url: str, hosts: Sequence[str] = ()) -> str:
    """A URL of this machine as a container reaches it: a loopback host, or one of `hosts` (the address a server
    listens on for containers), becomes host.docker.internal."""
    for host in (*_LOOPBACK_HOSTS, *hosts):
        endpoint_url = endpoint_url.replace(f"//{host}:", f"//{CONTAINER_HOST}:").replace(
            f"//{host}/", f"//{CONTAINER_HOST}/"
        )
        if endpoint_url.endswith(f"//{host}"):
            endpoint_url = endpoint_url.removesuffix(host) + CONTAINER_HOST
    return endpoint_url


def write_connection_file(
    path: Path,
    *,
    api_url: str,
    endpoint_url: str | None,
    resources: ProvisionedResources,
    api_sender_id: str | None = None,
) -> Path:
    """Write the connection file (JSON): `apiUrl`, `endpointUrl` (the emulator), `region`, `tableName`, `queueUrl`,
    `deadLetterQueueUrl`, and `apiSenderId` (the SenderId of the enqueue API's messages) when known."""
    document = {
        "apiUrl": api_url,
        "endpointUrl": endpoint_url,
        "region": resources.region,
        "tableName": resources.table_name,
        "queueUrl": resources.queue_url,
        "deadLetterQueueUrl": resources.dlq_url,
    }
    if api_sender_id:
        document["apiSenderId"] = api_sender_id
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return path


def write_env_file(
    path: Path,
    model: TemplateModel,
    resources: ProvisionedResources,
    endpoint: str | None,
    local_values: Mapping[str, str] | None = None,
) -> Path:
    """Write a `sam local invoke --env-vars` / `sam local start-api --env-vars` file for `resources`:
    `{"EnqueueApiFunction": {"TABLE_NAME": ..., "QUEUE_URL": ..., "AWS_ENDPOINT_URL": ...}, "JobWorkerFunction":
    {...}}`, with the template's (unscaled) values, since `sam local` runs the functions with their real Timeout.

    A function named by reference (the worker's TEST_SANDBOX_FUNCTION) has the name the local runtime serves it
    under; a function without environment variables (the test sandbox) is left out. AWS_ENDPOINT_URL is `endpoint`
    (None: not set). SAM only applies variables the template declares for the function, which is why template.yaml
    declares AWS_ENDPOINT_URL through its EndpointUrl parameter: run `sam local ... --env-vars <file>
    --parameter-overrides EndpointUrl=<endpoint>` (any non-empty value declares it; the file's value is the one
    used). `local_values` are values for variables the template declares, each set for the functions that declare
    it, over the template's: those it declares only for `sam local` (with EndpointUrl), such as LOCAL_JWT_PUBLIC_KEY
    (the development key's public half, against which the producer verifies bearer tokens under `sam local
    start-api`), LOCAL_GIT_SERVER and LOCAL_GIT_CA (the sample workspaces' git server) and the worker's
    AWS_ENDPOINT_URL_LAMBDA (`sam local start-lambda`), and others the stack gives its containers in its own way
    (WORKSPACES_REMOTE_ROOT, and TEST_SANDBOX_FUNCTION as `sam local start-lambda` names the sandbox)."""
    document: dict[str, dict[str, str]] = {}
    for function_id in model.resources_of_type("AWS::Serverless::Function"):
        environment = model.function_environment(function_id, resources.references)
        if not environment:
            continue  # SAM applies only variables the template declares: the test sandbox declares none
        if endpoint is not None:
            environment["AWS_ENDPOINT_URL"] = endpoint
        declared = (model.function_properties(function_id).get("Environment") or {}).get("Variables") or {}
        environment.update({name: value for name, value in (local_values or {}).items() if name in declared})
        document[function_id] = environment
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path
