"""Large payloads (claim check): a job whose queue message would be too large is stored as an S3 object, and the
message carries a pointer (`payloadRef`) instead of the payload.

The object holds the job's canonical document (`models.canonical_job_document`: workspace, type and payload), so its
sha256 *is* the job's payload hash: the worker checks what it reads against the hash the job was accepted with, and
idempotency (same jobId and payload = 202, another payload = 409) is the same for large and small jobs. The key is
derived from tenant, workspace, jobId and payload hash, so storing the same job twice writes the same bytes to the
same key (idempotent), and a job resubmitted with another payload never overwrites the accepted one.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from botocore.exceptions import ClientError

from agent_jobs.models import JobMessage, PayloadRef, PayloadUnavailableError, canonical_job_document
from agent_jobs.store.codec import MAX_STORED_BODY_CHARS

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

PAYLOAD_PREFIX: Final = "payloads/"
"""Every payload object lives under this prefix (the producer may write only here, the lifecycle rules act here)."""
CONTENT_TYPE: Final = "application/json"
_MISSING_CODES: Final = frozenset({"NoSuchKey", "404", "NotFound", "NoSuchBucket"})
_WHAT_TO_DO: Final = (
    "submit the same job again (same jobId and payload) to store its payload again, then resume the workspace with "
    "retry; or skip the job"
)


def payload_key(message: JobMessage) -> str:
    """`payloads/<tenant>/<workspace>/<jobId>/<payload hash>.json`: ids are restricted to [A-Za-z0-9._-], so a key
    is unambiguous, and the hash keeps another payload under the same jobId from overwriting the accepted one."""
    return f"{PAYLOAD_PREFIX}{message.tenant_id}/{message.workspace_id}/{message.job_id}/{message.payload_hash}.json"


def message_body(message: JobMessage) -> str:
    """The queue message body of a job message (JSON, camelCase)."""
    return message.model_dump_json(by_alias=True)


class PayloadStore:
    """Payload objects in one bucket. The S3 client is built on first use: a worker that only sees small jobs never
    pays for it on a cold start."""

    def __init__(self, bucket: str | None, client_factory: Callable[[], S3Client]) -> None:
        self.bucket = bucket or None
        self._client_factory = client_factory
        self._client: S3Client | None = None
        # The worker resolves payloads from several threads (one per message group); a boto3 Session, which the
        # factory uses, must not build clients from two threads at once.
        self._client_lock = threading.Lock()

    @property
    def client(self) -> S3Client:
        if self._client is None:
            with self._client_lock:
                if self._client is None:
                    self._client = self._client_factory()
        return self._client

    def store(self, message: JobMessage) -> JobMessage:
        """Store an inline message's payload as an object and return the pointer message that replaces it.

        Idempotent: the same job always writes the same bytes to the same key (a repeat also restores an object that
        was deleted). Encrypted at rest with SSE-S3 whatever the bucket's default says.
        """
        if self.bucket is None:
            raise ValueError("no payload bucket is configured (PAYLOAD_BUCKET)")
        if message.payload is None:
            return message  # already a pointer
        document = canonical_job_document(message.workspace_id, str(message.type), message.payload)
        key = payload_key(message)
        self.client.put_object(
            Bucket=self.bucket,
            Key=key,
            Body=document,
            ContentType=CONTENT_TYPE,
            ServerSideEncryption="AES256",
            ChecksumAlgorithm="SHA256",
            Metadata={"job-id": message.job_id, "payload-hash": message.payload_hash},
        )
        ref = PayloadRef(bucket=self.bucket, key=key, size=len(document), sha256=message.payload_hash)
        return message.model_copy(update={"payload": None, "payload_ref": ref})

    def read(self, ref: PayloadRef) -> bytes:
        """The object's bytes. Raises PayloadUnavailableError when it does not exist (S3 is strongly consistent, so
        missing means deleted or expired); any other S3 error propagates (transient: the record is retried)."""
        try:
            response = self.client.get_object(Bucket=ref.bucket, Key=ref.key)
        except ClientError as error:
            code = str(error.response.get("Error", {}).get("Code", ""))
            if code in _MISSING_CODES:
                raise PayloadUnavailableError(
                    f"the payload object {ref.url} does not exist (deleted, or expired by the bucket's lifecycle "
                    f"rule); {_WHAT_TO_DO}"
                ) from None
            raise
        return response["Body"].read()


def storable_body(body: str, message: JobMessage, payloads: PayloadStore) -> str:
    """The body a record keeps for a job that may still run (PARKED, DEAD): `body` when it fits a record, else the
    job's pointer message, its payload stored in the payload bucket as the API stores a large job's. SQS takes bodies
    up to 1 MiB, far more than a DynamoDB item holds, and a parked job must run later exactly as it was sent. (Without
    a payload bucket the body is kept cut, with its size and hash, and the job cannot run again.)"""
    if message.payload is None or payloads.bucket is None:
        return body
    # Every record takes this check: a character is at most 4 UTF-8 bytes, so most bodies need no encoding to pass.
    if len(body) * 4 <= MAX_STORED_BODY_CHARS or len(body.encode()) <= MAX_STORED_BODY_CHARS:
        return body
    return message_body(payloads.store(message))


def resolve_payload(message: JobMessage, payloads: PayloadStore) -> JobMessage:
    """The message with its payload inline: a message that carries `payloadRef` gets the payload from its object,
    checked against the job's payload hash; an inline message is returned as it is.

    The one place a pointer is resolved: the worker's record parse and a resume's drain of a stored body call it.
    Raises PayloadUnavailableError (saying what to do) when the object is missing or is not the accepted payload
    (size, sha256, or its workspace or type differ): such a job must never run. Other S3 errors propagate.
    """
    ref = message.payload_ref
    if ref is None:
        return message
    document = payloads.read(ref)
    problem = None
    if len(document) != ref.size:
        problem = f"is {len(document)} bytes, not the {ref.size} bytes stored"
    elif hashlib.sha256(document).hexdigest() != message.payload_hash:
        problem = "does not have the sha256 of the payload the job was accepted with (it was changed)"
    else:
        parsed = json.loads(document)
        if parsed.get("workspaceId") != message.workspace_id or parsed.get("type") != str(message.type):
            problem = "belongs to another workspace or job type"
        elif not isinstance(parsed.get("payload"), dict):
            problem = "holds no payload object"
    if problem is not None:
        raise PayloadUnavailableError(f"the payload object {ref.url} {problem}; {_WHAT_TO_DO}")
    return message.model_copy(update={"payload": parsed["payload"], "payload_ref": None})
