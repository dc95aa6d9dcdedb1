"""The documented `sam local` commands (docs/sam-local.md), run as a user runs them: one bash script of exactly
`COMMANDS`, from the repository root, with Docker and the Lambda base image there. Then each command's answer and the
state in the local stack's emulator are checked, and `sam local start-api` gets the requests an attacker would send.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from boto3.dynamodb.types import TypeDeserializer

from agent_jobs_local.auth import mint_token
from tests.documentation import doc_section
from tests.sam_build.test_sam_build import ELF_MACHINE_AARCH64, ELF_MACHINE_X86_64, elf_machine
from tests.sam_local.commands import COMMANDS, PAGE, SECTION, documented_commands, normalized
from tests.sam_local.conftest import REPO, lambda_architecture

START_API = "http://127.0.0.1:3001"
SCRIPT_TIMEOUT_SECONDS = 1500
# Docker's installation and the base image's build (first run only) come before the script, in the same setup.
pytestmark = pytest.mark.timeout(2400)
# Where `make local LOCAL_ARGS=--sam-local` creates the sample tenant's remotes (beside its workspaces folder).
SAMPLE_REMOTES = REPO / ".local" / "remotes" / "tenant-demo"


def test_docs_show_exactly_the_commands_this_suite_runs() -> None:
    assert documented_commands() == [normalized(command) for command in COMMANDS]


def test_documented_commands_paste_into_zsh_too() -> None:
    # Interactive zsh (macOS's shell) takes `#` literally unless INTERACTIVE_COMMENTS is set: no comments in the block
    block = re.search(r"```sh\n(.*?)```", doc_section(PAGE, SECTION), flags=re.DOTALL)
    assert block is not None
    assert [line for line in block.group(1).splitlines() if re.search(r"(^|\s)#", line)] == []


def test_documented_commands_parser_joins_continuations_and_drops_comments() -> None:
    section = (
        "text\n```sh\n# a comment line\nmake build \\\n    ARCHITECTURE=x86_64   # why\n\nsam local invoke F\n```\n"
    )

    assert documented_commands(section) == ["make build ARCHITECTURE=x86_64", "sam local invoke F"]


@dataclass
class ScriptRun:
    """The commands' outputs (`out[i]`, `err[i]` for COMMANDS[i]), how long each took, and the stack they left."""

    folder: Path
    seconds: float
    step_seconds: dict[int, float]

    def out(self, index: int) -> str:
        return (self.folder / f"{index}.out").read_text()

    def err(self, index: int) -> str:
        return (self.folder / f"{index}.err").read_text()

    def answer(self, naming: str) -> dict[str, Any]:
        """The JSON that the one command containing `naming` printed last on its standard output (a function's
        answer, an API's body)."""
        (index,) = [index for index, command in enumerate(COMMANDS) if naming in command]
        command = COMMANDS[index]
        lines = [line for line in self.out(index).splitlines() if line.strip()]
        assert lines, f"no output from {command!r}; its stderr ends: {self.err(index)[-2000:]}"
        answer: dict[str, Any] = json.loads(lines[-1])
        return answer


def _script(folder: Path) -> str:
    """COMMANDS as one bash script: each command's output to files of its own, background ones left running."""
    lines = ["set -euo pipefail", f"cd {shlex.quote(str(REPO))}"]
    for index, command in enumerate(COMMANDS):
        out, err = shlex.quote(str(folder / f"{index}.out")), shlex.quote(str(folder / f"{index}.err"))
        lines.append(f"echo {index} $(date +%s.%N) >> {shlex.quote(str(folder / 'steps'))}")
        if command.split("=", 1)[0].isidentifier() and "=" in command.split()[0]:
            lines.append(command)  # an assignment: the shell's own state
        elif command.endswith("&"):
            lines.append(f"{{ {command.removesuffix('&').strip()}; }} > {out} 2> {err} &")
        else:
            lines.append(f"{{ {command}; }} > {out} 2> {err}")
    lines.append(f"echo end $(date +%s.%N) >> {shlex.quote(str(folder / 'steps'))}")
    return "\n".join(lines) + "\n"


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """Stop what the script left running (the local stack, sam local start-api): its process group, SIGTERM first
    (a script's background commands ignore SIGINT, as bash starts them)."""
    for signal_number, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, signal_number)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.5)


def _port_taken(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def commands_run(
    lambda_image: str, command_line_tools: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ScriptRun]:
    # The commands use the local API's port 3000, start-api's 3001 and start-lambda's 3002; taken, an `until` would wait
    # forever.
    taken = [port for port in (3000, 3001, 3002) if _port_taken(port)]
    if taken:
        pytest.fail(
            f"the documented commands need port {' and '.join(map(str, taken))}, in use (another `make local`?)"
        )
    folder = tmp_path_factory.mktemp("sam-local")
    script = folder / "commands.sh"
    script.write_text(_script(folder))
    env = {**os.environ, "SAM_CLI_TELEMETRY": "0"}
    started = time.monotonic()
    process = subprocess.Popen(["bash", str(script)], cwd=REPO, env=env, start_new_session=True)
    try:
        try:
            code = process.wait(timeout=SCRIPT_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            code = None
        seconds = time.monotonic() - started
        steps = [line.split() for line in (folder / "steps").read_text().splitlines()]
        times = [float(at) for _, at in steps]
        step_seconds = {int(name): later - at for (name, _), at, later in zip(steps, times, times[1:], strict=False)}
        if code != 0:
            last = int(steps[-1][0]) if steps[-1][0] != "end" else len(COMMANDS) - 1
            pytest.fail(
                f"the documented commands stopped at {COMMANDS[last]!r} (exit {code}):\n"
                f"{(folder / f'{last}.err').read_text()[-3000:] if (folder / f'{last}.err').exists() else ''}"
            )
        run = ScriptRun(folder=folder, seconds=seconds, step_seconds=step_seconds)
        yield run
    finally:
        _stop_group(process)


@dataclass
class Emulator:
    """The local stack's emulator, as its connection file names it."""

    endpoint: str
    table: str

    @classmethod
    def of_local_stack(cls) -> Emulator:
        connection = json.loads((REPO / ".agent-jobs" / "local.json").read_text())
        return cls(endpoint=connection["endpointUrl"], table=connection["tableName"])

    def item(self, key: str) -> dict[str, Any] | None:
        client = boto3.client(
            "dynamodb",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="local",
            aws_secret_access_key="local",
        )
        found = client.get_item(TableName=self.table, Key={"pk": {"S": key}}, ConsistentRead=True).get("Item")
        deserializer = TypeDeserializer()
        return None if found is None else {name: deserializer.deserialize(value) for name, value in found.items()}

    def job(self, job_id: str, tenant_id: str = "tenant-demo") -> dict[str, Any] | None:
        from agent_jobs.keys import job_key

        return self.item(job_key(tenant_id, job_id))

    def wait_for_job(self, job_id: str, status: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if (job is not None and job["status"] == status) or time.monotonic() > deadline:
                assert job is not None, f"{job_id} was never recorded"
                assert job["status"] == status, job
                return job
            time.sleep(0.5)


def _remote_git(workspace_id: str, *args: str) -> bytes:
    """git in the sample workspace's remote (the folder the local git server serves)."""
    remote = SAMPLE_REMOTES / f"{workspace_id}.git"
    return subprocess.run(["git", "-C", str(remote), *args], capture_output=True, check=True, timeout=30).stdout


def remote_branch_head(workspace_id: str) -> str:
    return _remote_git(workspace_id, "rev-parse", f"refs/heads/agent/{workspace_id}").decode().strip()


def remote_branch_message(workspace_id: str) -> str:
    return _remote_git(workspace_id, "log", "-1", "--format=%B", f"refs/heads/agent/{workspace_id}").decode()


def remote_branch_file(workspace_id: str, path: str) -> bytes:
    return _remote_git(workspace_id, "show", f"refs/heads/agent/{workspace_id}:{path}")


def _command(naming: str) -> str:
    (command,) = [command for command in COMMANDS if naming in command]
    return command


def _body(response: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(response["body"])
    return body


def test_documented_commands_run_and_answer_as_documented(commands_run: ScriptRun) -> None:
    emulator = Emulator.of_local_stack()
    architecture = lambda_architecture()

    # the build is for this machine: the layer's compiled wheels and the template's Architecture agree
    layer = REPO / ".aws-sam" / "sam-local" / "SharedLayer" / "python" / "pydantic_core"
    machine = "x86_64" if architecture == "x86_64" else "aarch64"
    assert any(f"-{machine}-linux-gnu" in path.name for path in layer.glob("_pydantic_core*.so"))
    # with what only sam local needs: the producer's own token check
    assert (layer.parent / "jwt").is_dir()
    (rust_bindings,) = (layer.parent / "cryptography").rglob("_rust*.so")
    assert elf_machine(rust_bindings) == (ELF_MACHINE_X86_64 if architecture == "x86_64" else ELF_MACHINE_AARCH64)

    # the local stack registered the events' workspaces for their tenant, and wrote the env file containers need
    env_file = json.loads((REPO / "env.local.json").read_text())
    assert env_file["EnqueueApiFunction"]["AWS_ENDPOINT_URL"].startswith("http://host.docker.internal:")
    assert "BEGIN PUBLIC KEY" in env_file["EnqueueApiFunction"]["LOCAL_JWT_PUBLIC_KEY"]
    for workspace_id in ("repo-alpha", "repo-beta", "repo-gamma"):
        workspace = emulator.item(f"ws#{workspace_id}")
        assert (workspace or {}).get("tenantId") == "tenant-demo", workspace_id

    # the producer, in its container, against the emulator
    put = commands_run.answer("events/http_put_workspace.json")
    assert put["statusCode"] == 201, put
    assert (emulator.item("ws#repo-delta") or {}).get("tenantId") == "tenant-demo"
    posted = commands_run.answer("events/http_post_job.json")
    assert posted["statusCode"] == 202, posted
    assert _body(posted)["jobId"] == "job-0001"
    got = commands_run.answer("events/http_get_job.json")
    assert got["statusCode"] == 200, got
    assert _body(got)["jobId"] == "job-0001"
    invalid = commands_run.answer("events/http_post_job_invalid.json")
    assert invalid["statusCode"] == 422, invalid
    assert emulator.job("job 0002") is None
    # the queued job ran on the stack's own workers: its patch is on repo-gamma's branch
    assert emulator.wait_for_job("job-0001", "SUCCEEDED")["attempt"] == 1

    # the worker, in its container: the events' jobs are checked, claimed and run in order per workspace, on remotes
    # the local git server serves over HTTPS (trusting its local CA, under sam local only); run_tests invokes the test
    # sandbox that `sam local start-lambda` serves, and open_pr the GitHub API of the tenant's folder of that server
    first = commands_run.answer("events/sqs_fifo_two_workspaces.json")
    assert first["batchItemFailures"] == [], commands_run.err(COMMANDS.index(_command("sqs_fifo_two_workspaces")))[
        -3000:
    ]
    for job_id, workspace_id, path, content in (
        ("job-a-001", "repo-alpha", "src/app.py", b"fixed = True\n"),
        ("job-b-001", "repo-beta", "README.md", b"Beta docs\n"),
    ):
        job = emulator.job(job_id)
        assert job is not None
        assert (job["status"], job["attempt"], job["result"]["alreadyApplied"]) == ("SUCCEEDED", 1, False), job
        # the remote's branch holds the patched file, in a commit that names the job
        assert remote_branch_file(workspace_id, path) == content
        assert remote_branch_head(workspace_id) == job["result"]["commit"]
        assert f"Agent-Job-Id: {job_id}" in remote_branch_message(workspace_id)
        assert (emulator.item(f"ws#{workspace_id}") or {}).get("state", "ACTIVE") == "ACTIVE"
    # the tests ran in the sandbox's own container, on the commit each patch made
    for job_id, patched_by in (("job-a-002", "job-a-001"), ("job-b-002", "job-b-001")):
        job = emulator.job(job_id)
        assert job is not None
        assert (job["status"], job["attempt"]) == ("SUCCEEDED", 1), job
        assert (job["result"]["outcome"], job["result"]["exitCode"]) == ("passed", 0), job
        assert job["result"]["outputTail"] == "tests pass\n"
        assert job["result"]["commit"] == (emulator.job(patched_by) or {})["result"]["commit"]
    pull_request = emulator.job("job-a-003")
    assert pull_request is not None
    assert (pull_request["status"], pull_request["result"]["alreadyOpen"]) == ("SUCCEEDED", False), pull_request
    assert pull_request["result"]["number"] >= 1
    # the duplicate delivery: job-a-001 again, twice, and job-a-002: acknowledged without a second effect
    duplicate = commands_run.answer("events/sqs_fifo_duplicate_delivery.json")
    assert duplicate["batchItemFailures"] == []
    for job_id in ("job-a-001", "job-a-002"):
        assert (emulator.job(job_id) or {}).get("attempt") == 1
    assert remote_branch_head("repo-alpha") == (emulator.job("job-a-001") or {})["result"]["commit"]

    # the test sandbox, in its container, with its tenant
    sandbox = commands_run.answer("events/sandbox_run_tests.json")
    assert (sandbox["outcome"], sandbox["exitCode"], sandbox["outputTail"]) == ("passed", 0, "unit: 3 passed\n")

    # sam local start-api: the token verified by the function itself; the job queued and run by the stack's workers
    accepted = commands_run.answer("localhost:3001/jobs -H")
    assert (accepted["jobId"], accepted["status"], accepted["created"]) == ("api-1", "QUEUED", True)
    read = commands_run.answer("localhost:3001/jobs/api-1")
    assert (read["jobId"], read["tenantId"]) == ("api-1", "tenant-demo")
    assert emulator.wait_for_job("api-1", "SUCCEEDED")["workspaceId"] == "repo-gamma"

    invocations = sum(command.startswith("sam local invoke") for command in COMMANDS)
    steps = {
        f"{index} {COMMANDS[index][:30]}": round(seconds, 1) for index, seconds in commands_run.step_seconds.items()
    }
    print(
        f"\nsam local: the documented {len(COMMANDS)} commands in {commands_run.seconds:.0f} s; {invocations} sam local"
        f" invoke runs; start-api answered {sum(command.startswith('curl') for command in COMMANDS)} requests;"
        f" each step (s): {json.dumps(steps)}"
    )


def _request(method: str, path: str, headers: dict[str, str], body: bytes | None = None) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(f"{START_API}{path}", data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read() or b"{}")


def _job(job_id: str, workspace_id: str = "repo-gamma") -> bytes:
    patch = f"--- /dev/null\n+++ b/{job_id}.txt\n@@ -0,0 +1 @@\n+{job_id}\n"
    job = {"jobId": job_id, "workspaceId": workspace_id, "type": "apply_patch"}
    return json.dumps({**job, "payload": {"patch": patch, "commitMessage": job_id}}).encode()


def test_start_api_refuses_what_an_attacker_sends(commands_run: ScriptRun) -> None:
    emulator = Emulator.of_local_stack()
    json_type = {"content-type": "application/json"}

    public = _request("GET", "/openapi.json", {})
    no_token = _request("POST", "/jobs", json_type, _job("attack-1"))
    forged = _request("POST", "/jobs", {**json_type, "authorization": "Bearer e30.e30.c2lnbmF0dXJl"}, _job("attack-2"))
    injected = _request(
        "POST", "/jobs", {**json_type, "x-tenant-id": "tenant-demo", "tenant_id": "tenant-demo"}, _job("attack-3")
    )
    other_tenant = _request(
        "POST", "/jobs", {**json_type, "authorization": f"Bearer {mint_token('tenant-b')}"}, _job("attack-4")
    )
    reading_another_tenants_job = _request("GET", "/jobs/api-1", {"authorization": f"Bearer {mint_token('tenant-b')}"})

    assert public[0] == 200
    assert public[1]["openapi"].startswith("3.")
    assert (no_token[0], forged[0], injected[0]) == (401, 401, 401)
    assert other_tenant[0] == 404  # repo-gamma is no workspace of tenant-b's
    assert reading_another_tenants_job[0] == 404
    for job_id in ("attack-1", "attack-2", "attack-3"):
        assert emulator.job(job_id) is None
    assert emulator.job("attack-4", "tenant-b") is None
