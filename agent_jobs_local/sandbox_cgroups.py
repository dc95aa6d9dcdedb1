"""The cgroups that hold a local sandbox's memory and processes (see `sandbox_bounds` for the bounds themselves).

`find_places` looks, for each controller (memory, pids), for the nearest cgroup from this process's own upwards
under which it may create a cgroup with that controller: on cgroup v2 first (a cgroup whose `cgroup.subtree_control`
hands the controller to its children, as a subtree delegated to this user or service does), else in the
controller's cgroup v1 hierarchy. The sandboxes' cgroups are created there, inside the runtime's own where it can,
so whatever accounts for the runtime accounts for its sandboxes too.

Each sandbox gets a cgroup of its own (`SandboxCgroup`), named after the runtime that made it:
`agent-jobs-sandbox-<PID namespace>-<pid>-<start time>-<n>`. So a cgroup left by a runtime that was killed is
recognised by the next one in the same PID namespace and removed (`remove_stale`); another namespace's runtimes,
whose pids mean nothing here, are left alone. Standard library only.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

CONTROLLERS: Final = ("memory", "pids")
SANDBOX_PREFIX: Final = "agent-jobs-sandbox-"
# A file each controller puts in every cgroup it manages, per cgroup version: its presence says the controller is on.
_CONTROL_FILE: Final = {
    ("memory", 1): "memory.limit_in_bytes",
    ("memory", 2): "memory.max",
    ("pids", 1): "pids.max",
    ("pids", 2): "pids.max",
}
_REMOVE_WAIT_SECONDS: Final = 5.0
_probes = itertools.count()


@dataclass(frozen=True)
class CgroupMount:
    """A mounted cgroup hierarchy: v2 (`controllers` empty: they are listed per cgroup) or a v1 hierarchy of
    `controllers`. `root` is the cgroup the mount shows at `mount_point` (not "/" in a container's view)."""

    version: int
    mount_point: Path
    root: str
    controllers: frozenset[str]


@dataclass(frozen=True)
class CgroupPlace:
    """Where the sandboxes' cgroups of one controller are created: under `parent`, a cgroup of version `version`."""

    controller: str
    version: int
    parent: Path


def parse_mountinfo(text: str) -> list[CgroupMount]:
    """The cgroup mounts of a /proc/<pid>/mountinfo."""
    mounts = []
    for line in text.splitlines():
        fields, _, after = line.partition(" - ")
        parts, extra = fields.split(), after.split()
        if len(parts) < 5 or len(extra) < 3:
            continue
        fs_type, options = extra[0], set(extra[2].split(","))
        root, mount_point = _unescape(parts[3]), Path(_unescape(parts[4]))
        if fs_type == "cgroup2":
            mounts.append(CgroupMount(2, mount_point, root, frozenset()))
        elif fs_type == "cgroup":
            mounts.append(CgroupMount(1, mount_point, root, frozenset(options & set(CONTROLLERS))))
    return mounts


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """This process's cgroup per v1 controller, and its v2 cgroup under the key "" (from /proc/<pid>/cgroup)."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:
            paths[""] = path
        for controller in controllers.split(","):
            if controller in CONTROLLERS:
                paths[controller] = path
    return paths


def find_places(mounts: Iterable[CgroupMount], own: Mapping[str, str]) -> tuple[dict[str, CgroupPlace], dict[str, str]]:
    """Where each controller's sandbox cgroups can be created, and for each controller with no such place, why not."""
    mounts = list(mounts)
    places: dict[str, CgroupPlace] = {}
    reasons: dict[str, str] = {}
    for controller in CONTROLLERS:
        tried: list[str] = []
        for mount in mounts:
            if mount.version == 2 and "" in own:
                place = _usable_place(controller, mount, own[""], tried)
            elif mount.version == 1 and controller in mount.controllers and controller in own:
                place = _usable_place(controller, mount, own[controller], tried)
            else:
                continue
            if place is not None:
                if place.version == 2 or controller not in places:
                    places[controller] = place
                if place.version == 2:
                    break
        if controller not in places:
            where = "; ".join(tried)
            reasons[controller] = (
                f"no cgroup of this process lets it create a cgroup with the {controller} controller ({where})"
                if tried
                else f"no cgroup file system with the {controller} controller is mounted"
            )
    return places, reasons


def _usable_place(controller: str, mount: CgroupMount, own_path: str, tried: list[str]) -> CgroupPlace | None:
    relative = os.path.relpath(own_path, mount.root) if own_path.startswith(mount.root) else None
    if relative is None or relative.startswith(".."):
        tried.append(f"cgroup v{mount.version}: this process's cgroup {own_path} is outside {mount.mount_point}")
        return None
    cgroup = (mount.mount_point / relative).resolve()
    while True:
        handed_down = mount.version == 1 or controller in _read(cgroup / "cgroup.subtree_control").split()
        if handed_down and _can_create(cgroup, controller, mount.version):
            return CgroupPlace(controller, mount.version, cgroup)
        if cgroup == mount.mount_point or mount.mount_point not in cgroup.parents:
            break
        cgroup = cgroup.parent
    where = "no cgroup from its own up to the root hands it to children" if mount.version == 2 else "not writable"
    tried.append(f"cgroup v{mount.version} at {mount.mount_point}: {where}")
    return None


def _can_create(parent: Path, controller: str, version: int) -> bool:
    probe = parent / f"{SANDBOX_PREFIX}{owner_tag()}-probe{next(_probes)}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        return (probe / _CONTROL_FILE[controller, version]).exists()
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()


def owner_tag(pid: int | None = None) -> str | None:
    """`<pid namespace>-<pid>-<start time>` of a live process of this PID namespace (this one by default), None when it
    is gone: a pid alone could have been reused by another process since."""
    pid = os.getpid() if pid is None else pid
    stat = _read(Path(f"/proc/{pid}/stat"))
    fields = stat.rpartition(")")[2].split()
    return f"{_pid_namespace()}-{pid}-{fields[19]}" if len(fields) > 19 else None


def _pid_namespace() -> str:
    """This process's PID namespace, as the number of its /proc/self/ns/pid link (`pid:[4026531836]`)."""
    with contextlib.suppress(OSError):
        return "".join(character for character in os.readlink("/proc/self/ns/pid") if character.isdigit())
    return "0"


class SandboxCgroup:
    """One sandbox's cgroups (one per distinct place: a single one on cgroup v2), with its limits written before any
    process enters: memory at `memory_limit_bytes` with no swap, processes and threads at `max_tasks`."""

    def __init__(
        self, places: Mapping[str, CgroupPlace], name: str, *, memory_limit_bytes: int | None, max_tasks: int | None
    ) -> None:
        self.places = dict(places)
        self.name = name
        self.folders: dict[str, Path] = {controller: place.parent / name for controller, place in self.places.items()}
        created: list[Path] = []
        try:
            for folder in dict.fromkeys(self.folders.values()):
                folder.mkdir()
                created.append(folder)
            memory, pids = self.places.get("memory"), self.places.get("pids")
            if memory is not None and memory_limit_bytes is not None:
                self._limit_memory(memory.version, self.folders["memory"], memory_limit_bytes)
            if pids is not None and max_tasks is not None:
                (self.folders["pids"] / "pids.max").write_text(str(max_tasks))
        except OSError:
            for folder in created:
                with contextlib.suppress(OSError):
                    folder.rmdir()
            raise

    @staticmethod
    def _limit_memory(version: int, folder: Path, limit: int) -> None:
        if version == 2:
            (folder / "memory.max").write_text(str(limit))
            _write_if_present(folder / "memory.swap.max", "0")
            _write_if_present(folder / "memory.oom.group", "1")  # an out-of-memory kill ends the whole sandbox
            return
        (folder / "memory.limit_in_bytes").write_text(str(limit))
        # Without swap accounting (memsw), a cgroup over its limit would swap out instead: keep it off swap.
        if not _write_if_present(folder / "memory.memsw.limit_in_bytes", str(limit)):
            _write_if_present(folder / "memory.swappiness", "0")

    @property
    def procs_files(self) -> list[str]:
        """The files a process writes its pid to, to enter every cgroup of the sandbox."""
        return [str(folder / "cgroup.procs") for folder in dict.fromkeys(self.folders.values())]

    def memory_in_use(self) -> int | None:
        """Bytes the sandbox holds, less the file cache it could give back (kernel memory, such as a process's stack
        and page tables, included); None without a memory cgroup."""
        place = self.places.get("memory")
        if place is None:
            return None
        folder = self.folders["memory"]
        usage_file = "memory.current" if place.version == 2 else "memory.usage_in_bytes"
        try:
            usage = int(_read(folder / usage_file, strict=True))
        except (OSError, ValueError):
            return None
        stat = _counters(_read(folder / "memory.stat"))
        return max(0, usage - stat.get("active_file", 0) - stat.get("inactive_file", 0))

    def shared_memory(self) -> int:
        """Bytes of shared memory the sandbox holds: its tmpfs files (/tmp's), shared mappings and System V memory."""
        if "memory" not in self.places:
            return 0
        return _counters(_read(self.folders["memory"] / "memory.stat")).get("shmem", 0)

    def out_of_memory_kills(self) -> int:
        place = self.places.get("memory")
        if place is None:
            return 0
        events = "memory.events" if place.version == 2 else "memory.oom_control"
        return _counters(_read(self.folders["memory"] / events)).get("oom_kill", 0)

    def refused_tasks(self) -> int:
        """How often a fork or a new thread was refused at the process limit."""
        if "pids" not in self.places:
            return 0
        return _counters(_read(self.folders["pids"] / "pids.events")).get("max", 0)

    def remove(self, wait_seconds: float = _REMOVE_WAIT_SECONDS) -> bool:
        """Kill what is still in the cgroups and remove them; False when one could not be removed in time."""
        return remove_cgroups(dict.fromkeys(self.folders.values()), wait_seconds)


def remove_cgroups(folders: Iterable[Path], wait_seconds: float = _REMOVE_WAIT_SECONDS) -> bool:
    """Kill every process in each of `folders` (cgroups), then remove them; a process dies, and leaves its cgroup,
    a moment after SIGKILL, so removal is retried until `wait_seconds` have passed. False if one is still there."""
    remaining = [folder for folder in folders if folder.exists()]
    deadline = time.monotonic() + wait_seconds
    while remaining:
        for folder in list(remaining):
            if not _write_if_present(folder / "cgroup.kill", "1"):  # v2 kills them all at once
                for pid in _read(folder / "cgroup.procs").split():
                    with contextlib.suppress(OSError):
                        os.kill(int(pid), signal.SIGKILL)
            try:
                folder.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                continue
            remaining.remove(folder)
        if remaining:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
    return True


def remove_stale(places: Iterable[CgroupPlace]) -> list[Path]:
    """Remove the sandbox cgroups, under `places`, of runtimes that are no longer running; returns those removed. A
    live runtime's are left alone: several runtimes may share a parent cgroup."""
    stale: list[Path] = []
    for parent in dict.fromkeys(place.parent for place in places):
        with contextlib.suppress(OSError):
            for folder in parent.iterdir():
                if folder.name.startswith(SANDBOX_PREFIX) and folder.is_dir():
                    namespace, pid, start = [*folder.name.removeprefix(SANDBOX_PREFIX).split("-"), "", "", ""][:3]
                    if namespace != _pid_namespace() or not pid.isdigit():
                        continue  # another namespace's runtime: whether it still runs cannot be told from here
                    if owner_tag(int(pid)) != f"{namespace}-{pid}-{start}":
                        stale.append(folder)
    return [folder for folder in stale if remove_cgroups([folder])]


def _counters(text: str) -> dict[str, int]:
    counters: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            counters[name] = int(value)
    return counters


def _read(path: Path, *, strict: bool = False) -> str:
    try:
        return path.read_text()
    except OSError:
        if strict:
            raise
        return ""


def _write_if_present(path: Path, value: str) -> bool:
    """Write `value` to the control file `path`; False when the kernel does not offer that file here (a cgroup file
    system refuses to create one: EACCES, not ENOENT)."""
    if not path.exists():
        return False
    path.write_text(value)
    return True


def _unescape(field: str) -> str:
    """mountinfo's octal escapes (a space is \\040)."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field)
