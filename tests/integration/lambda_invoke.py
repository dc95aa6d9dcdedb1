"""A minimal Lambda Invoke endpoint on 127.0.0.1 that runs the test sandbox's handler in this process.

Enough of Lambda's Invoke API for the worker's boto3 client (AWS_ENDPOINT_URL_LAMBDA): POST
/2015-03-31/functions/{name}/invocations, X-Amz-Tenant-Id required (the function is PER_TENANT), 200 with the
handler's answer, or with X-Amz-Function-Error: Unhandled and {"errorMessage", "errorType"} when it raises. An
archive given by URL is downloaded here and passed inline, as the local runtime's endpoint does for its sandbox
without network. No isolation at all: for tests of the worker's side only.
"""

from __future__ import annotations

import base64
import http.server
import json
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from test_sandbox import app as sandbox_app

PATH_PREFIX = "/2015-03-31/functions/"
PATH_SUFFIX = "/invocations"


class _Remaining:
    def __init__(self, timeout_seconds: float) -> None:
        self.deadline = time.monotonic() + timeout_seconds

    def get_remaining_time_in_millis(self) -> int:
        return int((self.deadline - time.monotonic()) * 1000)


class LambdaInvokeServer:
    """Serves `function_name` with `handler` (the sandbox's by default); records each invocation's tenant and event."""

    def __init__(
        self,
        function_name: str,
        *,
        timeout_seconds: float = 90,
        handler: Callable[[dict[str, Any], Any], Any] = sandbox_app.lambda_handler,
        fetch: Callable[[str], bytes] | None = None,
    ) -> None:
        self.function_name = function_name
        self.fetch = fetch or _download
        self.timeout_seconds = timeout_seconds
        self.handler = handler
        # One execution environment runs one invocation at a time, as Lambda's do: the in-process handler reaps its
        # own children, which would take another invocation's if two ran at once in this process.
        self._one_at_a_time = threading.Lock()
        self.invocations: list[tuple[str, dict[str, Any]]] = []
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                endpoint._serve(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> LambdaInvokeServer:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _serve(self, request: http.server.BaseHTTPRequestHandler) -> None:
        path = request.path.split("?")[0]
        name = path.removeprefix(PATH_PREFIX).removesuffix(PATH_SUFFIX)
        body = request.rfile.read(int(request.headers.get("Content-Length") or 0))
        if not path.startswith(PATH_PREFIX) or name != self.function_name:
            self._answer(request, 404, {"Type": "User", "message": f"Function not found: {name}"}, "ResourceNotFound")
            return
        tenant = request.headers.get("X-Amz-Tenant-Id")
        if not tenant:
            message = "The invoked function is tenant-isolated: pass a tenant id"
            self._answer(request, 400, {"Type": "User", "message": message}, "InvalidParameterValueException")
            return
        event = json.loads(body)
        self.invocations.append((tenant, json.loads(body)))
        archive = event.get("archive") or {}
        if "url" in archive:
            data = self.fetch(archive["url"])
            event["archive"] = {"inline": base64.b64encode(data).decode(), "sha256": archive["sha256"]}
        try:
            with self._one_at_a_time:
                answer = self.handler(event, _Remaining(self.timeout_seconds))
        except Exception as error:
            self._answer(request, 200, {"errorMessage": str(error), "errorType": type(error).__name__}, None, True)
            return
        self._answer(request, 200, answer, None)

    @staticmethod
    def _answer(
        request: http.server.BaseHTTPRequestHandler,
        status: int,
        payload: Any,
        error_type: str | None,
        function_error: bool = False,
    ) -> None:
        body = json.dumps(payload).encode()
        request.send_response(status)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(body)))
        if error_type:
            request.send_header("X-Amzn-ErrorType", error_type)
        if function_error:
            request.send_header("X-Amz-Function-Error", "Unhandled")
        request.end_headers()
        request.wfile.write(body)


def _download(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:
        data: bytes = response.read()
    return data


def presigned_get(stack: Any) -> Callable[[str], bytes]:
    """Fetch a presigned GET of the stack's payload bucket: over HTTP from moto's server, through boto3 from moto in
    this process (whose S3 answers boto3 only)."""

    def fetch(url: str) -> bytes:
        parts = urllib.parse.urlsplit(url)
        if parts.hostname in ("127.0.0.1", "localhost"):
            return _download(url)
        key = urllib.parse.unquote(parts.path.lstrip("/"))
        bucket = stack.settings.payload_bucket
        key = key.removeprefix(f"{bucket}/")  # path-style URL
        body: bytes = stack.services.payloads.client.get_object(Bucket=bucket, Key=key)["Body"].read()
        return body

    return fetch
