"""Batch enqueue, measured: the three producers and the batch route submit the same jobs, each into its own copy of
the template's queue and table, with every call counted (`batch_enqueue` turns the results into figures)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

REPO = Path(__file__).resolve().parent.parent
# Like sam local: the layer's package (as at /opt/python) and the API's code are importable.
for _folder in (REPO / "functions" / "enqueue_api", REPO / "layers" / "shared"):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

from agent_jobs.keys import deduplication_id, workspace_group_id  # noqa: E402
from agent_jobs.models import ApplyPatchJob, OpenPrJob, RunTestsJob, job_request_adapter  # noqa: E402
from agent_jobs.producer import MAX_BATCH_JOBS, enqueue_job, enqueue_jobs  # noqa: E402
from agent_jobs_bench.stack import BenchStack, provision_stack  # noqa: E402
from agent_jobs_local.emulator import Emulator  # noqa: E402

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient
    from mypy_boto3_sqs.client import SQSClient


TENANT = "bench-tenant"
WORKSPACES = 10
_WRITES: Mapping[str, Callable[[Mapping[str, Any]], int]] = {
    "PutItem": lambda params: 1,
    "UpdateItem": lambda params: 1,
    "DeleteItem": lambda params: 1,
    "TransactWriteItems": lambda params: sum(1 for item in params["TransactItems"] if "ConditionCheck" not in item),
    "BatchWriteItem": lambda params: sum(len(requests) for requests in params["RequestItems"].values()),
}

Job = ApplyPatchJob | RunTestsJob | OpenPrJob


@dataclass(frozen=True)
class Measurement:
    """What one producer cost for `jobs` jobs."""

    jobs: int
    seconds: float
    sqs_calls: int
    dynamodb_calls: int
    dynamodb_write_calls: int
    items_written: int
    accepted: int
    seconds_by_operation: Mapping[str, float]  # time spent inside each kind of call (the emulator's share)

    def per_job(self, count: int) -> float:
        return count / self.jobs

    @property
    def jobs_per_second(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else 0.0


class CallCounter:
    """Counts the calls (and the DynamoDB items written) the given clients make, from botocore's events."""

    def __init__(self, sqs: Any, dynamodb: Any) -> None:
        self._clients = (sqs, dynamodb)
        self.calls: Counter[tuple[str, str]] = Counter()
        self.items_written = 0
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self._started: dict[str, float] = {}

    def _count(self, model: Any, params: Mapping[str, Any], **_: Any) -> None:
        service = model.service_model.service_name
        self.calls[(service, model.name)] += 1
        if service == "dynamodb" and model.name in _WRITES:
            self.items_written += _WRITES[model.name](params)

    def _send_started(self, model: Any, **_: Any) -> None:
        self._started[model.name] = time.perf_counter()

    def _answered(self, model: Any, **_: Any) -> None:
        self.seconds[model.name] += time.perf_counter() - self._started.pop(model.name, time.perf_counter())

    def __enter__(self) -> CallCounter:
        for client in self._clients:
            # Fired once per API call, with the call's parameters as the caller gave them.
            client.meta.events.register("before-parameter-build", self._count)
            client.meta.events.register("before-call", self._send_started)
            client.meta.events.register("after-call", self._answered)
        return self

    def __exit__(self, *_: object) -> None:
        for client in self._clients:
            client.meta.events.unregister("before-parameter-build", self._count)
            client.meta.events.unregister("before-call", self._send_started)
            client.meta.events.unregister("after-call", self._answered)

    def total(self, service: str) -> int:
        return sum(count for (name, _), count in self.calls.items() if name == service)

    def writes(self) -> int:
        return sum(count for (name, op), count in self.calls.items() if name == "dynamodb" and op in _WRITES)


def _job(run: str, n: int) -> Job:
    workspace = f"ws-{n % WORKSPACES:02d}"
    patch = f"--- a/f.txt\n+++ b/f.txt\n@@ -0,0 +1 @@\n+change {n}\n"
    body = {
        "jobId": f"{run}-{n:05d}",
        "workspaceId": workspace,
        "type": "apply_patch",
        "payload": {"patch": patch, "commitMessage": f"change {n}"},
    }
    return job_request_adapter.validate_python(body)


def naive_enqueue(
    job: Job, tenant_id: str, *, dynamodb: DynamoDBClient, sqs: SQSClient, table: str, queue: str
) -> bool:
    """The naive producer: GetItem (seen?), PutItem QUEUED, SendMessage (same group and deduplication id)."""
    key: dict[str, Any] = {"pk": {"S": f"job#{job.job_id}"}}
    if "Item" in dynamodb.get_item(TableName=table, Key=key):
        return False
    request = job.model_dump(mode="json", by_alias=True)
    now = str(time.time_ns() // 1_000_000)
    dynamodb.put_item(
        TableName=table,
        Item={
            **key,
            "jobId": {"S": job.job_id},
            "workspaceId": {"S": job.workspace_id},
            "tenantId": {"S": tenant_id},
            "type": {"S": str(job.type)},
            "payloadHash": {"S": hashlib.sha256(json.dumps(request["payload"], sort_keys=True).encode()).hexdigest()},
            "status": {"S": "QUEUED"},
            "acceptedAt": {"N": now},
            "updatedAt": {"N": now},
        },
    )
    sqs.send_message(
        QueueUrl=queue,
        MessageBody=json.dumps({**request, "tenantId": tenant_id}),
        MessageGroupId=workspace_group_id(job.workspace_id),
        MessageDeduplicationId=deduplication_id(tenant_id, job.job_id, str(job.type)),
        MessageAttributes={
            "tenantId": {"DataType": "String", "StringValue": tenant_id},
            "type": {"DataType": "String", "StringValue": str(job.type)},
        },
    )
    return True


def _measure(stack: BenchStack, jobs: Sequence[Job], submit: Callable[[Sequence[Job]], int]) -> Measurement:
    sqs, dynamodb = stack.services.sqs, stack.services.dynamodb
    with CallCounter(sqs, dynamodb) as counter:
        started = time.perf_counter()
        accepted = submit(jobs)
        seconds = time.perf_counter() - started
    return Measurement(
        jobs=len(jobs),
        seconds=seconds,
        sqs_calls=counter.total("sqs"),
        dynamodb_calls=counter.total("dynamodb"),
        dynamodb_write_calls=counter.writes(),
        items_written=counter.items_written,
        accepted=accepted,
        seconds_by_operation=dict(counter.seconds),
    )


def _producer(stack: BenchStack) -> dict[str, Any]:
    """What the producer functions take besides the jobs and the tenant, as the API passes them."""
    return {
        "guard": stack.services.guard,
        "sqs": stack.services.sqs,
        "queue_url": stack.queue_url,
        "payloads": stack.services.payloads,
        "inline_limit_bytes": stack.settings.inline_message_limit_bytes,
    }


def measure_batch(stack: BenchStack, jobs: Sequence[Job]) -> Measurement:
    def submit(all_jobs: Sequence[Job]) -> int:
        accepted = 0
        for start in range(0, len(all_jobs), MAX_BATCH_JOBS):
            results = enqueue_jobs(all_jobs[start : start + MAX_BATCH_JOBS], TENANT, **_producer(stack))
            accepted += sum(1 for result in results if result.accepted and result.created)
        return accepted

    return _measure(stack, jobs, submit)


def measure_one_by_one(stack: BenchStack, jobs: Sequence[Job]) -> Measurement:
    def submit(all_jobs: Sequence[Job]) -> int:
        accepted = 0
        for job in all_jobs:
            result = enqueue_job(job, TENANT, **_producer(stack))
            accepted += int(result.created)
        return accepted

    return _measure(stack, jobs, submit)


def measure_naive(stack: BenchStack, jobs: Sequence[Job]) -> Measurement:
    def submit(all_jobs: Sequence[Job]) -> int:
        sqs, dynamodb = stack.services.sqs, stack.services.dynamodb
        return sum(
            naive_enqueue(job, TENANT, dynamodb=dynamodb, sqs=sqs, table=stack.table_name, queue=stack.queue_url)
            for job in all_jobs
        )

    return _measure(stack, jobs, submit)


def measure_route(stack: BenchStack, jobs: Sequence[Job]) -> Measurement:
    """`POST /jobs:batch` through the API's handler in this process (as API Gateway invokes it, with the JWT
    authorizer's claims), on the clients the handler builds from its template environment."""
    from agent_jobs_local.event_source import LambdaContextStub
    from enqueue_api import app

    environment = stack.model.function_environment("EnqueueApiFunction", stack.references)
    overrides = {
        **environment,
        "AWS_ENDPOINT_URL": stack.endpoint_url,
        "POWERTOOLS_METRICS_NAMESPACE": "AgentJobsBench",
        # The emulator takes any credentials; nothing from the developer's shell (a profile) is used.
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        # One tenant sends every job, faster than MaxJobsPerSecondPerTenant: the quota's calls are measured (its
        # counter's UpdateItem per request, a COUNT query per workspace of a batch), never its refusals.
        "MAX_JOBS_PER_SECOND_PER_TENANT": "1000000",
    }
    saved = {name: os.environ.get(name) for name in overrides}
    os.environ.update(overrides)
    app.reset_services()
    # Powertools read the namespace and log level when the module was imported; its metrics print to stdout.
    namespace, level = app.metrics.namespace, app.logger.log_level
    app.metrics.namespace = "AgentJobsBench"
    app.logger.setLevel("WARNING")
    try:
        services = app.services()
        route_stack = dataclasses.replace(stack, settings=services.settings, services=services)

        def submit(all_jobs: Sequence[Job]) -> int:
            accepted = 0
            for start in range(0, len(all_jobs), MAX_BATCH_JOBS):
                chunk = [job.model_dump(mode="json", by_alias=True) for job in all_jobs[start : start + MAX_BATCH_JOBS]]
                with contextlib.redirect_stdout(io.StringIO()):
                    response = app.lambda_handler(_batch_event(chunk), LambdaContextStub(timeout_seconds=30))
                results = json.loads(response["body"])["results"]
                accepted += sum(1 for result in results if result["statusCode"] == 202 and result["created"])
            return accepted

        return _measure(route_stack, jobs, submit)
    finally:
        app.reset_services()
        app.metrics.namespace = namespace
        app.logger.setLevel(level)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _batch_event(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    body = json.dumps({"jobs": jobs})
    return {
        "version": "2.0",
        "routeKey": "POST /jobs:batch",
        "rawPath": "/jobs:batch",
        "rawQueryString": "",
        "headers": {"content-type": "application/json", "content-length": str(len(body))},
        "requestContext": {
            "accountId": "123456789012",
            "apiId": "bench",
            "domainName": "localhost",
            "domainPrefix": "localhost",
            "http": {
                "method": "POST",
                "path": "/jobs:batch",
                "protocol": "HTTP/1.1",
                "sourceIp": "127.0.0.1",
                "userAgent": "bench",
            },
            "requestId": uuid.uuid4().hex,
            "routeKey": "POST /jobs:batch",
            "stage": "$default",
            "time": "01/Jan/2026:00:00:00 +0000",
            "timeEpoch": int(time.time() * 1000),
            "authorizer": {"jwt": {"claims": {"tenant_id": TENANT}, "scopes": None}},
        },
        "body": body,
        "isBase64Encoded": False,
    }


@dataclass(frozen=True)
class Results:
    batch: Measurement
    one_by_one: Measurement
    naive: Measurement
    route: Measurement


def measure(quick: bool = False) -> Results:
    """Each producer on its own fresh stack in one emulator, the same number of jobs over the same workspaces."""
    jobs = 40 if quick else 200
    with Emulator() as emulator:
        stacks = [provision_stack(emulator.url, function_id="EnqueueApiFunction") for _ in range(4)]
        for stack in stacks:
            stack.register_workspaces((f"ws-{n:02d}" for n in range(WORKSPACES)), TENANT)
        batch = measure_batch(stacks[0], [_job("batch", n) for n in range(jobs)])
        one_by_one = measure_one_by_one(stacks[1], [_job("single", n) for n in range(jobs)])
        naive = measure_naive(stacks[2], [_job("naive", n) for n in range(jobs)])
        route = measure_route(stacks[3], [_job("route", n) for n in range(jobs)])
    for name, result in (("batch", batch), ("one-by-one", one_by_one), ("naive", naive), ("route", route)):
        if result.accepted != result.jobs:
            raise RuntimeError(f"the {name} producer accepted {result.accepted} of {result.jobs} jobs")
    return Results(batch, one_by_one, naive, route)
