"""A record that fails for want of AWS (the job store unreachable, throttled) is reported failed so that the queue
brings it back; each such failure is logged with its job and cause and counted by cause, never silent."""

from __future__ import annotations

import io
import json
import logging
import socket
from dataclasses import replace
from typing import Any

import boto3
import pytest
from aws_lambda_powertools import Logger, Metrics
from botocore.config import Config
from botocore.exceptions import ClientError, EndpointConnectionError

from agent_jobs.guard import JobGuard
from job_worker.processing import BatchWorker, failure_cause
from tests.conftest import Stack, enqueue, make_job


def closed_port() -> int:
    """A local port nothing listens on: a connection to it is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_worker_logs_each_record_it_fails_for_an_unreachable_job_store(
    stack: Stack, workspaces: Any, lambda_context: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # Given two jobs of two workspaces, and a worker whose DynamoDB endpoint refuses every connection
    enqueue(stack, make_job("down-1", "ws-a"), make_job("down-2", "ws-b"))
    event = stack.receive()
    unreachable = boto3.client(
        "dynamodb",
        region_name="us-east-1",
        endpoint_url=f"http://127.0.0.1:{closed_port()}",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(connect_timeout=1, retries={"total_max_attempts": 1}),
    )
    services = replace(stack.services, dynamodb=unreachable, guard=JobGuard(unreachable, stack.table_name))
    worker = BatchWorker(
        services=services,
        workspaces=workspaces,
        logger=Logger(service="agent-jobs-test"),
        metrics=Metrics(namespace="AgentJobsTest"),
    )

    # When it handles them
    with caplog.at_level(logging.ERROR):
        response = worker.handle(event, lambda_context())

    # Then both are reported failed (the queue brings them back), nothing applied, and each failure is logged at
    # ERROR with its jobId, workspace and cause
    assert len(response["batchItemFailures"]) == 2
    assert workspaces.commits("ws-a") == workspaces.commits("ws-b") == []
    logged = {
        getattr(record, "jobId", None): record
        for record in caplog.records
        if record.getMessage().startswith("record failed")
    }
    assert set(logged) == {"down-1", "down-2"}
    assert {getattr(record, "workspaceId", None) for record in logged.values()} == {"ws-a", "ws-b"}
    assert {getattr(record, "cause", None) for record in logged.values()} == {"Unavailable"}
    assert all(record.levelno == logging.ERROR and record.exc_info for record in logged.values())
    assert all("EndpointConnectionError" in getattr(record, "error", "") for record in logged.values())
    print(f"\nlogged: {[(record.jobId, record.cause, record.error[:60]) for record in logged.values()]}")  # type: ignore[attr-defined]


def client_error(code: str, status: int) -> ClientError:
    response: Any = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return ClientError(response, "TransactWriteItems")


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (client_error("ProvisionedThroughputExceededException", 400), "Throttled"),
        (client_error("ThrottlingException", 400), "Throttled"),
        (client_error("TransactionConflictException", 400), "Conflict"),
        (client_error("InternalServerError", 500), "Unavailable"),
        (client_error("SomethingNew", 503), "Unavailable"),
        (client_error("ValidationException", 400), "Aws"),
        (EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), "Unavailable"),
        (RuntimeError("a bug"), "Other"),
    ],
)
def test_failure_causes_name_what_a_record_met(error: Exception, cause: str) -> None:
    assert failure_cause(error) == cause


def test_worker_logs_a_jobs_unexpected_error_with_its_traceback_and_its_jobs_keys(
    stack: Stack, workspaces: Any, hooks: Any, lambda_context: Any
) -> None:
    # Given a job whose handler meets an error nobody planned for, deep in its own code, and a worker whose log lines
    # are written as Lambda's would be
    enqueue(stack, make_job("unplanned-1", "ws-a"))

    def remove_the_checkout() -> None:
        raise FileNotFoundError(2, "No such file or directory")

    hooks.before_commit["unplanned-1"] = remove_the_checkout
    log = io.StringIO()
    worker = BatchWorker(
        services=stack.services,
        workspaces=workspaces,
        logger=Logger(service="agent-jobs-traceback-test", stream=log),
        metrics=Metrics(namespace="AgentJobsTest"),
    )

    # When the worker runs it
    event = stack.receive()
    response = worker.handle(event, lambda_context())

    # Then the job comes back for a retry, and its warning names the job and carries the traceback down to the line
    # that raised, so the cause can be found from the log alone
    assert len(response["batchItemFailures"]) == 1
    lines = [json.loads(line) for line in log.getvalue().splitlines()]
    (warning,) = [line for line in lines if line["message"] == "job failed, will retry"]
    assert warning["level"] == "WARNING"
    assert (warning["jobId"], warning["workspaceId"], warning["type"]) == ("unplanned-1", "ws-a", "apply_patch")
    assert warning["tenantId"] == "tenant-1"
    assert warning["error"] == "FileNotFoundError(2, 'No such file or directory')"
    assert warning["exception_name"] == "FileNotFoundError"
    assert "Traceback" in warning["exception"]
    assert "in remove_the_checkout" in warning["exception"]
