"""Run a tenant's test command in a child process that cannot see this process's credentials or outlive its time.

The child gets a short allow-list of this process's variables (never AWS_*, Lambda or credential-looking ones), runs
in its own session so that a timeout kills it and every process it started, and has its output read as it comes so
a chatty command never blocks on a full pipe while only the last `output_limit_bytes` are kept. After the run,
`kill_leftovers` ends the processes that left the group on purpose (setsid daemons).

Standard library only: the sandbox function runs with the interpreter alone, without the shared layer.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

TestOutcome = Literal["passed", "failed", "timed_out"]

INHERITED_VARIABLES = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR")
_SECRET_PREFIXES = ("AWS_", "_AWS_", "POWERTOOLS_", "LAMBDA_", "_LAMBDA_", "_X_AMZN_", "SANDBOX_")
_SECRET_FRAGMENTS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "API_KEY", "APIKEY", "PRIVATE_KEY")
_RUNTIME_VARIABLES = frozenset({"_HANDLER", "LD_LIBRARY_PATH", "PYTHONPATH", "TABLE_NAME", "QUEUE_URL"})
_READ_CHUNK = 64 * 1024
_POLL_SECONDS = 0.02
_DRAIN_SECONDS = 2.0
_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36


class SandboxRequestError(Exception):
    """A request the sandbox cannot run (bad archive, missing command, a limit hit): reported, not raised further."""

    def __init__(self, message: str, *, permanent: bool = True) -> None:
        super().__init__(message)
        self.permanent = permanent


@dataclass(frozen=True)
class TestRun:
    __test__ = False  # a result, not a pytest test class

    outcome: TestOutcome
    exit_code: int | None
    duration_seconds: float
    output_tail: str
    truncated: bool


def is_withheld_variable(name: str) -> bool:
    """True for a variable the test command must never see: credentials, the runtime's and the sandbox's settings."""
    upper = name.upper()
    return (
        upper.startswith(_SECRET_PREFIXES)
        or any(fragment in upper for fragment in _SECRET_FRAGMENTS)
        or upper in _RUNTIME_VARIABLES
    )


def scrubbed_environment(environment: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: the allow-listed variables of this process, then `environment`, minus withheld names.

    A withheld name is dropped even when the caller passes it in `environment`: a test command runs agent-written
    code, so it must never hold AWS credentials, tokens or the function's settings.
    """
    inherited = {name: os.environ[name] for name in INHERITED_VARIABLES if name in os.environ}
    merged = {**inherited, **(environment or {})}
    return {name: value for name, value in merged.items() if not is_withheld_variable(name)}


def run_test_command(
    argv: Sequence[str],
    *,
    cwd: Path,
    timeout_seconds: float,
    environment: Mapping[str, str] | None = None,
    output_limit_bytes: int = 64 * 1024,
    kill_grace_seconds: float = 2.0,
) -> TestRun:
    """Run `argv` in `cwd` and report how it ended, with the tail of its combined stdout and stderr.

    `argv` is the test command the workspace registered, run as a list without a shell.
    At `timeout_seconds` the command's whole process group gets SIGTERM, then SIGKILL after `kill_grace_seconds`; a
    command that ends normally also has any processes it left behind in its group killed. Processes that leave the
    group on purpose (setsid) are out of reach here; their output is not awaited for more than a moment, and
    `kill_leftovers` ends them after the run.
    """
    if isinstance(argv, str) or not argv:
        raise ValueError("argv must be a non-empty list of arguments, e.g. ['pytest', '-q']")
    if timeout_seconds <= 0:
        raise ValueError("timeout_seconds must be positive; with no time left, retry the job instead of running it")
    if not cwd.is_dir():
        raise SandboxRequestError(f"cannot run the tests in {cwd}: not a directory; check the workspace checkout")
    tail = OutputTail(output_limit_bytes)
    started = time.monotonic()
    try:
        process = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=scrubbed_environment(environment),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            shell=False,
            start_new_session=True,  # its own process group, so a timeout can kill everything it started
            close_fds=True,
        )
    except (FileNotFoundError, PermissionError) as error:
        raise SandboxRequestError(
            f"cannot start the test command {argv[0]!r} ({error.strerror}); fix the workspace's registered test command"
        ) from error
    assert process.stdout is not None
    with process.stdout, selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        exited = _pump_until_exit(process, selector, tail, started + timeout_seconds)
        if not exited:
            _signal_group(process.pid, signal.SIGTERM)
            _pump_until_exit(process, selector, tail, time.monotonic() + kill_grace_seconds)
        # The leader has exited (or ignored SIGTERM) but is not reaped yet, so its group id still names its group.
        _signal_group(process.pid, signal.SIGKILL)
        _drain(selector, tail, time.monotonic() + _DRAIN_SECONDS)
        exit_code = process.wait()
    duration = time.monotonic() - started
    if not exited:
        return TestRun("timed_out", None, duration, tail.text(), tail.truncated)
    return TestRun("passed" if exit_code == 0 else "failed", exit_code, duration, tail.text(), tail.truncated)


def hide_own_environment() -> bool:
    """Make this process non-dumpable: its /proc entries (environ, mem, fd) become root's, so a test command of the
    same uid cannot read the credentials Lambda put in this process's environment. A command's own processes are
    dumpable again after exec. False where unsupported."""
    return _prctl(_PR_SET_DUMPABLE, 0)


def adopt_orphans(enabled: bool = True) -> bool:
    """Make this process the child subreaper (or stop being one): a daemon a test starts (double fork, setsid) is
    re-parented to this process instead of to init, so it stays a descendant that `kill_leftovers` finds.
    False where unsupported."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, int(enabled))


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def descendants() -> set[int]:
    """The pids of every process below this one."""
    return _descendants_of(os.getpid(), _process_table())


def kill_leftovers(*, spared: set[int] | frozenset[int] = frozenset(), whole_uid: bool) -> list[int]:
    """SIGKILL what the tests left running and reap it; returns the pids killed.

    The descendants of this process, except `spared` (those that ran before the tests). With `whole_uid`, every
    process of this process's uid except itself and its ancestors: in a Lambda execution environment (or a local
    sandbox) nothing else of that uid may survive an invocation, whatever it did to leave the process tree.
    """
    processes = _process_table()
    ancestors = _ancestors_of(os.getpid(), processes)
    victims = _descendants_of(os.getpid(), processes) - set(spared)
    if whole_uid:
        uid = os.getuid()
        victims |= {pid for pid, (_, owner) in processes.items() if owner == uid}
    victims -= ancestors
    for victim in sorted(victims):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(victim, signal.SIGKILL)
    for victim in victims:  # our children (and adopted orphans) would stay zombies otherwise
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(victim, 0)
    return sorted(victims)


def _ancestors_of(pid: int, processes: dict[int, tuple[int | None, int | None]]) -> set[int]:
    found: set[int] = set()
    current: int | None = pid
    while current is not None and current not in found:
        found.add(current)
        current = processes.get(current, (None, None))[0]
    return found


def _descendants_of(pid: int, processes: dict[int, tuple[int | None, int | None]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for child, (parent, _) in processes.items():
        if parent is not None:
            children.setdefault(parent, []).append(child)
    found: set[int] = set()
    pending = list(children.get(pid, []))
    while pending:
        current = pending.pop()
        if current not in found:
            found.add(current)
            pending.extend(children.get(current, []))
    return found


def _process_table() -> dict[int, tuple[int | None, int | None]]:
    """pid → (parent pid, real uid) of every process visible in /proc."""
    table: dict[int, tuple[int | None, int | None]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        parent: int | None = None
        owner: int | None = None
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in Path(f"/proc/{entry}/status").read_text().splitlines():
                if line.startswith("PPid:"):
                    parent = int(line.split()[1]) or None
                elif line.startswith("Uid:"):
                    owner = int(line.split()[1])
        if owner is not None:
            table[int(entry)] = (parent, owner)
    return table


class OutputTail:
    """The last `limit` bytes of a stream, however long the stream."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("output_limit_bytes must be positive")
        self.limit = limit
        self.total = 0
        self._buffer = bytearray()

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self._buffer += chunk[-self.limit :]
        if len(self._buffer) > self.limit:
            del self._buffer[: len(self._buffer) - self.limit]

    @property
    def truncated(self) -> bool:
        return self.total > self.limit

    def text(self) -> str:
        kept = bytes(self._buffer)
        if self.truncated:
            # The cut may fall inside a UTF-8 character: start at the next character instead of at a stray byte.
            start = 0
            while start < min(3, len(kept)) and 0x80 <= kept[start] <= 0xBF:
                start += 1
            kept = kept[start:]
        return kept.decode("utf-8", errors="replace")


def _pump_until_exit(
    process: subprocess.Popen[bytes], selector: selectors.BaseSelector, tail: OutputTail, deadline: float
) -> bool:
    """Collect output until the process exits (True) or the deadline passes (False), without reaping it."""
    while not _has_exited(process):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        if selector.get_map():
            _read_ready(selector, tail, min(remaining, _POLL_SECONDS))
        else:
            time.sleep(min(remaining, _POLL_SECONDS))  # the command closed its output but still runs
    return True


def _drain(selector: selectors.BaseSelector, tail: OutputTail, deadline: float) -> None:
    while selector.get_map():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        _read_ready(selector, tail, remaining)


def _read_ready(selector: selectors.BaseSelector, tail: OutputTail, timeout: float) -> None:
    for key, _ in selector.select(timeout):
        chunk = os.read(key.fd, _READ_CHUNK)
        if chunk:
            tail.add(chunk)
        else:
            selector.unregister(key.fileobj)  # end of output: every writer has closed the pipe


def _has_exited(process: subprocess.Popen[bytes]) -> bool:
    # WNOWAIT leaves the exited leader unreaped: its pid, hence its group id, cannot be reused before we kill the group.
    waitid = getattr(os, "waitid", None)
    if waitid is None:  # Python < 3.13 on macOS; Lambda is Linux
        return process.poll() is not None
    return waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is already gone
        os.killpg(pgid, signum)
