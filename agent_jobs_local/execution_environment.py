"""A Lambda execution environment as a local process: one function, initialised once, invoked many times.

`ExecutionEnvironment` starts a process (a fresh interpreter running this module, nothing inherited from the
caller's memory) that lays out the function as Lambda does — its CodeUri folder first on `sys.path` (/var/task), the
layer folders next (/opt/python), the project root last (so local tooling such as fault injection can be imported by a
bootstrap hook), `os.environ` replaced by the function's environment — imports the handler module once (the cold
start), and then serves invocations over a pipe while it stays warm.

As in Lambda, an invocation ends in one of these outcomes (`Outcome`): a JSON-serialisable response; a function
error (the handler raised: the environment stays warm, as Lambda keeps it after a function error); a timeout (the
deadline passed: the process is killed); a crash (the process died: `os._exit`, a signal, `sys.exit`). Init errors
(the handler module failed to import, or the bootstrap hook failed) are their own outcome. This module and its
siblings `environment_spec` (the spec, the outcomes, the environment variables) and `environment_process` (what runs
inside the process) import only the standard library and `agent_jobs_local.event_source`, so the environment starts
without the caller's dependencies loaded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any, Final

from agent_jobs_local.environment_process import serve
from agent_jobs_local.environment_spec import (
    PASSTHROUGH_VARIABLES,
    PROJECT_ROOT,
    FunctionSpec,
    InvocationResult,
    Outcome,
    lambda_environment,
)

# Lambda gives the Init phase 10 s; several local environments starting at once on a small machine need more.
INIT_TIMEOUT_SECONDS: Final = 60.0


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
    "PASSTHROUGH_VARIABLES",
    "PROJECT_ROOT",
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
