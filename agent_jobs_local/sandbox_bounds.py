"""A local sandbox's bounds, as Lambda bounds the function it stands for, from the function's own template values:
memory (MemorySize), processes and threads (1,024, Lambda's limit per execution environment, which no setting
changes) and disk (the root and /dev read-only, /tmp a tmpfs of EphemeralStorage: see `sandbox_bwrap`).

Memory and processes are held by a cgroup of each sandbox's own (`sandbox_cgroups`), which bwrap enters before it
starts anything (`sandbox_enter`). Locally /tmp is memory, and the kernel charges its files to the sandbox that
writes them, so the cgroup's limit is MemorySize + EphemeralStorage: the most a sandbox can ever take of this
machine. The memory bound itself, MemorySize for everything but /tmp's files and the file cache the kernel can drop,
is watched while the sandbox runs (`SandboxLimits.exceeded`, every `WATCH_INTERVAL_SECONDS`): past it the sandbox is
ended, and its invocation fails as Lambda fails one that ran out of memory (Runtime.OutOfMemory). A process or thread
refused at the limit ends the sandbox too (Sandbox.ProcessLimit): Lambda only fails that fork, but locally a sandbox
at its limit is nearly always a fork bomb spinning on the CPUs every tenant's API, emulator and workers share.

Without a cgroup it can use, the machine holds what rlimits hold: for a user other than root, RLIMIT_NPROC (which
counts all of the user's processes, so a sandbox gets 1,024 more than the user already runs); memory is then not
bounded (RLIMIT_AS would refuse runtimes that reserve address space up front). `SandboxBounds.warnings` says so, one
line per bound, and the local runtime prints them when it starts.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agent_jobs_local.sandbox_bwrap import SandboxedFunction, interpreter
from agent_jobs_local.sandbox_cgroups import (
    SANDBOX_PREFIX,
    CgroupPlace,
    SandboxCgroup,
    find_places,
    owner_tag,
    parse_mountinfo,
    parse_proc_cgroup,
    remove_stale,
)

# Lambda's quota on processes and threads in one execution environment.
LAMBDA_MAX_TASKS: Final = 1024
WATCH_INTERVAL_SECONDS: Final = 0.05
ENTER: Final = Path(__file__).resolve().parent / "sandbox_enter.py"
MIB: Final = 1024 * 1024


@dataclass(frozen=True)
class BoundHit:
    """A bound a sandbox went past: the function error its invocation ends with."""

    error_type: str
    message: str


def memory_hit(function: SandboxedFunction) -> BoundHit:
    setting = function.memory_setting
    return BoundHit(
        "Runtime.OutOfMemory",
        f"the function used more than its {function.memory_size_mb} MB of memory ({setting}), so its sandbox was"
        f" ended: make the code it runs use less memory, or raise {setting}",
    )


def process_hit(max_tasks: int) -> BoundHit:
    return BoundHit(
        "Sandbox.ProcessLimit",
        f"the function tried to run more than {max_tasks:,} processes and threads at once (Lambda's limit per execution"
        " environment, which no setting raises), so its sandbox was ended: start fewer processes and threads, and"
        " never fork without end",
    )


class SandboxLimits:
    """One sandbox's bounds: the command that starts bwrap inside them, and whether the sandbox went past one."""

    def __init__(
        self, function: SandboxedFunction, cgroup: SandboxCgroup | None, rlimits: Mapping[str, int], max_tasks: int
    ) -> None:
        self.function, self.cgroup, self.rlimits, self.max_tasks = function, cgroup, dict(rlimits), max_tasks
        self._sandbox_root: Path | None = None

    def command(self, bwrap_command: list[str]) -> list[str]:
        """`bwrap_command`, started by `sandbox_enter` when there is a cgroup to enter or an rlimit to set."""
        if self.cgroup is None and not self.rlimits:
            return bwrap_command
        spec = {"cgroupProcs": self.cgroup.procs_files if self.cgroup else [], "rlimits": self.rlimits}
        _, python = interpreter()
        return [str(python), "-I", "-S", str(ENTER), json.dumps(spec), *bwrap_command]

    def exceeded(self, bwrap_pid: int | None) -> BoundHit | None:
        """The bound the sandbox has gone past, if any. `bwrap_pid` (the sandbox's bwrap, while it runs) lets its
        memory be measured without /tmp's files; without it only what the kernel counted is read."""
        cgroup = self.cgroup
        if cgroup is None:
            return None
        if cgroup.out_of_memory_kills():
            return memory_hit(self.function)
        if cgroup.refused_tasks():
            return process_hit(self.max_tasks)
        if bwrap_pid is None:
            return None
        in_use = cgroup.memory_in_use()
        if in_use is not None and in_use - self._tmp_bytes(bwrap_pid, cgroup) > self.function.memory_size_mb * MIB:
            return memory_hit(self.function)
        return None

    def _tmp_bytes(self, bwrap_pid: int, cgroup: SandboxCgroup) -> int:
        """What the sandbox's /tmp holds, seen through its first process's root; where that cannot be read, all of
        the sandbox's shared memory (which holds /tmp's files and a little more)."""
        if self._sandbox_root is None:
            children = Path(f"/proc/{bwrap_pid}/task/{bwrap_pid}/children")
            with contextlib.suppress(OSError):
                first = children.read_text().split()[:1]
                if first:
                    self._sandbox_root = Path(f"/proc/{first[0]}/root")
        if self._sandbox_root is not None:
            with contextlib.suppress(OSError):
                tmp = os.statvfs(self._sandbox_root / "tmp")
                return (tmp.f_blocks - tmp.f_bfree) * tmp.f_frsize
        return cgroup.shared_memory()

    def release(self) -> None:
        """Remove the sandbox's cgroup (killing whatever is left in it)."""
        if self.cgroup is not None:
            self.cgroup.remove()


class SandboxBounds:
    """How this machine bounds each sandbox (see the module docstring): the cgroup places found for memory and
    processes, and why a bound has none. `open` makes one sandbox's `SandboxLimits`."""

    def __init__(
        self, places: Mapping[str, CgroupPlace], reasons: Mapping[str, str], *, max_tasks: int = LAMBDA_MAX_TASKS
    ) -> None:
        self.places, self.reasons, self.max_tasks = dict(places), dict(reasons), max_tasks
        self._names = itertools.count()
        self._owner = owner_tag()

    @classmethod
    def detect(
        cls, mountinfo: Path = Path("/proc/self/mountinfo"), own_cgroups: Path = Path("/proc/self/cgroup")
    ) -> SandboxBounds:
        """The bounds this machine allows this process to set."""
        places, reasons = find_places(parse_mountinfo(_read(mountinfo)), parse_proc_cgroup(_read(own_cgroups)))
        return cls(places, reasons)

    @property
    def holds_processes_by_rlimit(self) -> bool:
        return "pids" not in self.places and os.geteuid() != 0

    @property
    def warnings(self) -> list[str]:
        """One line per bound this machine cannot hold as Lambda does, naming it and why; empty when all hold."""
        lines = []
        if "memory" not in self.places:
            lines.append(
                f"sandbox memory is not bounded: {self.reasons['memory']}, and RLIMIT_AS would refuse runtimes that"
                " reserve address space; a test command can take all of this machine's memory. Run the local runtime"
                " as root, or where systemd delegates the memory and pids controllers to its user"
            )
        if "pids" not in self.places:
            if self.holds_processes_by_rlimit:
                lines.append(
                    f"sandbox processes are bounded by RLIMIT_NPROC only: {self.reasons['pids']}; RLIMIT_NPROC counts"
                    f" every process of this user, so a sandbox may run {self.max_tasks:,} more than the user runs when"
                    " it starts, and one at its limit is not ended"
                )
            else:
                lines.append(
                    f"sandbox processes are not bounded: {self.reasons['pids']}, and RLIMIT_NPROC does not hold root;"
                    " a fork bomb in a test command can take all of this machine's processes. Run the local runtime"
                    " where it can create cgroups with the pids controller"
                )
        return lines

    def remove_stale(self) -> list[Path]:
        """Remove the sandbox cgroups a runtime that was killed left behind."""
        return remove_stale(self.places.values())

    def open(self, function: SandboxedFunction) -> SandboxLimits:
        """The bounds of a new sandbox of `function`: its cgroup is created with its limits (OSError when it cannot
        be: a sandbox never starts without the bounds this machine gave the ones before it)."""
        cgroup = None
        if self.places:
            cgroup = SandboxCgroup(
                self.places,
                f"{SANDBOX_PREFIX}{self._owner}-{next(self._names)}",
                memory_limit_bytes=(function.memory_size_mb + function.ephemeral_storage_mb) * MIB,
                max_tasks=self.max_tasks,
            )
        rlimits = {}
        if self.holds_processes_by_rlimit:
            rlimits["RLIMIT_NPROC"] = _tasks_of(os.getuid()) + self.max_tasks
        return SandboxLimits(function, cgroup, rlimits, self.max_tasks)


def _tasks_of(uid: int) -> int:
    """How many processes and threads `uid` runs now (what RLIMIT_NPROC counts)."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                status = dict(
                    line.split(":", 1) for line in Path(f"/proc/{entry}/status").read_text().splitlines() if ":" in line
                )
                if int(status["Uid"].split()[0]) == uid:
                    count += int(status["Threads"])
    return count


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
