"""The job model: what an agent submits, what travels on the queue, and the states a job and a workspace go through."""

from __future__ import annotations

import base64
import functools
import hashlib
import json
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    ValidationError,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

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


class CamelModel(BaseModel):
    # defer_build: a model's validator is built on its first use, not at import, so a cold start pays only for the
    # models its invocations use (the worker never validates a resume request or a registration body).
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True, defer_build=True
    )


class ResumeDecision(StrEnum):
    """What an operator decides for the job that halted a workspace when resuming it."""

    RETRY = "retry"  # run the halting job again, first, then the parked jobs behind it
    SKIP = "skip"  # never run the halting job (SKIPPED), run the parked jobs behind it


DRAIN_MESSAGE_TYPE = "drain"
"""The `type` message attribute of a drain marker (job messages carry their job type there)."""


class ResumeRequest(CamelModel):
    """The body of `POST /workspaces/{workspaceId}/resume`: the decision for the halting job the operator saw."""

    decision: ResumeDecision
    halting_job_id: Annotated[str, Field(min_length=1, max_length=200)]


class DrainMarker(CamelModel):
    """The body of a drain marker: sent into a resuming workspace's own FIFO group, it makes the worker run that
    workspace's PARKED jobs in SequenceNumber order. `round` counts the markers of one resume."""

    drain: Literal["parked"] = "parked"
    workspace_id: WorkspaceId
    resume_id: Annotated[str, Field(min_length=1, max_length=64, pattern=ID_PATTERN)]
    round: Annotated[int, Field(ge=0)] = 0


class Author(CamelModel):
    name: Annotated[str, Field(min_length=1, max_length=200)]
    email: Annotated[str, Field(min_length=3, max_length=254, pattern=r"^[^@\s]+@[^@\s]+$")]


class PatchEncoding(StrEnum):
    TEXT = "text"
    BASE64 = "base64"


class ApplyPatchPayload(CamelModel):
    patch: Annotated[
        str,
        Field(
            min_length=1,
            description=(
                "A git-format or plain unified diff (binary files as `git diff --binary` writes them). With "
                "patchEncoding base64, the diff's bytes in standard base64: the way to send a diff that is not UTF-8 "
                "text (a file in a legacy encoding)."
            ),
        ),
    ]
    patch_encoding: Annotated[
        PatchEncoding,
        Field(description="How `patch` holds the diff: `text` (the diff itself) or `base64` (its bytes)."),
    ] = PatchEncoding.TEXT
    commit_message: Annotated[str, Field(min_length=1, max_length=10_000)]
    author: Author | None = None

    @model_validator(mode="after")
    def _base64_patch_decodes(self) -> ApplyPatchPayload:
        if self.patch_encoding is PatchEncoding.BASE64:
            try:
                if not base64.b64decode(self.patch, validate=True):
                    raise ValueError("empty")
            except ValueError:
                raise PydanticCustomError(
                    "patch_base64",
                    "patch is not standard base64 of a non-empty diff (patchEncoding is base64): encode the diff's "
                    "bytes with base64 (RFC 4648, with padding), or send the diff as text without patchEncoding",
                ) from None
        return self

    @model_serializer(mode="wrap")
    def _text_encoding_left_out(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A text patch reads exactly as before patchEncoding existed: its canonical document and hash do not change.
        data: dict[str, Any] = handler(self)
        for name in ("patch_encoding", "patchEncoding"):
            if data.get(name) == PatchEncoding.TEXT:
                del data[name]
        return data

    def patch_content(self) -> str | bytes:
        """The diff: the text as sent, or the bytes a base64 patch holds."""
        if self.patch_encoding is PatchEncoding.BASE64:
            return base64.b64decode(self.patch)
        return self.patch

    def patch_text(self) -> str:
        """The diff as text; bytes that are not UTF-8 become lone surrogates (`surrogateescape`), one per byte."""
        content = self.patch_content()
        return content.decode("utf-8", errors="surrogateescape") if isinstance(content, bytes) else content


class RunTestsPayload(CamelModel):
    # A name of a test command registered with the workspace, never a shell string.
    suite: Annotated[str, Field(min_length=1, max_length=64, pattern=ID_PATTERN)] = "default"


class OpenPrPayload(CamelModel):
    title: Annotated[str, Field(min_length=1, max_length=256)]
    body: Annotated[str, Field(max_length=65_536)] = ""


class _JobFields(CamelModel):
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

if TYPE_CHECKING:
    job_request_adapter: TypeAdapter[ApplyPatchJob | RunTestsJob | OpenPrJob]


@functools.cache
def _job_request_adapter() -> TypeAdapter[ApplyPatchJob | RunTestsJob | OpenPrJob]:
    return TypeAdapter(JobRequest)


if not TYPE_CHECKING:  # type checkers see the declaration above, and no name of this module they do not know

    def __getattr__(name: str) -> Any:
        # `job_request_adapter` is built on first use (it builds every job model's validator), not at import.
        if name == "job_request_adapter":
            return _job_request_adapter()
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class PayloadRef(CamelModel):
    """Where a payload too large for a queue message is stored: an S3 object holding the job's canonical document
    (`canonical_job_document`), so its sha256 is the job's payload hash."""

    bucket: Annotated[str, Field(min_length=3, max_length=63)]
    key: Annotated[str, Field(min_length=1, max_length=1024)]
    size: Annotated[int, Field(ge=0)]
    sha256: Sha256Hex

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


class PayloadUnavailableError(Exception):
    """A message's payload object is missing or is not the payload its job was accepted with: the job cannot run."""


MESSAGE_VERSION = 1
"""The version of the queue message format this code reads and writes (`v`; a body without `v` is version 1). The
format is published as `schemas/job-message.v1.schema.json`; a message of another version is REJECTED."""
MESSAGE_SCHEMA_FILE = f"schemas/job-message.v{MESSAGE_VERSION}.schema.json"


def _unsupported_version(version: object) -> str:
    if not isinstance(version, int) or isinstance(version, bool):
        return f"message version v must be the JSON number {MESSAGE_VERSION} (or left out), not {json.dumps(version)}"
    return (
        f"unsupported message version {version!r}: this deployment reads version {MESSAGE_VERSION} "
        f'({MESSAGE_SCHEMA_FILE}); send "v": {MESSAGE_VERSION} or leave v out'
    )


def _check_version(value: int) -> int:
    if value != MESSAGE_VERSION:
        raise PydanticCustomError("message_version", _unsupported_version(value))
    return value


class JobMessage(CamelModel):
    """The body of a queue message: the request plus the tenant the producer verified and the payload hash.

    `tenantId` is optional for producers that send to the queue directly: the job's tenant is the workspace owner's
    in any case, so the worker gives a message without one the owner's and rejects one that names another tenant.

    The payload travels inline (`payload`) or, when the message would be too large, as a pointer to an S3 object
    (`payloadRef`); exactly one of the two. The worker resolves a pointer with `agent_jobs.payloads.resolve_payload`.
    """

    v: Annotated[int, Field(strict=True), AfterValidator(_check_version)] = MESSAGE_VERSION
    job_id: JobId
    workspace_id: WorkspaceId
    tenant_id: TenantId | None = None
    type: JobType
    payload: dict[str, Any] | None = None
    payload_ref: PayloadRef | None = None
    payload_hash: Sha256Hex

    @model_validator(mode="after")
    def _one_payload(self) -> JobMessage:
        if (self.payload is None) == (self.payload_ref is None):
            raise ValueError("a job message carries exactly one of payload and payloadRef")
        if self.payload_ref is not None and self.payload_ref.sha256 != self.payload_hash:
            raise ValueError("payloadRef.sha256 must be the payloadHash: the object is the job's canonical document")
        return self

    @model_serializer(mode="wrap")
    def _without_absent_payload(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # The side that is not used is left out, so an inline message reads exactly as before payloadRef existed.
        data: dict[str, Any] = handler(self)
        for name in ("payload", "payload_ref", "payloadRef", "tenant_id", "tenantId"):
            if name in data and data[name] is None:
                del data[name]
        return data

    def request(self) -> ApplyPatchJob | RunTestsJob | OpenPrJob:
        """Validate the payload for the job's type (the worker rejects a message whose payload does not validate).

        A message whose payload is still a pointer (its object could not be resolved) raises PayloadUnavailableError.
        """
        if self.payload is None:
            ref = self.payload_ref
            raise PayloadUnavailableError(
                f"the payload of job {self.job_id} ({ref.url if ref else 'no object'}) is missing or is not the "
                "payload the job was accepted with; submit the same job again (same jobId and payload) to store it "
                "again, then resume the workspace with retry, or skip the job"
            )
        return _job_request_adapter().validate_python(
            {"jobId": self.job_id, "workspaceId": self.workspace_id, "type": self.type, "payload": self.payload}
        )


def canonical_job_document(workspace_id: str, job_type: str, payload: dict[str, Any]) -> bytes:
    """The canonical JSON (UTF-8) of what makes a job *this* job: workspace, type and payload. Its sha256 is the
    payload hash, and it is what a large payload's S3 object holds."""
    canonical = json.dumps(
        {"workspaceId": workspace_id, "type": str(job_type), "payload": payload},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return canonical.encode()


def payload_hash(job: ApplyPatchJob | RunTestsJob | OpenPrJob) -> str:
    """sha256 of the canonical JSON of what makes a job *this* job: workspace, type and payload.

    The same jobId resubmitted with the same hash is an idempotent retry; with another hash it is a conflict.
    """
    document = canonical_job_document(job.workspace_id, str(job.type), job.payload.model_dump(by_alias=True))
    return hashlib.sha256(document).hexdigest()


def parse_queue_message(body: str) -> JobMessage:
    """A queue message body as a JobMessage, for messages of the API and of producers that send to the queue directly.

    `payloadHash` is optional on the wire: when absent, it is derived from the inline payload. A hash of the payload
    exactly as sent (the canonical document without the fields the job model fills in by default) is accepted too,
    and replaced by the canonical one, so that every record of a job holds the same hash. The message's payload is
    the canonical one too (the defaults filled in), so that a copy stored for later (a parked job's payload object)
    has the hash the job is known by. Any other hash is refused
    (ValueError): the body is not the job its producer hashed. Raises pydantic's ValidationError or ValueError for a
    body that is not a job message.
    """
    try:
        message = JobMessage.model_validate_json(body)
    except ValidationError as error:
        if any(item["loc"] == ("v",) for item in error.errors()):
            # The version alone is reported: the rest of a body of another version may mean something else entirely.
            raise ValueError(_unsupported_version(_version_of(body))) from None
        if not any(item["type"] == "missing" and item["loc"] == ("payloadHash",) for item in error.errors()):
            raise
        data = json.loads(body)
        request = _job_request_adapter().validate_python(
            {key: data.get(key) for key in ("jobId", "workspaceId", "type", "payload")}
        )
        payload = request.payload.model_dump(by_alias=True)
        return JobMessage.model_validate({**data, "payload": payload, "payloadHash": payload_hash(request)})
    if message.payload is None:
        return message  # a pointer message is checked against its object when it is resolved
    request = message.request()
    canonical = payload_hash(request)
    payload = request.payload.model_dump(by_alias=True)
    if canonical != message.payload_hash:
        as_sent = canonical_job_document(message.workspace_id, message.type, message.payload)
        if hashlib.sha256(as_sent).hexdigest() != message.payload_hash:
            raise ValueError("payloadHash does not match the payload; leave it out to have it derived from the payload")
    elif payload == message.payload:
        return message  # the API's messages: already canonical
    # The payload as the job model fills it in: what its hash is of, and what a stored copy of it must hold.
    return message.model_copy(update={"payload": payload, "payload_hash": canonical})


def _version_of(body: str) -> object:
    """The body's `v`, for the error that refuses it."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        return MESSAGE_VERSION
    return document.get("v", MESSAGE_VERSION) if isinstance(document, dict) else MESSAGE_VERSION


def job_message(job: ApplyPatchJob | RunTestsJob | OpenPrJob, tenant_id: str) -> JobMessage:
    return JobMessage(
        job_id=job.job_id,
        workspace_id=job.workspace_id,
        tenant_id=tenant_id,
        type=job.type,
        payload=job.payload.model_dump(by_alias=True),
        payload_hash=payload_hash(job),
    )
