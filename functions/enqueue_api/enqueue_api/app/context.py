"""What every route shares: the Powertools logger, tracer and metrics, and the AWS services built on the first
invocation and kept while the environment is warm."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, TypedDict, cast

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.event_handler import APIGatewayHttpResolver
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEventV2

from agent_jobs.quotas import JobQuotas
from agent_jobs.services import Services, build_services
from agent_jobs.workspaces import WorkspaceRegistry

from .registration_checks import RegistrationChecks

if TYPE_CHECKING:
    from mypy_boto3_sqs.client import SQSClient

    from agent_jobs.guard import JobGuard
    from agent_jobs.payloads import PayloadStore

logger = Logger()
tracer = Tracer()
metrics = Metrics()


@functools.cache
def services() -> Services:
    """Built on the first invocation (settings from the environment) and reused while the environment is warm."""
    return build_services()


def reset_services() -> None:
    """Forget the cached clients and settings; the next invocation builds them from the environment again."""
    services.cache_clear()
    registration_checks.cache_clear()


@functools.cache
def registration_checks() -> RegistrationChecks:
    """The registrations jobs are checked against at submit, kept while the environment is warm."""
    svc = services()
    return RegistrationChecks(workspace_registry(svc), svc.guard)


def job_quotas(svc: Services) -> JobQuotas:
    return JobQuotas(
        svc.dynamodb,
        svc.settings.table_name,
        jobs_per_second_per_tenant=svc.settings.max_jobs_per_second_per_tenant,
        queued_jobs_per_workspace=svc.settings.max_queued_jobs_per_workspace,
    )


class Producer(TypedDict):
    """What accepting jobs (`enqueue_job`, `enqueue_jobs`) needs besides the jobs and the tenant."""

    guard: JobGuard
    sqs: SQSClient
    queue_url: str
    payloads: PayloadStore
    inline_limit_bytes: int
    quotas: JobQuotas


def producer(svc: Services) -> Producer:
    return Producer(
        guard=svc.guard,
        sqs=svc.sqs,
        queue_url=svc.settings.queue_url,
        payloads=svc.payloads,
        inline_limit_bytes=svc.settings.inline_message_limit_bytes,
        quotas=job_quotas(svc),
    )


def workspace_registry(svc: Services) -> WorkspaceRegistry:
    return WorkspaceRegistry(
        svc.dynamodb, svc.settings.table_name, max_workspaces_per_tenant=svc.settings.max_workspaces_per_tenant
    )


def http_event(router: Router | APIGatewayHttpResolver) -> APIGatewayProxyEventV2:
    """The request being answered, as the HTTP API (payload format 2.0) delivers it to this API's resolver."""
    return cast("APIGatewayProxyEventV2", router.current_event)
