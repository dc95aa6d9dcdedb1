"""`TemplateModel`: template.yaml with its parameters resolved, read resource by resource."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent_jobs_local.template.buckets import BucketReader
from agent_jobs_local.template.functions import FunctionReader
from agent_jobs_local.template.loading import DEFAULT_TEMPLATE_PATH, TemplateError, load_template
from agent_jobs_local.template.queues import QueueReader, TableReader
from agent_jobs_local.template.values import as_int, get_att_resource


class TemplateModel(FunctionReader, QueueReader, TableReader, BucketReader):
    """template.yaml with its parameters resolved (defaults, or overrides validated as CloudFormation would) and a
    resolver for the intrinsic functions, for one stack name, region and account."""

    @classmethod
    def from_path(cls, path: Path = DEFAULT_TEMPLATE_PATH, **kwargs: Any) -> TemplateModel:
        return cls(load_template(path), **kwargs)

    def for_account(self, *, account_id: str, region: str) -> TemplateModel:
        """The same template and parameters for another account and region."""
        return TemplateModel(
            self.template,
            stack_name=self.stack_name,
            parameter_overrides=self._overrides,
            region=region,
            account_id=account_id,
        )

    @property
    def jobs_queue_id(self) -> str:
        """The queue the worker consumes."""
        return self.worker.event_source.queue_id

    @property
    def dead_letter_queue_id(self) -> str:
        """The jobs queue's redrive target."""
        redrive = self.properties(self.jobs_queue_id).get("RedrivePolicy") or {}
        queue_id = get_att_resource(redrive.get("deadLetterTargetArn"))
        if queue_id is None:
            raise TemplateError(f"{self.jobs_queue_id} has no RedrivePolicy with a !GetAtt deadLetterTargetArn")
        return queue_id

    def redrive_max_receive_count(self) -> int:
        redrive = self.properties(self.jobs_queue_id).get("RedrivePolicy") or {}
        return as_int(self.resolve(redrive.get("maxReceiveCount")), f"{self.jobs_queue_id} maxReceiveCount")
