"""The producer's HTTP API on localhost, as `sam local start-api` serves it, without Docker.

`LocalApiServer` reads the routes from the template (the `HttpApi` events of a function: `POST /jobs`,
`GET /jobs/{jobId}`), turns each HTTP request into the event API Gateway gives a Lambda integration with payload
format 2.0, invokes the handler, and turns the handler's answer back into an HTTP response the way API Gateway does.

The event has the keys API Gateway sends and omits the ones it omits when empty (`cookies`,
`queryStringParameters`, `pathParameters`, `body`), like events/http_post_job.json: header names lower-cased,
repeated headers comma-joined, the Cookie header moved to `cookies`, hop-by-hop headers (Connection, ...) dropped,
API Gateway's x-forwarded-* and x-amzn-trace-id added; query parameters comma-joined; path parameters as they appear
in the path (not URL-decoded); a body that is not text (by Content-Type, or not UTF-8, or with a Content-Encoding)
base64-encoded with `isBase64Encoded: true`; `requestContext` with accountId, apiId, domainName, domainPrefix,
http {method, path, protocol, sourceIp, userAgent}, requestId, routeKey, stage `$default`, time and timeEpoch, and
`authorizer.jwt` {claims, scopes} on the routes an authorizer protects.

Authorization is API Gateway's, read per route from the template: a route runs the API's `DefaultAuthorizer` (or the
`Authorizer` its event names) unless its event says `Auth: {Authorizer: NONE}`. On such a route the
`authorizer_claims` hook (default: `auth.verify_authorization`, the JWT authorizer's checks against the local
development key) gives the caller's claims from the request headers; when it gives None the answer is 401
`{"message":"Unauthorized"}` and the function is not invoked. A route with `AuthorizationScopes` (its own, else its
authorizer's) needs a token whose `scope` (space-separated) or `scp` holds one of them, else 403
`{"message":"Forbidden"}`, again without invoking the function. Claims reach the function as API Gateway passes
them: every value a string (numbers as digits, lists as `[a b]`); `scopes` is the token's scopes on a route with
AuthorizationScopes, else null.

Answers: a response object (statusCode, headers, multiValueHeaders, cookies as Set-Cookie, body, isBase64Encoded) is
written as is; a response without statusCode is API Gateway's inferred format (200, JSON body); a handler that raises,
runs past the function's Timeout or answers something unusable gives 500 `{"message":"Internal Server Error"}`; a
request no route matches gives 404 `{"message":"Not Found"}`; a body above HTTP API's 10 MB payload quota gives 413
`{"message":"Request Entity Too Large"}` without invoking the handler.
A client that hangs up before its answer is written is logged in one line (a warning), not as a traceback.

HTTP connections are served concurrently. Given an `execution_environment.EnvironmentPool`, invocations run
concurrently too, each in a warm environment process of its own, as Lambda scales a function out behind API Gateway
(the local runtime serves the producer that way); a run past the Timeout is killed there. Given a handler callable,
invocations run in this process one at a time, as in one execution environment (the handler module's state,
Powertools' resolver included, is not made for concurrent invocations).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Final, TypeAlias
from urllib.parse import urlsplit

from agent_jobs_local.api_events import (
    FORBIDDEN,
    INTERNAL_ERROR,
    MAX_PAYLOAD_BYTES,
    NOT_FOUND,
    TOO_LARGE,
    UNAUTHORIZED,
    Answer,
    api_gateway_event,
    event_headers,
    http_answer,
    json_answer,
    new_request_id,
)
from agent_jobs_local.api_routes import (
    DEFAULT_ROUTE,
    ApiRouteError,
    HttpRoute,
    api_gateway_claims,
    http_api_routes,
    route_authorization,
    token_scopes,
)
from agent_jobs_local.auth import verify_authorization
from agent_jobs_local.event_source import LambdaContextStub
from agent_jobs_local.execution_environment import EnvironmentPool, Outcome

if TYPE_CHECKING:
    from agent_jobs_local.template import TemplateModel

LambdaHandler: TypeAlias = Callable[[dict[str, Any], Any], Any]
AuthorizerClaims: TypeAlias = Callable[[Mapping[str, str]], Mapping[str, Any] | None]
"""Given the event's (lower-cased) headers, the verified JWT claims of the caller, or None (API Gateway's 401)."""

_FAILED: Final = object()  # an in-process handler raised

logger = logging.getLogger(__name__)


class LocalApiServer:
    """The HTTP API of `model`'s function (`function_id`, default the one with HttpApi events) on `host:port`
    (0 = a free port), invoking `handler`: an `EnvironmentPool` of the function's environments (concurrent
    invocations, each in its own process), or a callable `handler(event, context)` run in this process one invocation
    at a time, its context counting down from the function's Timeout.

    `authorizer_claims(headers)` is the JWT authorizer of the routes an authorizer guards (default
    `auth.verify_authorization`, tokens of the local development key; tests may set another): claims, or None for
    API Gateway's 401. `start()` serves in a background thread; `url` is the base URL
    (`http://127.0.0.1:<port>`); `stop()` shuts the server down. Also a context manager.
    """

    def __init__(
        self,
        model: TemplateModel,
        handler: LambdaHandler | EnvironmentPool,
        *,
        function_id: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        authorizer_claims: AuthorizerClaims | None = None,
    ) -> None:
        self.model = model
        self.handler = handler
        self.routes = sorted(http_api_routes(model, function_id), key=HttpRoute.specificity, reverse=True)
        self.function_id = self.routes[0].function_id
        settings = model.function_settings(self.function_id)
        self.timeout_seconds = settings.timeout_seconds
        self.memory_size_mb = settings.memory_size_mb
        self.authorizer_claims: AuthorizerClaims = authorizer_claims or verify_authorization
        api_name = f"{model.stack_name}/{self.routes[0].event_name}"
        self.api_id = hashlib.sha256(api_name.encode()).hexdigest()[:10]
        self._invocation_lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, port), self._request_handler_class())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def host(self) -> str:
        return str(self._server.server_address[0])

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> LocalApiServer:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._server.serve_forever, args=(0.1,), name="local-http-api", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=10)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> LocalApiServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # --- request -> event -> response --------------------------------------------------------------------------

    def route(self, method: str, raw_path: str) -> tuple[HttpRoute, dict[str, str]] | None:
        for route in self.routes:
            parameters = route.match(method, raw_path)
            if parameters is not None:
                return route, parameters
        return None

    def authorize(self, route: HttpRoute, header_items: list[tuple[str, str]]) -> dict[str, Any] | Answer | None:
        """What API Gateway's authorizer makes of a request to `route`: None for an open route, the
        `requestContext.authorizer` value for an authorized one, or the 401 / 403 answer given instead of invoking."""
        if route.authorizer is None:
            return None
        headers, _ = event_headers(header_items)
        claims = self.authorizer_claims(headers)
        if claims is None:
            return json_answer(UNAUTHORIZED)
        granted = token_scopes(claims)
        if route.authorization_scopes and not set(route.authorization_scopes) & set(granted):
            return json_answer(FORBIDDEN)
        scopes = granted if route.authorization_scopes else None
        return {"jwt": {"claims": api_gateway_claims(claims), "scopes": scopes}}

    def invoke(self, event: dict[str, Any]) -> Answer:
        """Run the handler on `event` as one invocation and translate its answer (500 on any failure)."""
        if isinstance(self.handler, EnvironmentPool):
            result = self.handler.invoke(event)
            if result.outcome is not Outcome.OK:
                logger.error(
                    "%s invocation ended %s (%s): API Gateway answers 500",
                    self.function_id,
                    result.outcome,
                    result.error,
                )
                return json_answer(INTERNAL_ERROR)
            response, elapsed = result.response, result.duration_seconds
        else:
            response, elapsed = self._invoke_here(self.handler, event)
            if response is _FAILED:
                return json_answer(INTERNAL_ERROR)
        if elapsed > self.timeout_seconds:
            logger.error(
                "%s ran %.1f s, past its Timeout of %s s: API Gateway answers 500",
                self.function_id,
                elapsed,
                self.timeout_seconds,
            )
            return json_answer(INTERNAL_ERROR)
        try:
            return http_answer(json.loads(json.dumps(response)))
        except (TypeError, ValueError):
            logger.exception("%s answered something API Gateway cannot use: 500", self.function_id)
            return json_answer(INTERNAL_ERROR)

    def _invoke_here(self, handler: LambdaHandler, event: dict[str, Any]) -> tuple[Any, float]:
        """`handler`'s response in this process (`_FAILED` when it raised) and the seconds it took."""
        context = LambdaContextStub(
            timeout_seconds=self.timeout_seconds, function_name=self.function_id, memory_limit_in_mb=self.memory_size_mb
        )
        with self._invocation_lock:
            started = time.monotonic()
            try:
                response = handler(event, context)
            except Exception:
                logger.exception("%s raised: API Gateway answers 500", self.function_id)
                response = _FAILED
            return response, time.monotonic() - started

    def _request_handler_class(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class RequestHandler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self) -> None:
                body = self._read_body()
                split = urlsplit(self.path)
                matched = api.route(self.command, split.path or "/")
                if len(body) > MAX_PAYLOAD_BYTES:
                    answer = json_answer(TOO_LARGE)
                    request_id = new_request_id()
                elif matched is None:
                    answer = json_answer(NOT_FOUND)
                    request_id = new_request_id()
                else:
                    route, parameters = matched
                    header_items = list(self.headers.items())
                    authorized = api.authorize(route, header_items)
                    if isinstance(authorized, Answer):
                        self._write(authorized, new_request_id())
                        return
                    event = api_gateway_event(
                        route_key=route.route_key,
                        path_parameters=parameters,
                        method=self.command,
                        target=self.path,
                        protocol=self.request_version,
                        header_items=header_items,
                        body=body,
                        source_ip=str(self.client_address[0]),
                        server_port=api.port,
                        account_id=api.model.account_id,
                        api_id=api.api_id,
                        default_host=api.host,
                        authorizer=authorized,
                    )
                    request_id = event["requestContext"]["requestId"]
                    answer = api.invoke(event)
                self._write(answer, request_id)

            def _read_body(self) -> bytes:
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    chunks: list[bytes] = []
                    while True:
                        size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length > 0 else b""

            def _write(self, answer: Answer, request_id: str) -> None:
                self.send_response_only(answer.status)
                self.send_header("Date", formatdate(usegmt=True))
                for name, value in answer.headers:
                    if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer.body)))
                self.send_header("Apigw-Requestid", request_id)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(answer.body)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_HEAD = _handle

            def handle(self) -> None:
                """Serve the connection; a client that hung up before its answer was written (curl stopped with
                Ctrl-C, a timed-out agent) is one line in the log, not socketserver's traceback: nothing went wrong
                on this side, and the request's effect, if any, stands as it would behind API Gateway."""
                try:
                    super().handle()
                except (BrokenPipeError, ConnectionResetError) as error:
                    self.close_connection = True
                    request = f"{getattr(self, 'command', '?')} {urlsplit(getattr(self, 'path', '?')).path}"
                    logger.warning(
                        "client %s hung up before the answer to %s was written (%s)",
                        self.address_string(),
                        request,
                        error.strerror or type(error).__name__,
                    )

            def log_message(self, format: str, *args: Any) -> None:
                logger.debug("%s %s", self.address_string(), format % args)

        return RequestHandler


__all__ = [
    "DEFAULT_ROUTE",
    "MAX_PAYLOAD_BYTES",
    "ApiRouteError",
    "AuthorizerClaims",
    "HttpRoute",
    "LambdaHandler",
    "LocalApiServer",
    "api_gateway_claims",
    "http_answer",
    "http_api_routes",
    "route_authorization",
    "token_scopes",
]
