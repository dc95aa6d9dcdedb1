"""Which of the API's operations a request is, told from its method and path before it is routed: the body pre-check,
the wording of a 422 and the advice of a 503 depend on it."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Final

from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEventV2


class Operation(StrEnum):
    SUBMIT_JOB = "submit a job"
    SUBMIT_BATCH = "submit a batch of jobs"
    REGISTER_WORKSPACE = "register a workspace"
    RESUME_WORKSPACE = "resume a workspace"
    READ = "read"


_ROUTES: Final = (
    ("POST", re.compile(r"/jobs"), Operation.SUBMIT_JOB),
    ("POST", re.compile(r"/jobs:batch"), Operation.SUBMIT_BATCH),
    ("PUT", re.compile(r"/workspaces/[^/]+"), Operation.REGISTER_WORKSPACE),
    ("POST", re.compile(r"/workspaces/[^/]+/resume"), Operation.RESUME_WORKSPACE),
)


def operation_of(event: APIGatewayProxyEventV2) -> Operation:
    """The operation `event` asks for; READ for every request without a body to read."""
    method, path = event.request_context.http.method, event.path
    for route_method, pattern, operation in _ROUTES:
        if method == route_method and pattern.fullmatch(path):
            return operation
    return Operation.READ
