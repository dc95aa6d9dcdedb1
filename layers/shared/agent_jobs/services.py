"""AWS clients and the guard, built once per process on first use (never at import time)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

import boto3
from botocore.config import Config

from agent_jobs.guard import JobGuard
from agent_jobs.payloads import PayloadStore
from agent_jobs.settings import Settings
from agent_jobs.tenant_shares import TenantShares

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient
    from mypy_boto3_sqs.client import SQSClient

# Standard retry mode backs off on throttling; the timeouts keep a stalled call well inside a 120 s invocation.
_CLIENT_CONFIG = Config(retries={"mode": "standard", "max_attempts": 4}, connect_timeout=3, read_timeout=10)
# Seconds the worker waits for the sandbox's answer beyond the sandbox's own Timeout (Lambda answers a timed-out
# invocation with an error; this only guards against a connection that never answers).
SANDBOX_READ_SLACK_SECONDS = 30


class LambdaInvoker(Protocol):
    """The one Lambda call the worker makes: a synchronous invoke of the test sandbox."""

    def invoke(self, **kwargs: Any) -> Mapping[str, Any]: ...


def sandbox_client_config(settings: Settings) -> Config:
    """No retries: a retried invoke would run the tests twice (the job's own retry decides). The read timeout
    outlasts the sandbox's Timeout, so a long test run is answered, not cut off."""
    return Config(
        retries={"mode": "standard", "total_max_attempts": 1},
        connect_timeout=3,
        read_timeout=settings.test_sandbox_timeout_seconds + SANDBOX_READ_SLACK_SECONDS,
    )


class LazyClient:
    """A client built on first use, once, whichever thread asks first (a boto3 Session must not build clients from
    two threads at once)."""

    def __init__(self, factory: Callable[[], LambdaInvoker]) -> None:
        self._factory = factory
        self._client: LambdaInvoker | None = None
        self._lock = threading.Lock()

    def __call__(self) -> LambdaInvoker:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._factory()
        return self._client


@dataclass(frozen=True)
class Services:
    settings: Settings
    dynamodb: DynamoDBClient
    sqs: SQSClient
    guard: JobGuard
    # Its S3 client is built on first use, so a cold start that never meets a large payload does not pay for it.
    payloads: PayloadStore
    # The Lambda client for the test sandbox, built on the first run_tests job that needs it.
    sandbox_lambda: Callable[[], LambdaInvoker]
    # Each tenant's share of the worker's concurrency (TENANT_SHARE, or the tenant's override); None: no shares.
    tenant_shares: TenantShares | None = None


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
    # SigV4, so the presigned GET of a checkout carries its own expiry (X-Amz-Expires) and works in every region.
    s3_config = _CLIENT_CONFIG.merge(Config(signature_version="s3v4"))
    payloads = PayloadStore(settings.payload_bucket, lambda: session.client("s3", config=s3_config))
    config = sandbox_client_config(settings)
    sandbox_lambda = LazyClient(lambda: cast("LambdaInvoker", session.client("lambda", config=config)))
    return Services(
        settings=settings,
        dynamodb=dynamodb,
        sqs=sqs,
        guard=guard,
        payloads=payloads,
        sandbox_lambda=sandbox_lambda,
        tenant_shares=TenantShares(dynamodb, settings.table_name, settings.tenant_share),
    )
