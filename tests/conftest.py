"""Shared fixtures: AWS resources created from template.yaml in moto (in-process, or moto's server over HTTP),
the settings and services the functions would build from their environment, and Lambda-shaped SQS events."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import pytest
from moto import mock_aws

from agent_jobs.guard import JobGuard, to_item
from agent_jobs.models import JobMessage, job_message, job_request_adapter
from agent_jobs.services import Services, build_services
from agent_jobs.settings import Settings
from agent_jobs_local.emulator import (
    Emulator,
    patch_atomic_table_operations,
    patch_fifo_deduplication,
    patch_fifo_sequence_numbers,
    patch_sender_ids,
)
from agent_jobs_local.event_source import LambdaContextStub, receive_event, settle
from agent_jobs_local.template import TemplateModel, load_template, provision
from agent_jobs_local.unregistered_workspaces import UnregisteredWorkspaces

REPO = Path(__file__).resolve().parent.parent
REGION = "us-east-1"


@pytest.fixture(autouse=True)
def aws_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake credentials and a fixed region; no profile or endpoint leaks in from the developer's shell."""
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "AgentJobsTest")
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", "agent-jobs")
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
    monkeypatch.setenv("POWERTOOLS_DEV", "false")


@dataclass
class Stack:
    """The deployed resources as a test sees them, plus the services a function would build."""

    kind: str
    session: boto3.Session
    queue_url: str
    queue_arn: str
    dlq_url: str
    table_name: str
    settings: Settings
    services: Services
    model: TemplateModel
    references: Mapping[str, Mapping[str, str]]

    @property
    def guard(self) -> JobGuard:
        return self.services.guard

    def env(self, function_id: str = "JobWorkerFunction") -> dict[str, str]:
        """The environment template.yaml gives the function, resolved against these resources."""
        return self.model.function_environment(function_id, self.references)

    def receive(self, batch_size: int = 10) -> dict[str, Any]:
        return receive_event(
            self.services.sqs, self.queue_url, queue_arn=self.queue_arn, region=REGION, batch_size=batch_size
        )

    def settle(self, event: dict[str, Any], response: Any) -> list[str]:
        return settle(self.services.sqs, self.queue_url, event, response)

    def queue_depth(self, url: str | None = None) -> int:
        attributes = self.services.sqs.get_queue_attributes(
            QueueUrl=url or self.queue_url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesNotVisible"])

    # Items are returned as Any: tests index them freely and a missing item fails the test at the index.
    def item(self, pk: str) -> Any:
        raw = self.services.dynamodb.get_item(TableName=self.table_name, Key={"pk": {"S": pk}}).get("Item")
        return to_item(raw) if raw else None

    def job(self, job_id: str, tenant_id: str | None = None) -> Any:
        """The job record of `tenant_id`'s `job_id`; without a tenant, the one job record of that jobId (a test
        naming a jobId that two tenants used must say which tenant's it means)."""
        if tenant_id is not None:
            return self.guard.get_job(tenant_id, job_id)
        scan = self.services.dynamodb.get_paginator("scan").paginate(
            TableName=self.table_name,
            FilterExpression="jobId = :jid AND begins_with(pk, :job)",
            ExpressionAttributeValues={":jid": {"S": job_id}, ":job": {"S": "job#"}},
        )
        tenants = {str(to_item(raw)["tenantId"]) for page in scan for raw in page["Items"]}
        if len(tenants) > 1:
            raise AssertionError(f"jobId {job_id} is a job of {sorted(tenants)}: name the tenant")
        return self.guard.get_job(tenants.pop(), job_id) if tenants else None

    def workspace(self, workspace_id: str) -> Any:
        return self.guard.get_workspace(workspace_id)


def count_dynamodb_calls(stack: Stack) -> Counter[str]:
    """The DynamoDB calls the stack's client makes from now on, by operation (a live count)."""
    calls: Counter[str] = Counter()

    def count(model: Any, **_: Any) -> None:
        calls[model.name] += 1

    stack.services.dynamodb.meta.events.register("before-call.dynamodb", count)
    return calls


def _make_stack(kind: str, session: boto3.Session, **settings_overrides: Any) -> Stack:
    model = TemplateModel(load_template(), stack_name=f"aj-{uuid.uuid4().hex[:8]}")
    resources = provision(session, model)
    environment = model.function_environment("JobWorkerFunction", resources.references)
    # The template's settings, with a shorter deadline margin and no backoff so retries are immediate in tests.
    fast = {"time_safety_margin_ms": 2_000, "backoff_base_seconds": 0}
    settings = Settings.model_validate({**{k.lower(): v for k, v in environment.items()}, **fast, **settings_overrides})
    return Stack(
        kind=kind,
        session=session,
        queue_url=resources.queue_url,
        queue_arn=resources.queue_arn,
        dlq_url=resources.dlq_url,
        table_name=resources.table_name,
        settings=settings,
        services=build_services(settings, session),
        model=model,
        references=resources.references,
    )


@pytest.fixture
def stack() -> Iterator[Stack]:
    """Queue, DLQ and table from template.yaml in moto, in this process. The worker runs message groups on threads,
    so moto's DynamoDB gets the emulator's correction for concurrent writes (a failed transaction's rollback would
    otherwise undo another thread's write, which DynamoDB never does); and the worker orders a workspace's jobs by
    their SequenceNumbers, so moto's FIFO queues get the emulator's increasing ones instead of random digits, and a
    duplicate send is answered with the message first accepted, within its deduplication scope and window, as by SQS;
    and it trusts a message's SenderId, so each message gets its sender's principal, as from the emulator."""
    patch_atomic_table_operations()
    patch_fifo_sequence_numbers()
    patch_fifo_deduplication()
    patch_sender_ids()
    with mock_aws():
        yield _make_stack("in-process", boto3.Session(region_name=REGION))


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """The local emulator (moto's server, FIFO SequenceNumbers as SQS assigns them) in its own process: every call
    crosses a real HTTP connection."""
    with Emulator() as emulator:
        yield emulator.url


@pytest.fixture
def server_stack(moto_server: str, monkeypatch: pytest.MonkeyPatch) -> Stack:
    """Resources from template.yaml in moto's server (a fresh, uniquely named set per test)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    return _make_stack("moto-server", boto3.Session(region_name=REGION))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses moto is marked `aws`, so `make unit` can leave it out: every `*stack` fixture builds the
    template's resources in moto (in this process or in its server), and `moto_server` is the server itself."""
    for item in items:
        names = getattr(item, "fixturenames", ())
        if any(name == "moto_server" or name.endswith("stack") for name in names):
            item.add_marker(pytest.mark.aws)


@pytest.fixture(params=["in-process", "moto-server"])
def any_stack(request: pytest.FixtureRequest) -> Stack:
    """Runs a test against both: moto in-process and moto's server over HTTP."""
    name = "stack" if request.param == "in-process" else "server_stack"
    return request.getfixturevalue(name)  # type: ignore[no-any-return]


@pytest.fixture
def lambda_context() -> Callable[..., LambdaContextStub]:
    def make(timeout_seconds: float = 120) -> LambdaContextStub:
        return LambdaContextStub(timeout_seconds=timeout_seconds)

    return make


def make_job(
    job_id: str | None = None,
    workspace_id: str = "ws-a",
    job_type: str = "apply_patch",
    payload: dict[str, Any] | None = None,
) -> Any:
    """A validated job request; apply_patch gets a small valid diff unless a payload is given."""
    if not payload:
        payload = {
            "apply_patch": {
                "patch": f"--- a/f.txt\n+++ b/f.txt\n@@ -0,0 +1 @@\n+{job_id}\n",
                "commitMessage": f"change for {job_id}",
            },
            "run_tests": {"suite": "unit"},
            "open_pr": {"title": "agent changes"},
        }[job_type]
    return job_request_adapter.validate_python(
        {"jobId": job_id or uuid.uuid4().hex, "workspaceId": workspace_id, "type": job_type, "payload": payload}
    )


def make_message(
    job_id: str | None = None, workspace_id: str = "ws-a", tenant_id: str = "tenant-1", **kw: Any
) -> JobMessage:
    return job_message(make_job(job_id, workspace_id, **kw), tenant_id)


@pytest.fixture
def sqs_fifo_record() -> Callable[..., dict[str, Any]]:
    """Factory of Lambda SQS FIFO records, for tests that need a record the queue would not produce."""
    counter = iter(range(1, 1_000_000))

    def make(
        group: str,
        body: str | dict[str, Any],
        *,
        message_id: str | None = None,
        receive_count: int = 1,
        sequence_number: str | None = None,
        tenant_id: str | None = "tenant-1",
        sender_id: str = "AIDAEXAMPLE",
    ) -> dict[str, Any]:
        n = next(counter)
        attributes = {
            "ApproximateReceiveCount": str(receive_count),
            "SentTimestamp": str(int(time.time() * 1000)),
            "SequenceNumber": sequence_number or f"{18_000_000_000_000_000_000 + n}",
            "MessageGroupId": group,
            "SenderId": sender_id,
            "MessageDeduplicationId": uuid.uuid4().hex,
            "ApproximateFirstReceiveTimestamp": str(int(time.time() * 1000)),
        }
        return {
            "messageId": message_id or str(uuid.uuid4()),
            "receiptHandle": f"receipt-{n}",
            "body": body if isinstance(body, str) else json.dumps(body),
            "attributes": attributes,
            "messageAttributes": (
                {
                    "tenantId": {
                        "stringValue": tenant_id,
                        "stringListValues": [],
                        "binaryListValues": [],
                        "dataType": "String",
                    }
                }
                if tenant_id
                else {}
            ),
            "md5OfBody": "",
            "eventSource": "aws:sqs",
            "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:agent-jobs-jobs.fifo",
            "awsRegion": REGION,
        }

    return make


os.environ.setdefault("SAM_CLI_TELEMETRY", "0")
# Powertools reads these when a function module is imported (at collection), before any fixture runs.
os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "AgentJobsTest")
os.environ.setdefault("POWERTOOLS_SERVICE_NAME", "agent-jobs")


# ---- the worker ------------------------------------------------------------------------------------------------


class Hooks:
    """Fault injection at the workspace: callables run before a job's commit, keyed by jobId."""

    def __init__(self) -> None:
        self.before_commit: dict[str, Callable[[], None]] = {}


def naive_append(workspace: Any, *, job_id: str, message: str, patch: str) -> Any:
    """A commit appended to a LocalWorkspace's ledger with no compare-and-swap and no look for the job's commit:
    what the naive pattern's side effect does."""
    import hashlib
    from dataclasses import asdict

    from job_worker.jobs.workspace import Commit

    head = workspace.head()
    sha = hashlib.sha1(f"{head}{job_id}{len(workspace.history())}".encode(), usedforsecurity=False).hexdigest()
    commit = Commit(sha=sha, parent=head, job_id=job_id, message=message, patch=patch)
    with (workspace.path / "commits.jsonl").open("a") as ledger:
        ledger.write(json.dumps(asdict(commit)) + "\n")
    return commit


class HookedWorkspaceStore(UnregisteredWorkspaces):
    """A LocalWorkspaceStore whose commits can be intercepted, to stall, fail or race a job at its side effect."""

    def __init__(self, root: Path, hooks: Hooks) -> None:
        from agent_jobs_local.folder_workspaces import LocalWorkspaceStore

        self.inner = LocalWorkspaceStore(root)
        self.hooks = hooks

    def open(self, workspace_id: str) -> Any:
        workspace = self.inner.open(workspace_id)
        original_commit = workspace.commit
        hooks = self.hooks

        def commit(
            *, job_id: str, message: str, patch: str, expected_head: str | None, author: str | None = None
        ) -> Any:
            hook = hooks.before_commit.get(job_id)
            if hook is not None:
                hook()
            if expected_head is None:  # the naive pattern: apply onto whatever the branch is at, no checks at all
                return naive_append(workspace, job_id=job_id, message=message, patch=patch)
            return original_commit(
                job_id=job_id, message=message, patch=patch, expected_head=expected_head, author=author
            )

        workspace.commit = commit  # type: ignore[method-assign]
        return workspace

    def commits(self, workspace_id: str) -> list[str]:
        """The branch as the jobIds of its commits, oldest first."""
        return [c.job_id for c in self.inner.open(workspace_id).history()]


@pytest.fixture
def hooks() -> Hooks:
    return Hooks()


@pytest.fixture
def workspaces(tmp_path: Path, hooks: Hooks) -> HookedWorkspaceStore:
    return HookedWorkspaceStore(tmp_path / "workspaces", hooks)


@pytest.fixture
def make_worker(workspaces: HookedWorkspaceStore) -> Callable[..., Any]:
    """A BatchWorker on a stack's services (optionally with another guard, e.g. one with a controlled clock)."""
    from dataclasses import replace

    from aws_lambda_powertools import Logger, Metrics

    from job_worker.processing import BatchWorker

    def make(stack: Stack, guard: JobGuard | None = None) -> BatchWorker:
        services = stack.services if guard is None else replace(stack.services, guard=guard)
        return BatchWorker(
            services=services,
            workspaces=workspaces,
            logger=Logger(service="agent-jobs-test"),
            metrics=Metrics(namespace="AgentJobsTest"),
        )

    return make


class ManualClock:
    """Epoch milliseconds that only move when a test says so."""

    def __init__(self) -> None:
        self.now = int(time.time() * 1000)

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += int(seconds * 1000)


class WindowClock:
    """Seconds, as the emulator's SQS measures its deduplication window, that only move when a test says so."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def deduplicate_on(clock: WindowClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process moto's FIFO numbering and deduplication applied afresh to moto's own methods (whatever this process
    corrected before), deduplicating by `clock`; monkeypatch restores them after the test."""
    import inspect

    from moto.sqs import models

    for owner, name in (
        (models.SQSBackend, "send_message"),
        (models.SQSBackend, "send_message_batch"),
        (models.Queue, "add_message"),
    ):
        monkeypatch.setattr(owner, name, inspect.unwrap(getattr(owner, name)))  # moto's own, without corrections
    patch_fifo_deduplication(clock=clock)


_registration_clients: dict[str, Any] = {}


def register_workspace(stack: Stack, workspace_id: str, tenant_id: str = "tenant-1") -> None:
    """Register `workspace_id` for `tenant_id` (an https remote nobody calls) unless some tenant registered it or
    another tenant owns its item: jobs are accepted only for a registration of their tenant. A client of its own,
    so tests that count the stack's calls count only the job's."""
    from agent_jobs.registration import WorkspaceRegistration
    from agent_jobs.workspaces import WorkspaceOwnedElsewhereError, WorkspaceRegistry

    client = _registration_clients.get(stack.table_name)
    if client is None:
        client = _registration_clients[stack.table_name] = stack.session.client("dynamodb", region_name=REGION)
    registry = WorkspaceRegistry(client, stack.table_name)
    if registry.get(workspace_id) is None:
        registration = WorkspaceRegistration.model_validate(
            {"remoteUrl": f"https://git.example.com/{tenant_id}/{workspace_id}.git", "branch": f"agent/{workspace_id}"}
        )
        with contextlib.suppress(WorkspaceOwnedElsewhereError):  # another tenant's: its jobs are to be refused
            registry.register(workspace_id, registration, tenant_id)


def enqueue(stack: Stack, *jobs: Any, tenant_id: str = "tenant-1") -> list[Any]:
    """Submit `jobs` as the API does, each workspace registered for `tenant_id` first unless it is registered."""
    from agent_jobs.producer import enqueue_job

    for workspace_id in dict.fromkeys(job.workspace_id for job in jobs):
        register_workspace(stack, workspace_id, tenant_id)
    return [
        enqueue_job(
            job,
            tenant_id,
            guard=stack.guard,
            sqs=stack.services.sqs,
            queue_url=stack.queue_url,
            payloads=stack.services.payloads,
            inline_limit_bytes=stack.settings.inline_message_limit_bytes,
        )
        for job in jobs
    ]


# ---- registered git workspaces ------------------------------------------------------------------------------------


@dataclass
class GitWorkspaces:
    """Bare git remotes (made with dulwich) registered as workspaces, each under `root/<tenantId>/` (the remotes root
    the functions are given), and the fake GitHub their open_pr talks to."""

    root: Path
    github: Any
    remotes: dict[str, Path] = field(default_factory=dict)

    def branch(self, workspace_id: str) -> list[str]:
        """The jobIds of the commits on the workspace's branch, oldest first, read from the remote itself."""
        from job_worker.jobs.git_workspace import GitRemote, GitWorkspaceStore

        remote = GitRemote(url=str(self.remotes[workspace_id]), branch=f"agent/{workspace_id}")
        store = GitWorkspaceStore(self.root.parent / "reader-cache", lambda _: remote)
        return [commit.job_id for commit in store.open(workspace_id).history()]

    def env(self) -> dict[str, str]:
        """The functions' settings that let them use these remotes and the fake GitHub."""
        host = urlsplit(self.github.url).netloc
        return {"WORKSPACES_REMOTE_ROOT": str(self.root), "ALLOWED_PRIVATE_HOSTS": host}

    def bounds(self) -> Any:
        """The tenant bounds of a worker given `env()`."""
        from agent_jobs.tenancy import TenantBounds

        return TenantBounds(
            remote_root=str(self.root), allowed_private_hosts=frozenset({urlsplit(self.github.url).netloc})
        )


@pytest.fixture
def git_workspaces(tmp_path: Path) -> Iterator[GitWorkspaces]:
    """The remotes root and the fake GitHub of `register_git_workspace`."""
    from agent_jobs_local.fake_github import FakeGitHub

    github = FakeGitHub().start()
    yield GitWorkspaces(root=tmp_path / "remotes", github=github)
    github.stop()


@pytest.fixture
def register_git_workspace(git_workspaces: GitWorkspaces) -> Callable[..., GitWorkspaces]:
    """register(stack, workspace_id, files) makes a bare remote seeded with `files` on main, under the remotes root's
    folder of the tenant, and registers it."""
    from dulwich.repo import Repo

    from agent_jobs.registration import WorkspaceRegistration
    from agent_jobs.workspaces import WorkspaceRegistry
    from tests.git.conftest import commit_files

    workspaces = git_workspaces
    github = workspaces.github

    def register(
        stack: Stack, workspace_id: str, files: dict[str, bytes], tenant_id: str = "tenant-1"
    ) -> GitWorkspaces:
        remote = workspaces.root / tenant_id / f"{workspace_id}.git"
        workspaces.remotes[workspace_id] = remote
        remote.mkdir(parents=True)
        Repo.init_bare(str(remote)).close()
        commit_files(remote, "main", files, "initial commit")
        github.add_repository("agents", workspace_id)
        registration = WorkspaceRegistration.model_validate(
            {
                "remoteUrl": str(remote),
                "branch": f"agent/{workspace_id}",
                "baseBranch": "main",
                "testCommands": {"unit": [sys.executable, "-c", "print('tests pass')"]},
                "githubRepository": f"agents/{workspace_id}",
                "githubApiUrl": github.url,
            }
        )
        WorkspaceRegistry(stack.services.dynamodb, stack.table_name).register(workspace_id, registration, tenant_id)
        return workspaces

    return register
