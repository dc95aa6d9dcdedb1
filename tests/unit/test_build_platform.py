"""The layer's check of the platform its wheels were built for (`agent_jobs.build_platform`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_jobs.build_platform import MARKER, architecture_of, check, mismatch


@pytest.mark.parametrize(
    ("name", "architecture"),
    [
        ("manylinux2014_aarch64", "arm64"),
        ("manylinux2014_x86_64", "x86_64"),
        ("manylinux_2_28_x86_64", "x86_64"),
        ("aarch64", "arm64"),
        ("arm64", "arm64"),
        ("x86_64", "x86_64"),
        ("AMD64", "x86_64"),
        ("riscv64", None),
        ("", None),
    ],
)
def test_architecture_of_platform_tags_and_machines(name: str, architecture: str | None) -> None:
    assert architecture_of(name) == architecture


def test_a_layer_for_arm64_under_an_x86_64_function_says_what_to_build(tmp_path: Path) -> None:
    (tmp_path / MARKER).write_text("manylinux2014_aarch64\n")

    with pytest.raises(
        ImportError, match=r"built for arm64 .* runs on x86_64: build with `make build ARCHITECTURE=x86_64`"
    ):
        check(tmp_path, machine="x86_64")


@pytest.mark.parametrize(
    ("built", "machine"), [("manylinux2014_aarch64", "aarch64"), ("manylinux2014_x86_64", "x86_64")]
)
def test_a_layer_for_its_own_architecture_loads(tmp_path: Path, built: str, machine: str) -> None:
    (tmp_path / MARKER).write_text(f"{built}\n")

    check(tmp_path, machine=machine)  # no ImportError


def test_no_marker_or_an_unknown_name_is_no_mismatch(tmp_path: Path) -> None:
    check(tmp_path, machine="x86_64")  # the source tree: nothing to compare
    assert mismatch("manylinux2014_riscv64", "x86_64") is None
    assert mismatch("manylinux2014_x86_64", "s390x") is None
