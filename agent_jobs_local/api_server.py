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

HTTP connections are served concurrently. Given an `execution_environment.EnvironmentPool`, invocations run
concurrently too, each in a warm environment process of its own, as Lambda scales a function out behind API Gateway
(the local runtime serves the producer that way); a run past the Timeout is killed there. Given a handler callable,
invocations run in this process one at a time, as in one execution environment (the handler module's state,
Powertools' resolver included, is not made for concurrent invocations).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import formatdate
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Final, TypeAlias
from urllib.parse import parse_qsl, urlsplit

from agent_jobs_local.auth import verify_authorization
from agent_jobs_local.event_source import LambdaContextStub
from agent_jobs_local.execution_environment import EnvironmentPool, Outcome

if TYPE_CHECKING:
    from agent_jobs_local.template import TemplateModel

LambdaHandler: TypeAlias = Callable[[dict[str, Any], Any], Any]
AuthorizerClaims: TypeAlias = Callable[[Mapping[str, str]], Mapping[str, Any] | None]
"""Given the event's (lower-cased) headers, the verified JWT claims of the caller, or None (API Gateway's 401)."""

DEFAULT_ROUTE: Final = "$default"
_TEXT_MEDIA_TYPES: Final = frozenset(
    {
        "application/json",
        "application/javascript",
        "application/x-javascript",
        "application/xml",
        "application/x-yaml",
        "application/yaml",
        "application/graphql",
    }
)
_NOT_FOUND: Final = (HTTPStatus.NOT_FOUND, {"message": "Not Found"})
_INTERNAL_ERROR: Final = (HTTPStatus.INTERNAL_SERVER_ERROR, {"message": "Internal Server Error"})
_TOO_LARGE: Final = (HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"message": "Request Entity Too Large"})
MAX_PAYLOAD_BYTES: Final = 10 * 1024 * 1024
"""API Gateway HTTP API's payload quota (10 MB, not adjustable): a larger request never reaches the function."""
_UNAUTHORIZED: Final = (HTTPStatus.UNAUTHORIZED, {"message": "Unauthorized"})
_FORBIDDEN: Final = (HTTPStatus.FORBIDDEN, {"message": "Forbidden"})
# A route's `Auth: {Authorizer: NONE}` opts it out of the API's default authorizer.
NO_AUTHORIZER: Final = "NONE"
# Hop-by-hop headers (RFC 9110 7.6.1) end at API Gateway; they never reach the integration.
_HOP_BY_HOP_HEADERS: Final = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"}
)
_FAILED: Final = object()  # an in-process handler raised
_PATH_VARIABLE: Final = re.compile(r"^\{([A-Za-z0-9._-]+)(\+?)\}$")

logger = logging.getLogger(__name__)


class ApiRouteError(ValueError):
    """The template's HTTP API routes cannot be served as asked; the message says what to change."""


@dataclass(frozen=True)
class HttpRoute:
    """One `HttpApi` event of a function: `method` (upper case, or ANY) and `path` (`/jobs/{jobId}`), or the
    `$default` route. `authorizer` names the authorizer that guards it (None: open); `authorization_scopes`, when
    any, are the scopes of which the caller's token must hold one."""

    function_id: str
    event_name: str
    method: str
    path: str
    authorizer: str | None = None
    authorization_scopes: tuple[str, ...] = ()

    @property
    def route_key(self) -> str:
        return DEFAULT_ROUTE if self.path == DEFAULT_ROUTE else f"{self.method} {self.path}"

    @property
    def _segments(self) -> list[str]:
        return [segment for segment in self.path.split("/") if segment]

    def match(self, method: str, raw_path: str) -> dict[str, str] | None:
        """The path parameters when this route takes the request, else None."""
        if self.path == DEFAULT_ROUTE:
            return {}
        if self.method not in ("ANY", method):
            return None
        parts = [part for part in raw_path.split("/") if part]
        parameters: dict[str, str] = {}
        for index, segment in enumerate(self._segments):
            variable = _PATH_VARIABLE.match(segment)
            if variable and variable.group(2):  # {name+}: the rest of the path, at least one segment
                if index >= len(parts):
                    return None
                parameters[variable.group(1)] = "/".join(parts[index:])
                return parameters
            if index >= len(parts):
                return None
            if variable:
                parameters[variable.group(1)] = parts[index]
            elif segment != parts[index]:
                return None
        return parameters if len(parts) == len(self._segments) else None

    def specificity(self) -> tuple[int, int, int, int]:
        """API Gateway prefers exact paths, then path variables, then greedy variables, then $default."""
        if self.path == DEFAULT_ROUTE:
            return (0, 0, 0, 0)
        segments = self._segments
        greedy = any(s.endswith("+}") for s in segments)
        literal = sum(1 for s in segments if not _PATH_VARIABLE.match(s))
        return (1, 0 if greedy else 1, literal, 0 if self.method == "ANY" else 1)


def http_api_routes(model: TemplateModel, function_id: str | None = None) -> list[HttpRoute]:
    """The `HttpApi` events of `function_id` (default: the one function that has any) as routes."""
    routes: list[HttpRoute] = []
    for candidate in model.resources_of_type("AWS::Serverless::Function"):
        if function_id is not None and candidate != function_id:
            continue
        events: Mapping[str, Any] = model.function_properties(candidate).get("Events") or {}
        for event_name, event in events.items():
            if event.get("Type") != "HttpApi":
                continue
            properties = event.get("Properties") or {}
            # Path, Method and Auth: ApiId only names the API whose Auth applies (it is not provisioned locally).
            path, method = model.resolve(properties.get("Path")), model.resolve(properties.get("Method"))
            authorizer, scopes = route_authorization(model, properties)
            if path is None and method is None:
                routes.append(HttpRoute(candidate, event_name, "ANY", DEFAULT_ROUTE, authorizer, scopes))
                continue
            method = str(method or "ANY").upper()
            routes.append(
                HttpRoute(
                    candidate,
                    event_name,
                    "ANY" if method in ("ANY", "X-AMAZON-APIGATEWAY-ANY-METHOD") else method,
                    str(path or "/"),
                    authorizer,
                    scopes,
                )
            )
    functions = sorted({route.function_id for route in routes})
    if not routes:
        raise ApiRouteError(f"no HttpApi events in the template{f' for {function_id}' if function_id else ''}")
    if len(functions) > 1:
        raise ApiRouteError(f"HttpApi events belong to several functions {functions}: name one as function_id")
    return routes


def _api_auth(model: TemplateModel, event_properties: Mapping[str, Any]) -> Mapping[str, Any]:
    """The `Auth` of the HttpApi an event belongs to: its ApiId's resource, else SAM's implicit API (Globals)."""
    api_id = event_properties.get("ApiId")
    if isinstance(api_id, Mapping) and isinstance(api_id.get("Ref"), str):
        auth = model.properties(api_id["Ref"]).get("Auth")
    else:
        auth = ((model.template.get("Globals") or {}).get("HttpApi") or {}).get("Auth")
    return auth if isinstance(auth, Mapping) else {}


def route_authorization(
    model: TemplateModel, event_properties: Mapping[str, Any]
) -> tuple[str | None, tuple[str, ...]]:
    """The authorizer that guards an HttpApi event's route (None: open) and the scopes it requires, as SAM wires
    them: the event's `Auth.Authorizer` (NONE opts out), else the API's `DefaultAuthorizer`; the event's
    `Auth.AuthorizationScopes`, else the authorizer's own."""
    api_auth = _api_auth(model, event_properties)
    route_auth = event_properties.get("Auth") or {}
    authorizer = model.resolve(route_auth.get("Authorizer")) or model.resolve(api_auth.get("DefaultAuthorizer"))
    if authorizer is None or authorizer == NO_AUTHORIZER:
        return None, ()
    authorizers = api_auth.get("Authorizers") or {}
    if authorizer not in authorizers:
        raise ApiRouteError(f"the route's authorizer '{authorizer}' is not among the API's Authorizers")
    scopes = route_auth.get("AuthorizationScopes")
    if scopes is None:
        scopes = (authorizers[authorizer] or {}).get("AuthorizationScopes")
    return str(authorizer), tuple(str(scope) for scope in model.resolve(scopes) or ())


def token_scopes(claims: Mapping[str, Any]) -> list[str]:
    """The scopes a token grants, as an HTTP API JWT authorizer reads them: `scope` (space-separated) or `scp`."""
    raw = claims.get("scope", claims.get("scp"))
    if isinstance(raw, str):
        return raw.split()
    if isinstance(raw, list):
        return [str(scope) for scope in raw]
    return []


def api_gateway_claims(claims: Mapping[str, Any]) -> dict[str, str]:
    """Claims as an HTTP API passes them to the function: every value a string, a list as `[a b]`."""

    def text(value: Any) -> str:
        if isinstance(value, str):
            return value
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, list):
            return "[" + " ".join(text(item) for item in value) + "]"
        if isinstance(value, int | float):
            return str(int(value)) if float(value).is_integer() else str(value)
        return json.dumps(value, separators=(",", ":"))

    return {str(name): text(value) for name, value in claims.items()}


def _is_text(content_type: str | None, content_encoding: str | None, body: bytes) -> bool:
    if content_encoding and content_encoding.strip().lower() not in ("", "identity"):
        return False
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    texty = (
        not media_type
        or media_type.startswith("text/")
        or media_type in _TEXT_MEDIA_TYPES
        or media_type.endswith(("+json", "+xml"))
    )
    if not texty:
        return False
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _host_name(host_header: str | None) -> str:
    """The Host header without its port ("[::1]:80" -> "[::1]")."""
    host = (host_header or "").strip()
    if host.startswith("["):
        return host.split("]", 1)[0] + "]"
    return host.rsplit(":", 1)[0]


def _request_id() -> str:
    return base64.b64encode(secrets.token_bytes(11)).decode()


def _trace_id() -> str:
    return f"Root=1-{int(time.time()):08x}-{secrets.token_hex(12)}"


def _event_headers(header_items: list[tuple[str, str]]) -> tuple[dict[str, str], list[str]]:
    """Headers as API Gateway passes them (names lower-cased, repeats comma-joined, hop-by-hop ones dropped) and the
    Cookie header's cookies."""
    headers: dict[str, str] = {}
    cookies: list[str] = []
    for name, value in header_items:
        key = name.lower()
        if key in _HOP_BY_HOP_HEADERS:
            continue
        if key == "cookie":
            cookies.extend(part.strip() for part in value.split(";") if part.strip())
            continue
        headers[key] = f"{headers[key]},{value}" if key in headers else value
    return headers, cookies


@dataclass(frozen=True)
class _Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes


def _json_answer(status_and_body: tuple[HTTPStatus, dict[str, str]]) -> _Answer:
    status, body = status_and_body
    return _Answer(int(status), [("Content-Type", "application/json")], json.dumps(body).encode())


def http_answer(response: Any) -> _Answer:
    """A payload-format-2.0 Lambda response as API Gateway turns it into HTTP; ValueError when it cannot."""
    if not (isinstance(response, dict) and "statusCode" in response):
        # API Gateway's inferred format: the whole response is the JSON body of a 200.
        text = response if isinstance(response, str) else json.dumps(response)
        return _Answer(200, [("Content-Type", "application/json")], text.encode())
    status = int(response["statusCode"])
    if not 100 <= status <= 599:
        raise ValueError(f"statusCode {status} is not an HTTP status")
    headers: list[tuple[str, str]] = []
    for name, values in (response.get("multiValueHeaders") or {}).items():
        headers.extend((str(name), str(value)) for value in values)
    headers.extend((str(name), str(value)) for name, value in (response.get("headers") or {}).items())
    headers.extend(("Set-Cookie", str(cookie)) for cookie in response.get("cookies") or [])
    raw = response.get("body")
    if raw is None:
        body = b""
    elif response.get("isBase64Encoded"):
        body = base64.b64decode(str(raw), validate=True)
    else:
        body = (raw if isinstance(raw, str) else json.dumps(raw)).encode()
    return _Answer(status, headers, body)


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

    def build_event(
        self,
        *,
        route: HttpRoute,
        path_parameters: Mapping[str, str],
        method: str,
        target: str,
        protocol: str,
        header_items: list[tuple[str, str]],
        body: bytes,
        source_ip: str,
        server_port: int,
        authorizer: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The payload-format-2.0 event for one request (`target` is the request line's path and query;
        `authorizer` the `requestContext.authorizer` an authorizer gave it, e.g. from `authorize`)."""
        split = urlsplit(target)
        raw_path = split.path or "/"
        headers, cookies = _event_headers(header_items)
        headers.setdefault("x-amzn-trace-id", _trace_id())
        headers["x-forwarded-for"] = (
            f"{headers['x-forwarded-for']}, {source_ip}" if "x-forwarded-for" in headers else source_ip
        )
        headers["x-forwarded-port"] = str(server_port)
        headers["x-forwarded-proto"] = "http"
        query: dict[str, str] = {}
        for key, value in parse_qsl(split.query, keep_blank_values=True):
            query[key] = f"{query[key]},{value}" if key in query else value
        host = _host_name(headers.get("host")) or self.host
        now = time.time()
        context: dict[str, Any] = {
            "accountId": self.model.account_id,
            "apiId": self.api_id,
            "domainName": host,
            "domainPrefix": host.split(".", 1)[0],
            "http": {
                "method": method,
                "path": raw_path,
                "protocol": protocol,
                "sourceIp": source_ip,
                "userAgent": headers.get("user-agent", ""),
            },
            "requestId": _request_id(),
            "routeKey": route.route_key,
            "stage": "$default",
            "time": datetime.fromtimestamp(now, UTC).strftime("%d/%b/%Y:%H:%M:%S +0000"),
            "timeEpoch": int(now * 1000),
        }
        if authorizer is not None:
            context["authorizer"] = dict(authorizer)
        event: dict[str, Any] = {"version": "2.0", "routeKey": route.route_key, "rawPath": raw_path}
        event["rawQueryString"] = split.query
        if cookies:
            event["cookies"] = cookies
        event["headers"] = headers
        if query:
            event["queryStringParameters"] = query
        event["requestContext"] = context
        is_base64 = False
        if body:
            is_base64 = not _is_text(headers.get("content-type"), headers.get("content-encoding"), body)
            event["body"] = base64.b64encode(body).decode() if is_base64 else body.decode("utf-8")
        if path_parameters:
            event["pathParameters"] = dict(path_parameters)
        event["isBase64Encoded"] = is_base64
        return event

    def authorize(self, route: HttpRoute, header_items: list[tuple[str, str]]) -> dict[str, Any] | _Answer | None:
        """What API Gateway's authorizer makes of a request to `route`: None for an open route, the
        `requestContext.authorizer` value for an authorized one, or the 401 / 403 answer given instead of invoking."""
        if route.authorizer is None:
            return None
        headers, _ = _event_headers(header_items)
        claims = self.authorizer_claims(headers)
        if claims is None:
            return _json_answer(_UNAUTHORIZED)
        granted = token_scopes(claims)
        if route.authorization_scopes and not set(route.authorization_scopes) & set(granted):
            return _json_answer(_FORBIDDEN)
        scopes = granted if route.authorization_scopes else None
        return {"jwt": {"claims": api_gateway_claims(claims), "scopes": scopes}}

    def invoke(self, event: dict[str, Any]) -> _Answer:
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
                return _json_answer(_INTERNAL_ERROR)
            response, elapsed = result.response, result.duration_seconds
        else:
            response, elapsed = self._invoke_here(self.handler, event)
            if response is _FAILED:
                return _json_answer(_INTERNAL_ERROR)
        if elapsed > self.timeout_seconds:
            logger.error(
                "%s ran %.1f s, past its Timeout of %s s: API Gateway answers 500",
                self.function_id,
                elapsed,
                self.timeout_seconds,
            )
            return _json_answer(_INTERNAL_ERROR)
        try:
            return http_answer(json.loads(json.dumps(response)))
        except (TypeError, ValueError):
            logger.exception("%s answered something API Gateway cannot use: 500", self.function_id)
            return _json_answer(_INTERNAL_ERROR)

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
                    answer = _json_answer(_TOO_LARGE)
                    request_id = _request_id()
                elif matched is None:
                    answer = _json_answer(_NOT_FOUND)
                    request_id = _request_id()
                else:
                    route, parameters = matched
                    header_items = list(self.headers.items())
                    authorized = api.authorize(route, header_items)
                    if isinstance(authorized, _Answer):
                        self._write(authorized, _request_id())
                        return
                    event = api.build_event(
                        route=route,
                        path_parameters=parameters,
                        method=self.command,
                        target=self.path,
                        protocol=self.request_version,
                        header_items=header_items,
                        body=body,
                        source_ip=str(self.client_address[0]),
                        server_port=api.port,
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

            def _write(self, answer: _Answer, request_id: str) -> None:
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
