"""The platform the layer's wheels were built for, against the machine a function runs on.

The layer's build (layers/shared/Makefile) writes the wheels' platform tag (e.g. `manylinux2014_aarch64`) to
`BUILD_PLATFORM` beside this module. A layer built for one architecture under functions of the other (a deploy with
`--parameter-overrides Architecture=x86_64` over a default arm64 `make build`) would fail later, in a native module,
with a message that says nothing of the cause; importing `agent_jobs` fails first, saying what to do. Only the
standard library: this runs before anything the wheels hold is imported. The source tree has no `BUILD_PLATFORM`, so
tests and the local runtime are never checked.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Final

MARKER: Final = "BUILD_PLATFORM"
# A platform tag's or a machine's name -> the Lambda architecture it is.
_ARCHITECTURES: Final = {"aarch64": "arm64", "arm64": "arm64", "x86_64": "x86_64", "amd64": "x86_64"}


def architecture_of(name: str) -> str | None:
    """The Lambda architecture of a machine name (`platform.machine()`) or a wheel platform tag, None if neither."""
    lowered = name.strip().lower()
    for machine, architecture in _ARCHITECTURES.items():
        if lowered == machine or (lowered.endswith(f"_{machine}") and "linux" in lowered):
            return architecture
    return None


def mismatch(built_platform: str, machine: str) -> str | None:
    """What to do when wheels for `built_platform` cannot run on `machine`, else None (also when either is unknown)."""
    built, running = architecture_of(built_platform), architecture_of(machine)
    if built is None or running is None or built == running:
        return None
    return (
        f"the shared layer was built for {built} ({built_platform.strip()}) but this function runs on {running}: build"
        f" with `make build ARCHITECTURE={running}`, which sets the template's Architecture parameter and the layer's"
        f" wheels together, and deploy that build with --parameter-overrides Architecture={running}"
    )


def check(folder: Path | None = None, machine: str | None = None) -> None:
    """Raise ImportError when the layer's `BUILD_PLATFORM` (in `folder`, default this package's) does not match
    `machine` (default this one's); nothing when there is no such file."""
    try:
        built = ((folder or Path(__file__).parent) / MARKER).read_text(encoding="ascii")
    except FileNotFoundError:
        return
    problem = mismatch(built, machine if machine is not None else platform.machine())
    if problem:
        raise ImportError(problem)


__all__ = ["MARKER", "architecture_of", "check", "mismatch"]
