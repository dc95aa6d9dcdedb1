"""A tenant's test command as an attacker, on the local runtime: the whole system over HTTP with real tokens, the
worker's real processes, and run_tests through the test sandbox function.

The victim tenant `acme` registers a workspace whose repository holds a secret, applies a patch (so the worker's git
cache holds acme's code) and runs its tests. The attacker tenant `mallory` registers a test command that runs a
script of its own repository, which tries what a hostile test suite would: read the worker's environment and every
process's, list and read the worker's caches and acme's remote, read the development signing key and the env files,
call the emulator with whatever credentials it found, leave a `setsid` daemon behind, and write outside its
checkout. The result of mallory's run (its output tail, stored with the job) and this machine itself must show that
every attempt failed. `pytest -s` prints what each attempt saw.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent_jobs_local.auth import dev_key_path, mint_token
from agent_jobs_local.runtime import LocalRuntime
from agent_jobs_local.workload import TEST_SUITE, create_remote, register_workspaces

REPO = Path(__file__).resolve().parents[2]
GITHUB_API_URL = "https://api.github.com"
SETTLED = {"SUCCEEDED", "DEAD", "REJECTED", "PARKED", "SKIPPED"}
VICTIM, ATTACKER = "acme", "mallory"
SECRET = f"ACME-SECRET-{uuid.uuid4().hex}"
PATCHED = f"ACME-PATCHED-{uuid.uuid4().hex}"


# --- the local runtime and its tenants -----------------------------------------------------------------------------


def create_tenant_remote(remotes_root: Path, tenant: str, workspace_id: str, files: dict[str, bytes]) -> Path:
    """A bare git remote of `tenant`'s workspace, under the tenant's own folder of the remotes root (where a
    file-system remote of that tenant is allowed to be)."""
    return create_remote(remotes_root / tenant / f"{workspace_id}.git", workspace_id, files)


def request(api_url: str, method: str, path: str, tenant: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {mint_token(tenant)}", "Content-Type": "application/json"}
    call = urllib.request.Request(f"{api_url}{path}", data=data, headers=headers, method=method)
    with urllib.request.urlopen(call, timeout=30) as response:
        return json.loads(response.read())


def run_job(api_url: str, tenant: str, job: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
    """Submit `job` as `tenant` and wait until it settles; the job as its tenant reads it."""
    request(api_url, "POST", "/jobs", tenant, job)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen: dict[str, Any] = request(api_url, "GET", f"/jobs/{job['jobId']}", tenant)
        if seen.get("status") in SETTLED:
            return seen
        time.sleep(0.2)
    raise AssertionError(f"{job['jobId']} did not settle within {timeout} s: {seen}")


def run_tests_job(workspace_id: str) -> dict[str, Any]:
    job_id = f"{workspace_id}-tests-{uuid.uuid4().hex[:8]}"
    return {"jobId": job_id, "workspaceId": workspace_id, "type": "run_tests", "payload": {"suite": TEST_SUITE}}


def apply_patch_job(workspace_id: str, name: str, line: str) -> dict[str, Any]:
    patch = f"--- a/{name}\n+++ b/{name}\n@@ -0,0 +1 @@\n+{line}\n"
    job_id = f"{workspace_id}-patch-{uuid.uuid4().hex[:8]}"
    return {
        "jobId": job_id,
        "workspaceId": workspace_id,
        "type": "apply_patch",
        "payload": {"patch": patch, "commitMessage": "acme's change"},
    }


@dataclass
class Stack:
    runtime: LocalRuntime
    root: Path
    remotes_root: Path

    @property
    def api_url(self) -> str:
        return self.runtime.api_url

    def register(self, tenant: str, workspace_id: str, test_command: Sequence[str], **files: bytes) -> Path:
        remote = create_tenant_remote(self.remotes_root, tenant, workspace_id, files)
        register_workspaces(
            self.api_url, {workspace_id: remote}, GITHUB_API_URL, tenant_id=tenant, test_command=test_command
        )
        return remote


@contextlib.contextmanager
def start_stack(root: Path, **options: Any) -> Iterator[Stack]:
    remotes_root = root / "remotes"
    runtime = LocalRuntime(
        workspaces_root=root / "workspaces",
        time_scale=0.1,
        concurrency=2,
        remotes_root=remotes_root,
        **options,
    ).start()
    try:
        yield Stack(runtime, root, remotes_root)
    finally:
        runtime.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with start_stack(tmp_path_factory.mktemp("attacks")) as started:
        yield started


# --- the attack ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Targets:
    """Absolute paths and addresses of this machine the attacker knows (or guesses) and tries."""

    workspaces_root: Path
    victim_remote: Path
    project: Path
    dev_key: Path
    env_files: tuple[Path, ...]
    emulator_url: str
    daemon_marker: str
    daemon_target: Path
    written: tuple[Path, ...]


def attack_script(targets: Targets) -> str:
    q = shlex.quote
    emulator_probe = (
        "import os, re, urllib.request\n"
        "found = {}\n"
        "for name in os.listdir('/proc'):\n"
        "    try: text = open(f'/proc/{name}/environ', 'rb').read().decode(errors='replace')\n"
        "    except OSError: continue\n"
        "    found.update(re.findall(r'(AWS_ACCESS_KEY_ID|AWS_SECRET_ACCESS_KEY)=([^\\x00]*)', text))\n"
        "print('credentials found:', sorted(found))\n"
        f"call = urllib.request.Request({targets.emulator_url!r} + '/?Action=ListQueues', method='POST')\n"
        "try:\n"
        "    with urllib.request.urlopen(call, timeout=3) as answer: print('EMULATOR: reachable', answer.status)\n"
        "except Exception as error: print('EMULATOR: unreachable', type(error).__name__, error)\n"
    )
    daemon = (
        f"while :; do echo still-here >> {q(str(targets.daemon_target))}; cp -r {q(str(targets.workspaces_root))}"
        " /tmp/stolen 2>/dev/null; sleep 0.2; done"
    )
    writes = "\n".join(f"(echo pwned > {q(str(path))}) 2>&1 && echo 'WROTE: {path.name}'" for path in targets.written)
    return f"""
echo "== /proc/$PPID/environ (the parent: the worker when unsandboxed)"
tr '\\0' '\\n' < /proc/$PPID/environ 2>&1 | grep -E 'AWS_|TABLE_NAME|QUEUE_URL|WORKSPACES_ROOT' | sed 's/^/  /'
echo "== every /proc/*/environ"
for f in /proc/[0-9]*/environ; do
  tr '\\0' '\\n' < "$f" 2>/dev/null | grep -E 'AWS_(ACCESS|SECRET|SESSION)|TABLE_NAME|QUEUE_URL|WORKSPACES_ROOT' \\
    | sed "s|^|  $f: |"
done
echo "== processes seen: $(ls -d /proc/[0-9]* | wc -l)"
for p in /proc/[0-9]*; do echo "  ${{p#/proc/}}: $(tr '\\0' ' ' < $p/cmdline 2>/dev/null | cut -c1-70)"; done
echo "== the worker's caches"
ls -la {q(str(targets.workspaces_root))} 2>&1 | head -5
grep -rIl "ACME-" {q(str(targets.workspaces_root))} 2>&1 | head -5
grep -rIh "ACME-" {q(str(targets.workspaces_root))} 2>/dev/null | head -5
echo "== acme's remote"
ls {q(str(targets.victim_remote))} 2>&1 | head -5
git --git-dir={q(str(targets.victim_remote))} show main:secret.txt 2>&1 | head -3
echo "== the development key and env files"
cat {q(str(targets.dev_key))} 2>&1 | head -3
for f in {" ".join(q(str(path)) for path in targets.env_files)}; do cat "$f" 2>&1 | head -5; done
echo "== the emulator"
python3 -c {q(emulator_probe)} 2>&1
echo "== a daemon left behind"
setsid sh -c {q(daemon)} {q(targets.daemon_marker)} > /dev/null 2>&1 < /dev/null &
sleep 0.5
echo "daemon started: $(grep -l {q(targets.daemon_marker)} /proc/[0-9]*/cmdline 2>/dev/null | wc -l) process(es)"
echo "== writes outside the checkout"
{writes}
echo "== done"
"""


def host_processes_with(marker: str) -> str:
    return subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True, check=False).stdout


@pytest.fixture(scope="module")
def attack(stack: Stack) -> dict[str, Any]:
    """acme's workspace with a secret, patched and tested; then mallory's hostile test command; then acme's tests
    again (what a daemon left behind would copy). Returns mallory's job as mallory reads it, and what was tried."""
    runtime, root = stack.runtime, stack.root
    victim_remote = stack.register(
        VICTIM, "acme-app", ["python3", "-c", "print('acme tests pass')"], **{"secret.txt": f"{SECRET}\n".encode()}
    )
    patched = run_job(stack.api_url, VICTIM, apply_patch_job("acme-app", "feature.txt", PATCHED))
    assert patched["status"] == "SUCCEEDED", patched
    tested = run_job(stack.api_url, VICTIM, run_tests_job("acme-app"))
    assert tested["status"] == "SUCCEEDED", tested

    marker = f"attack-daemon-{uuid.uuid4().hex}"
    targets = Targets(
        workspaces_root=runtime.workspaces_root,
        victim_remote=victim_remote,
        project=REPO,
        dev_key=dev_key_path(),
        env_files=(REPO / "env.local.json", REPO / ".agent-jobs" / "local.json"),
        emulator_url=str(runtime.endpoint_url),
        daemon_marker=marker,
        daemon_target=root / f"{marker}.txt",
        written=(
            REPO / f"{marker}-in-project.txt",
            Path("/tmp") / f"{marker}-in-host-tmp.txt",
            victim_remote / f"{marker}-in-acme-remote.txt",
            runtime.workspaces_root / f"{marker}-in-caches.txt",
        ),
    )
    # The hostile code is in mallory's repository, as an agent's patch would put it there; the command just runs it.
    stack.register(ATTACKER, "mallory-app", ["sh", "attack.sh"], **{"attack.sh": attack_script(targets).encode()})
    attacked = run_job(stack.api_url, ATTACKER, run_tests_job("mallory-app"))
    processes_after = host_processes_with(marker)
    later = run_job(stack.api_url, VICTIM, run_tests_job("acme-app"))
    time.sleep(1)  # a daemon that survived would have written again by now
    return {
        "job": attacked,
        "later_victim_job": later,
        "targets": targets,
        "processes_after": processes_after,
        "processes_later": host_processes_with(marker),
    }


def output_of(attack: dict[str, Any]) -> str:
    job = attack["job"]
    assert job["status"] == "SUCCEEDED", job  # the hostile command ran: its tests "pass" or "fail", the job succeeds
    output: str = job["result"]["outputTail"]
    print(f"\n--- what mallory's test command saw ---\n{output}--- end ---")
    assert "== done" in output, "the attack script did not run to its end"
    return output


def test_attacker_sees_no_credential_or_worker_setting(attack: dict[str, Any], stack: Stack) -> None:
    output = output_of(attack)
    worker = stack.runtime.function_env[stack.runtime.model.worker.function.function_id]

    for name in ("AWS_ACCESS_KEY_ID=", "AWS_SECRET_ACCESS_KEY=", "AWS_SESSION_TOKEN=", "TABLE_NAME=", "QUEUE_URL="):
        assert name not in output
    assert "WORKSPACES_ROOT=" not in output
    assert worker["TABLE_NAME"] not in output
    assert worker["QUEUE_URL"] not in output
    assert "credentials found: []" in output
    seen = int(output.split("== processes seen: ")[1].split()[0])
    assert seen < 10  # the sandbox's own few processes, none of the worker's or this machine's


def test_attacker_reads_nothing_of_the_other_tenant(attack: dict[str, Any]) -> None:
    output = output_of(attack)

    assert SECRET not in output
    assert PATCHED not in output
    assert "ACME-" not in output
    assert "No such file or directory" in output.split("== the worker's caches")[1]


def test_attacker_reads_no_key_material_or_env_file(attack: dict[str, Any]) -> None:
    output = output_of(attack)
    key_lines = [line for line in dev_key_path().read_text().splitlines() if line and "-----" not in line]

    assert "PRIVATE KEY" not in output
    assert not [line for line in key_lines if line in output]
    assert '"apiUrl"' not in output
    assert '"EnqueueApiFunction"' not in output


def test_attacker_cannot_reach_the_emulator(attack: dict[str, Any]) -> None:
    output = output_of(attack)

    assert "EMULATOR: unreachable" in output
    assert "EMULATOR: reachable" not in output


def test_attacker_leaves_no_process_behind(attack: dict[str, Any]) -> None:
    output = output_of(attack)
    targets: Targets = attack["targets"]

    assert "daemon started: " in output  # the daemon did start, inside the sandbox
    assert attack["processes_after"] == ""
    assert attack["processes_later"] == ""
    assert not targets.daemon_target.exists()
    assert attack["later_victim_job"]["result"]["outcome"] == "passed"


def test_attacker_writes_nothing_outside_its_checkout(attack: dict[str, Any]) -> None:
    output_of(attack)
    targets: Targets = attack["targets"]

    assert [path for path in targets.written if path.exists()] == []
    assert not (Path("/tmp") / "stolen").exists()


# --- the sandbox still runs tests ----------------------------------------------------------------------------------


def test_workers_reach_the_sandbox_function_through_the_local_endpoint(stack: Stack) -> None:
    runtime = stack.runtime
    endpoint = runtime.lambda_endpoint
    assert endpoint is not None
    assert endpoint.sandbox_error is None
    worker = runtime.function_env[runtime.model.worker.function.function_id]

    assert worker["AWS_ENDPOINT_URL_LAMBDA"] == endpoint.url
    assert worker["TEST_SANDBOX_FUNCTION"] == endpoint.function_name("TestSandboxFunction")
    assert runtime.model.function_settings("TestSandboxFunction").tenant_isolation_mode == "PER_TENANT"


def test_sandbox_runs_a_passing_and_a_failing_test_command(stack: Stack) -> None:
    stack.register("acme", "acme-passing", ["sh", "-c", "echo all green; python3 -c 'print(6 * 7)'"])
    stack.register("acme", "acme-failing", ["sh", "-c", "echo one red >&2; exit 4"])

    passing = run_job(stack.api_url, "acme", run_tests_job("acme-passing"))
    failing = run_job(stack.api_url, "acme", run_tests_job("acme-failing"))

    assert passing["status"] == failing["status"] == "SUCCEEDED"
    assert passing["result"]["outcome"] == "passed"
    assert "all green" in passing["result"]["outputTail"]
    assert "42" in passing["result"]["outputTail"]
    assert (failing["result"]["outcome"], failing["result"]["exitCode"]) == ("failed", 4)
    assert "one red" in failing["result"]["outputTail"]


def test_without_bwrap_run_tests_fails_naming_the_package_and_nothing_runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = tmp_path_factory.mktemp("no-bwrap")
    ran = root / "the-command-ran"
    with start_stack(root, bwrap=str(root / "bin" / "bwrap")) as no_bwrap:
        endpoint = no_bwrap.runtime.lambda_endpoint
        assert endpoint is not None
        assert endpoint.sandbox_error is not None
        assert "apt-get install bubblewrap" in endpoint.sandbox_error
        no_bwrap.register("acme", "acme-unsandboxed", ["sh", "-c", f"touch {shlex.quote(str(ran))}"])

        job = run_job(no_bwrap.api_url, "acme", run_tests_job("acme-unsandboxed"))

        assert endpoint.invocations == 0
    assert job["status"] == "DEAD", job
    assert "apt-get install bubblewrap" in str(job["error"])
    assert job["result"] is None
    assert not ran.exists()
