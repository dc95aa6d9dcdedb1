"""The job model: what an agent submits, what travels on the queue, and the states a job and a workspace go through."""

from __future__ import annotations

import hashlib
import json
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from pydantic.alias_generators import to_camel

# Ids are restricted so that the message group id `ws#<workspaceId>` stays within SQS's 128 characters and uses only
# characters SQS accepts, and so that ids are safe in DynamoDB keys, log lines and URLs.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
JobId = Annotated[str, Field(min_length=1, max_length=64, pattern=ID_PATTERN)]
WorkspaceId = Annotated[str, Field(min_length=1, max_length=100, pattern=ID_PATTERN)]
TenantId = Annotated[str, Field(min_length=1, max_length=64, pattern=ID_PATTERN)]


class JobType(StrEnum):
    APPLY_PATCH = "apply_patch"
    RUN_TESTS = "run_tests"
    OPEN_PR = "open_pr"


class JobStatus(StrEnum):
    QUEUED = "QUEUED"
    IN_FLIGHT = "IN_FLIGHT"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    DEAD = "DEAD"
    REJECTED = "REJECTED"
    PARKED = "PARKED"
    SKIPPED = "SKIPPED"


class WorkspaceState(StrEnum):
    ACTIVE = "ACTIVE"
    HALTED = "HALTED"
    RESUMING = "RESUMING"


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class Author(_Model):
    name: Annotated[str, Field(min_length=1, max_length=200)]
    email: Annotated[str, Field(min_length=3, max_length=254, pattern=r"^[^@\s]+@[^@\s]+$")]


class ApplyPatchPayload(_Model):
    patch: Annotated[str, Field(min_length=1, description="A git-format or plain unified diff.")]
    commit_message: Annotated[str, Field(min_length=1, max_length=10_000)]
    author: Author | None = None


class RunTestsPayload(_Model):
    # A name of a test command registered with the workspace, never a shell string.
    suite: Annotated[str, Field(min_length=1, max_length=64, pattern=ID_PATTERN)] = "default"


class OpenPrPayload(_Model):
    title: Annotated[str, Field(min_length=1, max_length=256)]
    body: Annotated[str, Field(max_length=65_536)] = ""


class _JobFields(_Model):
    job_id: JobId
    workspace_id: WorkspaceId


class ApplyPatchJob(_JobFields):
    type: Literal[JobType.APPLY_PATCH]
    payload: ApplyPatchPayload


class RunTestsJob(_JobFields):
    type: Literal[JobType.RUN_TESTS]
    payload: RunTestsPayload = RunTestsPayload()


class OpenPrJob(_JobFields):
    type: Literal[JobType.OPEN_PR]
    payload: OpenPrPayload


JobRequest = Annotated[ApplyPatchJob | RunTestsJob | OpenPrJob, Field(discriminator="type")]
"""What an agent submits (the API body, or the argument of `enqueue_job`). The tenant is never part of it."""

job_request_adapter: TypeAdapter[ApplyPatchJob | RunTestsJob | OpenPrJob] = TypeAdapter(JobRequest)


class JobMessage(_Model):
    """The body of a queue message: the request plus the tenant the producer verified and the payload hash."""

    job_id: JobId
    workspace_id: WorkspaceId
    tenant_id: TenantId
    type: JobType
    payload: dict[str, Any]
    payload_hash: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]

    def request(self) -> ApplyPatchJob | RunTestsJob | OpenPrJob:
        """Validate the payload for the job's type (the worker rejects a message whose payload does not validate)."""
        return job_request_adapter.validate_python(
            {"jobId": self.job_id, "workspaceId": self.workspace_id, "type": self.type, "payload": self.payload}
        )


def payload_hash(job: ApplyPatchJob | RunTestsJob | OpenPrJob) -> str:
    """sha256 of the canonical JSON of what makes a job *this* job: workspace, type and payload.

    The same jobId resubmitted with the same hash is an idempotent retry; with another hash it is a conflict.
    """
    canonical = json.dumps(
        {"workspaceId": job.workspace_id, "type": str(job.type), "payload": job.payload.model_dump(by_alias=True)},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def job_message(job: ApplyPatchJob | RunTestsJob | OpenPrJob, tenant_id: str) -> JobMessage:
    return JobMessage(
        job_id=job.job_id,
        workspace_id=job.workspace_id,
        tenant_id=tenant_id,
        type=job.type,
        payload=job.payload.model_dump(by_alias=True),
        payload_hash=payload_hash(job),
    )
