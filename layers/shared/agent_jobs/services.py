"""AWS clients and the guard, built once per process on first use (never at import time)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import boto3
from botocore.config import Config

from agent_jobs.guard import JobGuard
from agent_jobs.payloads import PayloadStore
from agent_jobs.settings import Settings

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient
    from mypy_boto3_sqs.client import SQSClient

# Standard retry mode backs off on throttling; the timeouts keep a stalled call well inside a 120 s invocation.
_CLIENT_CONFIG = Config(retries={"mode": "standard", "max_attempts": 4}, connect_timeout=3, read_timeout=10)


@dataclass(frozen=True)
class Services:
    settings: Settings
    dynamodb: DynamoDBClient
    sqs: SQSClient
    guard: JobGuard
    # Its S3 client is built on first use, so a cold start that never meets a large payload does not pay for it.
    payloads: PayloadStore


def build_services(settings: Settings | None = None, session: boto3.Session | None = None) -> Services:
    """Clients honour AWS_ENDPOINT_URL, so the same code talks to AWS, to moto's server or to any emulator."""
    settings = settings or Settings()  # required fields come from the environment
    session = session or boto3.Session()
    dynamodb = session.client("dynamodb", config=_CLIENT_CONFIG)
    sqs = session.client("sqs", config=_CLIENT_CONFIG)
    guard = JobGuard(
        dynamodb,
        settings.table_name,
        max_attempts=settings.max_attempts,
        max_claims=settings.max_claims,
        ttl_days=settings.job_ttl_days,
    )
    payloads = PayloadStore(settings.payload_bucket, lambda: session.client("s3", config=_CLIENT_CONFIG))
    return Services(settings=settings, dynamodb=dynamodb, sqs=sqs, guard=guard, payloads=payloads)
