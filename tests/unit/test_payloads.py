"""Large payloads: the pointer in the job message, and the payload store (moto in-process, the bucket provisioned from
template.yaml)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws
from pydantic import ValidationError

from agent_jobs.models import JobMessage, PayloadRef, PayloadUnavailableError, canonical_job_document
from agent_jobs.payloads import PayloadStore, payload_key, resolve_payload
from tests.conftest import REGION, Stack, _make_stack, make_message


@pytest.fixture
def bucket_stack() -> Iterator[Stack]:
    with mock_aws():
        yield _make_stack("in-process", boto3.Session(region_name=REGION))


def pointer_fields(message: JobMessage, **ref: Any) -> dict[str, Any]:
    fields = message.model_dump(by_alias=True, exclude={"payload"})
    fields["payloadRef"] = {
        "bucket": "bkt",
        "key": "payloads/k.json",
        "size": 10,
        "sha256": message.payload_hash,
        **ref,
    }
    return fields


# ---- the message ------------------------------------------------------------------------------------------------


def test_job_message_carries_exactly_one_of_payload_and_payload_ref() -> None:
    message = make_message("job-1")
    both = {**pointer_fields(message), "payload": message.payload}
    neither = message.model_dump(by_alias=True, exclude={"payload"})

    for fields in (both, neither):
        with pytest.raises(ValidationError, match="exactly one of payload and payloadRef"):
            JobMessage.model_validate(fields)
    assert JobMessage.model_validate(pointer_fields(message)).payload_ref is not None


def test_job_message_pointer_must_name_the_payload_hash() -> None:
    message = make_message("job-1")

    with pytest.raises(ValidationError, match=r"payloadRef.sha256 must be the payloadHash"):
        JobMessage.model_validate(pointer_fields(message, sha256="0" * 64))


def test_job_message_body_leaves_out_the_side_it_does_not_use() -> None:
    inline = make_message("job-1")
    pointer = JobMessage.model_validate(pointer_fields(inline))

    assert "payloadRef" not in inline.model_dump_json(by_alias=True)
    assert '"payload"' not in pointer.model_dump_json(by_alias=True)
    assert JobMessage.model_validate_json(pointer.model_dump_json(by_alias=True)) == pointer


def test_job_message_request_of_an_unresolved_pointer_says_what_to_do() -> None:
    pointer = JobMessage.model_validate(pointer_fields(make_message("job-1")))

    with pytest.raises(PayloadUnavailableError, match=r"submit the same job again .* resume the workspace with retry"):
        pointer.request()


def test_canonical_job_document_hashes_to_the_payload_hash() -> None:
    message = make_message("job-1")
    assert message.payload is not None

    document = canonical_job_document(message.workspace_id, str(message.type), message.payload)

    assert hashlib.sha256(document).hexdigest() == message.payload_hash


# ---- store and resolve ------------------------------------------------------------------------------------------


def test_payload_store_stores_an_encrypted_json_object_under_a_derived_key(bucket_stack: Stack) -> None:
    message = make_message("job-1", tenant_id="tenant-9")
    payloads = bucket_stack.services.payloads

    pointer = payloads.store(message)

    ref = pointer.payload_ref
    assert ref is not None
    assert pointer.payload is None
    assert ref.key == payload_key(message) == f"payloads/tenant-9/ws-a/job-1/{message.payload_hash}.json"
    head = payloads.client.head_object(Bucket=ref.bucket, Key=ref.key)
    assert (head["ServerSideEncryption"], head["ContentType"]) == ("AES256", "application/json")
    assert head["ContentLength"] == ref.size
    assert ref.sha256 == message.payload_hash


def test_payload_store_is_idempotent(bucket_stack: Stack) -> None:
    message = make_message("job-1")
    payloads = bucket_stack.services.payloads

    first, second = payloads.store(message), payloads.store(message)

    assert first == second
    listed = payloads.client.list_objects_v2(Bucket=str(payloads.bucket))["Contents"]
    assert [obj["Key"] for obj in listed] == [payload_key(message)]


def test_resolve_payload_gives_back_the_message_as_submitted(bucket_stack: Stack) -> None:
    message = make_message("job-1")
    payloads = bucket_stack.services.payloads

    resolved = resolve_payload(payloads.store(message), payloads)

    assert resolved == message
    assert resolved.request() == message.request()


def test_resolve_payload_of_an_inline_message_builds_no_client() -> None:
    def no_client() -> Any:
        raise AssertionError("an inline message must not need S3")

    message = make_message("job-1")

    assert resolve_payload(message, PayloadStore("bkt", no_client)) is message


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [
        pytest.param("delete", "does not exist", id="missing"),
        pytest.param("same-size", "does not have the sha256 of the payload", id="changed-same-size"),
        pytest.param("longer", "bytes, not the", id="size-mismatch"),
    ],
)
def test_resolve_payload_refuses_an_object_that_is_not_the_accepted_payload(
    bucket_stack: Stack, tamper: str, reason: str
) -> None:
    # Given a stored payload whose object was then deleted or changed
    message = make_message("job-1")
    payloads = bucket_stack.services.payloads
    pointer = payloads.store(message)
    ref = pointer.payload_ref
    assert ref is not None
    original = payloads.client.get_object(Bucket=ref.bucket, Key=ref.key)["Body"].read()
    if tamper == "delete":
        payloads.client.delete_object(Bucket=ref.bucket, Key=ref.key)
    else:
        changed = original.replace(b"change for", b"CHANGE FOR") + (b" " if tamper == "longer" else b"")
        payloads.client.put_object(Bucket=ref.bucket, Key=ref.key, Body=changed)

    # Then resolving it refuses, naming the object and what to do
    with pytest.raises(PayloadUnavailableError) as refused:
        resolve_payload(pointer, payloads)
    assert reason in str(refused.value)
    assert ref.url in str(refused.value)
    assert "submit the same job again (same jobId and payload)" in str(refused.value)


def test_resolve_payload_refuses_another_workspaces_document_even_with_a_matching_hash(bucket_stack: Stack) -> None:
    # Given a pointer message for ws-b that names ws-a's stored document (hash and size match that document)
    stored = bucket_stack.services.payloads.store(make_message("job-1", workspace_id="ws-a"))
    assert stored.payload_ref is not None
    forged = stored.model_copy(update={"workspace_id": "ws-b"})

    with pytest.raises(PayloadUnavailableError, match="belongs to another workspace or job type"):
        resolve_payload(forged, bucket_stack.services.payloads)


def test_resolve_payload_lets_a_transient_s3_error_through(bucket_stack: Stack) -> None:
    # Given S3 answering a throttling error: not the job's fault, so it must not end the job
    pointer = bucket_stack.services.payloads.store(make_message("job-1"))
    client = bucket_stack.services.payloads.client

    def throttled(**_: Any) -> Any:
        raise ClientError({"Error": {"Code": "SlowDown", "Message": "slow down"}}, "GetObject")

    store = PayloadStore("bkt", lambda: client)
    store.client.get_object = throttled  # type: ignore[method-assign]

    with pytest.raises(ClientError):
        resolve_payload(pointer, store)


def test_payload_ref_url_names_bucket_and_key() -> None:
    assert PayloadRef(bucket="bkt", key="payloads/x.json", size=1, sha256="a" * 64).url == "s3://bkt/payloads/x.json"


def test_pointer_message_stays_far_below_the_stored_body_limit() -> None:
    # A pointer is what a parked job stores: far below the guard's 300,000 stored characters, however large the payload
    from agent_jobs.guard import MAX_STORED_BODY_CHARS

    fields = pointer_fields(make_message("j" * 64), bucket="b" * 63, key="payloads/" + "k" * 1000, size=5_000_000)
    assert len(JobMessage.model_validate(fields).model_dump_json(by_alias=True)) < MAX_STORED_BODY_CHARS // 100
