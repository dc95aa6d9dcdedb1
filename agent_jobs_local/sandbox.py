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


def sandbox_environment(function: SandboxedFunction, tenant_id: str | None) -> dict[str, str]:
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
    if tenant_id is not None:
        environment["AWS_LAMBDA_TENANT_ID"] = tenant_id
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


def bwrap_command(
    bwrap: str, function: SandboxedFunction, tenant_id: str | None, *, disable_userns: bool = True
) -> list[str]:
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
    for name, value in sorted(sandbox_environment(function, tenant_id).items()):
        command += ["--setenv", name, value]
    # Isolated (no PYTHON* variables, no user or working-directory paths), no site (the interpreter's own
    # site-packages are not the handler's), no bytecode written (all of it is read-only).
    command += ["--", str(python), "-I", "-S", "-B", f"{RUNTIME_ROOT}/bootstrap.py"]
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
        command = bwrap_command(bwrap, probe, None, disable_userns=disable_userns)
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


def run_sandboxed(
    bwrap: str,
    function: SandboxedFunction,
    event: Any,
    *,
    request_id: str,
    tenant_id: str | None,
    disable_userns: bool = True,
) -> SandboxRun:
    """Run one invocation of `function` on `event` in a new sandbox and wait for it, at most the function's Timeout."""
    request = {
        "handler": function.handler,
        "event": event,
        "timeoutSeconds": function.timeout_seconds,
        "functionName": function.function_name,
        "functionArn": function.function_arn,
        "memoryLimitInMb": function.memory_size_mb,
        "requestId": request_id,
        "tenantId": tenant_id,
    }
    started = time.monotonic()
    process = subprocess.Popen(
        bwrap_command(bwrap, function, tenant_id, disable_userns=disable_userns),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # one group: a timeout kills bwrap and anything that could still be outside
        close_fds=True,
        # bwrap stays the sandbox's PID 1, and its own environment is readable there (/proc/1/environ): give it none
        # of this process's (credentials, the functions' settings); the sandbox's is set by --clearenv/--setenv.
        env={},
    )
    assert process.stdin is not None
    assert process.stdout is not None
    assert process.stderr is not None
    answer = _BoundedReader(process.stdout, keep_first=MAX_RESPONSE_BYTES)
    log = _BoundedReader(process.stderr, keep_last=LOG_TAIL_BYTES)
    writer = threading.Thread(target=_write_all, args=(process.stdin, json.dumps(request).encode()), daemon=True)
    for thread in (answer, log, writer):
        thread.start()
    timed_out = False
    try:
        process.wait(timeout=function.timeout_seconds + START_ALLOWANCE_SECONDS)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        _kill_group(process)
    for thread in (answer, log, writer):
        thread.join(timeout=_KILL_WAIT_SECONDS)
    duration = time.monotonic() - started
    log_tail = bytes(log.data).decode("utf-8", errors="replace")
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
    if not isinstance(document, dict) or process.returncode != 0:
        message = f"Runtime exited with error: exit status {process.returncode}"
        if log_tail.strip():
            message += f"; its last log line: {log_tail.strip().splitlines()[-1][:500]}"
        return SandboxRun(None, "Runtime.ExitError", message, log_tail, duration)
    if "result" in document:
        return SandboxRun(document["result"], None, None, log_tail, duration)
    return SandboxRun(
        None, str(document.get("errorType", "Error")), str(document.get("errorMessage", "")), log_tail, duration
    )


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
