"""The resources every benchmark runs against: the template's queue, dead-letter queue and table, provisioned from
template.yaml in the local emulator (moto's server, every call over HTTP), and the services a function would build."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3

REPO = Path(__file__).resolve().parent.parent
REGION = "us-east-1"
# Like sam local: the layer's package (as at /opt/python) and the worker's code (as at /var/task) are importable.
for _folder in (REPO / "functions" / "job_worker", REPO / "layers" / "shared"):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

from agent_jobs.services import Services, build_services  # noqa: E402
from agent_jobs.settings import Settings  # noqa: E402
from agent_jobs_local.emulator import Emulator  # noqa: E402
from agent_jobs_local.template import AwsClients, TemplateModel, load_template, provision  # noqa: E402


@dataclass
class BenchStack:
    """One provisioned set of the template's resources and the services (clients, guard) a function builds."""

    endpoint_url: str
    session: boto3.Session
    queue_url: str
    queue_arn: str
    dlq_url: str
    table_name: str
    settings: Settings
    services: Services
    model: TemplateModel
    references: Mapping[str, Mapping[str, str]]

    def register_workspaces(self, workspace_ids: Iterable[str], tenant_id: str) -> None:
        """Register each workspace for `tenant_id` (the API accepts jobs only for its tenant's registrations), with
        the stack's own client, so a benchmark's counted clients never see these calls. The remote is never used."""
        from agent_jobs.registration import WorkspaceRegistration
        from agent_jobs.workspaces import WorkspaceRegistry

        registry = WorkspaceRegistry(self.services.dynamodb, self.table_name)
        for workspace_id in workspace_ids:
            registration = WorkspaceRegistration.model_validate(
                {"remoteUrl": f"https://git.example.com/bench/{workspace_id}.git", "branch": f"agent/{workspace_id}"}
            )
            registry.register(workspace_id, registration, tenant_id)


@contextmanager
def _endpoint(endpoint_url: str) -> Iterator[None]:
    """AWS_ENDPOINT_URL set while the product's own `build_services` makes its clients (botocore reads it then)."""
    previous = os.environ.get("AWS_ENDPOINT_URL")
    os.environ["AWS_ENDPOINT_URL"] = endpoint_url
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("AWS_ENDPOINT_URL", None)
        else:
            os.environ["AWS_ENDPOINT_URL"] = previous


def provision_stack(
    endpoint_url: str, *, function_id: str = "JobWorkerFunction", **settings_overrides: Any
) -> BenchStack:
    """A fresh, uniquely named set of the template's resources on `endpoint_url`, with the settings template.yaml gives
    `function_id` (no backoff, so a retried record comes back at once; overridable)."""
    # Fake credentials: the emulator accepts any, and nothing from the developer's shell (a profile) leaks in.
    session = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name=REGION)
    model = TemplateModel(load_template(), stack_name=f"bench-{uuid.uuid4().hex[:8]}")
    resources = provision(AwsClients.from_session(session, endpoint_url=endpoint_url), model)
    environment = model.function_environment(function_id, resources.references)
    overrides = {"backoff_base_seconds": 0, **settings_overrides}
    settings = Settings.model_validate({**{k.lower(): v for k, v in environment.items()}, **overrides})
    with _endpoint(endpoint_url):
        services = build_services(settings, session)
    return BenchStack(
        endpoint_url=endpoint_url,
        session=session,
        queue_url=resources.queue_url,
        queue_arn=resources.queue_arn,
        dlq_url=resources.dlq_url,
        table_name=resources.table_name,
        settings=settings,
        services=services,
        model=model,
        references=resources.references,
    )


@contextmanager
def emulated_stack(**settings_overrides: Any) -> Iterator[BenchStack]:
    """The emulator in its own process (stopped on exit) with one provisioned stack in it."""
    with Emulator() as emulator:
        yield provision_stack(emulator.url, **settings_overrides)
