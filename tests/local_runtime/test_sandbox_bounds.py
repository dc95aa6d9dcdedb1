"""The local sandbox's bounds, as Lambda bounds the function it stands for: memory at MemorySize (with /tmp's files
apart, since /tmp is disk in Lambda), 1,024 processes and threads, nothing writable but /tmp, and /tmp at
EphemeralStorage. A sandbox past its memory or process bound is ended and its invocation names the bound; its cgroup
goes with it, and the next sandbox runs as if nothing happened. The attacks through the whole stack are in
tests/security/test_sandbox_bounds.py."""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from agent_jobs_local.lambda_endpoint import LocalLambdaEndpoint
from agent_jobs_local.sandbox_bounds import LAMBDA_MAX_TASKS, SandboxBounds
from agent_jobs_local.sandbox_cgroups import SANDBOX_PREFIX, owner_tag, parse_mountinfo, parse_proc_cgroup
from agent_jobs_local.template import TemplateModel
from tests.process_guard import guarded_process_tree

SHELL_HANDLER = """
import subprocess

def handler(event, context):
    done = subprocess.run(["sh", "-c", event["script"]], capture_output=True, text=True)
    return {"out": done.stdout[-4000:], "err": done.stderr[-4000:], "code": done.returncode}
"""
MB = 1024 * 1024
# Allocates `mb` MB in 16 MB pieces, then stops: however the bound fares, the test never takes more.
HOG = "held = []\nfor _ in range({mb} // 16):\n    held.append(b'x' * (16 << 20))\nprint('allocated', {mb})\n"
# Forks `sleep`s until refused or 2,000 of them, each ending in 5 s: a bomb that ends by itself, run in a guarded
# tree. Small processes, so that it meets the process bound before the memory bound.
FORK_BOMB = "started=0; while [ $started -lt 2000 ]; do sleep 5 & started=$((started + 1)); done; echo $started"


def bounded_template(code_uri: str, memory_mb: int = 128, storage_mb: int = 512) -> dict[str, Any]:
    """A per-tenant function whose MemorySize, like the test sandbox's, comes from a template parameter."""
    properties = {
        "CodeUri": code_uri,
        "Handler": "shell.handler",
        "Runtime": "python3.13",
        "Timeout": 30,
        "MemorySize": {"Ref": "ProbeMemorySize"},
        "EphemeralStorage": {"Size": storage_mb},
        "TenancyConfig": {"TenantIsolationMode": "PER_TENANT"},
    }
    return {
        "Parameters": {"ProbeMemorySize": {"Type": "Number", "Default": memory_mb}},
        "Resources": {"ProbeFunction": {"Type": "AWS::Serverless::Function", "Properties": properties}},
    }


@pytest.fixture
def shell_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "shell"
    folder.mkdir()
    (folder / "shell.py").write_text(SHELL_HANDLER, encoding="utf-8")
    return folder


def start_endpoint(shell_dir: Path, **template: Any) -> LocalLambdaEndpoint:
    model = TemplateModel(bounded_template(shell_dir.name, **template), stack_name="bounds-test")
    return LocalLambdaEndpoint(model, template_dir=shell_dir.parent, ready_sandboxes=1).start()


@pytest.fixture
def endpoint(shell_dir: Path) -> Iterator[LocalLambdaEndpoint]:
    started = start_endpoint(shell_dir)
    if started.bound_warnings:
        started.stop()
        pytest.skip(f"this machine cannot bound sandboxes: {started.bound_warnings}")
    try:
        yield started
    finally:
        started.stop()


def run(endpoint: LocalLambdaEndpoint, script: str, tenant: str = "acme") -> tuple[str | None, Any]:
    """(FunctionError, payload) of one invocation of `script` in the sandbox."""
    client = boto3.client(
        "lambda",
        endpoint_url=endpoint.url,
        region_name="us-east-1",
        config=Config(retries={"total_max_attempts": 1}, read_timeout=120),
    )
    answer = client.invoke(
        FunctionName="bounds-test-ProbeFunction", TenantId=tenant, Payload=json.dumps({"script": script})
    )
    return answer.get("FunctionError"), json.loads(answer["Payload"].read())


def python(code: str) -> str:
    return f"python3 -c {shlex.quote(code)}"


def own_cgroups(endpoint: LocalLambdaEndpoint) -> set[str]:
    """The names of the sandbox cgroups this process has made and not removed (one per sandbox, in each place)."""
    assert endpoint.bounds is not None
    tag = f"{SANDBOX_PREFIX}{owner_tag()}-"
    parents = {place.parent for place in endpoint.bounds.places.values()}
    return {folder.name for parent in parents for folder in parent.iterdir() if folder.name.startswith(tag)}


def test_memory_hog_ends_its_sandbox_naming_the_memory_size_and_its_setting(endpoint: LocalLambdaEndpoint) -> None:
    error, payload = run(endpoint, python(HOG.format(mb=3 * 128)))

    assert error == "Unhandled"
    assert payload["errorType"] == "Runtime.OutOfMemory"
    assert "more than its 128 MB of memory (ProbeMemorySize)" in payload["errorMessage"]
    assert "raise ProbeMemorySize" in payload["errorMessage"]


@pytest.mark.parametrize(
    "code",
    [
        # shared anonymous memory: the kernel counts it with tmpfs files, yet it is not /tmp
        "import mmap\nm = mmap.mmap(-1, 384 << 20)\nfor i in range(0, len(m), 4096): m[i] = 1\nprint('held')",
        # a memory file outside any file system
        "import os\nfd = os.memfd_create('hog')\nfor _ in range(24): os.write(fd, b'x' * (16 << 20))\nprint('held')",
    ],
    ids=["shared-mapping", "memfd"],
)
def test_memory_hidden_from_the_heap_counts_too(endpoint: LocalLambdaEndpoint, code: str) -> None:
    error, payload = run(endpoint, python(code))

    assert (error, payload["errorType"]) == ("Unhandled", "Runtime.OutOfMemory")


def test_files_in_tmp_do_not_count_against_memory(endpoint: LocalLambdaEndpoint) -> None:
    # Given /tmp holding 300 MB, more than the function's 128 MB of memory (in Lambda /tmp is disk, not memory)
    script = f"dd if=/dev/zero of=/tmp/kept bs=1M count=300 2>&1 | tail -1; {python(HOG.format(mb=64))}"

    error, payload = run(endpoint, script)

    # Then the run goes on with its 64 MB of memory
    assert error is None, payload
    assert "allocated 64" in payload["out"]


def test_tmp_holds_its_ephemeral_storage_and_no_more(endpoint: LocalLambdaEndpoint) -> None:
    error, payload = run(endpoint, "dd if=/dev/zero of=/tmp/fill bs=1M count=700; ls -l /tmp/fill")

    assert error is None, payload
    assert "No space left on device" in payload["err"]
    size = int(payload["out"].split()[4])
    assert 500 * MB <= size <= 512 * MB


def test_nothing_outside_tmp_is_writable(endpoint: LocalLambdaEndpoint) -> None:
    targets = ["/filled", "/var/filled", "/var/task/filled", "/dev/shm/filled", "/dev/filled", "/usr/filled"]
    script = "; ".join(f"dd if=/dev/zero of={target} bs=1M count=64 2>&1 | head -1" for target in targets)

    error, payload = run(endpoint, script)

    assert error is None, payload
    lines = payload["out"].splitlines()
    assert len(lines) == len(targets)
    assert all("Read-only file system" in line for line in lines), lines


def test_fork_bomb_ends_its_sandbox_at_lambdas_process_limit(shell_dir: Path) -> None:
    with guarded_process_tree():
        endpoint = start_endpoint(shell_dir, memory_mb=512)
        try:
            error, payload = run(endpoint, FORK_BOMB)
            after_error, after = run(endpoint, "echo next run")
        finally:
            endpoint.stop()

    assert error == "Unhandled"
    assert payload["errorType"] == "Sandbox.ProcessLimit"
    assert f"more than {LAMBDA_MAX_TASKS:,} processes and threads" in payload["errorMessage"]
    assert (after_error, after["out"]) == (None, "next run\n")


def test_threads_count_against_the_process_limit(shell_dir: Path) -> None:
    code = (
        "import threading, time\n"
        "threads = [threading.Thread(target=time.sleep, args=(3,)) for _ in range(1100)]\n"
        "[thread.start() for thread in threads]\nprint('all started')"
    )
    with guarded_process_tree():
        endpoint = start_endpoint(shell_dir, memory_mb=512)
        try:
            error, payload = run(endpoint, python(code))
        finally:
            endpoint.stop()

    assert (error, payload["errorType"]) == ("Unhandled", "Sandbox.ProcessLimit")


def test_sandbox_can_neither_see_nor_leave_its_cgroup(endpoint: LocalLambdaEndpoint) -> None:
    # Given the host paths where the sandboxes' cgroups are, as an attacker could guess them
    assert endpoint.bounds is not None
    parents = sorted({str(place.parent) for place in endpoint.bounds.places.values()})
    attempts = [f"echo 1 > {parent}/cgroup.procs" for parent in parents]
    attempts += [f"echo 1 > {parent}/cgroup.procs" for parent in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup/memory")]
    attempts += ["ls /sys/fs/cgroup", "mkdir -p /tmp/cg && mount -t cgroup -o pids none /tmp/cg"]
    script = "; ".join(f"({attempt}) >/dev/null 2>&1 && echo ESCAPED: {attempt}" for attempt in attempts)

    error, payload = run(endpoint, f"{script}; cat /proc/self/cgroup")

    # Then there is no cgroup file system to write to and none can be mounted; its own cgroup is its namespace's root
    assert error is None, payload
    assert "ESCAPED" not in payload["out"], payload["out"]
    own = payload["out"].splitlines()
    assert own
    assert all(line.endswith(":/") for line in own), own


def test_each_sandbox_cgroup_goes_with_its_sandbox(shell_dir: Path) -> None:
    endpoint = start_endpoint(shell_dir)
    try:
        if endpoint.bound_warnings:
            pytest.skip(f"this machine cannot bound sandboxes: {endpoint.bound_warnings}")
        run(endpoint, python(HOG.format(mb=3 * 128)))
        run(endpoint, "echo ok")
        # the ready sandbox's cgroup only, and the one being started
        assert 1 <= len(own_cgroups(endpoint)) <= 2
    finally:
        endpoint.stop()

    assert own_cgroups(endpoint) == set()


def test_cgroups_a_killed_runtime_left_are_removed_at_start(shell_dir: Path) -> None:
    bounds = SandboxBounds.detect()
    if bounds.warnings:
        pytest.skip(f"this machine cannot bound sandboxes: {bounds.warnings}")
    parent = bounds.places["pids"].parent
    # Given a runtime, killed, that left a cgroup with a process still in it, a live runtime's cgroup, and one of a
    # runtime in another PID namespace (its pid, dead here, may be alive there)
    killed = subprocess.Popen(["sleep", "60"])
    killed_tag = owner_tag(killed.pid)
    assert killed_tag is not None
    killed.kill()
    killed.wait()
    leftover = parent / f"{SANDBOX_PREFIX}{killed_tag}-0"
    leftover.mkdir()
    straggler = subprocess.Popen(["sleep", "60"])
    (leftover / "cgroup.procs").write_text(str(straggler.pid))
    live = subprocess.Popen(["sleep", "60"])
    alive = parent / f"{SANDBOX_PREFIX}{owner_tag(live.pid)}-0"
    alive.mkdir()
    foreign = parent / f"{SANDBOX_PREFIX}1-{killed.pid}-{killed_tag.split('-')[2]}-0"
    foreign.mkdir()
    try:
        # When a runtime starts
        endpoint = start_endpoint(shell_dir)
        endpoint.stop()

        # Then the dead runtime's cgroup and its process are gone, the others untouched
        assert straggler.wait(timeout=10) == -9
        assert not leftover.exists()
        assert alive.exists()
        assert foreign.exists()
    finally:
        for process in (straggler, live):
            process.kill()
            process.wait()
        for folder in (leftover, alive, foreign):
            if folder.exists():
                folder.rmdir()


def test_machine_without_cgroups_says_which_bounds_it_cannot_hold(
    shell_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a machine with no cgroup file system mounted
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("22 1 0:21 / /proc rw,nosuid - proc proc rw\n")
    bounds = SandboxBounds.detect(mountinfo=mountinfo)
    model = TemplateModel(bounded_template(shell_dir.name), stack_name="bounds-test")

    # When the endpoint starts
    with (
        caplog.at_level(logging.WARNING, logger="agent_jobs_local.lambda_endpoint"),
        LocalLambdaEndpoint(model, template_dir=shell_dir.parent, bounds=bounds, ready_sandboxes=1) as endpoint,
    ):
        error, payload = run(endpoint, "echo still runs")

    # Then it warns, once per bound, naming it and why; and sandboxes still run, with the bounds rlimits give
    memory, processes = endpoint.bound_warnings
    assert memory.startswith("sandbox memory is not bounded: no cgroup file system with the memory controller")
    expected = "bounded by RLIMIT_NPROC only" if os.geteuid() != 0 else "RLIMIT_NPROC does not hold root"
    assert expected in processes
    assert [record.getMessage().split(": ", 1)[1] for record in caplog.records] == [memory, processes]
    assert (error, payload["out"]) == (None, "still runs\n")


def test_cgroup_files_are_read_as_the_kernel_writes_them() -> None:
    mountinfo = (
        "30 25 0:26 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n"
        "31 25 0:27 / /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids\n"
        "32 25 0:28 /ns /sys/fs/cgroup/my\\040unified rw - cgroup2 cgroup2 rw\n"
    )
    own = "8:pids:/\n4:memory:/runner/job-1\n1:name=systemd:/\n0::/ns/leaf\n"

    mounts = parse_mountinfo(mountinfo)

    assert [(mount.version, str(mount.mount_point), mount.root, set(mount.controllers)) for mount in mounts] == [
        (1, "/sys/fs/cgroup/memory", "/", {"memory"}),
        (1, "/sys/fs/cgroup/pids", "/", {"pids"}),
        (2, "/sys/fs/cgroup/my unified", "/ns", set()),
    ]
    assert parse_proc_cgroup(own) == {"pids": "/", "memory": "/runner/job-1", "": "/ns/leaf"}
