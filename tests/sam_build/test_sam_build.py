"""`sam build` without Docker: the layer's wheels are cross-installed for Lambda's platform, the functions' code and
the agent_jobs package land where Lambda looks for them (/var/task and /opt/python)."""

from __future__ import annotations

import os
import platform
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from agent_jobs_local.template import DEFAULT_TEMPLATE_PATH, TemplateModel

pytestmark = pytest.mark.build

ELF_MACHINE_X86_64 = 62
ELF_MACHINE_AARCH64 = 183
LAMBDA_UNZIPPED_LIMIT_BYTES = 250 * 1024 * 1024
REPO = DEFAULT_TEMPLATE_PATH.parent


def elf_machine(path: Path) -> int:
    """e_machine of an ELF file (offset 18; byte order from EI_DATA)."""
    header = path.read_bytes()[:20]
    assert header[:4] == b"\x7fELF", f"{path} is not an ELF file"
    byte_order = "<" if header[5] == 1 else ">"
    (machine,) = struct.unpack(f"{byte_order}H", header[18:20])
    return int(machine)


def pydantic_core_extension(layer_python: Path) -> Path:
    (extension,) = (layer_python / "pydantic_core").glob("_pydantic_core*.so")
    return extension


def relative_files(root: Path) -> set[str]:
    return {str(path.relative_to(root)) for path in root.rglob("*") if path.is_file()}


def test_sam_build_cross_installs_the_layer_for_arm64(arm64_build_dir: Path) -> None:
    layer_python = arm64_build_dir / "SharedLayer" / "python"
    extension = pydantic_core_extension(layer_python)
    assert "cpython-313-aarch64-linux-gnu" in extension.name
    assert elf_machine(extension) == ELF_MACHINE_AARCH64


def test_sam_build_puts_the_agent_jobs_package_in_the_layer(arm64_build_dir: Path) -> None:
    source = REPO / "layers" / "shared" / "agent_jobs"
    built = arm64_build_dir / "SharedLayer" / "python" / "agent_jobs"
    assert (built / "__init__.py").is_file()
    expected = {name for name in relative_files(source) if "__pycache__" not in name}
    # and what its wheels were built for, which importing agent_jobs checks
    assert relative_files(built) == expected | {"BUILD_PLATFORM"}
    assert (built / "BUILD_PLATFORM").read_text() == "manylinux2014_aarch64\n"


def test_a_layer_for_the_other_architecture_refuses_to_load_saying_what_to_build(arm64_build_dir: Path) -> None:
    # Given the arm64 layer (deployed with the default Architecture), imported on this machine as if a function of the
    # other architecture ran it
    layer_python = arm64_build_dir / "SharedLayer" / "python"
    if platform.machine().lower() in ("aarch64", "arm64"):
        pytest.skip("this machine is arm64: the arm64 layer is the right one here")

    result = subprocess.run(
        [sys.executable, "-c", "import agent_jobs.models"],
        env={**os.environ, "PYTHONPATH": str(layer_python)},
        capture_output=True,
        text=True,
        check=False,
    )

    # Then the import fails saying what to do, before a native module fails to load
    assert result.returncode != 0
    assert "built for arm64 (manylinux2014_aarch64) but this function runs on x86_64" in result.stderr
    assert "make build ARCHITECTURE=x86_64" in result.stderr


def test_sam_build_layer_leaves_the_runtime_sdk_out(arm64_build_dir: Path) -> None:
    # Given the Lambda runtime ships boto3 and botocore, a second copy in /opt/python would shadow them
    layer_python = arm64_build_dir / "SharedLayer" / "python"
    for package in (
        "aws_lambda_powertools",
        "pydantic",
        "pydantic_settings",
        "aws_xray_sdk",
        "dulwich",
        "unidiff",
        "urllib3",
    ):
        assert (layer_python / package).is_dir(), package
    for package in ("boto3", "botocore", "s3transfer", "bin"):
        assert not (layer_python / package).exists(), package


def test_sam_build_stays_within_lambda_size_limit(arm64_build_dir: Path) -> None:
    size = sum(path.stat().st_size for path in arm64_build_dir.rglob("*") if path.is_file())
    assert size < LAMBDA_UNZIPPED_LIMIT_BYTES


@pytest.mark.parametrize("function_id", ["EnqueueApiFunction", "JobWorkerFunction", "TestSandboxFunction"])
def test_sam_build_ships_each_function_code_without_build_files(arm64_build_dir: Path, function_id: str) -> None:
    model = TemplateModel.from_path()
    settings = model.function_settings(function_id)
    source, built = REPO / settings.code_uri, arm64_build_dir / function_id
    package = settings.handler.split(".", 1)[0]  # each function folder holds one package, named by its Handler
    expected = {name for name in relative_files(source) if "__pycache__" not in name and name.startswith(f"{package}/")}
    assert relative_files(built) == expected
    handler_module = settings.handler.rsplit(".", 1)[0].replace(".", "/")
    handler_file = built / f"{handler_module}.py"
    if not handler_file.is_file():
        handler_file = built / handler_module / "__init__.py"  # the handler module is a package
    assert handler_file.is_file(), f"{function_id} handler {settings.handler} was not built"


def test_sam_build_for_this_machine_builds_an_importable_layer(local_build_dir: Path) -> None:
    layer_python = local_build_dir / "SharedLayer" / "python"
    expected_machine = ELF_MACHINE_AARCH64 if platform.machine().lower() in ("aarch64", "arm64") else ELF_MACHINE_X86_64
    extension = pydantic_core_extension(layer_python)
    assert f"cpython-{sys.version_info.major}{sys.version_info.minor}" in extension.name
    assert elf_machine(extension) == expected_machine

    # When this interpreter imports the layer first on its path, as Lambda puts /opt/python
    probe = "import agent_jobs, aws_lambda_powertools, pydantic_core, pydantic_settings; print(pydantic_core.__file__)"
    result = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "PYTHONPATH": str(layer_python)},
        capture_output=True,
        text=True,
        check=False,
    )

    # Then the layer's own compiled pydantic_core is the one loaded
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).is_relative_to(layer_python)


def test_local_build_dir_holds_the_functions_and_the_layer(local_build_dir: Path) -> None:
    for part in ("EnqueueApiFunction", "JobWorkerFunction", "TestSandboxFunction", "SharedLayer/python/agent_jobs"):
        assert (local_build_dir / part).is_dir(), part


def test_sam_build_ships_the_sandbox_alone_without_the_layers_package(arm64_build_dir: Path) -> None:
    built = arm64_build_dir / "TestSandboxFunction"
    assert relative_files(built) == {f"test_sandbox/{name}.py" for name in ("__init__", "app", "archive", "runner")}
    # it imports nothing but the standard library and its own modules
    for path in built.glob("*.py"):
        text = path.read_text()
        for package in ("agent_jobs", "boto3", "botocore", "aws_lambda_powertools", "pydantic"):
            assert f"import {package}" not in text, (path.name, package)
            assert f"from {package}" not in text, (path.name, package)


def test_the_deployed_layer_carries_nothing_only_sam_local_needs(arm64_build_dir: Path) -> None:
    # PyJWT and cryptography verify tokens only under `sam local` (layers/shared/requirements-sam-local.txt)
    layer_python = arm64_build_dir / "SharedLayer" / "python"
    assert not (layer_python / "jwt").exists()
    assert not (layer_python / "cryptography").exists()
