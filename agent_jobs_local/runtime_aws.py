"""The local runtime's AWS side: clients for its endpoint (signed with a fake key for an emulator), the template's
resources provisioned there, the jobs queue's VisibilityTimeout scaled like the worker's Timeout, and this process's
environment variables set for a run and restored after it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final

import boto3

from agent_jobs_local.template import AwsClients, ProvisionedResources, TemplateModel, provision

FAKE_CREDENTIALS: Final = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


def aws_clients(region: str, endpoint_url: str | None) -> AwsClients:
    """Clients of `endpoint_url` (None: AWS itself) in `region`."""
    key: str | None = None
    if endpoint_url is not None and boto3.Session().get_credentials() is None:
        key = "testing"  # an emulator accepts any signature, but boto3 signs nothing without credentials
    session = boto3.Session(region_name=region, aws_access_key_id=key, aws_secret_access_key=key)
    return AwsClients.from_session(session, endpoint_url=endpoint_url)


def provision_for_account(clients: AwsClients, model: TemplateModel) -> tuple[TemplateModel, ProvisionedResources]:
    """The template's resources provisioned through `clients`, and the model for the account and region they are in
    (an emulator's account or region can differ from the model's)."""
    resources = provision(clients, model)
    if (resources.account_id, resources.region) != (model.account_id, model.region):
        model = model.for_account(account_id=resources.account_id, region=resources.region)
    return model, resources


def scale_visibility_timeout(
    clients: AwsClients, model: TemplateModel, resources: ProvisionedResources, time_scale: float
) -> None:
    """The jobs queue's VisibilityTimeout, scaled like the worker's Timeout (set even at scale 1, so a queue left
    scaled by an earlier run on a long-lived emulator gets the template's value back)."""
    attributes = model.queue_attributes(model.jobs_queue_id, resources.references)
    if "VisibilityTimeout" not in attributes:
        return
    seconds = max(1, round(float(attributes["VisibilityTimeout"]) * time_scale))
    clients.sqs.set_queue_attributes(QueueUrl=resources.queue_url, Attributes={"VisibilityTimeout": str(seconds)})


class EnvironOverrides:
    """Variables of this process's `os.environ` set for a run; `restore()` puts back what was there before."""

    def __init__(self) -> None:
        self._saved: dict[str, str | None] = {}

    def set(self, values: Mapping[str, str]) -> None:
        for name, value in values.items():
            self._saved.setdefault(name, os.environ.get(name))
            os.environ[name] = value

    def restore(self) -> None:
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved = {}
