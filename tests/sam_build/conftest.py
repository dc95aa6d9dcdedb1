"""The real `sam build`, run once per session for each target: the Lambda platform (arm64, the defaults of
layers/shared/Makefile) and this machine (so the built handlers can run here).

Every test in this folder is marked `build` (`make test-fast` leaves them out): the layer build installs wheels from
the package registry.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.resolve().parents:
            item.add_marker(pytest.mark.build)


def local_layer_platform() -> str:
    """The manylinux platform tag of this machine, for LAYER_PLATFORM."""
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        return "manylinux2014_x86_64"
    if machine in ("aarch64", "arm64"):
        return "manylinux2014_aarch64"
    raise pytest.UsageError(f"no manylinux wheels for this machine ({machine}): the local build needs x86_64 or arm64")


def local_python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def sam_build(build_dir: Path, **environment: str) -> Path:
    """`sam build` from the repository root into `build_dir` (never the cache: the layer's target platform comes from
    the environment, which sam's cache key does not include). Returns `build_dir`."""
    env = {
        **os.environ,
        **environment,
        "SAM_CLI_TELEMETRY": "0",
        # The layer Makefile runs `python3 -m pip`: this interpreter's environment, as `make build` arranges.
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    command = [str(BIN / "sam"), "build", "--build-dir", str(build_dir), "--no-cached", "--parallel"]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    if result.returncode != 0:
        pytest.fail(f"sam build failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return build_dir


@pytest.fixture(scope="session")
def arm64_build_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The build as deployed: the layer cross-installed for Lambda's arm64 python3.13."""
    return sam_build(tmp_path_factory.mktemp("sam-arm64") / "build")


@pytest.fixture(scope="session")
def local_build_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same build with the layer's wheels for this machine and this interpreter: a `.aws-sam/build`-like folder
    with EnqueueApiFunction/, JobWorkerFunction/ and SharedLayer/python, whose handlers can run here."""
    return sam_build(
        tmp_path_factory.mktemp("sam-local") / "build",
        LAYER_PLATFORM=local_layer_platform(),
        LAYER_PYTHON_VERSION=local_python_version(),
    )
