"""What a local Lambda execution environment runs and how an invocation ends: the function's `FunctionSpec` (picklable,
it crosses to the environment's process), the `Outcome` and `InvocationResult` of an invocation, and the environment
variables a function process sees (`lambda_environment`). Standard library only, like the environment's process."""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

PROJECT_ROOT: Final = Path(__file__).resolve().parent.parent
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
