"""The worker's Lambda handler as deployed (app.lambda_handler, Powertools wiring, settings from the environment),
run on the real-shaped events in events/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent_jobs.models import JobStatus
from jobs.workspace import LocalWorkspaceStore
from tests.conftest import REPO, Stack, enqueue, make_message

EVENTS = REPO / "events"


@pytest.fixture
def worker_app(any_stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    import app  # the worker function folder is on the path as in Lambda (/var/task)

    for name, value in any_stack.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WORKSPACES_ROOT", str(tmp_path / "ws"))
    monkeypatch.setattr(app, "_worker", None)  # a cold start for each test
    return app


def load_event(name: str) -> dict[str, Any]:
    event: dict[str, Any] = json.loads((EVENTS / name).read_text())
    return event


def test_worker_app_runs_the_two_workspace_event(worker_app, any_stack, tmp_path, lambda_context):
    event = load_event("sqs_fifo_two_workspaces.json")
    response = worker_app.lambda_handler(event, lambda_context())
    assert response == {"batchItemFailures": []}
    store = LocalWorkspaceStore(tmp_path / "ws")
    assert [c.job_id for c in store.open("repo-alpha").history()] == ["job-a-001"]
    assert [c.job_id for c in store.open("repo-beta").history()] == ["job-b-001"]
    for record in event["Records"]:
        job = any_stack.job(json.loads(record["body"])["jobId"])
        assert job["status"] == JobStatus.SUCCEEDED
        assert job["tenantId"] == "tenant-demo"
        assert job["sequenceNumber"] == record["attributes"]["SequenceNumber"]


def test_worker_app_absorbs_the_duplicate_delivery_event(worker_app, any_stack, tmp_path, lambda_context):
    event = load_event("sqs_fifo_duplicate_delivery.json")
    response = worker_app.lambda_handler(event, lambda_context())
    assert response == {"batchItemFailures": []}
    store = LocalWorkspaceStore(tmp_path / "ws")
    assert [c.job_id for c in store.open("repo-alpha").history()] == ["job-a-001"]
    job = any_stack.job("job-a-001")
    assert job["attempt"] == 1
    assert job["messageId"] == event["Records"][0]["messageId"]  # the resent message never claimed it


def test_worker_app_reports_a_leased_record_and_never_raises(worker_app, any_stack, lambda_context):
    # Given a job another worker holds with a live lease
    message = make_message("job-a-001", workspace_id="repo-alpha", tenant_id="tenant-demo")
    any_stack.guard.claim(message, message_id="other", sequence_number=None, remaining_ms=60_000)
    event = load_event("sqs_fifo_duplicate_delivery.json")
    event["Records"][0]["body"] = message.model_dump_json(by_alias=True)
    event["Records"][1]["body"] = message.model_dump_json(by_alias=True)
    # When the handler gets it, Then the record and the rest of its group are reported, not acknowledged
    response = worker_app.lambda_handler(event, lambda_context())
    assert [f["itemIdentifier"] for f in response["batchItemFailures"]] == [r["messageId"] for r in event["Records"]]


def test_worker_app_settings_come_from_the_environment(worker_app, any_stack, monkeypatch, lambda_context):
    monkeypatch.setenv("MAX_ATTEMPTS", "7")
    worker = worker_app.worker()
    assert worker.services.settings.max_attempts == 7
    assert worker.services.settings.table_name == any_stack.table_name
    assert worker_app.worker() is worker  # built once, reused while warm


def test_worker_app_message_from_the_producer_runs(worker_app, any_stack, tmp_path, lambda_context):
    from tests.conftest import make_job

    enqueue(any_stack, make_job("p-1", "ws-prod"))
    event = any_stack.receive()
    assert worker_app.lambda_handler(event, lambda_context()) == {"batchItemFailures": []}
    assert [c.job_id for c in LocalWorkspaceStore(tmp_path / "ws").open("ws-prod").history()] == ["p-1"]
