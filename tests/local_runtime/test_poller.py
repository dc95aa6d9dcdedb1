"""The worker's SQS event source, run locally, follows the template: copies of template.yaml with another BatchSize,
Timeout and CodeUri change what the poller does. The function is a small recording one; the template names it."""

from __future__ import annotations

import json
import textwrap
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml

from agent_jobs_local.poller import EventSourceError, EventSourcePoller, reported_failures
from agent_jobs_local.template import TemplateModel, load_template, provision

REGION = "us-east-1"
SLOW_SECONDS = 3

RECORDING_FUNCTION = textwrap.dedent(
    """
    import json
    import os
    import time

    COLD = True
    time.sleep(float(os.environ.get("INIT_SECONDS", "0")))  # a slow Init phase (imports, clients) when asked


    def lambda_handler(event, context):
        # Recorded before anything slow or failing happens, so a killed invocation is on record too.
        global COLD
        batch = {
            "pid": os.getpid(),
            "cold": COLD,
            "remaining_ms": context.get_remaining_time_in_millis(),
            "records": [
                [r["messageId"], json.loads(r["body"]), r["attributes"]["ApproximateReceiveCount"]]
                for r in event["Records"]
            ],
        }
        COLD = False
        with open(os.environ["BATCH_LOG"], "a") as log:
            log.write(json.dumps(batch) + "\\n")
        for record in event["Records"]:
            body = json.loads(record["body"])
            first_delivery = record["attributes"]["ApproximateReceiveCount"] == "1"
            if body.get("sleep") and first_delivery:
                time.sleep(body["sleep"])
            if body.get("raise") and first_delivery:
                raise RuntimeError("asked to fail")
        return {"batchItemFailures": []}
    """
)


def write_template_copy(tmp_path: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    """template.yaml, changed by `change`, with the worker's CodeUri and Handler naming the recording function."""
    function_dir = tmp_path / "recording_function"
    function_dir.mkdir(exist_ok=True)
    (function_dir / "app.py").write_text(RECORDING_FUNCTION)
    template = load_template()
    template["Resources"]["JobWorkerFunction"]["Properties"]["CodeUri"] = str(function_dir)
    template["Resources"]["JobWorkerFunction"]["Properties"]["Handler"] = "app.lambda_handler"
    change(template)
    path = tmp_path / f"template-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(template, sort_keys=False))
    return path


def worker_properties(template: dict[str, Any]) -> dict[str, Any]:
    properties: dict[str, Any] = template["Resources"]["JobWorkerFunction"]["Properties"]
    return properties


def event_properties(template: dict[str, Any]) -> dict[str, Any]:
    properties: dict[str, Any] = worker_properties(template)["Events"]["JobsQueueRecords"]["Properties"]
    return properties


def batch_size_2_by_parameter_default_timeout_2(template: dict[str, Any]) -> None:
    template["Parameters"]["WorkerBatchSize"]["Default"] = 2
    worker_properties(template)["Timeout"] = 2
    template["Resources"]["JobsQueue"]["Properties"]["VisibilityTimeout"] = 6


def batch_size_7_literal_timeout_5(template: dict[str, Any]) -> None:
    event_properties(template)["BatchSize"] = 7
    worker_properties(template)["Timeout"] = 5
    template["Resources"]["JobsQueue"]["Properties"]["VisibilityTimeout"] = 6


@dataclass
class Run:
    poller: EventSourcePoller
    batches: list[dict[str, Any]]
    sent: dict[str, str]  # body name -> message id


def run_poller_on(
    template_path: Path,
    tmp_path: Path,
    moto_server: str,
    monkeypatch: pytest.MonkeyPatch,
    messages: list[tuple[str, dict[str, Any]]],
    *,
    concurrency: int = 1,  # one environment, so "the next invocation after a kill" is well defined
    function_env: dict[str, str] | None = None,
) -> Run:
    """Provision the copy in the emulator, send `messages` (group, body), run its poller until the queue is empty."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    model = TemplateModel.from_path(template_path, stack_name=f"poll-{uuid.uuid4().hex[:8]}")
    resources = provision(boto3.Session(region_name=REGION), model)
    sqs = boto3.client("sqs", region_name=REGION)
    sent: dict[str, str] = {}
    for n, (group, body) in enumerate(messages):
        answer = sqs.send_message(
            QueueUrl=resources.queue_url,
            MessageBody=json.dumps(body),
            MessageGroupId=group,
            MessageDeduplicationId=f"m{n}",
        )
        sent[body["name"]] = answer["MessageId"]
    batch_log = tmp_path / f"batches-{model.stack_name}.jsonl"
    poller = EventSourcePoller(
        model=model,
        queue_url=resources.queue_url,
        queue_arn=resources.queue_arn,
        region=REGION,
        function_env={"BATCH_LOG": str(batch_log), **(function_env or {})},
        endpoint_url=moto_server,
        concurrency=concurrency,
        poll_wait_seconds=0.5,
    )
    with poller:
        assert poller.drain(timeout=45), f"the queue did not empty: {poller.stats}"
    batches = [json.loads(line) for line in batch_log.read_text().splitlines()]
    return Run(poller, batches, sent)


@pytest.mark.parametrize(
    ("change", "batch_size", "timeout_seconds"),
    [(batch_size_2_by_parameter_default_timeout_2, 2, 2), (batch_size_7_literal_timeout_5, 7, 5)],
    ids=["BatchSize-2-Timeout-2", "BatchSize-7-Timeout-5"],
)
def test_poller_follows_the_template(
    change: Callable[[dict[str, Any]], None],
    batch_size: int,
    timeout_seconds: int,
    tmp_path: Path,
    moto_server: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a copy of the template with its own BatchSize and Timeout, and a workspace with 15 jobs, one that takes
    # SLOW_SECONDS on its first delivery and one that fails on its first delivery
    template_path = write_template_copy(tmp_path, change)
    messages: list[tuple[str, dict[str, Any]]] = [("ws#bulk", {"name": f"bulk-{n}"}) for n in range(15)]
    messages += [("ws#slow", {"name": "slow", "sleep": SLOW_SECONDS}), ("ws#boom", {"name": "boom", "raise": True})]

    # When its poller runs until the queue is empty
    run = run_poller_on(template_path, tmp_path, moto_server, monkeypatch, messages)
    stats, poller = run.poller.stats, run.poller

    # Then batches are as large as the copy's BatchSize allows, and no larger
    assert poller.batch_size == batch_size
    assert stats.largest_batch == batch_size
    assert max(len(batch["records"]) for batch in run.batches) == batch_size

    # and the context counts down from the copy's Timeout
    assert all(batch["remaining_ms"] <= timeout_seconds * 1000 for batch in run.batches)
    assert run.batches[0]["remaining_ms"] > (timeout_seconds - 1) * 1000

    # and the slow invocation is killed at the Timeout only when the Timeout is shorter: nothing of its batch deleted,
    # delivered again later, in a fresh environment (a cold start)
    log = poller.invocation_log()
    killed = timeout_seconds < SLOW_SECONDS
    slow_first = next(entry for entry in log if run.sent["slow"] in entry.message_ids)
    assert (slow_first.outcome == "timeout") == killed
    assert stats.timeouts == (1 if killed else 0)
    slow_deliveries = [r[2] for batch in run.batches for r in batch["records"] if r[1]["name"] == "slow"]
    assert slow_deliveries[0] == "1"
    if killed:
        assert slow_first.deleted == 0
        assert slow_deliveries == ["1", "2"]
        after_kill = log[log.index(slow_first) + 1]
        assert after_kill.cold_start
        assert after_kill.environment_pid != slow_first.environment_pid
    assert stats.cold_starts == 1 + stats.timeouts

    # and a function error deletes nothing of its batch but keeps the environment warm
    boom_first = next(entry for entry in log if run.sent["boom"] in entry.message_ids)
    assert boom_first.outcome == "function_error"
    assert boom_first.deleted == 0
    after_error = log[log.index(boom_first) + 1]
    assert not after_error.cold_start
    assert after_error.environment_pid == boom_first.environment_pid
    boom_deliveries = [r[2] for batch in run.batches for r in batch["records"] if r[1]["name"] == "boom"]
    assert boom_deliveries == ["1", "2"]
    assert stats.handler_errors == 1
    assert stats.crashes == 0

    # and every message was deleted exactly when its invocation succeeded
    assert stats.records_deleted == len(messages)
    assert stats.records_received == stats.records_deleted + stats.records_in_failed_invocations
    assert stats.max_concurrent_invocations == 1


def timeout_1_visibility_2(template: dict[str, Any]) -> None:
    worker_properties(template)["Timeout"] = 1
    template["Resources"]["JobsQueue"]["Properties"]["VisibilityTimeout"] = 2


def test_poller_initialises_environments_before_taking_records(
    tmp_path: Path, moto_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a function whose Init phase outlasts the queue's VisibilityTimeout (as a 1.2 s import does against a
    # time-scaled visibility, with many environments starting at once on a small machine), two pollers, and jobs
    template_path = write_template_copy(tmp_path, timeout_1_visibility_2)
    messages: list[tuple[str, dict[str, Any]]] = [(f"ws#{n}", {"name": f"job-{n}"}) for n in range(3)]

    # When the pollers run until the queue is empty
    run = run_poller_on(
        template_path, tmp_path, moto_server, monkeypatch, messages, concurrency=2, function_env={"INIT_SECONDS": "4"}
    )

    # Then no record came back to the queue while an environment was starting: each was received and handled once
    deliveries = [record[2] for batch in run.batches for record in batch["records"]]
    assert sorted(record[1]["name"] for batch in run.batches for record in batch["records"]) == [
        "job-0",
        "job-1",
        "job-2",
    ]
    assert deliveries == ["1", "1", "1"]
    assert run.poller.stats.records_received == 3


def test_poller_concurrency_defaults_to_the_templates_maximum_concurrency(tmp_path: Path) -> None:
    def maximum_concurrency_3(template: dict[str, Any]) -> None:
        template["Parameters"]["WorkerMaximumConcurrency"]["Default"] = 3

    model = TemplateModel.from_path(write_template_copy(tmp_path, maximum_concurrency_3), stack_name="conc")
    poller = EventSourcePoller(
        model=model,
        queue_url="http://127.0.0.1:1/123456789012/conc-jobs.fifo",
        queue_arn=f"arn:aws:sqs:{REGION}:123456789012:{model.queue_name(model.jobs_queue_id)}",
        region=REGION,
        function_env={},
    )

    assert poller.concurrency == 3
    assert poller.invocation_timeout_seconds == model.worker.timeout_seconds


def test_poller_refuses_an_event_source_without_report_batch_item_failures(tmp_path: Path) -> None:
    def no_partial_batch_responses(template: dict[str, Any]) -> None:
        del event_properties(template)["FunctionResponseTypes"]

    model = TemplateModel.from_path(write_template_copy(tmp_path, no_partial_batch_responses), stack_name="rbif")

    with pytest.raises(EventSourceError, match="ReportBatchItemFailures"):
        EventSourcePoller(
            model=model,
            queue_url="http://127.0.0.1:1/123456789012/rbif-jobs.fifo",
            queue_arn=f"arn:aws:sqs:{REGION}:123456789012:{model.queue_name(model.jobs_queue_id)}",
            region=REGION,
            function_env={},
        )


@pytest.mark.parametrize(
    ("response", "failed"),
    [
        (None, set()),
        ({}, set()),
        ({"batchItemFailures": None}, set()),
        ({"batchItemFailures": []}, set()),
        ({"batchItemFailures": [{"itemIdentifier": "m2"}]}, {"m2"}),
        ("ok", None),
        ({"batchItemFailures": "m2"}, None),
        ({"batchItemFailures": [{"itemIdentifier": ""}]}, None),
        ({"batchItemFailures": [{"itemIdentifier": None}]}, None),
        ({"batchItemFailures": [{"id": "m2"}]}, None),
        ({"batchItemFailures": [{"itemIdentifier": "not-in-the-batch"}]}, None),
    ],
)
def test_poller_reads_responses_by_lambdas_rules(response: Any, failed: set[str] | None) -> None:
    assert reported_failures(response, ["m1", "m2", "m3"]) == failed
