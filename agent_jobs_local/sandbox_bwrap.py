"""The bubblewrap sandbox's command line (see `sandbox` for what is inside one): finding bwrap and checking it can make
its namespaces, the read-only binds of the interpreter and a few /etc files, and the cleared environment a sandboxed
function sees (never a credential)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

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


# Names that never reach a sandbox, whatever the function declares: credentials and anything that looks like one.
_WITHHELD_PREFIXES: Final = ("AWS_", "_AWS_", "_X_AMZN_")
_WITHHELD_FRAGMENTS: Final = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "API_KEY", "APIKEY", "PRIVATE")


@dataclass(frozen=True)
class SandboxedFunction:
    """What a sandbox needs of a function (read from the template by the caller). `memory_setting` names where its
    MemorySize comes from (the template parameter it refers to), for the message of a sandbox that ran out of it."""

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
    memory_setting: str = "MemorySize"


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
    # Last, once every mount point exists: nothing outside /tmp can be written, so /tmp's size bounds the disk. The
    # root is a tmpfs bwrap made without a size, and /dev/shm one of /dev's folders (Lambda has no /dev/shm at all).
    command += ["--remount-ro", "/dev", "--remount-ro", "/"]
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
