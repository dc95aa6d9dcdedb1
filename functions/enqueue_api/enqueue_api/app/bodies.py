"""The request body's pre-check: JSON only, within the operation's size limit, an object, valid Unicode."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Final

from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEventV2

from agent_jobs.producer import MAX_BATCH_JOBS
from agent_jobs.settings import Settings

from .errors import RequestRefused
from .operations import Operation, operation_of

# Why the request limit is what it is, for the 413: API Gateway's HTTP API accepts 10 MB, but it hands the request to
# the function as a synchronous invocation, whose event (the body JSON-escaped inside it) is capped at 6 MB.
REQUEST_LIMIT_REASON: Final = (
    "a request reaches this API's function as a synchronous Lambda invocation, whose event is capped at 6 MB "
    "(the body, escaped, inside it), below API Gateway's own 10 MB"
)
JSON_MEDIA_TYPE: Final = "application/json"


def body_limit_bytes(settings: Settings) -> int:
    """The largest request body: MAX_REQUEST_BYTES; without a payload bucket, what fits in one queue message."""
    if settings.payload_bucket:
        return settings.max_request_bytes
    return min(settings.max_request_bytes, settings.inline_message_limit_bytes)


def too_large_advice(settings: Settings) -> str:
    if not settings.payload_bucket:
        return (
            "(INLINE_MESSAGE_LIMIT_BYTES: without a payload bucket, PAYLOAD_BUCKET, a job must fit in one queue "
            "message); send a smaller payload or configure a payload bucket"
        )
    return (
        f"(MAX_REQUEST_BYTES) because {REQUEST_LIMIT_REASON}; send a smaller payload: split a large patch into "
        "several apply_patch jobs (they run in order), or leave generated files out of it"
    )


def batch_body_limit_bytes(settings: Settings) -> int:
    """The largest batch body: MAX_REQUEST_BYTES; without a payload bucket, what fits in MAX_BATCH_JOBS messages."""
    if settings.payload_bucket:
        return settings.max_request_bytes
    return min(settings.max_request_bytes, MAX_BATCH_JOBS * settings.inline_message_limit_bytes)


@dataclass(frozen=True)
class BodyRule:
    """What an operation's body is, for the pre-check's answers: its shape (400) and why it is limited (413)."""

    shape: str
    too_large: Callable[[Settings], str]
    limit: Callable[[Settings], int] = body_limit_bytes


JOB_SHAPE: Final = '{"jobId", "workspaceId", "type", "payload"}'
RESUME_SHAPE: Final = '{"decision": "retry"|"skip", "haltingJobId": "<the workspace\'s haltingJobId>"}'
BODY_RULES: Final = {
    Operation.SUBMIT_JOB: BodyRule(f"a job: {JOB_SHAPE}", too_large_advice),
    Operation.SUBMIT_BATCH: BodyRule(
        f'{{"jobs": [1 to {MAX_BATCH_JOBS} jobs, each {JOB_SHAPE}]}}',
        lambda settings: too_large_advice(settings).replace("a job must", "each job must"),
        batch_body_limit_bytes,
    ),
    Operation.REGISTER_WORKSPACE: BodyRule(
        'a workspace registration: {"remoteUrl", "branch", ...}',
        lambda _: "(the same limit as a job's); send fewer or shorter test commands",
    ),
    Operation.RESUME_WORKSPACE: BodyRule(
        f"a resume decision: {RESUME_SHAPE}", lambda _: "(a resume decision is a few bytes)"
    ),
}


def checked_body(raw_event: dict[str, Any], settings: Callable[[], Settings]) -> dict[str, Any]:
    """The pre-check of a request that carries a body, before Powertools routes and validates it: RequestRefused
    415 not JSON, 413 over the operation's limit, 400 empty or not UTF-8 (the JSON itself is read once, by
    `json_object`). The event comes back with its JSON media type (`+json`, any case) named `application/json`, as
    Powertools reads it."""
    event = APIGatewayProxyEventV2(raw_event)
    rule = BODY_RULES.get(operation_of(event))
    if rule is None:
        return raw_event
    limit = rule.limit(settings())
    content_type = _require_json_content_type(event)
    raw = _body_bytes(event)
    if len(raw) > limit:
        raise RequestRefused(
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            f"the request body is {len(raw)} bytes; the limit is {limit} bytes {rule.too_large(settings())}",
        )
    if not raw.strip():
        raise RequestRefused(HTTPStatus.BAD_REQUEST, f"the request body is empty; send {rule.shape}")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RequestRefused(HTTPStatus.BAD_REQUEST, "the request body is not valid UTF-8 text") from None
    if content_type is None or content_type.strip().startswith(JSON_MEDIA_TYPE):
        return raw_event
    headers = {
        name: value for name, value in (raw_event.get("headers") or {}).items() if name.lower() != "content-type"
    }
    return {**raw_event, "headers": {**headers, "content-type": JSON_MEDIA_TYPE}}


def json_object(text: str, event: APIGatewayProxyEventV2) -> dict[str, Any]:
    """The body as a JSON object, parsed once, by Powertools (the resolver's deserializer) when it validates the body:
    RequestRefused 400 when it is malformed, not an object, or holds text the job queue cannot carry."""
    document = _parse_json(text)
    if not isinstance(document, dict):
        rule = BODY_RULES.get(operation_of(event))
        shape = f": {rule.shape}" if rule else ""
        raise RequestRefused(
            HTTPStatus.BAD_REQUEST, f"the request body is a JSON {json_kind(document)}; send a JSON object{shape}"
        )
    return document


def json_kind(document: Any) -> str:
    kinds = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}
    return kinds.get(type(document), type(document).__name__)


def _require_json_content_type(event: APIGatewayProxyEventV2) -> str | None:
    content_type = event.headers.get("content-type")
    if content_type is None:
        return None
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type != JSON_MEDIA_TYPE and not media_type.endswith("+json"):
        raise RequestRefused(
            HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
            f"Content-Type '{content_type}' is not JSON; send the body as {JSON_MEDIA_TYPE}",
        )
    return content_type


def _body_bytes(event: APIGatewayProxyEventV2) -> bytes:
    body = event.body or ""
    if event.is_base64_encoded:
        try:
            return base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            raise RequestRefused(HTTPStatus.BAD_REQUEST, "the request body is not valid base64") from None
    try:
        return body.encode("utf-8")
    except UnicodeEncodeError:
        raise RequestRefused(HTTPStatus.BAD_REQUEST, "the request body is not valid UTF-8 text") from None


def _parse_json(text: str) -> Any:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise RequestRefused(
            HTTPStatus.BAD_REQUEST,
            f"the request body is not valid JSON ({error.msg} at line {error.lineno}, column {error.colno})",
        ) from None
    except (ValueError, RecursionError):  # numbers beyond the int digit limit; nesting beyond the recursion limit
        raise RequestRefused(HTTPStatus.BAD_REQUEST, "the request body is JSON this API cannot read") from None
    try:
        # "\ud800" escapes decode to lone surrogates, which cannot be hashed, stored or sent: refuse them here.
        dumped = json.dumps(document, ensure_ascii=False)
        dumped.encode("utf-8")
    except UnicodeEncodeError:
        raise RequestRefused(
            HTTPStatus.BAD_REQUEST,
            "the request body contains an unpaired surrogate escape; send valid Unicode text (a patch whose bytes are "
            'not UTF-8 goes as base64, with "patchEncoding": "base64" in the payload)',
        ) from None
    if "\ufffe" in dumped or "\uffff" in dumped:
        # SQS refuses a message holding either (JSON escapes the other characters it refuses): never a 503 to retry.
        raise RequestRefused(
            HTTPStatus.BAD_REQUEST,
            "the request body contains U+FFFE or U+FFFF, which the job queue does not accept; remove them",
        )
    return document
