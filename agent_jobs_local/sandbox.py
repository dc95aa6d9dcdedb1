"""One Lambda invocation in a new bubblewrap sandbox: the local stand-in for a tenant's own execution environment.

Every invocation gets a sandbox of its own, torn down when the invocation ends, so nothing is shared between two runs
(let alone two tenants). Inside: new PID, network (none: only a loopback that reaches nothing), IPC, UTS, user and
mount namespaces; no capabilities; its own session; a fresh /proc (its own processes only), /dev and /tmp (a tmpfs
of the function's EphemeralStorage); a cleared environment with PATH, HOME, LANG and the function's own non-secret
settings. The file system is only what the interpreter and common tools need, read-only: /usr (with the /bin, /lib,
/lib64 and /sbin links of a merged /usr), the interpreter's own prefix, a few /etc files (never /etc as a whole), the
function's CodeUri at /var/task and the bootstrap (`sandbox_bootstrap.py`) at /var/runtime. The project folder, the
development key, env files, the worker's WORKSPACES_ROOT caches and other runs' folders are not there.

The sandbox's first process is bwrap itself, as its PID 1: when the bootstrap returns, or the caller kills the
sandbox at the Timeout, or the caller dies (`--die-with-parent`), PID 1 exits and the kernel ends every process left
in the sandbox, `setsid` daemons included.

Each sandbox is bounded as Lambda bounds the function (`sandbox_bounds`): memory at MemorySize, 1,024 processes and
threads, nothing writable but /tmp at EphemeralStorage. One that goes past its memory or process bound is ended at
once and its invocation fails naming the bound (Runtime.OutOfMemory, Sandbox.ProcessLimit); its cgroup goes with it.

Without bwrap nothing runs: the invocation fails with a message that names the package to install. The command
line, bwrap's checks and the sandbox's environment are in `sandbox_bwrap`; this module runs sandboxes.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import IO, Any, Final

from agent_jobs_local.sandbox_bounds import WATCH_INTERVAL_SECONDS, BoundHit, SandboxBounds, SandboxLimits
from agent_jobs_local.sandbox_bwrap import (
    BWRAP_ENV,
    INSTALL_HINT,
    SandboxedFunction,
    bwrap_command,
    check_bwrap,
    find_bwrap,
    interpreter,
    is_withheld_variable,
    sandbox_environment,
)

# Lambda's limit on a synchronous invocation's response.
MAX_RESPONSE_BYTES: Final = 6 * 1024 * 1024
LOG_TAIL_BYTES: Final = 64 * 1024
# bwrap and the interpreter start before the handler's clock does.
START_ALLOWANCE_SECONDS: Final = 1.0
_KILL_WAIT_SECONDS: Final = 5.0


@dataclass(frozen=True)
class SandboxRun:
    """How one sandboxed invocation ended: `result` (the handler's answer) when `error_type` is None; otherwise a
    function error Lambda would report as Unhandled (`error_type`, `error_message`). `log_tail` is the end of what
    the sandbox wrote to standard error."""

    result: Any = None
    error_type: str | None = None
    error_message: str | None = None
    log_tail: str = ""
    duration_seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.error_type is not None


class _BoundedReader(threading.Thread):
    """Reads a pipe to its end, keeping the first `keep_first` bytes or the last `keep_last` bytes."""

    def __init__(self, stream: IO[bytes], *, keep_first: int = 0, keep_last: int = 0) -> None:
        super().__init__(daemon=True)
        self.stream, self.keep_first, self.keep_last = stream, keep_first, keep_last
        self.data = bytearray()
        self.total = 0

    def run(self) -> None:
        with self.stream:
            while chunk := os.read(self.stream.fileno(), 64 * 1024):
                self.total += len(chunk)
                if self.keep_first:
                    if len(self.data) <= self.keep_first:
                        self.data += chunk[: self.keep_first + 1 - len(self.data)]
                else:
                    self.data += chunk
                    del self.data[: max(0, len(self.data) - self.keep_last)]


def _write_all(stream: IO[bytes], data: bytes) -> None:
    try:
        with stream:
            stream.write(data)
    except (BrokenPipeError, OSError):
        pass  # the sandbox died first: its exit says why


class SandboxProcess:
    """One sandbox, started and initialised (the bootstrap has imported the handler, as in Lambda's Init phase), that
    serves exactly one invocation and is then torn down. Starting it ahead of the invocation takes the sandbox's
    start-up off the invocation's clock, as Lambda does; it never serves a second invocation or a second tenant.
    `bounds`: how this machine bounds sandboxes (None: not at all, as for bwrap's own check)."""

    def __init__(
        self,
        bwrap: str,
        function: SandboxedFunction,
        *,
        disable_userns: bool = True,
        bounds: SandboxBounds | None = None,
    ) -> None:
        self.function = function
        self._used = False
        self.limits: SandboxLimits | None = bounds.open(function) if bounds is not None else None
        command = bwrap_command(bwrap, function, disable_userns=disable_userns)
        try:
            self.process = subprocess.Popen(
                self.limits.command(command) if self.limits is not None else command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # one group: a timeout kills bwrap and anything that could still be outside
                close_fds=True,
                # bwrap stays the sandbox's PID 1, and its own environment is readable there (/proc/1/environ): give
                # it none of this process's (credentials, the functions' settings); --clearenv/--setenv set the
                # sandbox's.
                env={},
            )
        except BaseException:
            if self.limits is not None:
                self.limits.release()
            raise
        assert self.process.stdout is not None
        assert self.process.stderr is not None
        self._answer = _BoundedReader(self.process.stdout, keep_first=MAX_RESPONSE_BYTES)
        self._log = _BoundedReader(self.process.stderr, keep_last=LOG_TAIL_BYTES)
        self._answer.start()
        self._log.start()

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def invoke(self, event: Any, *, request_id: str, tenant_id: str | None) -> SandboxRun:
        """Hand the sandbox its one invocation and wait for it, at most the function's Timeout; then end it."""
        if self._used:
            raise RuntimeError("a sandbox serves one invocation only")
        self._used = True
        function = self.function
        request = {
            "event": event,
            "timeoutSeconds": function.timeout_seconds,
            "functionName": function.function_name,
            "functionArn": function.function_arn,
            "memoryLimitInMb": function.memory_size_mb,
            "requestId": request_id,
            "tenantId": tenant_id,
        }
        assert self.process.stdin is not None
        writer = threading.Thread(
            target=_write_all, args=(self.process.stdin, json.dumps(request).encode()), daemon=True
        )
        started = time.monotonic()
        writer.start()
        timed_out, hit = False, None
        try:
            timed_out, hit = self._watch(started + function.timeout_seconds + START_ALLOWANCE_SECONDS)
        finally:
            _kill_group(self.process)
            if hit is None and self.limits is not None:
                hit = self.limits.exceeded(None)  # went past one in the moment before it exited
            self._release()
        for thread in (self._answer, self._log, writer):
            thread.join(timeout=_KILL_WAIT_SECONDS)
        if hit is not None:
            log_tail = bytes(self._log.data).decode("utf-8", errors="replace")
            return SandboxRun(None, hit.error_type, hit.message, log_tail, time.monotonic() - started)
        return self._outcome(timed_out, time.monotonic() - started)

    def _watch(self, deadline: float) -> tuple[bool, BoundHit | None]:
        """Wait for the sandbox to exit, at most until `deadline`, checking its bounds as it runs: (timed out, the
        bound it went past)."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True, None
            try:
                self.process.wait(timeout=min(remaining, WATCH_INTERVAL_SECONDS) if self.limits else remaining)
                return False, None
            except subprocess.TimeoutExpired:
                pass
            hit = self.limits.exceeded(self.process.pid) if self.limits is not None else None
            if hit is not None:
                return False, hit

    def discard(self) -> None:
        """End a sandbox that will not be used."""
        self._used = True
        _kill_group(self.process)
        self._release()
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def _release(self) -> None:
        if self.limits is not None:
            self.limits.release()
            self.limits = None

    def _outcome(self, timed_out: bool, duration: float) -> SandboxRun:
        function, answer = self.function, self._answer
        log_tail = bytes(self._log.data).decode("utf-8", errors="replace")
        if timed_out:
            message = f"Task timed out after {function.timeout_seconds:.2f} seconds"
            return SandboxRun(None, "Sandbox.Timedout", message, log_tail, duration)
        if answer.total > MAX_RESPONSE_BYTES:
            message = f"Response payload size exceeded maximum allowed payload size ({MAX_RESPONSE_BYTES} bytes)."
            return SandboxRun(None, "Function.ResponseSizeTooLarge", message, log_tail, duration)
        try:
            document = json.loads(bytes(answer.data))
        except ValueError:
            document = None
        if not isinstance(document, dict) or self.process.returncode != 0:
            message = f"Runtime exited with error: exit status {self.process.returncode}"
            if log_tail.strip():
                message += f"; its last log line: {log_tail.strip().splitlines()[-1][:500]}"
            return SandboxRun(None, "Runtime.ExitError", message, log_tail, duration)
        if "result" in document:
            return SandboxRun(document["result"], None, None, log_tail, duration)
        error_type, error_message = str(document.get("errorType", "Error")), str(document.get("errorMessage", ""))
        return SandboxRun(None, error_type, error_message, log_tail, duration)


class SandboxPool:
    """Keeps up to `size` started, initialised and unused sandboxes of one function ready, so an invocation does not
    wait for bwrap and the interpreter to start. Each is used once; `take()` starts one on the spot when none is
    ready. The sandboxes are started on the pool's own thread, which lives until `stop()`: bwrap's
    --die-with-parent follows the thread that started it."""

    def __init__(
        self,
        bwrap: str,
        function: SandboxedFunction,
        *,
        size: int = 2,
        disable_userns: bool = True,
        bounds: SandboxBounds | None = None,
    ) -> None:
        self.bwrap, self.function, self.disable_userns, self.bounds = bwrap, function, disable_userns, bounds
        self._ready: queue.Queue[SandboxProcess] = queue.Queue(maxsize=max(1, size))
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._fill, name=f"sandboxes-{function.function_id}", daemon=True)

    def start(self) -> SandboxPool:
        self._thread.start()
        return self

    def _start_one(self) -> SandboxProcess:
        return SandboxProcess(self.bwrap, self.function, disable_userns=self.disable_userns, bounds=self.bounds)

    def _fill(self) -> None:
        while not self._stopping.is_set():
            try:
                sandbox = self._start_one()
            except OSError:  # out of processes or descriptors for now: invocations start their own meanwhile
                self._stopping.wait(1.0)
                continue
            while not self._stopping.is_set():
                try:
                    self._ready.put(sandbox, timeout=0.2)
                    break
                except queue.Full:
                    continue
            else:
                sandbox.discard()

    def take(self) -> SandboxProcess:
        """A started sandbox nobody has used (one started now when none is ready, or the ready one died)."""
        while True:
            try:
                sandbox = self._ready.get_nowait()
            except queue.Empty:
                return self._start_one()
            if sandbox.alive:
                return sandbox
            sandbox.discard()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=10)
        while True:
            try:
                self._ready.get_nowait().discard()
            except queue.Empty:
                return


def run_sandboxed(
    bwrap: str,
    function: SandboxedFunction,
    event: Any,
    *,
    request_id: str,
    tenant_id: str | None,
    disable_userns: bool = True,
    bounds: SandboxBounds | None = None,
) -> SandboxRun:
    """Run one invocation of `function` on `event` in a new sandbox started for it."""
    sandbox = SandboxProcess(bwrap, function, disable_userns=disable_userns, bounds=bounds)
    return sandbox.invoke(event, request_id=request_id, tenant_id=tenant_id)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    try:
        process.wait(timeout=_KILL_WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


__all__ = [
    "BWRAP_ENV",
    "INSTALL_HINT",
    "SandboxPool",
    "SandboxProcess",
    "SandboxRun",
    "SandboxedFunction",
    "bwrap_command",
    "check_bwrap",
    "find_bwrap",
    "interpreter",
    "is_withheld_variable",
    "run_sandboxed",
    "sandbox_environment",
]
