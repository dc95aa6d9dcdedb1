"""The runtime inside a local sandbox: one invocation of a Lambda handler, with the standard library only.

Bound read-only into the sandbox (never with the rest of this package) and run as `python3 -I -S bootstrap.py
module.function`. It imports the handler from /var/task first (Lambda's Init phase), then reads its one invocation,
`{"event", "timeoutSeconds", "functionName", "functionArn", "memoryLimitInMb", "requestId", "tenantId"}`, as JSON on
stdin, calls the handler with a context whose remaining time counts down from the function's Timeout from then on,
and writes `{"result": ...}` or, when the handler raised, `{"errorMessage", "errorType", "stackTrace"}` as
one JSON document on its standard output. Everything the handler prints goes to standard error (its log), so nothing
it prints can be taken for the answer.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from typing import Any

TASK_ROOT = "/var/task"


class LambdaContext:
    """The attributes of Lambda's Python context object that a handler reads."""

    def __init__(self, request: dict[str, Any]) -> None:
        self._deadline = time.monotonic() + float(request["timeoutSeconds"])
        self.function_name = str(request["functionName"])
        self.function_version = "$LATEST"
        self.invoked_function_arn = str(request.get("functionArn") or self.function_name)
        self.memory_limit_in_mb = int(request["memoryLimitInMb"])
        self.aws_request_id = str(request["requestId"])
        self.log_group_name = f"/aws/lambda/{self.function_name}"
        self.log_stream_name = "local-sandbox"
        self.tenant_id = request.get("tenantId")
        self.identity = None
        self.client_context = None

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def _load(handler: str) -> Any:
    module_name, _, function_name = handler.rpartition(".")
    return getattr(importlib.import_module(module_name.replace("/", ".")), function_name)


def main() -> int:
    answer = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # the handler's prints are its log, never the answer
    sys.stdout = sys.stderr
    sys.path.insert(0, TASK_ROOT)
    os.chdir(TASK_ROOT)
    # Init: import the handler before the invocation arrives (its time is not the invocation's).
    handler, init_error = None, None
    try:
        handler = _load(sys.argv[1])
    except Exception as error:
        init_error = error
    request = json.loads(sys.stdin.buffer.read())  # the invocation starts here
    context = LambdaContext(request)
    try:
        if init_error is not None:
            raise init_error
        document: dict[str, Any] = {"result": handler(request["event"], context)}  # type: ignore[misc]
        text = json.dumps(document)
    except Exception as error:
        import traceback  # only on an error: every invocation starts a new interpreter, so imports are its cost

        trace = traceback.format_exception(type(error), error, error.__traceback__)
        sys.stderr.write("".join(trace))
        error_type = "Runtime.ImportModuleError" if error is init_error else type(error).__name__
        message = f"Unable to import module {sys.argv[1]!r}: {error}" if error is init_error else str(error)
        text = json.dumps({"errorMessage": message, "errorType": error_type, "stackTrace": trace})
    answer.write(text)
    answer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
