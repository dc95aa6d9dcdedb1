"""`sam local` for real: a container engine, the Lambda Python base image, and the documented `sam local` commands.

Every test in this folder is marked `sam_local` (and `build`, so `make test-fast` leaves them out with the other `sam
build` tests); `make sam-local` runs them alone. They need Docker: when it is missing and this runs as root with
apt-get (CI), Debian's docker.io is installed and its daemon started for the test run; the base image SAM runs the
functions in is pulled, or, when no registry can be reached, built from Debian packages and PyPI by
tools/build_lambda_image.sh under the same name. Only where no container engine can run at all are the tests skipped,
saying why.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
DOCKERD_LOG = Path("/tmp/agent-jobs-dockerd.log")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.resolve().parents:
            item.add_marker(pytest.mark.sam_local)
            item.add_marker(pytest.mark.build)


def lambda_architecture() -> str:
    """This machine's Lambda architecture: the functions run natively (arm64 under emulation is far too slow)."""
    machine = platform.machine().lower()
    return "arm64" if machine in ("aarch64", "arm64") else "x86_64"


def base_image(architecture: str) -> str:
    """The image SAM CLI runs python3.13 functions in (it names the architecture in the tag)."""
    return f"public.ecr.aws/lambda/python:3.13-{architecture}"


def _run(command: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


def _docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return _run(["docker", "info"], timeout=30).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _apt_install(*packages: str) -> str | None:
    """Install Debian `packages` when this runs as root with apt-get (refreshing the lists only if the first try
    fails); None when done, else why not."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return f"not root with apt-get: install {' '.join(packages)} yourself"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", *packages]
    if subprocess.run(install, capture_output=True, env=env, timeout=900, check=False).returncode == 0:
        return None
    subprocess.run(["apt-get", "update", "-qq"], capture_output=True, env=env, timeout=600, check=False)
    done = subprocess.run(install, capture_output=True, text=True, env=env, timeout=900, check=False)
    return None if done.returncode == 0 else f"apt-get install {' '.join(packages)} failed: {done.stderr[-500:]}"


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[None]:
    """A Docker daemon that answers: the one running, else Debian's docker.io installed (as root) and its daemon
    started for this test run (stopped at its end)."""
    started: subprocess.Popen[bytes] | None = None
    if not _docker_answers():
        if shutil.which("dockerd") is None:
            problem = _apt_install("docker.io")
            if problem is not None:
                pytest.skip(f"no container engine: Docker is not installed and cannot be ({problem})")
        if os.geteuid() != 0:
            pytest.skip("no container engine: the Docker daemon is not running and only root can start it")
        with DOCKERD_LOG.open("ab") as log:
            started = subprocess.Popen(
                ["dockerd"], stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )
        deadline = time.monotonic() + 60
        while not _docker_answers():
            if started.poll() is not None or time.monotonic() > deadline:
                tail = DOCKERD_LOG.read_text(errors="replace")[-800:]
                started.kill()
                pytest.skip(f"no container engine: dockerd did not start here (its log ends: {tail})")
            time.sleep(1)
    yield
    if started is not None:
        started.terminate()
        try:
            started.wait(timeout=30)
        except subprocess.TimeoutExpired:
            started.kill()


@pytest.fixture(scope="session")
def lambda_image(docker_engine: None) -> str:
    """The Lambda Python base image for this machine: present, else pulled, else (no registry reachable) built by
    tools/build_lambda_image.sh under the same name. Reused by name on later runs."""
    architecture = lambda_architecture()
    image = base_image(architecture)
    if _run(["docker", "image", "inspect", image]).returncode == 0:
        return image
    try:
        if _run(["docker", "pull", image], timeout=300).returncode == 0:
            return image
    except subprocess.TimeoutExpired:
        pass
    if shutil.which("debootstrap") is None:
        problem = _apt_install("debootstrap")
        if problem is not None:
            pytest.fail(f"{image} cannot be pulled and its stand-in needs debootstrap: {problem}")
    built = subprocess.run(
        ["bash", str(REPO / "tools" / "build_lambda_image.sh"), architecture],
        cwd=REPO,
        env={**os.environ, "PROJECT_DIR": str(REPO)},
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    if built.returncode != 0:
        pytest.fail(f"{image} could not be pulled, nor built:\n{built.stderr[-3000:]}")
    return image


@pytest.fixture(scope="session")
def command_line_tools(docker_engine: None) -> None:
    """jq and curl, which the documented commands use."""
    missing = [tool for tool in ("jq", "curl") if shutil.which(tool) is None]
    if missing:
        problem = _apt_install(*missing)
        if problem is not None:
            pytest.fail(f"the documented sam local commands need {', '.join(missing)}: {problem}")
