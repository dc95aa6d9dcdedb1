"""The published queue message format: `schemas/job-message.v1.schema.json` is generated from the job model, and a
body the schema accepts is one the worker parses (and the other way round), so a producer that validates against the
file sends what the worker runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from agent_jobs.models import MESSAGE_SCHEMA_FILE, job_message, parse_queue_message
from agent_jobs.wire import render
from tests.conftest import make_job

ROOT = Path(__file__).resolve().parents[2]
PATCH = "--- a/f.txt\n+++ b/f.txt\n@@ -0,0 +1 @@\n+x\n"
BASE: dict[str, Any] = {
    "jobId": "j-1",
    "workspaceId": "ws-a",
    "type": "apply_patch",
    "payload": {"patch": PATCH, "commitMessage": "m"},
}
REF = {"bucket": "payload-bucket", "key": "payloads/t/ws-a/j-1/x.json", "size": 10, "sha256": "a" * 64}

# (name, body, what the worker does with it): True = parsed as a job, False = REJECTED.
CASES: list[tuple[str, dict[str, Any], bool]] = [
    ("direct, nothing optional", BASE, True),
    ("version 1 named", {**BASE, "v": 1}, True),
    ("version 2", {**BASE, "v": 2}, False),
    ("version as a string", {**BASE, "v": "1"}, False),
    ("tenant in the body", {**BASE, "tenantId": "acme"}, True),
    ("tenant not an id", {**BASE, "tenantId": "a b"}, False),
    ("author given", {**BASE, "payload": {**BASE["payload"], "author": {"name": "A", "email": "a@b.c"}}}, True),
    ("unknown field", {**BASE, "priority": 5}, False),
    ("unknown payload field", {**BASE, "payload": {**BASE["payload"], "force": True}}, False),
    ("no payload", {k: v for k, v in BASE.items() if k != "payload"}, False),
    ("payload and payloadRef", {**BASE, "payloadRef": REF, "payloadHash": "a" * 64}, False),
    (
        "payloadRef alone",
        {**{k: v for k, v in BASE.items() if k != "payload"}, "payloadRef": REF, "payloadHash": "a" * 64},
        True,
    ),
    ("payloadRef without hash", {**{k: v for k, v in BASE.items() if k != "payload"}, "payloadRef": REF}, False),
    ("unknown type", {**BASE, "type": "rm_rf"}, False),
    ("run_tests", {**BASE, "type": "run_tests", "payload": {"suite": "unit"}}, True),
    ("run_tests empty payload", {**BASE, "type": "run_tests", "payload": {}}, True),
    ("open_pr", {**BASE, "type": "open_pr", "payload": {"title": "t"}}, True),
    ("open_pr without title", {**BASE, "type": "open_pr", "payload": {"body": "b"}}, False),
    ("jobId with #", {**BASE, "jobId": "a#b"}, False),
    ("hash not hex", {**BASE, "payloadHash": "xyz"}, False),
]


def test_the_schema_file_is_the_job_models_schema() -> None:
    committed = (ROOT / MESSAGE_SCHEMA_FILE).read_text()
    assert committed == render(), "the schema file is stale: run `make schema` and commit it"


@pytest.mark.parametrize(("name", "body", "parsed"), CASES, ids=[case[0] for case in CASES])
def test_the_schema_and_the_worker_agree(name: str, body: dict[str, Any], parsed: bool) -> None:
    validator = Draft202012Validator(json.loads((ROOT / MESSAGE_SCHEMA_FILE).read_text()))
    Draft202012Validator.check_schema(validator.schema)
    schema_errors = [error.message for error in validator.iter_errors(body)]

    try:
        parse_queue_message(json.dumps(body))
        worker_parsed = True
    except ValueError:
        worker_parsed = False

    assert (worker_parsed, not schema_errors) == (parsed, parsed), schema_errors


def test_the_api_message_is_a_version_1_message_the_schema_accepts() -> None:
    message = job_message(make_job("j-1", "ws-a"), "acme")
    body = json.loads(message.model_dump_json(by_alias=True))

    assert body["v"] == 1
    validator = Draft202012Validator(json.loads((ROOT / MESSAGE_SCHEMA_FILE).read_text()))
    assert list(validator.iter_errors(body)) == []


def test_another_version_is_refused_for_its_version_alone() -> None:
    with pytest.raises(ValueError, match=r"^unsupported message version 2: this deployment reads version 1"):
        parse_queue_message(json.dumps({"v": 2, "jobId": "j", "something": "else"}))
    with pytest.raises(ValueError, match=r"must be the JSON number 1 \(or left out\), not \"1\""):
        parse_queue_message(json.dumps({**BASE, "v": "1"}))
