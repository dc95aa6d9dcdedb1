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

Without bwrap nothing runs: the invocation fails with a message that names the package to install.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

BWRAP_ENV: Final = "AGENT_JOBS_BWRAP"
INSTALL_HINT: Final = "install it with `sudo apt-get install bubblewrap` (Debian/Ubuntu; the package is bubblewrap)"
BOOTSTRAP: Final = Path(__file__).resolve().parent / "sandbox_bootstrap.py"
TASK_ROOT: Final = "/var/task"
RUNTIME_ROOT: Final = "/var/runtime"
# Files of /etc that programs read to start (the dynamic linker's cache, users and groups, TLS roots, the time zone,
# Debian's alternatives links); never /etc as a whole (no shadow, no host configuration).
ETC_FILES: Final = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/ca-certificates.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/localtime",
    "/etc/alternatives",
)
MERGED_USR_LINKS: Final = ("bin", "lib", "lib64", "sbin")
# Lambda's limit on a synchronous invocation's response.
MAX_RESPONSE_BYTES: Final = 6 * 1024 * 1024
LOG_TAIL_BYTES: Final = 64 * 1024
# bwrap and the interpreter start before the handler's clock does.
START_ALLOWANCE_SECONDS: Final = 1.0
_KILL_WAIT_SECONDS: Final = 5.0
# Names that never reach a sandbox, whatever the function declares: credentials and anything that looks like one.
_WITHHELD_PREFIXES: Final = ("AWS_", "_AWS_", "_X_AMZN_")
_WITHHELD_FRAGMENTS: Final = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "API_KEY", "APIKEY", "PRIVATE")


@dataclass(frozen=True)
class SandboxedFunction:
    """What a sandbox needs of a function (read from the template by the caller)."""

    function_id: str
    function_name: str
    function_arn: str
    code_dir: Path
    handler: str
    timeout_seconds: float
    memory_size_mb: int
    ephemeral_storage_mb: int
    region: str
    environment: Mapping[str, str]


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


def is_withheld_variable(name: str) -> bool:
    upper = name.upper()
    return upper.startswith(_WITHHELD_PREFIXES) or any(fragment in upper for fragment in _WITHHELD_FRAGMENTS)


def find_bwrap(setting: str | None = None) -> str | None:
    """The bwrap to use: `setting`, else AGENT_JOBS_BWRAP, else `bwrap` on PATH; None when there is none."""
    configured = setting if setting is not None else os.environ.get(BWRAP_ENV)
    if configured:
        path = Path(configured)
        return str(path) if path.is_file() and os.access(path, os.X_OK) else None
    return shutil.which("bwrap")


def interpreter() -> tuple[Path, Path]:
    """(prefix, executable) of the interpreter without its virtual environment: the sandbox gets the standard
    library, not the project's packages."""
    prefix = Path(sys.base_prefix).resolve()
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for name in (version, "python3"):
        candidate = prefix / "bin" / name
        if candidate.exists():
            return prefix, candidate
    return prefix, Path(sys.executable).resolve()


def sandbox_environment(function: SandboxedFunction) -> dict[str, str]:
    """PATH, HOME, LANG, Lambda's non-secret variables and the function's own settings minus anything that looks like
    a credential: never the caller's environment."""
    prefix, _ = interpreter()
    environment = {
        name: value for name, value in function.environment.items() if not is_withheld_variable(name) and value
    }
    environment.update(
        {
            "PATH": f"{prefix / 'bin'}:/usr/local/bin:/usr/bin:/bin",
            "HOME": "/tmp",
            "LANG": "C.UTF-8",
            "TZ": ":UTC",
            "LAMBDA_TASK_ROOT": TASK_ROOT,
            "LAMBDA_RUNTIME_DIR": RUNTIME_ROOT,
            "AWS_REGION": function.region,
            "AWS_DEFAULT_REGION": function.region,
            "AWS_LAMBDA_FUNCTION_NAME": function.function_name,
            "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(function.memory_size_mb),
            "_HANDLER": function.handler,
        }
    )
    return environment


def _read_only_binds() -> list[str]:
    arguments = ["--ro-bind", "/usr", "/usr"]
    for name in MERGED_USR_LINKS:
        path = Path("/") / name
        if path.is_symlink():
            arguments += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            arguments += ["--ro-bind", str(path), str(path)]
    prefix, _ = interpreter()
    if prefix != Path("/usr") and Path("/usr") not in prefix.parents:
        arguments += ["--ro-bind", str(prefix), str(prefix)]
    for etc_file in ETC_FILES:
        if os.path.exists(etc_file):  # a dangling link (localtime without tzdata) is left out
            arguments += ["--ro-bind", etc_file, etc_file]
    return arguments


def bwrap_command(bwrap: str, function: SandboxedFunction, *, disable_userns: bool = True) -> list[str]:
    """The bwrap command line of one invocation's sandbox, running the bootstrap."""
    _, python = interpreter()
    command = [bwrap, "--die-with-parent", "--unshare-all", "--new-session", "--cap-drop", "ALL"]
    if disable_userns:
        command += ["--unshare-user", "--disable-userns"]  # no nested user namespaces from inside
    command += ["--hostname", "sandbox", "--proc", "/proc", "--dev", "/dev"]
    command += ["--size", str(function.ephemeral_storage_mb * 1024 * 1024), "--tmpfs", "/tmp"]
    command += _read_only_binds()
    command += ["--ro-bind", str(function.code_dir), TASK_ROOT]
    command += ["--ro-bind", str(BOOTSTRAP), f"{RUNTIME_ROOT}/bootstrap.py"]
    command += ["--chdir", TASK_ROOT, "--clearenv"]
    for name, value in sorted(sandbox_environment(function).items()):
        command += ["--setenv", name, value]
    # Isolated (no PYTHON* variables, no user or working-directory paths), no site (the interpreter's own
    # site-packages are not the handler's), no bytecode written (all of it is read-only).
    command += ["--", str(python), "-I", "-S", "-B", f"{RUNTIME_ROOT}/bootstrap.py", function.handler]
    return command


def check_bwrap(bwrap: str | None) -> tuple[bool, str]:
    """Start one empty sandbox with the options invocations use: (True, "") when it works, else (False, what to do).
    `disable_userns` support is part of the answer: (True, "no-disable-userns") when this bwrap lacks the option."""
    if bwrap is None:
        return False, f"bubblewrap (bwrap) is not installed, so no test sandbox can start: {INSTALL_HINT}"
    probe = SandboxedFunction(
        function_id="probe",
        function_name="probe",
        function_arn="probe",
        code_dir=BOOTSTRAP.parent,
        handler="probe.handler",
        timeout_seconds=5,
        memory_size_mb=128,
        ephemeral_storage_mb=16,
        region="us-east-1",
        environment={},
    )
    detail = ""
    for disable_userns in (True, False):
        command = bwrap_command(bwrap, probe, disable_userns=disable_userns)
        command = [*command[: command.index("--")], "--", "/bin/sh", "-c", "exit 0"]
        try:
            completed = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False, env={})
        except (OSError, subprocess.TimeoutExpired) as error:
            return False, f"{bwrap} could not be run ({error}); reinstall bubblewrap: {INSTALL_HINT}"
        if completed.returncode == 0:
            return True, "" if disable_userns else "no-disable-userns"
        detail = completed.stderr.strip()
        if "disable-userns" not in detail:
            break
    if "namespace" in detail.lower() or "operation not permitted" in detail.lower():
        return False, (
            f"bwrap cannot create its namespaces here ({detail}): user namespaces are disabled on this machine."
            " Enable them (`sudo sysctl -w kernel.unprivileged_userns_clone=1` on Debian, or raise"
            " user.max_user_namespaces; in a container, allow unshare/user namespaces), or run as root"
        )
    return False, f"bwrap fails to start a sandbox: {detail or 'no message'}"


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
    start-up off the invocation's clock, as Lambda does; it never serves a second invocation or a second tenant."""

    def __init__(self, bwrap: str, function: SandboxedFunction, *, disable_userns: bool = True) -> None:
        self.function = function
        self._used = False
        self.process = subprocess.Popen(
            bwrap_command(bwrap, function, disable_userns=disable_userns),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # one group: a timeout kills bwrap and anything that could still be outside
            close_fds=True,
            # bwrap stays the sandbox's PID 1, and its own environment is readable there (/proc/1/environ): give it
            # none of this process's (credentials, the functions' settings); --clearenv/--setenv set the sandbox's.
            env={},
        )
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
        timed_out = False
        try:
            self.process.wait(timeout=function.timeout_seconds + START_ALLOWANCE_SECONDS)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(self.process)
        for thread in (self._answer, self._log, writer):
            thread.join(timeout=_KILL_WAIT_SECONDS)
        return self._outcome(timed_out, time.monotonic() - started)

    def discard(self) -> None:
        """End a sandbox that will not be used."""
        self._used = True
        _kill_group(self.process)
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

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

    def __init__(self, bwrap: str, function: SandboxedFunction, *, size: int = 2, disable_userns: bool = True) -> None:
        self.bwrap, self.function, self.disable_userns = bwrap, function, disable_userns
        self._ready: queue.Queue[SandboxProcess] = queue.Queue(maxsize=max(1, size))
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._fill, name=f"sandboxes-{function.function_id}", daemon=True)

    def start(self) -> SandboxPool:
        self._thread.start()
        return self

    def _start_one(self) -> SandboxProcess:
        return SandboxProcess(self.bwrap, self.function, disable_userns=self.disable_userns)

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
) -> SandboxRun:
    """Run one invocation of `function` on `event` in a new sandbox started for it."""
    sandbox = SandboxProcess(bwrap, function, disable_userns=disable_userns)
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
