"""Lambda's Invoke call on localhost, for the template's functions that other functions invoke directly.

`LocalLambdaEndpoint` serves `POST /2015-03-31/functions/{FunctionName}/invocations` on 127.0.0.1 for every function
of the template without Events (the test sandbox), so a boto3 Lambda client with `AWS_ENDPOINT_URL_LAMBDA` set to
`url` invokes it as it would in AWS. CodeUri, Handler, Timeout, MemorySize, EphemeralStorage, TenancyConfig and the
function's own environment are read from the template. The function is named by its name, its ARN or a partial ARN
(`account:function:name`), optionally with the `$LATEST` qualifier.

Each invocation runs the real handler in a new bubblewrap sandbox. A few sandboxes per function are started and
initialised ahead, so an invocation does not wait for one to start (Lambda keeps start-up out of an invocation's time
too); each serves exactly one invocation, of one tenant, and is then torn down. Answers are Lambda's: 200 with the
handler's JSON; on a function error (it raised, timed out, or its runtime exited) 200 with
`X-Amz-Function-Error: Unhandled` and `{"errorMessage", "errorType"}`. `X-Amz-Log-Type: Tail` adds the last 4 KB of
the sandbox's log as `X-Amz-Log-Result`. Invocation types RequestResponse, Event (202, run in the background) and
DryRun (204). A PER_TENANT function needs `X-Amz-Tenant-Id` (without it: 400 InvalidParameterValueException, as
Lambda answers) and another function refuses one. An unknown function is 404 ResourceNotFoundException; a request
above 6 MB is 413 RequestTooLargeException; with ReservedConcurrentExecutions reached, 429 TooManyRequestsException.

The sandbox has no network, so an archive the event gives by URL (`"archive": {"url", "sha256", "size"}`) is
downloaded here, within its declared size, and handed to the handler inline; the handler still checks its sha256.

Without a working bwrap nothing runs unsandboxed: `start()` probes it once and every invocation then fails
(Unhandled) with a message that says what to install or enable.

`start()` also finds how this machine bounds each sandbox (`sandbox_bounds`: memory at the function's MemorySize,
1,024 processes and threads, disk: /tmp at EphemeralStorage, nothing else writable), removes the sandbox cgroups a
killed runtime left behind, and logs a warning per bound the machine cannot hold (`bound_warnings`). A sandbox that
goes past its memory or process bound is ended, and its invocation is a function error that names the bound and
the template setting it comes from.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from agent_jobs_local.sandbox import SandboxedFunction, SandboxPool, SandboxRun, check_bwrap, find_bwrap
from agent_jobs_local.sandbox_bounds import SandboxBounds

if TYPE_CHECKING:
    from agent_jobs_local.template import References, TemplateModel

MAX_REQUEST_BYTES: Final = 6 * 1024 * 1024
LOG_RESULT_BYTES: Final = 4096
# An archive given by URL may be larger than an invocation's payload (that is why it is a URL), up to this much.
MAX_ARCHIVE_DOWNLOAD_BYTES: Final = 256 * 1024 * 1024
DOWNLOAD_TIMEOUT_SECONDS: Final = 30.0
PER_TENANT: Final = "PER_TENANT"
_INVOKE_PATH: Final = re.compile(r"^/2015-03-31/functions/(?P<name>[^/]+)/invocations$")
# A name, an ARN or a partial ARN (account:function:name), with an optional qualifier.
_FUNCTION_ARN: Final = re.compile(
    r"^(?:arn:[^:]+:lambda:[^:]+:)?(?:\d{12}:)?(?:function:)?(?P<name>[^:]+)(?::(?P<q>.+))?$"
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Answer:
    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


def _error(status: HTTPStatus, error_type: str, message: str) -> _Answer:
    body = json.dumps({"Type": "User", "message": message}).encode()
    return _Answer(status, body, (("x-amzn-ErrorType", error_type), ("Content-Type", "application/json")))


def sandboxed_function(
    model: TemplateModel, function_id: str, *, template_dir: Path, references: References | None = None
) -> SandboxedFunction:
    """The sandbox settings of `function_id`, all from the template: its environment is only what it declares itself
    (never Globals', which hold the data-plane settings of the other functions)."""
    settings = model.function_settings(function_id)
    memory = model.function_properties(function_id).get("MemorySize")
    parameter = memory.get("Ref") if isinstance(memory, dict) else None
    return SandboxedFunction(
        function_id=function_id,
        function_name=model.function_name(function_id),
        function_arn=model.function_arn(function_id),
        code_dir=(template_dir / settings.code_uri).resolve(),
        handler=settings.handler,
        timeout_seconds=float(settings.timeout_seconds),
        memory_size_mb=settings.memory_size_mb,
        ephemeral_storage_mb=settings.ephemeral_storage_mb,
        region=model.region,
        environment=model.function_own_environment(function_id, references),
        memory_setting=parameter if isinstance(parameter, str) else f"the MemorySize of {function_id}",
    )


class LocalLambdaEndpoint:
    """Lambda's Invoke call for `model`'s directly invoked functions (see the module docstring), on 127.0.0.1.

    `bwrap`: the bubblewrap binary (default AGENT_JOBS_BWRAP, else `bwrap` on PATH). `function_ids`: default every
    function without Events. `ready_sandboxes`: how many started, unused sandboxes each function keeps ready.
    `bounds`: how sandboxes are bounded (default: what this machine allows, found at `start()`).
    `start()` checks bwrap and serves in a background thread; `url` is what AWS_ENDPOINT_URL_LAMBDA takes; `stop()`
    shuts it down. `sandbox_error` is None when sandboxes can start, else why
    not; `bound_warnings` lists the bounds this machine cannot hold. `invocations` counts the sandboxes started.
    """

    def __init__(
        self,
        model: TemplateModel,
        *,
        template_dir: Path,
        references: References | None = None,
        function_ids: Sequence[str] | None = None,
        bwrap: str | None = None,
        port: int = 0,
        ready_sandboxes: int = 2,
        bounds: SandboxBounds | None = None,
    ) -> None:
        self.model = model
        ids = list(model.directly_invoked_functions() if function_ids is None else function_ids)
        self.functions: dict[str, SandboxedFunction] = {
            function_id: sandboxed_function(model, function_id, template_dir=template_dir, references=references)
            for function_id in ids
        }
        self._settings = {function_id: model.function_settings(function_id) for function_id in ids}
        self._by_name = {function.function_name: function_id for function_id, function in self.functions.items()}
        self._slots: dict[str, threading.BoundedSemaphore] = {
            function_id: threading.BoundedSemaphore(settings.reserved_concurrency)
            for function_id, settings in self._settings.items()
            if settings.reserved_concurrency
        }
        self.bwrap = find_bwrap(bwrap)
        self.ready_sandboxes = ready_sandboxes
        self._pools: dict[str, SandboxPool] = {}
        self.sandbox_error: str | None = None
        self.bounds = bounds
        self.bound_warnings: list[str] = []
        self._disable_userns = True
        self.invocations = 0
        self._count_lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._request_handler_class())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def function_name(self, function_id: str) -> str:
        return self.functions[function_id].function_name

    def start(self) -> LocalLambdaEndpoint:
        if self._thread is None:
            works, detail = check_bwrap(self.bwrap)
            if not works:
                self.sandbox_error = detail
                logger.warning("the local Lambda endpoint cannot sandbox invocations: %s", detail)
            self._disable_userns = detail != "no-disable-userns"
            if works and self.bwrap is not None:
                bounds = self.bounds = self.bounds or SandboxBounds.detect()
                bounds.remove_stale()
                self.bound_warnings = bounds.warnings
                for warning in self.bound_warnings:
                    logger.warning("the local Lambda endpoint cannot bound its sandboxes as Lambda does: %s", warning)
                for function_id, function in self.functions.items():
                    pool = SandboxPool(
                        self.bwrap,
                        function,
                        size=self.ready_sandboxes,
                        disable_userns=self._disable_userns,
                        bounds=bounds,
                    )
                    self._pools[function_id] = pool.start()
            self._thread = threading.Thread(
                target=self._server.serve_forever, args=(0.1,), name="local-lambda-invoke", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=10)
            self._thread = None
        self._server.server_close()
        for pool in self._pools.values():
            pool.stop()
        self._pools = {}

    def __enter__(self) -> LocalLambdaEndpoint:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # --- one request -------------------------------------------------------------------------------------------

    def _function_id(self, quoted_name: str) -> str | None:
        match = _FUNCTION_ARN.match(urllib.parse.unquote(quoted_name))
        if match is None or match.group("q") not in (None, "$LATEST"):
            return None
        return self._by_name.get(match.group("name"))

    def handle(self, path: str, headers: Mapping[str, str], body: bytes) -> _Answer:
        """The answer to one Invoke request (`headers` with lower-case names)."""
        split = urllib.parse.urlsplit(path)
        route = _INVOKE_PATH.match(split.path)
        if route is None:
            return _error(HTTPStatus.NOT_FOUND, "UnknownOperationException", f"no such operation: {split.path}")
        function_id = self._function_id(route.group("name"))
        qualifier = dict(urllib.parse.parse_qsl(split.query)).get("Qualifier")
        if function_id is None or qualifier not in (None, "$LATEST"):
            name = urllib.parse.unquote(route.group("name"))
            return _error(HTTPStatus.NOT_FOUND, "ResourceNotFoundException", f"Function not found: {name}")
        if len(body) > MAX_REQUEST_BYTES:
            message = f"Request must be smaller than {MAX_REQUEST_BYTES} bytes for the InvokeFunction operation"
            return _error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "RequestTooLargeException", message)
        tenant_id = headers.get("x-amz-tenant-id") or None
        isolated = self._settings[function_id].tenant_isolation_mode == PER_TENANT
        if isolated and tenant_id is None:
            message = (
                "The invoked function is enabled with tenancy configuration. Add a valid tenant ID in your request"
                " and try again."
            )
            return _error(HTTPStatus.BAD_REQUEST, "InvalidParameterValueException", message)
        if not isolated and tenant_id is not None:
            message = (
                "The invoked function is not enabled with tenancy configuration. Remove the tenant ID from your"
                " request and try again."
            )
            return _error(HTTPStatus.BAD_REQUEST, "InvalidParameterValueException", message)
        try:
            event = json.loads(body or b"{}")
        except ValueError:
            return _error(
                HTTPStatus.BAD_REQUEST, "InvalidRequestContentException", "Could not parse request body into json"
            )
        invocation_type = headers.get("x-amz-invocation-type", "RequestResponse")
        if invocation_type == "DryRun":
            return _Answer(HTTPStatus.NO_CONTENT, b"")
        if invocation_type not in ("RequestResponse", "Event"):
            message = f"1 validation error detected: Value '{invocation_type}' at 'invocationType' failed"
            return _error(HTTPStatus.BAD_REQUEST, "ValidationException", message)
        slot = self._slots.get(function_id)
        if slot is not None and not slot.acquire(blocking=False):
            return _error(HTTPStatus.TOO_MANY_REQUESTS, "TooManyRequestsException", "Rate Exceeded.")
        if invocation_type == "Event":
            worker = threading.Thread(target=self._invoke, args=(function_id, event, tenant_id, slot), daemon=True)
            worker.start()
            return _Answer(HTTPStatus.ACCEPTED, b"")
        run = self._invoke(function_id, event, tenant_id, slot)
        return self._answer(run, tail=headers.get("x-amz-log-type") == "Tail")

    def _invoke(
        self, function_id: str, event: Any, tenant_id: str | None, slot: threading.BoundedSemaphore | None
    ) -> SandboxRun:
        try:
            pool = self._pools.get(function_id)
            if pool is None:
                return SandboxRun(None, "Sandbox.Unavailable", self.sandbox_error or "the endpoint is not started")
            try:
                event = _inline_archive(event)
            except ArchiveDownloadError as error:
                return SandboxRun(None, "Sandbox.ArchiveDownload", str(error))
            try:
                sandbox = pool.take()
            except OSError as error:  # no process, descriptor or cgroup to be had: nothing runs unbounded
                return SandboxRun(None, "Sandbox.Unavailable", f"a sandbox could not be started: {error}")
            with self._count_lock:
                self.invocations += 1
            return sandbox.invoke(event, request_id=str(uuid.uuid4()), tenant_id=tenant_id)
        finally:
            if slot is not None:
                slot.release()

    @staticmethod
    def _answer(run: SandboxRun, *, tail: bool) -> _Answer:
        headers = [("Content-Type", "application/json"), ("X-Amz-Executed-Version", "$LATEST")]
        if tail:
            log = run.log_tail.encode("utf-8", errors="replace")[-LOG_RESULT_BYTES:]
            headers.append(("X-Amz-Log-Result", base64.b64encode(log).decode()))
        if run.failed:
            headers.append(("X-Amz-Function-Error", "Unhandled"))
            body = {"errorMessage": run.error_message, "errorType": run.error_type}
            return _Answer(HTTPStatus.OK, json.dumps(body).encode(), tuple(headers))
        return _Answer(HTTPStatus.OK, json.dumps(run.result).encode(), tuple(headers))

    def _request_handler_class(self) -> type[BaseHTTPRequestHandler]:
        endpoint = self

        class RequestHandler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_REQUEST_BYTES:
                    self.close_connection = True  # the body is not read: this connection cannot be reused
                    answer = _error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "RequestTooLargeException", "Too large")
                else:
                    body = self.rfile.read(length) if length > 0 else b""
                    headers = {name.lower(): value for name, value in self.headers.items()}
                    answer = endpoint.handle(self.path, headers, body)
                self.send_response_only(answer.status)
                self.send_header("x-amzn-RequestId", str(uuid.uuid4()))
                for name, value in answer.headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer.body)))
                # The caller may be gone by now (a worker killed at its own Timeout): the invocation ran all the
                # same, as it does in Lambda, and nobody is left to answer.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.end_headers()
                    self.wfile.write(answer.body)

            def log_message(self, format: str, *args: Any) -> None:
                logger.debug("%s %s", self.address_string(), format % args)

        return RequestHandler


class ArchiveDownloadError(RuntimeError):
    """An archive given by URL could not be fetched for the sandbox."""


def _inline_archive(event: Any) -> Any:
    """`event` with an archive given by URL downloaded (at most its declared `size`, and at most
    MAX_ARCHIVE_DOWNLOAD_BYTES) and given inline instead; any other event unchanged."""
    archive = event.get("archive") if isinstance(event, dict) else None
    if not isinstance(archive, dict) or "url" not in archive:
        return event
    url, size = archive.get("url"), archive.get("size")
    if not isinstance(url, str) or urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise ArchiveDownloadError("the archive URL must be an http(s) URL")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_ARCHIVE_DOWNLOAD_BYTES:
        raise ArchiveDownloadError(f"the archive size must be an integer from 0 to {MAX_ARCHIVE_DOWNLOAD_BYTES}")
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_SECONDS) as response:
            data = response.read(size + 1)
    except (urllib.error.URLError, OSError) as error:
        raise ArchiveDownloadError(f"the archive could not be downloaded for the sandbox: {error}") from error
    if len(data) > size:
        raise ArchiveDownloadError(f"the archive is larger than its declared size of {size} bytes")
    inline = {key: value for key, value in archive.items() if key not in ("url", "size")}
    inline["inline"] = base64.b64encode(data).decode()
    return {**event, "archive": inline}


__all__ = [
    "MAX_ARCHIVE_DOWNLOAD_BYTES",
    "PER_TENANT",
    "ArchiveDownloadError",
    "LocalLambdaEndpoint",
    "sandboxed_function",
]
