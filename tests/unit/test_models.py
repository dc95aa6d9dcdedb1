"""The job model: what an agent may submit, the ids SQS and DynamoDB will see, and the hash that tells a retry from a
conflict."""

from __future__ import annotations

import hashlib
import re
import string
from typing import Any

import pytest
from pydantic import ValidationError

from agent_jobs.keys import MAX_GROUP_ID_LENGTH, deduplication_id, workspace_group_id
from agent_jobs.models import (
    ApplyPatchJob,
    JobMessage,
    JobType,
    OpenPrJob,
    RunTestsJob,
    job_message,
    job_request_adapter,
    payload_hash,
)

# What SQS accepts in MessageGroupId and MessageDeduplicationId: 1-128 of alphanumerics and ASCII punctuation.
SQS_ID = re.compile(r"^[A-Za-z0-9!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]{1,128}$")
MAX_JOB_ID = 64
MAX_WORKSPACE_ID = 100

PATCH = "--- a/f.txt\n+++ b/f.txt\n@@ -0,0 +1 @@\n+hello\n"


def request(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "jobId": "job-1",
        "workspaceId": "ws-a",
        "type": "apply_patch",
        "payload": {"patch": PATCH, "commitMessage": "add hello"},
    }
    body.update(overrides)
    return body


def validate(body: dict[str, Any]) -> ApplyPatchJob | RunTestsJob | OpenPrJob:
    return job_request_adapter.validate_python(body)


def error_locations(body: dict[str, Any]) -> list[tuple[str | int, ...]]:
    with pytest.raises(ValidationError) as caught:
        validate(body)
    return [tuple(error["loc"]) for error in caught.value.errors()]


# ---- valid jobs ----------------------------------------------------------------------------------------------------


def test_job_request_apply_patch_with_author_is_accepted() -> None:
    job = validate(
        request(payload={"patch": PATCH, "commitMessage": "add hello", "author": {"name": "Bot", "email": "b@x.io"}})
    )

    assert isinstance(job, ApplyPatchJob)
    assert (job.job_id, job.workspace_id, job.type) == ("job-1", "ws-a", JobType.APPLY_PATCH)
    assert job.payload.commit_message == "add hello"
    assert job.payload.author is not None
    assert job.payload.author.email == "b@x.io"


def test_job_request_run_tests_defaults_to_the_default_suite() -> None:
    job = validate({"jobId": "job-2", "workspaceId": "ws-a", "type": "run_tests"})

    assert isinstance(job, RunTestsJob)
    assert job.payload.suite == "default"


def test_job_request_open_pr_is_accepted() -> None:
    job = validate(request(type="open_pr", payload={"title": "Agent changes", "body": "Please review"}))

    assert isinstance(job, OpenPrJob)
    assert job.payload.title == "Agent changes"


def test_job_request_is_frozen() -> None:
    job = validate(request())

    with pytest.raises(ValidationError):
        job.job_id = "other"  # type: ignore[misc]


# ---- refused jobs --------------------------------------------------------------------------------------------------


def test_job_request_unknown_type_is_refused_naming_the_allowed_types() -> None:
    with pytest.raises(ValidationError) as caught:
        validate(request(type="delete_repo"))

    (error,) = caught.value.errors()
    assert error["type"] == "union_tag_invalid"
    assert all(job_type.value in error["msg"] for job_type in JobType)


def test_job_request_missing_type_is_refused() -> None:
    body = request()
    del body["type"]

    with pytest.raises(ValidationError) as caught:
        validate(body)

    assert caught.value.errors()[0]["type"] == "union_tag_not_found"


@pytest.mark.parametrize(
    ("payload", "missing"),
    [
        ({"commitMessage": "m"}, "patch"),
        ({"patch": PATCH}, "commitMessage"),
    ],
)
def test_job_request_apply_patch_requires_patch_and_commit_message(payload: dict[str, Any], missing: str) -> None:
    assert error_locations(request(payload=payload)) == [("apply_patch", "payload", missing)]


def test_job_request_extra_top_level_field_is_refused() -> None:
    assert error_locations(request(priority="high")) == [("apply_patch", "priority")]


def test_job_request_extra_payload_field_is_refused() -> None:
    payload = {"patch": PATCH, "commitMessage": "m", "force": True}

    assert error_locations(request(payload=payload)) == [("apply_patch", "payload", "force")]


def test_job_request_tenant_in_body_is_refused() -> None:
    # The tenant comes from the caller's verified identity; a body that names one must not be accepted at all.
    assert error_locations(request(tenantId="someone-else")) == [("apply_patch", "tenantId")]


def test_job_request_snake_case_tenant_in_body_is_refused() -> None:
    assert error_locations(request(tenant_id="someone-else")) == [("apply_patch", "tenant_id")]


def test_job_request_ids_are_not_coerced_from_numbers() -> None:
    assert ("apply_patch", "jobId") in error_locations(request(jobId=12345))


def test_job_request_run_tests_suite_is_a_name_not_a_shell_command() -> None:
    assert error_locations(request(type="run_tests", payload={"suite": "unit; rm -rf /"})) == [
        ("run_tests", "payload", "suite")
    ]


# ---- ids -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("job_id", ["a", "A", "0", "job-1", "job_1.retry-2", "a" * MAX_JOB_ID])
def test_job_request_job_id_accepts_the_documented_charset(job_id: str) -> None:
    assert validate(request(jobId=job_id)).job_id == job_id


@pytest.mark.parametrize(
    "job_id",
    [
        "",
        "a" * (MAX_JOB_ID + 1),
        "-leading-dash",
        ".hidden",
        "has space",
        "a/b",
        "a#b",
        "a:b",
        "ünïcode",
        "a\nb",
        "job-1\n",
    ],
)
def test_job_request_job_id_outside_the_charset_or_length_is_refused(job_id: str) -> None:
    assert error_locations(request(jobId=job_id)) == [("apply_patch", "jobId")]


@pytest.mark.parametrize(
    "workspace_id",
    ["", "w" * (MAX_WORKSPACE_ID + 1), "_leading", "ws a", "ws/a", "ws#a", "wś"],
)
def test_job_request_workspace_id_outside_the_charset_or_length_is_refused(workspace_id: str) -> None:
    assert error_locations(request(workspaceId=workspace_id)) == [("apply_patch", "workspaceId")]


def test_workspace_group_id_of_the_longest_workspace_id_fits_sqs() -> None:
    workspace_id = "w" * MAX_WORKSPACE_ID
    job = validate(request(workspaceId=workspace_id))

    group_id = workspace_group_id(job.workspace_id)

    assert group_id == f"ws#{workspace_id}"
    assert len(group_id) <= MAX_GROUP_ID_LENGTH
    assert SQS_ID.match(group_id)


def test_workspace_group_id_over_sqs_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="128"):
        workspace_group_id("w" * (MAX_GROUP_ID_LENGTH - 2))


@pytest.mark.parametrize("field", ["jobId", "workspaceId"])
def test_job_request_id_characters_are_all_legal_in_sqs_ids(field: str) -> None:
    # Given every printable ASCII character and a few non-ASCII ones, in the middle of an otherwise valid id
    candidates = string.printable + "éß€\u00a0\u200b"
    accepted = []
    for char in candidates:
        try:
            validate(request(**{field: f"a{char}b"}))
        except ValidationError:
            continue
        accepted.append(char)

    # Then every character the model lets through is one SQS accepts in a group id, and the set is the documented one
    assert accepted
    assert all(SQS_ID.match(f"ws#a{char}b") for char in accepted)
    assert set(accepted) == set(string.ascii_letters + string.digits + "._-")


# ---- payload hash --------------------------------------------------------------------------------------------------


def test_payload_hash_is_stable_across_releases() -> None:
    # A stored hash is compared with the hash of a later resubmission: its canonical form must never drift.
    job = validate(request(payload={"patch": "--- a/f\n+++ b/f\n", "commitMessage": "msg"}))

    assert payload_hash(job) == "2af92cd621a9ec63e2f7b5dfc51f4d297a6d3404f883eed9d7cfcd20823b9f0a"


def test_payload_hash_ignores_key_order_and_explicit_defaults() -> None:
    first = validate(request(payload={"patch": PATCH, "commitMessage": "m"}))
    reordered = validate(
        {"payload": {"author": None, "commitMessage": "m", "patch": PATCH}, "type": "apply_patch"}
        | {"workspaceId": "ws-a", "jobId": "job-1"}
    )

    assert payload_hash(first) == payload_hash(reordered)


def test_payload_hash_ignores_the_job_id() -> None:
    assert payload_hash(validate(request(jobId="job-1"))) == payload_hash(validate(request(jobId="job-2")))


@pytest.mark.parametrize(
    "change",
    [
        {"payload": {"patch": PATCH + "+more\n", "commitMessage": "add hello"}},
        {"payload": {"patch": PATCH, "commitMessage": "another message"}},
        {"payload": {"patch": PATCH, "commitMessage": "add hello", "author": {"name": "B", "email": "b@x.io"}}},
        {"workspaceId": "ws-b"},
    ],
)
def test_payload_hash_changes_with_payload_and_workspace(change: dict[str, Any]) -> None:
    assert payload_hash(validate(request(**change))) != payload_hash(validate(request()))


def test_payload_hash_changes_with_type() -> None:
    # Given two jobs identical but for their type (no two real types share a payload shape, so the type is swapped)
    run_tests = validate({"jobId": "job-1", "workspaceId": "ws-a", "type": "run_tests", "payload": {"suite": "x"}})
    same_payload_other_type = run_tests.model_copy(update={"type": JobType.OPEN_PR})

    assert payload_hash(run_tests) != payload_hash(same_payload_other_type)


def test_payload_hash_of_non_ascii_payload_is_hex_sha256() -> None:
    job = validate(request(payload={"patch": PATCH, "commitMessage": "ajoute « café » ☕"}))

    assert re.fullmatch(r"[0-9a-f]{64}", payload_hash(job))


# ---- deduplication id and queue message ----------------------------------------------------------------------------


def test_deduplication_id_is_sha256_of_tenant_job_id_and_type() -> None:
    expected = hashlib.sha256(b"tenant-1:job-1:apply_patch").hexdigest()

    assert deduplication_id("tenant-1", "job-1", "apply_patch") == expected
    assert SQS_ID.match(expected)
    assert deduplication_id("tenant-1", "job-1", "run_tests") != expected
    assert deduplication_id("tenant-1", "job-2", "apply_patch") != expected
    # Two tenants' jobs of one jobId are two jobs: the queue must not drop one as a duplicate of the other.
    assert deduplication_id("tenant-2", "job-1", "apply_patch") != expected


def test_job_message_carries_the_tenant_and_hash_in_camel_case() -> None:
    job = validate(request())

    message = job_message(job, "tenant-1")
    wire = message.model_dump(by_alias=True, mode="json")

    assert wire == {
        "v": 1,
        "jobId": "job-1",
        "workspaceId": "ws-a",
        "tenantId": "tenant-1",
        "type": "apply_patch",
        "payload": {"patch": PATCH, "commitMessage": "add hello", "author": None},
        "payloadHash": payload_hash(job),
    }
    assert JobMessage.model_validate_json(message.model_dump_json(by_alias=True)).request() == job


def test_job_message_refuses_an_invalid_tenant() -> None:
    with pytest.raises(ValidationError):
        job_message(validate(request()), "tenant with spaces")
