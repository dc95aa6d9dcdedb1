"""Inside a local execution environment's process: lay the function out as Lambda does (`sys.path`, `os.environ`, the
working folder), import the handler once, then answer invocations over a pipe (`serve`). Standard library only."""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from agent_jobs_local.environment_spec import PROJECT_ROOT, FunctionSpec
from agent_jobs_local.event_source import LambdaContextStub


@dataclass
class _ErrorPayload:
    error_type: str
    message: str
    trace: list[str] = field(default_factory=list)

    def text(self) -> str:
        return f"{self.error_type}: {self.message}"


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


def _report(replies: Connection, kind: str, error: Exception) -> None:
    """The error to the parent (`kind` and Lambda's error payload), its trace to the environment's stderr."""
    payload = _error_payload(error)
    sys.stderr.write("".join(payload.trace))
    replies.send((kind, payload.text()))


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
        _report(replies, "init_error", error)
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
            _report(replies, "error", error)
            continue
        replies.send(("result", response))
