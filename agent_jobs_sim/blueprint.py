"""What every simulated world is built from: template.yaml's queues, table and worker settings, read once per
process (the template is the deployment; the simulation runs the same configuration)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from agent_jobs.settings import Settings
from agent_jobs_local.template import TemplateModel, load_template

REGION = "us-east-1"
ACCOUNT_ID = "123456789012"


def queue_url(name: str) -> str:
    return f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT_ID}/{name}"


def queue_arn(name: str) -> str:
    return f"arn:aws:sqs:{REGION}:{ACCOUNT_ID}:{name}"


@dataclass(frozen=True)
class Blueprint:
    queue_name: str
    queue_attributes: dict[str, str]
    dlq_name: str
    dlq_attributes: dict[str, str]
    table_kwargs: dict[str, Any]
    settings: Settings
    timeout_seconds: int
    batch_size: int
    max_receive_count: int

    @property
    def queue_url(self) -> str:
        return queue_url(self.queue_name)

    @property
    def queue_arn(self) -> str:
        return queue_arn(self.queue_name)

    @property
    def dlq_url(self) -> str:
        return queue_url(self.dlq_name)

    @property
    def table_name(self) -> str:
        return str(self.table_kwargs["TableName"])


@functools.cache
def blueprint() -> Blueprint:
    model = TemplateModel(load_template(), stack_name="sim", region=REGION, account_id=ACCOUNT_ID)
    queue_id, dlq_id, table_id = model.jobs_queue_id, model.dead_letter_queue_id, model.table_id
    queue_name, dlq_name = model.queue_name(queue_id), model.queue_name(dlq_id)
    table_kwargs = model.table_create_kwargs()
    references: dict[str, dict[str, str]] = {
        dlq_id: {"Ref": queue_url(dlq_name), "Arn": queue_arn(dlq_name), "QueueName": dlq_name},
        queue_id: {"Ref": queue_url(queue_name), "Arn": queue_arn(queue_name), "QueueName": queue_name},
        table_id: {
            "Ref": str(table_kwargs["TableName"]),
            "Arn": f"arn:aws:dynamodb:{REGION}:{ACCOUNT_ID}:table/{table_kwargs['TableName']}",
        },
    }
    for function_id in model.resources_of_type("AWS::Serverless::Function"):
        references[function_id] = {"Ref": model.function_name(function_id), "Arn": model.function_arn(function_id)}
    if model.payload_bucket_id is not None:
        references[model.payload_bucket_id] = {"Ref": "sim-payloads", "Arn": "arn:aws:s3:::sim-payloads"}
    environment = model.worker_environment(references)
    settings = Settings.model_validate({key.lower(): value for key, value in environment.items()})
    worker = model.worker
    return Blueprint(
        queue_name=queue_name,
        queue_attributes=model.queue_attributes(queue_id, references),
        dlq_name=dlq_name,
        dlq_attributes=model.queue_attributes(dlq_id, references),
        table_kwargs=table_kwargs,
        settings=settings,
        timeout_seconds=worker.timeout_seconds,
        batch_size=worker.batch_size,
        max_receive_count=model.redrive_max_receive_count(),
    )
