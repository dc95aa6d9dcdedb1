"""The errors SimSQS raises: the exception classes of a real botocore SQS client, with the error response that
client would parse from SQS's JSON protocol (the query-compatible code in `Code`, the modelled shape name in
`QueryErrorCode`), so code under simulation catches exactly what it catches in production."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Final

import boto3
from botocore.exceptions import ClientError

if TYPE_CHECKING:
    from mypy_boto3_sqs.client import SQSClient

# A modelled error's shape name -> the code SQS sends in its x-amzn-query-error header (what botocore puts in
# `Error.Code`); botocore picks the exception class from the shape name.
QUERY_CODES: Final = {
    "QueueDoesNotExist": "AWS.SimpleQueueService.NonExistentQueue",
    "QueueNameExists": "QueueAlreadyExists",
    "ReceiptHandleIsInvalid": "ReceiptHandleIsInvalid",
    "MessageNotInflight": "AWS.SimpleQueueService.MessageNotInflight",
    "EmptyBatchRequest": "AWS.SimpleQueueService.EmptyBatchRequest",
    "TooManyEntriesInBatchRequest": "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
    "BatchEntryIdsNotDistinct": "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
    "BatchRequestTooLong": "AWS.SimpleQueueService.BatchRequestTooLong",
    "InvalidBatchEntryId": "AWS.SimpleQueueService.InvalidBatchEntryId",
    "PurgeQueueInProgress": "AWS.SimpleQueueService.PurgeQueueInProgress",
    "UnsupportedOperation": "AWS.SimpleQueueService.UnsupportedOperation",
    "ResourceNotFoundException": "ResourceNotFoundException",
    "InvalidAttributeName": "InvalidAttributeName",
    "InvalidAttributeValue": "InvalidAttributeValue",
}
EXPIRED_HANDLE: Final = "The receipt handle has expired."


@functools.cache
def error_client() -> SQSClient:
    """One real (never called) SQS client per process, for its exception classes."""
    return boto3.client("sqs", region_name="us-east-1", aws_access_key_id="sim", aws_secret_access_key="sim")


def _response(code: str, message: str, shape: str | None) -> dict[str, Any]:
    error: dict[str, Any] = {"Message": message, "Code": code, "Type": "Sender"}
    if shape is not None:
        error["QueryErrorCode"] = shape
    return {"Error": error, "ResponseMetadata": {"HTTPStatusCode": 400, "HTTPHeaders": {}, "RetryAttempts": 0}}


def modelled(shape: str, message: str, operation: str) -> ClientError:
    """The modelled error `shape` (e.g. "ReceiptHandleIsInvalid") as the real client raises it."""
    exception_class = getattr(error_client().exceptions, shape)
    error: ClientError = exception_class(_response(QUERY_CODES[shape], message, shape), operation)
    return error


def client_error(code: str, message: str, operation: str) -> ClientError:
    """An error SQS's model does not name (InvalidParameterValue, MissingParameter): a plain ClientError."""
    return ClientError(_response(code, message, None), operation)  # type: ignore[arg-type]


def invalid_parameter(parameter: str, value: object, reason: str, operation: str) -> ClientError:
    return client_error(
        "InvalidParameterValue", f"Value {value} for parameter {parameter} is invalid. Reason: {reason}", operation
    )


def missing_parameter(parameter: str, operation: str) -> ClientError:
    return client_error("MissingParameter", f"The request must contain the parameter {parameter}.", operation)


def queue_does_not_exist(operation: str) -> ClientError:
    return modelled("QueueDoesNotExist", "The specified queue does not exist.", operation)


def invalid_receipt_handle(handle: str, operation: str) -> ClientError:
    return modelled(
        "ReceiptHandleIsInvalid", f'The input receipt handle "{handle}" is not a valid receipt handle.', operation
    )
