"""A Lambda execution environment as a local process: one function, initialised once, invoked many times.

`ExecutionEnvironment` starts a process (a fresh interpreter running this module, nothing inherited from the
caller's memory) that lays out the function as Lambda does — its CodeUri folder first on `sys.path` (/var/task), the
layer folders next (/opt/python), the project root last (so local tooling such as fault injection can be imported by a
bootstrap hook), `os.environ` replaced by the function's environment — imports the handler module once (the cold
start), and then serves invocations over a pipe while it stays warm.

As in Lambda, an invocation ends in one of these outcomes (`Outcome`): a JSON-serialisable response; a function
error (the handler raised: the environment stays warm, as Lambda keeps it after a function error); a timeout (the
deadline passed: the process is killed); a crash (the process died: `os._exit`, a signal, `sys.exit`). Init errors
(the handler module failed to import, or the bootstrap hook failed) are their own outcome. This module imports only
the standard library and `agent_jobs_local.event_source`, so the environment starts without the caller's
dependencies loaded.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import importlib
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Final

from agent_jobs_local.event_source import LambdaContextStub

PROJECT_ROOT: Final = Path(__file__).resolve().parent.parent
# Lambda gives the Init phase 10 s; several local environments starting at once on a small machine need more.
INIT_TIMEOUT_SECONDS: Final = 60.0
# Environment variables a process needs to run at all, passed through from the caller's environment.
PASSTHROUGH_VARIABLES: Final = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TMPDIR",
    "TEMP",
    "TMP",
    "SYSTEMROOT",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CA_BUNDLE",
)


class Outcome(enum.StrEnum):
    OK = "ok"
    FUNCTION_ERROR = "function_error"
    TIMEOUT = "timeout"
    CRASH = "crash"
    INIT_ERROR = "init_error"


@dataclass(frozen=True)
class FunctionSpec:
    """Everything the environment's process needs; picklable, so it crosses to the spawned interpreter.

    `handler` is Lambda's `module.function` (the module may be a dotted or slash-separated path inside `code_dir`).
    `bootstrap` is an optional `"package.module:function"` called as `function(handler_module, bootstrap_config)`
    right after the handler module is imported and before the handler is looked up, so it may wrap or replace it.
    """

    function_id: str
    code_dir: Path
    handler: str
    environment: Mapping[str, str]
    layer_dirs: Sequence[Path] = ()
    memory_size_mb: int = 128
    bootstrap: str | None = None
    bootstrap_config: Mapping[str, Any] | None = None
    extra_sys_path: Sequence[Path] = (PROJECT_ROOT,)

    @property
    def module_name(self) -> str:
        module, _, _ = self.handler.rpartition(".")
        if not module:
            raise ValueError(f"{self.function_id} Handler {self.handler!r} is not 'module.function'")
        return module.replace("/", ".")

    @property
    def function_name(self) -> str:
        return self.handler.rpartition(".")[2]


@dataclass(frozen=True)
class InvocationResult:
    outcome: Outcome
    response: Any = None
    error: str | None = None
    duration_seconds: float = 0.0


@dataclass
class _ErrorPayload:
    error_type: str
    message: str
    trace: list[str] = field(default_factory=list)

    def text(self) -> str:
        return f"{self.error_type}: {self.message}"


def lambda_environment(
    spec_environment: Mapping[str, str],
    *,
    function_id: str,
    handler: str,
    code_dir: Path,
    region: str,
    timeout_seconds: float,
    memory_size_mb: int,
    endpoint_url: str | None,
) -> dict[str, str]:
    """The environment a function process sees: a few variables of the caller's (PATH, HOME, locale, credentials),
    Lambda's reserved variables, then the function's own, then AWS_ENDPOINT_URL when an endpoint is given.

    `AWS_SAM_LOCAL=true` is set as `sam local` sets it (Powertools then keeps tracing off locally). Fake credentials
    are added when the caller has none, so clients of a local emulator sign their requests.
    """
    environment = {name: os.environ[name] for name in PASSTHROUGH_VARIABLES if name in os.environ}
    environment.update(
        {
            "AWS_REGION": region,
            "AWS_DEFAULT_REGION": region,
            "AWS_LAMBDA_FUNCTION_NAME": function_id,
            "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(memory_size_mb),
            "AWS_LAMBDA_FUNCTION_TIMEOUT": str(max(1, round(timeout_seconds))),
            "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{function_id}",
            "AWS_EXECUTION_ENV": "AWS_Lambda_python3.13",
            "LAMBDA_TASK_ROOT": str(code_dir),
            "_HANDLER": handler,
            "AWS_SAM_LOCAL": "true",
        }
    )
    environment.update(spec_environment)
    if endpoint_url is not None:
        environment["AWS_ENDPOINT_URL"] = endpoint_url
    if "AWS_ACCESS_KEY_ID" not in environment and "AWS_PROFILE" not in environment:
        environment["AWS_ACCESS_KEY_ID"] = "testing"
        environment["AWS_SECRET_ACCESS_KEY"] = "testing"
    return environment


# --- Inside the environment's process -----------------------------------------------------------------------------


def _is_installed_location(path: Path) -> bool:
    prefixes = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), Path(sys.exec_prefix).resolve()}
    return "site-packages" in path.parts or any(prefix == path or prefix in path.parents for prefix in prefixes)


def _function_sys_path(spec: FunctionSpec, inherited: Sequence[str]) -> list[str]:
    """/var/task, /opt/python, the interpreter's own paths; never the project's other source folders."""
    project = PROJECT_ROOT
    kept: list[str] = []
    for entry in inherited:
        if not entry:
            continue  # the working directory: Lambda's is /var/task, already first
        path = Path(entry).resolve()
        if (path == project or project in path.parents) and not _is_installed_location(path):
            continue
        kept.append(entry)
    own = [str(spec.code_dir), *(str(layer) for layer in spec.layer_dirs)]
    extra = [str(path) for path in spec.extra_sys_path]
    return list(dict.fromkeys([*own, *kept, *extra]))


def _error_payload(error: BaseException) -> _ErrorPayload:
    return _ErrorPayload(
        error_type=type(error).__name__,
        message=str(error),
        trace=traceback.format_exception(type(error), error, error.__traceback__),
    )


def _resolve_bootstrap(reference: str) -> Any:
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"worker bootstrap {reference!r} is not 'package.module:function'")
    return getattr(importlib.import_module(module_name), attribute)


def serve(requests: Connection, replies: Connection, spec: FunctionSpec) -> None:
    """The environment's process: init once, then answer invocations until told to stop or the caller is gone."""
    try:
        os.environ.clear()
        os.environ.update(spec.environment)
        sys.path[:] = _function_sys_path(spec, sys.path)
        os.chdir(spec.code_dir)
        importlib.invalidate_caches()
        module = importlib.import_module(spec.module_name)
        if spec.bootstrap:
            _resolve_bootstrap(spec.bootstrap)(module, dict(spec.bootstrap_config or {}))
        handler = getattr(module, spec.function_name)
    except Exception as error:
        payload = _error_payload(error)
        sys.stderr.write("".join(payload.trace))
        replies.send(("init_error", payload.text()))
        return
    replies.send(("ready", None))
    while True:
        try:
            message = requests.recv()
        except (EOFError, OSError):
            return
        if message[0] != "invoke":
            return
        _, event, timeout_seconds = message
        context = LambdaContextStub(
            timeout_seconds=timeout_seconds, function_name=spec.function_id, memory_limit_in_mb=spec.memory_size_mb
        )
        try:
            # Lambda serialises the response as JSON: what cannot be serialised is a function error there too.
            response = json.dumps(handler(event, context))
        except Exception as error:
            payload = _error_payload(error)
            sys.stderr.write("".join(payload.trace))
            replies.send(("error", payload.text()))
            continue
        replies.send(("result", response))


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m agent_jobs_local.execution_environment --requests FD --replies FD`: the environment's process.
    The first request is the `FunctionSpec`."""
    parser = argparse.ArgumentParser(prog="python -m agent_jobs_local.execution_environment")
    parser.add_argument("--requests", type=int, required=True)
    parser.add_argument("--replies", type=int, required=True)
    args = parser.parse_args(argv)
    requests, replies = Connection(args.requests, writable=False), Connection(args.replies, readable=False)
    try:
        spec = requests.recv()
    except (EOFError, OSError):
        return
    serve(requests, replies, spec)


# --- The environment, as its poller sees it -----------------------------------------------------------------------


class ExecutionEnvironment:
    """One warm process for one function. Not thread-safe: one caller (a poller thread) owns it.

    The process is a fresh interpreter (`python -m agent_jobs_local.execution_environment`), not a fork and not a
    multiprocessing child, so nothing of the caller's memory or `__main__` module leaks into it; it talks to its
    owner over two pipes and returns when they close (its owner is gone).
    """

    def __init__(self, spec: FunctionSpec) -> None:
        self.spec = spec
        requests_read, requests_write = os.pipe()
        replies_read, replies_write = os.pipe()
        command = [sys.executable, "-m", "agent_jobs_local.execution_environment"]
        command += ["--requests", str(requests_read), "--replies", str(replies_write)]
        # PYTHONPATH only to find this module; the process then lays out sys.path as Lambda does.
        environment = {**spec.environment, "PYTHONPATH": str(PROJECT_ROOT)}
        try:
            self._process = subprocess.Popen(
                command,
                pass_fds=(requests_read, replies_write),
                env=environment,
                cwd=spec.code_dir,
                stdin=subprocess.DEVNULL,
            )
        finally:
            # Only the child holds these ends now, so its death shows as EOF on ours.
            os.close(requests_read)
            os.close(replies_write)
        self._requests = Connection(requests_write, readable=False)
        self._replies = Connection(replies_read, writable=False)
        self.pid = self._process.pid
        self.init: InvocationResult | None = None  # the Init phase's outcome, once wait_until_ready returned
        self.invocations = 0
        with contextlib.suppress(OSError):  # the process is already gone: wait_until_ready reports it
            self._requests.send(spec)

    @property
    def alive(self) -> bool:
        return self._process.poll() is None

    def wait_until_ready(self, timeout: float = INIT_TIMEOUT_SECONDS) -> InvocationResult:
        """The Init phase: OK once the handler module is imported (and the bootstrap ran). Also kept as `init`."""
        if self.init is None:
            self.init = self._init(timeout)
        return self.init

    def _init(self, timeout: float) -> InvocationResult:
        started = time.monotonic()
        reply = self._reply(timeout)
        duration = time.monotonic() - started
        if reply is None:
            self.kill()
            error = f"init did not finish within {timeout:g} s"
            return InvocationResult(Outcome.INIT_ERROR, error=error, duration_seconds=duration)
        kind, value = reply
        if kind == "ready":
            return InvocationResult(Outcome.OK, duration_seconds=duration)
        self.kill()
        if kind != "init_error":
            value = f"the process exited during init (exit code {self._process.returncode})"
        return InvocationResult(Outcome.INIT_ERROR, error=str(value), duration_seconds=duration)

    def invoke(
        self, event: Mapping[str, Any], *, timeout_seconds: float, slack_seconds: float = 0.5
    ) -> InvocationResult:
        """Run one invocation; the process is killed when it has not answered `timeout_seconds` (+ slack) later."""
        started = time.monotonic()
        self.invocations += 1
        try:
            self._requests.send(("invoke", dict(event), timeout_seconds))
        except OSError:
            self.kill()
            return InvocationResult(Outcome.CRASH, error="the process was gone before the invocation")
        reply = self._reply(timeout_seconds + slack_seconds)
        duration = time.monotonic() - started
        if reply is None:
            self.kill()
            error = f"Task timed out after {timeout_seconds:.2f} seconds"
            return InvocationResult(Outcome.TIMEOUT, error=error, duration_seconds=duration)
        kind, value = reply
        if kind == "result":
            return InvocationResult(Outcome.OK, response=json.loads(value), duration_seconds=duration)
        if kind == "error":
            return InvocationResult(Outcome.FUNCTION_ERROR, error=str(value), duration_seconds=duration)
        self.kill()
        error = f"the process exited during the invocation (exit code {self._process.returncode})"
        return InvocationResult(Outcome.CRASH, error=error, duration_seconds=duration)

    def _reply(self, timeout: float) -> tuple[str, Any] | None:
        """The process's next message; ("exited", None) when it died; None when `timeout` passed first."""
        if not wait([self._replies], timeout=timeout):
            return None
        try:
            kind, value = self._replies.recv()
        except (EOFError, OSError):
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=5)
            return "exited", None
        return str(kind), value

    def kill(self) -> None:
        """End the process now (a timeout, a crash, or shutting down)."""
        if self._process.poll() is None:
            self._process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=5)
        self._requests.close()
        self._replies.close()

    def shutdown(self, timeout: float = 2.0) -> None:
        """Ask the process to return, then kill it if it has not."""
        if self._process.poll() is None:
            with contextlib.suppress(OSError):
                self._requests.send(("shutdown", None, 0))
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=timeout)
        self.kill()


class EnvironmentPool:
    """Warm environments of one function shared by concurrent callers, as Lambda scales a function out.

    An invocation takes an idle environment; when every one is busy it starts another (a cold start) while fewer than
    `max_environments` exist, and otherwise waits for one to come back. An environment whose invocation timed out or
    crashed is killed and dropped; one whose Init failed fails only the invocation it was started for. Each invocation
    may run `timeout_seconds` (the function's Timeout); Init does not count against it. Thread-safe.
    """

    def __init__(self, spec: FunctionSpec, *, timeout_seconds: float, max_environments: int) -> None:
        if max_environments < 1:
            raise ValueError(f"max_environments must be at least 1, got {max_environments}")
        spec.module_name  # noqa: B018 - refuse a malformed Handler now, not in every environment
        self.spec = spec
        self.timeout_seconds = timeout_seconds
        self.max_environments = max_environments
        self.cold_starts = 0
        self._idle: list[ExecutionEnvironment] = []
        self._environments = 0
        self._closed = False
        self._available = threading.Condition()

    def invoke(self, event: Mapping[str, Any]) -> InvocationResult:
        environment = self._acquire()
        keep = False
        try:
            init = environment.wait_until_ready()
            if init.outcome is not Outcome.OK:
                return init
            result = environment.invoke(event, timeout_seconds=self.timeout_seconds)
            keep = result.outcome in (Outcome.OK, Outcome.FUNCTION_ERROR) and environment.alive
            return result
        finally:
            self._release(environment, keep=keep)

    def _acquire(self) -> ExecutionEnvironment:
        with self._available:
            while True:
                if self._closed:
                    raise RuntimeError(f"the environments of {self.spec.function_id} are shut down")
                if self._idle:
                    return self._idle.pop()
                if self._environments < self.max_environments:
                    self._environments += 1
                    self.cold_starts += 1
                    break
                self._available.wait()
        try:
            return ExecutionEnvironment(self.spec)
        except BaseException:
            with self._available:
                self._environments -= 1
                self._available.notify()
            raise

    def _release(self, environment: ExecutionEnvironment, *, keep: bool) -> None:
        with self._available:
            keep = keep and not self._closed
            if keep:
                self._idle.append(environment)
            else:
                self._environments -= 1
            self._available.notify()
        if not keep:
            environment.kill()

    def close(self) -> None:
        """Shut the idle environments down; busy ones end when their invocation returns. Later invocations fail."""
        with self._available:
            self._closed = True
            idle, self._idle = self._idle, []
            self._available.notify_all()
        for environment in idle:
            environment.shutdown()


__all__ = [
    "INIT_TIMEOUT_SECONDS",
    "EnvironmentPool",
    "ExecutionEnvironment",
    "FunctionSpec",
    "InvocationResult",
    "Outcome",
    "lambda_environment",
    "main",
    "serve",
]


if __name__ == "__main__":
    main()
