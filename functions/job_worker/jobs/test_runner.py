"""Run a workspace's test command in a child process that cannot see the worker's credentials or outlive its time.

The child gets a scrubbed environment (a short allow-list of the worker's variables plus the workspace's own, minus
anything that looks like a credential or a worker setting), runs in its own session so that a timeout kills it and
every process it started, and has its output read as it comes so a chatty command never blocks on a full pipe while
the worker keeps only the last `output_limit_bytes`.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agent_jobs.settings import Settings
from jobs.errors import PermanentJobError

TestOutcome = Literal["passed", "failed", "timed_out"]

INHERITED_VARIABLES = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR")
_SECRET_PREFIXES = ("AWS_", "_AWS_", "POWERTOOLS_", "LAMBDA_", "_X_AMZN_")
_SECRET_FRAGMENTS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "API_KEY", "APIKEY", "PRIVATE_KEY")
# The worker's own settings (TABLE_NAME, QUEUE_URL, MAX_ATTEMPTS, WORKSPACES_ROOT, ...) and the Lambda runtime's.
_WORKER_VARIABLES = frozenset(name.upper() for name in Settings.model_fields) | {"_HANDLER"}
_READ_CHUNK = 64 * 1024
_POLL_SECONDS = 0.02
_DRAIN_SECONDS = 2.0


@dataclass(frozen=True)
class TestRun:
    __test__ = False  # a result, not a pytest test class

    outcome: TestOutcome
    exit_code: int | None
    duration_seconds: float
    output_tail: str
    truncated: bool


def is_withheld_variable(name: str) -> bool:
    """True for a variable the test command must never see: credentials and the worker's own settings."""
    upper = name.upper()
    return (
        upper.startswith(_SECRET_PREFIXES)
        or any(fragment in upper for fragment in _SECRET_FRAGMENTS)
        or upper in _WORKER_VARIABLES
    )


def scrubbed_environment(environment: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: the allow-listed variables of this process, then `environment`, minus withheld names.

    A withheld name is dropped even when the workspace passes it in `environment`: a test command runs code from the
    agent's patches, so it must never hold the worker's AWS credentials, tokens or settings.
    """
    inherited = {name: os.environ[name] for name in INHERITED_VARIABLES if name in os.environ}
    merged = {**inherited, **(environment or {})}
    return {name: value for name, value in merged.items() if not is_withheld_variable(name)}


def test_timeout_seconds(remaining_ms: int, safety_margin_ms: int, ceiling_seconds: float) -> float:
    """How long the tests may run: the invocation's remaining time less the safety margin, at most `ceiling_seconds`.

    0 means there is no time left to run them in this invocation; the caller should retry the job instead.
    """
    return max(0.0, min(float(ceiling_seconds), (remaining_ms - safety_margin_ms) / 1000))


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

    `argv` is the test command the workspace registered, run as a list without a shell, never a string taken from a
    job's payload: an agent chooses which suite to run, not what command line runs it.
    At `timeout_seconds` the command's whole process group gets SIGTERM, then SIGKILL after `kill_grace_seconds`; a
    command that ends normally also has any processes it left behind in its group killed. Processes that leave the
    group on purpose (setsid) are out of reach; their output is not awaited for more than a moment.
    """
    if isinstance(argv, str) or not argv:
        raise ValueError("argv must be a non-empty list of arguments, e.g. ['pytest', '-q']")
    if timeout_seconds <= 0:
        raise ValueError("timeout_seconds must be positive; with no time left, retry the job instead of running it")
    if not cwd.is_dir():
        raise PermanentJobError(f"cannot run the tests in {cwd}: not a directory; check the workspace checkout")
    tail = _OutputTail(output_limit_bytes)
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
        raise PermanentJobError(
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


class _OutputTail:
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
    process: subprocess.Popen[bytes], selector: selectors.BaseSelector, tail: _OutputTail, deadline: float
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


def _drain(selector: selectors.BaseSelector, tail: _OutputTail, deadline: float) -> None:
    while selector.get_map():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        _read_ready(selector, tail, remaining)


def _read_ready(selector: selectors.BaseSelector, tail: _OutputTail, timeout: float) -> None:
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
