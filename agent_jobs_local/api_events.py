"""HTTP requests as the payload-format-2.0 events API Gateway gives a Lambda integration, and the integration's
answers back as HTTP responses (see `api_server` for the full list of what API Gateway adds, drops and answers)."""

from __future__ import annotations

import base64
import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any, Final
from urllib.parse import parse_qsl, urlsplit

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
NOT_FOUND: Final = (HTTPStatus.NOT_FOUND, {"message": "Not Found"})
INTERNAL_ERROR: Final = (HTTPStatus.INTERNAL_SERVER_ERROR, {"message": "Internal Server Error"})
TOO_LARGE: Final = (HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"message": "Request Entity Too Large"})
MAX_PAYLOAD_BYTES: Final = 10 * 1024 * 1024
"""API Gateway HTTP API's payload quota (10 MB, not adjustable): a larger request never reaches the function."""
UNAUTHORIZED: Final = (HTTPStatus.UNAUTHORIZED, {"message": "Unauthorized"})
FORBIDDEN: Final = (HTTPStatus.FORBIDDEN, {"message": "Forbidden"})
# Hop-by-hop headers (RFC 9110 7.6.1) end at API Gateway; they never reach the integration.
_HOP_BY_HOP_HEADERS: Final = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"}
)


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


def new_request_id() -> str:
    return base64.b64encode(secrets.token_bytes(11)).decode()


def _trace_id() -> str:
    return f"Root=1-{int(time.time()):08x}-{secrets.token_hex(12)}"


def event_headers(header_items: list[tuple[str, str]]) -> tuple[dict[str, str], list[str]]:
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
class Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes


def json_answer(status_and_body: tuple[HTTPStatus, dict[str, str]]) -> Answer:
    status, body = status_and_body
    return Answer(int(status), [("Content-Type", "application/json")], json.dumps(body).encode())


def http_answer(response: Any) -> Answer:
    """A payload-format-2.0 Lambda response as API Gateway turns it into HTTP; ValueError when it cannot."""
    if not (isinstance(response, dict) and "statusCode" in response):
        # API Gateway's inferred format: the whole response is the JSON body of a 200.
        text = response if isinstance(response, str) else json.dumps(response)
        return Answer(200, [("Content-Type", "application/json")], text.encode())
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
    return Answer(status, headers, body)


def api_gateway_event(
    *,
    route_key: str,
    path_parameters: Mapping[str, str],
    method: str,
    target: str,
    protocol: str,
    header_items: list[tuple[str, str]],
    body: bytes,
    source_ip: str,
    server_port: int,
    account_id: str,
    api_id: str,
    default_host: str,
    authorizer: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The payload-format-2.0 event for one request to the route `route_key` of the API `api_id` (`target` is the
    request line's path and query; `default_host` the domain name when the request has no Host header; `authorizer`
    the `requestContext.authorizer` an authorizer gave it)."""
    split = urlsplit(target)
    raw_path = split.path or "/"
    headers, cookies = event_headers(header_items)
    headers.setdefault("x-amzn-trace-id", _trace_id())
    headers["x-forwarded-for"] = (
        f"{headers['x-forwarded-for']}, {source_ip}" if "x-forwarded-for" in headers else source_ip
    )
    headers["x-forwarded-port"] = str(server_port)
    headers["x-forwarded-proto"] = "http"
    query: dict[str, str] = {}
    for key, value in parse_qsl(split.query, keep_blank_values=True):
        query[key] = f"{query[key]},{value}" if key in query else value
    host = _host_name(headers.get("host")) or default_host
    now = time.time()
    context: dict[str, Any] = {
        "accountId": account_id,
        "apiId": api_id,
        "domainName": host,
        "domainPrefix": host.split(".", 1)[0],
        "http": {
            "method": method,
            "path": raw_path,
            "protocol": protocol,
            "sourceIp": source_ip,
            "userAgent": headers.get("user-agent", ""),
        },
        "requestId": new_request_id(),
        "routeKey": route_key,
        "stage": "$default",
        "time": datetime.fromtimestamp(now, UTC).strftime("%d/%b/%Y:%H:%M:%S +0000"),
        "timeEpoch": int(now * 1000),
    }
    if authorizer is not None:
        context["authorizer"] = dict(authorizer)
    event: dict[str, Any] = {"version": "2.0", "routeKey": route_key, "rawPath": raw_path}
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
