"""The errors a real botocore DynamoDB client raises, with `error.response` shaped as botocore parses AWS's answer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import boto3
from botocore.exceptions import ClientError, ParamValidationError
from botocore.validate import ParamValidator

if TYPE_CHECKING:
    from botocore.client import BaseClient

_client: list[BaseClient] = []
_validator = ParamValidator()
_input_shapes: dict[str, Any] = {}


def _real_client() -> BaseClient:
    """A real client, built once per process on first use, for its exception classes and its service model (no call
    is ever sent)."""
    if not _client:
        _client.append(boto3.client("dynamodb", region_name="us-east-1"))
    return _client[0]


def _exceptions() -> Any:
    return _real_client().exceptions


def check_parameters(method: str, request: Mapping[str, Any]) -> None:
    """Raise the ParamValidationError a real client raises before sending `request` to `method` (an unknown
    parameter, a missing one, a value of the wrong type)."""
    shape: Any = _input_shapes.get(method)
    if shape is None:
        meta = _real_client().meta
        shape = meta.service_model.operation_model(meta.method_to_api_mapping[method]).input_shape
        _input_shapes[method] = shape
    report = _validator.validate(request, shape)
    if report.has_errors():
        raise ParamValidationError(report=report.generate_report())


def _response(
    code: str, message: str, extra: Mapping[str, Any] | None = None, *, message_member: str = "message"
) -> Any:
    """An error answer as botocore parses it: Error, ResponseMetadata, and the exception's modelled members (its
    message member is "message" for most, "Message" for TransactionCanceledException)."""
    return {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": 400, "HTTPHeaders": {}, "RetryAttempts": 0},
        message_member: message,
        **(extra or {}),
    }


def validation(message: str, operation: str) -> ClientError:
    return ClientError(_response("ValidationException", message, message_member="message"), operation)


def condition_failed(operation: str, item: dict[str, Any] | None) -> ClientError:
    """A failed ConditionExpression; `item` is the old item when ReturnValuesOnConditionCheckFailure=ALL_OLD."""
    extra = {"Item": item} if item is not None else {}
    error: ClientError = _exceptions().ConditionalCheckFailedException(
        _response("ConditionalCheckFailedException", "The conditional request failed", extra), operation
    )
    return error


def transaction_cancelled(reasons: list[dict[str, Any]]) -> ClientError:
    """A cancelled TransactWriteItems: one reason per action, in order."""
    codes = ", ".join(str(reason["Code"]) for reason in reasons)
    message = f"Transaction cancelled, please refer cancellation reasons for specific reasons [{codes}]"
    error: ClientError = _exceptions().TransactionCanceledException(
        _response("TransactionCanceledException", message, {"CancellationReasons": reasons}, message_member="Message"),
        "TransactWriteItems",
    )
    return error


def not_found(operation: str) -> ClientError:
    error: ClientError = _exceptions().ResourceNotFoundException(
        _response("ResourceNotFoundException", "Requested resource not found"), operation
    )
    return error


def in_use(table_name: str) -> ClientError:
    error: ClientError = _exceptions().ResourceInUseException(
        _response("ResourceInUseException", f"Table already exists: {table_name}"), "CreateTable"
    )
    return error
