"""The API's refusals and their answers: `{"message", "errors"?, "moreErrors"?}` with a 4xx status, 503 when AWS
is unavailable."""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any, Final

from aws_lambda_powertools.event_handler import Response, content_types
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEventV2
from botocore.exceptions import ClientError
from pydantic import BaseModel

from .context import logger, metrics
from .operations import Operation, operation_of
from .schemas import MAX_FIELD_ERRORS, ErrorView


class RequestRefused(Exception):
    """A request the API answers with a 4xx: the status and a message that says what to do. Of `errors`, the first
    MAX_FIELD_ERRORS are kept and the rest counted in `more_errors`. A refusal that tells more than a message (a
    conflict names the jobId, or the workspace as it is now) carries its `answer` model instead."""

    def __init__(
        self,
        status: HTTPStatus,
        message: str,
        errors: list[dict[str, str]] | None = None,
        more_errors: int = 0,
        *,
        answer: BaseModel | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.errors = None if errors is None else errors[:MAX_FIELD_ERRORS]
        self.more_errors = more_errors + (0 if errors is None else max(0, len(errors) - MAX_FIELD_ERRORS))
        self.answer = answer
        self.headers = headers


def json_response(status: HTTPStatus, body: dict[str, Any], headers: dict[str, str] | None = None) -> Response[Any]:
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON, body=body, headers=headers)


_JOB_RETRY: Final = (
    "the job store or queue is unavailable; retry the same request with the same jobId shortly (a jobId is accepted "
    "at most once, so a retry cannot create a duplicate)"
)


def refusal_body(error: RequestRefused) -> dict[str, Any]:
    """`{"message", "errors"?, "moreErrors"?}`, or the refusal's own answer model, as JSON."""
    logger.info("request refused", extra={"status": int(error.status), "reason": error.message})
    metrics.add_metric(name="RequestsRefused", unit=MetricUnit.Count, value=1)
    if error.answer is not None:
        return error.answer.model_dump(mode="json", by_alias=True)
    view = ErrorView(message=error.message, errors=error.errors, more_errors=error.more_errors or None)
    return view.model_dump(mode="json", by_alias=True, exclude_none=True)


def refusal_response(error: RequestRefused) -> Response[Any]:
    """The answer to a refused request, with its status."""
    return json_response(error.status, refusal_body(error), error.headers)


def refusal_proxy_response(error: RequestRefused) -> dict[str, Any]:
    """The refusal as the HTTP API's payload format 2.0 response, for a request refused before it is routed."""
    return {
        "statusCode": int(error.status),
        "headers": {"Content-Type": content_types.APPLICATION_JSON, **(error.headers or {})},
        "body": json.dumps(refusal_body(error), separators=(",", ":")),
        "isBase64Encoded": False,
    }


_RETRY_ADVICE: Final = {
    Operation.SUBMIT_JOB: _JOB_RETRY,
    Operation.SUBMIT_BATCH: _JOB_RETRY,
    Operation.RESUME_WORKSPACE: (
        "the workspace store or queue is unavailable; retry the same resume shortly (repeating it is safe: a resume "
        "already begun answers 202 and sends its drain marker again)"
    ),
    Operation.REGISTER_WORKSPACE: (
        "the workspace store is unavailable; retry the same request shortly (registering is idempotent)"
    ),
}


def _is_item_too_large(error: Exception) -> bool:
    """DynamoDB refused a write for an item over its size limit: a request that can never succeed as sent."""
    if not isinstance(error, ClientError):
        return False
    details = error.response.get("Error", {})
    if details.get("Code") == "ValidationException":
        return "size" in str(details.get("Message", "")).lower()
    # In a transaction (a registration, a job's acceptance) DynamoDB cancels it, naming the item's reason instead.
    reasons: list[dict[str, Any]] = error.response.get("CancellationReasons") or []  # type: ignore[assignment]
    return details.get("Code") == "TransactionCanceledException" and any(
        reason.get("Code") == "ValidationError" and "size" in str(reason.get("Message", "")).lower()
        for reason in reasons
    )


def unavailable_response(error: Exception, event: APIGatewayProxyEventV2) -> Response[Any]:
    """The answer when an AWS call failed: 503 with Retry-After and what is safe to retry, or 413 for a record
    DynamoDB can never hold."""
    if _is_item_too_large(error):
        # Never a 503: the same request would be refused again, and a client told to retry would retry forever.
        logger.exception("a record of this request is larger than a DynamoDB item")
        return refusal_response(
            RequestRefused(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                "the request makes a record larger than the job store holds (a DynamoDB item is at most 400 KB); "
                "send it smaller: shorter fields, fewer or shorter test commands",
            )
        )
    logger.exception("AWS call failed")
    metrics.add_metric(name="ServiceUnavailable", unit=MetricUnit.Count, value=1)
    message = _RETRY_ADVICE.get(
        operation_of(event), "the job store is unavailable; retry the same request shortly (reading changes nothing)"
    )
    return json_response(HTTPStatus.SERVICE_UNAVAILABLE, {"message": message}, headers={"Retry-After": "2"})
