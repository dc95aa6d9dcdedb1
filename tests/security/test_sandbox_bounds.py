"""A tenant's test command against the sandbox's bounds, on the local runtime: the whole system over HTTP, the
worker's real processes and run_tests through the test sandbox function in bubblewrap.

The attacker tenant `mallory` registers test commands that run scripts of its own repository: a memory hog, a fork
bomb, a disk filler in /tmp and one outside it. Each must end as its own job's failure, saying which bound and what
to do, while the victim tenant `acme`'s tests, run at the same moment in another sandbox, pass, and nothing is left
on this machine: no process and no cgroup. The sandbox runs with 256 MB of memory and 512 MB of /tmp (the template's
smallest SandboxMemorySize and SandboxEphemeralStorage, through the same parameters), so a hog meets its bound fast,
and with one attempt per job, so a job that fails ends DEAD at once. The whole module runs in a process tree capped
at a few thousand processes, so even a sandbox that failed to bound the bomb could not take this machine down.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from agent_jobs_local.sandbox_bounds import LAMBDA_MAX_TASKS
from agent_jobs_local.sandbox_cgroups import SANDBOX_PREFIX, owner_tag
from tests.process_guard import guarded_process_tree
from tests.security.test_sandbox_attacks import SETTLED, Stack, request, run_tests_job, start_stack

MEMORY_MB, STORAGE_MB = 256, 512
VICTIM, ATTACKER = "acme", "mallory"
MARKER = f"bounds-attack-{uuid.uuid4().hex}"
VICTIM_TESTS = "sleep 1; for i in 1 2 3 4 5; do sh -c 'exit 0' & done; wait; echo acme tests pass"

# Each attack stops by itself (at most a few times its bound), however the sandbox fares.
HOG = f"""
held = []
for step in range({3 * MEMORY_MB} // 16):
    held.append(b"x" * (16 << 20))
print("ALLOCATED", len(held) * 16, "MB")
"""
# Each child a `sleep` named by a number of its own, so that any left on this machine would be found.
SLEEPER = f"4.{uuid.uuid4().int % 10**9:09d}"
FORK_BOMB = f"""
started=0
while [ $started -lt 3000 ]; do sleep {SLEEPER} & started=$((started + 1)); done
echo FORKED $started
"""
TMP_FILLER = f"""
dd if=/dev/zero of="$TMPDIR/fill" bs=1M count={2 * STORAGE_MB} 2>&1 | tail -2
dd if=/dev/zero of=/tmp/more bs=1M count=16 2>&1 | head -1
ls -l "$TMPDIR/fill"
exit 1
"""
OUTSIDE_TARGETS = ("/filled", "/var/filled", "/var/task/filled", "/dev/shm/filled", "/etc/filled", "/usr/filled")
OUTSIDE_FILLER = (
    "failed=0\n"
    + "".join(
        f"dd if=/dev/zero of={target} bs=1M count=600 2>&1 | head -1; [ -e {target} ] || failed=1\n"
        for target in OUTSIDE_TARGETS
    )
    + "exit $failed\n"
)


def submit(stack: Stack, tenant: str, workspace_id: str) -> str:
    job = run_tests_job(workspace_id)
    request(stack.api_url, "POST", "/jobs", tenant, job)
    return str(job["jobId"])


def settle(stack: Stack, tenant: str, job_id: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen: dict[str, Any] = request(stack.api_url, "GET", f"/jobs/{job_id}", tenant)
        if seen.get("status") in SETTLED:
            return seen
        time.sleep(0.2)
    raise AssertionError(f"{job_id} did not settle within {timeout} s")


def host_processes_with(marker: str) -> str:
    return subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True, check=False).stdout


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    overrides = {"SandboxMemorySize": MEMORY_MB, "SandboxEphemeralStorage": STORAGE_MB, "MaxAttempts": 1}
    with (
        guarded_process_tree(),
        start_stack(tmp_path_factory.mktemp("bounds"), parameter_overrides=overrides) as started,
    ):
        endpoint = started.runtime.lambda_endpoint
        assert endpoint is not None
        if endpoint.bound_warnings:
            pytest.skip(f"this machine cannot bound sandboxes: {endpoint.bound_warnings}")
        started.register(VICTIM, "acme-app", ["sh", "-c", VICTIM_TESTS])
        yield started


def attack(stack: Stack, name: str, argv: list[str], script: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """mallory's tests running `script` (a file of its repository named after the marker) while acme's run in
    another sandbox: (mallory's job, acme's job), both as their tenants read them."""
    workspace_id = f"mallory-{name}"
    stack.register(ATTACKER, workspace_id, [*argv, f"{MARKER}-{name}"], **{f"{MARKER}-{name}": script.encode()})
    attacker_job = submit(stack, ATTACKER, workspace_id)
    victim_job = submit(stack, VICTIM, "acme-app")
    return settle(stack, ATTACKER, attacker_job), settle(stack, VICTIM, victim_job)


def assert_victim_passed(victim: dict[str, Any]) -> None:
    assert victim["status"] == "SUCCEEDED", victim
    assert victim["result"]["outcome"] == "passed", victim["result"]
    assert "acme tests pass" in victim["result"]["outputTail"]


def test_memory_hog_fails_its_own_job_naming_the_memory_bound(stack: Stack) -> None:
    attacked, victim = attack(stack, "hog", ["python3"], HOG)

    assert attacked["status"] == "DEAD", attacked
    assert "Runtime.OutOfMemory" in attacked["error"]
    assert f"more than its {MEMORY_MB} MB of memory (SandboxMemorySize)" in attacked["error"]
    assert "raise SandboxMemorySize" in attacked["error"]
    assert_victim_passed(victim)
    assert host_processes_with(MARKER) == ""


def test_fork_bomb_fails_its_own_job_naming_the_process_bound(stack: Stack) -> None:
    attacked, victim = attack(stack, "bomb", ["sh"], FORK_BOMB)

    assert attacked["status"] == "DEAD", attacked
    assert "Sandbox.ProcessLimit" in attacked["error"]
    assert f"more than {LAMBDA_MAX_TASKS:,} processes and threads" in attacked["error"]
    assert_victim_passed(victim)
    assert host_processes_with(MARKER) == ""
    assert host_processes_with(f"sleep {SLEEPER}") == ""


def test_tmp_filler_fails_its_own_tests_at_the_ephemeral_storage(stack: Stack) -> None:
    attacked, victim = attack(stack, "tmp", ["sh"], TMP_FILLER)

    assert attacked["status"] == "SUCCEEDED", attacked
    result = attacked["result"]
    assert result["outcome"] == "failed"
    assert "No space left on device" in result["outputTail"]
    filled = int(result["outputTail"].splitlines()[-1].split()[4])
    assert filled <= STORAGE_MB * 1024 * 1024
    assert f"all {STORAGE_MB} MB of the function's ephemeral storage" in result["limitReached"]
    assert "raise SandboxEphemeralStorage" in result["limitReached"]
    assert_victim_passed(victim)


def test_filler_outside_tmp_writes_nothing(stack: Stack) -> None:
    attacked, victim = attack(stack, "outside", ["sh"], OUTSIDE_FILLER)

    assert attacked["status"] == "SUCCEEDED", attacked
    result = attacked["result"]
    assert result["outcome"] == "failed"
    refusals = [line for line in result["outputTail"].splitlines() if "Read-only file system" in line]
    assert len(refusals) == len(OUTSIDE_TARGETS), result["outputTail"]
    assert "limitReached" not in result
    assert_victim_passed(victim)


def test_after_the_attacks_jobs_run_and_nothing_is_left(stack: Stack) -> None:
    # The attacks ran first (pytest keeps a module's order); a new workspace of the attacker's and the victim's run
    stack.register(ATTACKER, "mallory-honest", ["sh", "-c", "echo honest tests pass"])
    honest = settle(stack, ATTACKER, submit(stack, ATTACKER, "mallory-honest"))
    victim = settle(stack, VICTIM, submit(stack, VICTIM, "acme-app"))

    assert honest["status"] == "SUCCEEDED", honest
    assert (honest["result"]["outcome"], honest["result"]["outputTail"]) == ("passed", "honest tests pass\n")
    assert_victim_passed(victim)
    assert host_processes_with(MARKER) == ""
    # Only the sandboxes started ahead for the next invocations still have a cgroup: none of a finished run
    endpoint = stack.runtime.lambda_endpoint
    assert endpoint is not None
    assert endpoint.bounds is not None
    tag = f"{SANDBOX_PREFIX}{owner_tag()}-"
    names = {
        folder.name
        for place in endpoint.bounds.places.values()
        for folder in place.parent.iterdir()
        if folder.name.startswith(tag)
    }
    assert len(names) <= endpoint.ready_sandboxes + 1, json.dumps(sorted(names))
