"""Attacks through the queue itself: a principal allowed to send to the jobs queue sends messages for another
tenant's workspace. A workspace whose owner bound its direct producers runs only its bound senders' messages and the
enqueue API's; any other message, whatever tenant it names, is refused: recorded for the operator, counted, never the
owner's job, no halt, no jobId of the owner's taken. Who sent a message is read from its SenderId alone, which SQS
stamps (and the emulator derives from the caller's access key); the dead-letter redrive applies the same rule."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from aws_lambda_powertools import Logger, Metrics

from agent_jobs.direct_producers import sender_admitted
from agent_jobs.models import JobStatus, job_message
from agent_jobs.registration import WorkspaceRegistration
from agent_jobs.workspaces import WorkspaceRegistry
from agent_jobs_cli.deadletters import DeadLetterQueue, RedriveOutcome, registered_owners
from agent_jobs_local.principals import principal_id
from enqueue_api import app
from job_worker.jobs.registered import RegisteredWorkspaceStore
from job_worker.processing import MESSAGES_REFUSED, WORKSPACES_HALTED, BatchWorker
from tests.conftest import REGION, GitWorkspaces, Stack, enqueue, make_job
from tests.integration.test_enqueue_api import Api, job_body, post_event, use_environment
from tests.integration.test_worker_metrics import emitted_metrics, named
from tests.integration.test_workspace_api import put_event

OWNER = "acme"
WORKSPACE = "acme-repo"
# The owner's producers assume this role; a stranger is any other principal allowed to send to the queue.
BOUND_ROLE = "AROABOUNDPRODUCER0001"
BOUND_SESSION = f"{BOUND_ROLE}:acme-producer"
STRANGER = "AIDASTRANGERSENDER001"


def bind(stack: Stack, workspace_id: str, producers: list[str] | None) -> None:
    """The owner registers `workspace_id` again with `producers` as its direct producers."""
    registry = WorkspaceRegistry(stack.services.dynamodb, stack.table_name)
    registered = registry.get(workspace_id)
    assert registered is not None
    document = {**registered.registration.model_dump(by_alias=True), "directProducers": producers}
    registry.register(workspace_id, WorkspaceRegistration.model_validate(document), registered.tenant_id)


def worker_of(stack: Stack, git: GitWorkspaces, tmp_path: Path) -> BatchWorker:
    """The deployed worker's parts over the stack: registered git workspaces, the API's sender id from template.yaml."""
    registry = WorkspaceRegistry(stack.services.dynamodb, stack.table_name)
    return BatchWorker(
        services=stack.services,
        workspaces=RegisteredWorkspaceStore(registry, tmp_path / "cache", bounds=git.bounds()),
        logger=Logger(service="agent-jobs-test"),
        metrics=Metrics(namespace="AgentJobsTest"),
    )


@dataclass
class Owned:
    """acme's registered git workspace, its worker, and what a test sends to it."""

    stack: Stack
    git: GitWorkspaces
    worker: BatchWorker

    def handle(self, record: dict[str, Any], lambda_context: Any) -> Any:
        return self.worker.handle({"Records": [record]}, lambda_context())


@pytest.fixture
def owned(stack: Stack, register_git_workspace: Any, tmp_path: Path) -> Owned:
    """acme's workspace, bound to the role its producers assume."""
    git = register_git_workspace(stack, WORKSPACE, {"README.md": b"acme\n"}, tenant_id=OWNER)
    bind(stack, WORKSPACE, [BOUND_ROLE])
    return Owned(stack, git, worker_of(stack, git, tmp_path))


def planted_body(job_id: str, tenant: str | None) -> dict[str, Any]:
    body = job_message(make_job(job_id, WORKSPACE), tenant or OWNER).model_dump(mode="json", by_alias=True)
    if tenant is None:
        del body["tenantId"]
    return body


def assert_refused(stack: Stack, git: GitWorkspaces, record: dict[str, Any], response: Any, out: str) -> Any:
    """The record was refused: acknowledged, recorded under its message id for the operator (no record of acme's),
    counted, nothing applied, nothing halted, and the jobId it names still free for acme."""
    assert response == {"batchItemFailures": []}
    refused = stack.item(f"msg#{record['messageId']}")
    assert refused["status"] == JobStatus.REJECTED
    assert refused["senderId"] == record["attributes"]["SenderId"]
    assert refused["groupId"] == f"ws#{WORKSPACE}"
    assert "refusedDay" in refused
    # in nobody's view but the operator's
    assert "tenantId" not in refused
    assert "workspaceId" not in refused
    assert git.branch(WORKSPACE) == []
    assert stack.workspace(WORKSPACE)["state"] == "ACTIVE"
    metrics = emitted_metrics(out)
    assert [metric.value for metric in named(metrics, MESSAGES_REFUSED)] == [1]
    assert named(metrics, WORKSPACES_HALTED) == []
    job_id = json.loads(record["body"]).get("jobId")
    assert stack.job(job_id, OWNER) is None
    (own,) = enqueue(stack, make_job(job_id, WORKSPACE), tenant_id=OWNER)
    assert own.created
    return refused


# ---- a workspace with a binding: a sender the owner did not bind is never the owner's -----------------------------


@pytest.mark.parametrize("tenant", [None, OWNER, "mallory"], ids=["naming-no-tenant", "naming-the-owner", "naming-b"])
def test_an_unbound_senders_message_is_refused_whatever_tenant_it_names(
    owned: Owned, sqs_fifo_record: Any, lambda_context: Any, capsys: pytest.CaptureFixture[str], tenant: str | None
) -> None:
    # Given acme's workspace bound to its producers' role, and a stranger's message naming no tenant, acme or mallory
    record = sqs_fifo_record(f"ws#{WORKSPACE}", planted_body("planted", tenant), tenant_id=tenant, sender_id=STRANGER)
    capsys.readouterr()

    response = owned.handle(record, lambda_context)

    # Then it is refused: not acme's job, no commit, no halt, acme's jobId still free, recorded and counted
    refused = assert_refused(owned.stack, owned.git, record, response, capsys.readouterr().out)
    assert f"sender {STRANGER} is not one of the direct producers bound to workspace {WORKSPACE}" in refused["error"]
    assert refused.get("namedTenantId") == tenant


def test_an_unbound_senders_broken_message_naming_the_owner_halts_nothing(
    owned: Owned, sqs_fifo_record: Any, lambda_context: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a stranger's body that is no job at all, naming acme and acme's next jobId
    record = sqs_fifo_record(
        f"ws#{WORKSPACE}", {"jobId": "acme-next", "not": "a job"}, tenant_id=OWNER, sender_id=STRANGER
    )
    capsys.readouterr()

    response = owned.handle(record, lambda_context)

    assert_refused(owned.stack, owned.git, record, response, capsys.readouterr().out)


@pytest.mark.parametrize(
    ("binding", "sender"),
    [
        ([BOUND_ROLE], BOUND_SESSION),
        ([BOUND_SESSION], BOUND_SESSION),
        (["AIDABOUNDUSERPRODUCER"], "AIDABOUNDUSERPRODUCER"),
    ],
    ids=["a-session-of-a-bound-role", "a-bound-session", "a-bound-user"],
)
def test_a_bound_senders_message_runs_as_the_owners_job(
    owned: Owned, sqs_fifo_record: Any, lambda_context: Any, binding: list[str], sender: str
) -> None:
    bind(owned.stack, WORKSPACE, binding)
    record = sqs_fifo_record(f"ws#{WORKSPACE}", planted_body("direct", None), tenant_id=None, sender_id=sender)

    assert owned.handle(record, lambda_context) == {"batchItemFailures": []}

    job = owned.stack.job("direct", OWNER)
    assert (job["status"], job["tenantId"]) == (JobStatus.SUCCEEDED, OWNER)
    assert owned.git.branch(WORKSPACE) == ["direct"]


def test_another_session_of_a_bound_role_is_refused_when_one_session_is_bound(
    owned: Owned, sqs_fifo_record: Any, lambda_context: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    bind(owned.stack, WORKSPACE, [BOUND_SESSION])
    record = sqs_fifo_record(
        f"ws#{WORKSPACE}", planted_body("planted", OWNER), tenant_id=OWNER, sender_id=f"{BOUND_ROLE}:someone-else"
    )
    capsys.readouterr()

    response = owned.handle(record, lambda_context)

    assert_refused(owned.stack, owned.git, record, response, capsys.readouterr().out)


@pytest.fixture
def api(owned: Owned, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    """The enqueue API function signing with its own key, as it signs with its role in Lambda (and in the local
    runtime): its messages carry the SenderId template.yaml gives the worker as API_SENDER_ID."""
    stack = owned.stack
    key = stack.model.function_access_key("EnqueueApiFunction")
    env = {**stack.env("EnqueueApiFunction"), "AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": key}
    use_environment(monkeypatch, {**env, "WORKSPACES_REMOTE_ROOT": str(owned.git.root)})
    monkeypatch.setattr(app.metrics, "namespace", "AgentJobsTest")
    yield Api(stack)
    app.reset_services()


def test_the_apis_own_messages_run_on_a_workspace_with_a_binding(owned: Owned, api: Api, lambda_context: Any) -> None:
    # Given acme's workspace bound to a role that is not the API's, and a job acme submits through the API
    bind(owned.stack, WORKSPACE, [])  # bound to no direct producer at all: the API alone
    answer = api.invoke(post_event(job_body("via-api", WORKSPACE), claims={"tenant_id": OWNER}), register=False)
    assert answer.status == 202

    # When the worker receives it from the queue
    event = owned.stack.receive()
    (record,) = event["Records"]
    response = owned.worker.handle(event, lambda_context())

    # Then SQS's SenderId names the API's role, as the worker's API_SENDER_ID does, and the job runs as acme's
    assert record["attributes"]["SenderId"] == owned.stack.settings.api_sender_id
    assert owned.stack.settings.api_sender_id == owned.stack.env()["API_SENDER_ID"]
    assert response == {"batchItemFailures": []}
    assert owned.stack.job("via-api", OWNER)["status"] == JobStatus.SUCCEEDED
    assert owned.git.branch(WORKSPACE) == ["via-api"]


@pytest.mark.parametrize(
    "sender",
    [
        f"{BOUND_ROLE}X:acme-producer",  # another role whose unique id begins with the bound one's
        f"{BOUND_ROLE}X",
        BOUND_ROLE[:-1],
        f"x{BOUND_SESSION}",
        None,  # an event without SenderId
    ],
)
def test_only_the_bound_principal_itself_or_a_session_of_a_bound_role_is_admitted(sender: str | None) -> None:
    api = "AROAAPIROLE0000000001"
    assert not sender_admitted(sender, [BOUND_ROLE], api_sender_id=api)
    assert not sender_admitted(sender, [], api_sender_id=api)
    assert sender_admitted(BOUND_SESSION, [BOUND_ROLE], api_sender_id=api)
    assert sender_admitted(f"{api}:agent-jobs-enqueue-api", [], api_sender_id=api)
    assert not sender_admitted(f"{api}X:agent-jobs-enqueue-api", [], api_sender_id=api)


# ---- registration: the binding is validated strictly ---------------------------------------------------------------

MALFORMED = {
    "arn:aws:iam::123456789012:role/producer": "not its ARN",
    "AKIAIOSFODNN7EXAMPLE": "an IAM user's unique id (AIDA...)",  # an access key id names no principal
    "aroaboundproducer0001": "an IAM user's unique id (AIDA...)",
    "AIDASTRANGERSENDER001:session": "an IAM user's unique id (AIDA...)",  # a user has no sessions
    f"{BOUND_ROLE}:": "an IAM user's unique id (AIDA...)",
    f"{BOUND_ROLE}:a b": "an IAM user's unique id (AIDA...)",
    "AROASHORT": "at least 16 characters",
    f"{BOUND_ROLE}:{'s' * 65}": "an IAM user's unique id (AIDA...)",
}


@pytest.fixture
def registering(stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Api, str]]:
    root = tmp_path / "remotes"
    use_environment(monkeypatch, {**stack.env("EnqueueApiFunction"), "WORKSPACES_REMOTE_ROOT": str(root)})
    monkeypatch.setattr(app.metrics, "namespace", "AgentJobsTest")
    yield Api(stack), f"{root}/{OWNER}/repo.git"
    app.reset_services()


@pytest.mark.parametrize("value", sorted(MALFORMED))
def test_registering_a_malformed_direct_producer_is_422_saying_what_to_send(
    registering: tuple[Api, str], value: str
) -> None:
    api, remote = registering
    body = {"remoteUrl": remote, "branch": "agent/work", "directProducers": [BOUND_ROLE, value]}

    answer = api.invoke(put_event(WORKSPACE, body, claims={"tenant_id": OWNER}))

    assert answer.status == 422, value
    assert MALFORMED[value] in answer.field_errors()["directProducers.1"]
    assert api.stack.workspace(WORKSPACE) is None


@pytest.mark.parametrize(
    ("producers", "message"),
    [
        ([f"AROABOUNDPRODUCER{n:04}" for n in range(11)], "at most 10 direct producers"),
        ([BOUND_ROLE, BOUND_ROLE], f"{BOUND_ROLE} is listed twice"),
        ("AROABOUNDPRODUCER0001", "valid list"),
    ],
    ids=["too-many", "repeated", "not-a-list"],
)
def test_registering_too_many_or_repeated_direct_producers_is_422(
    registering: tuple[Api, str], producers: Any, message: str
) -> None:
    api, remote = registering
    body = {"remoteUrl": remote, "branch": "agent/work", "directProducers": producers}

    answer = api.invoke(put_event(WORKSPACE, body, claims={"tenant_id": OWNER}))

    assert answer.status == 422
    assert message in answer.field_errors()["directProducers"]


def test_a_registered_binding_is_stored_and_shown_to_its_owner(registering: tuple[Api, str]) -> None:
    api, remote = registering
    producers = [BOUND_ROLE, BOUND_SESSION, "AIDABOUNDUSERPRODUCER"]
    body = {"remoteUrl": remote, "branch": "agent/work", "directProducers": producers}

    answer = api.invoke(put_event(WORKSPACE, body, claims={"tenant_id": OWNER}))

    assert answer.status == 201
    assert answer.body["directProducers"] == producers
    registered = WorkspaceRegistry(api.stack.services.dynamodb, api.stack.table_name).get(WORKSPACE)
    assert registered is not None
    assert registered.registration.direct_producers == producers


# ---- the dead-letter redrive applies the same rule ------------------------------------------------------------------


def sender_client(stack: Stack, key: str) -> Any:
    """An SQS client signing with `key`: its messages carry the SenderId the emulator derives from it."""
    session = boto3.Session(aws_access_key_id=key, aws_secret_access_key=key, region_name=REGION)
    return session.client("sqs")


def dead_letter(sqs: Any, stack: Stack, job_id: str, tenant: str | None) -> str:
    """A message of acme's workspace as the queue dead-letters it: in the DLQ, with its sender's SenderId."""
    body = planted_body(job_id, tenant)
    sent = sqs.send_message(
        QueueUrl=stack.dlq_url,
        MessageBody=json.dumps(body),
        MessageGroupId=f"ws#{WORKSPACE}",
        MessageDeduplicationId=job_id,
    )
    return str(sent["MessageId"])


def test_the_redrive_refuses_an_unbound_senders_message_and_parks_a_bound_ones(owned: Owned) -> None:
    stack = owned.stack
    bind(stack, WORKSPACE, [principal_id("BOUNDPRODUCERKEY0001")])
    # Given the DLQ holds a stranger's message naming acme, then one of acme's bound producer, for acme's workspace
    stranger = dead_letter(sender_client(stack, "STRANGERKEY000000001"), stack, "planted", OWNER)
    bound = dead_letter(sender_client(stack, "BOUNDPRODUCERKEY0001"), stack, "own-1", None)
    dlq = DeadLetterQueue(
        stack.services.sqs, stack.dlq_url, api_sender_id=stack.settings.api_sender_id, final_wait_seconds=0
    )

    # When the operator redrives the workspace
    results = dlq.redrive(
        stack.guard,
        select_workspace=lambda workspace_id: workspace_id == WORKSPACE,
        owner_of=registered_owners(stack.services.dynamodb, stack.table_name),
    )

    # Then the stranger's is refused (recorded, deleted, never acme's job, its jobId free), the bound one parked
    outcomes = {result.message_id: result.outcome for result in results}
    assert outcomes == {stranger: RedriveOutcome.REFUSED, bound: RedriveOutcome.PARKED}
    refused = stack.item(f"msg#{stranger}")
    assert (refused["status"], refused["senderId"]) == (JobStatus.REJECTED, principal_id("STRANGERKEY000000001"))
    assert stack.job("planted", OWNER) is None
    assert stack.job("own-1", OWNER)["status"] == JobStatus.PARKED
    assert stack.workspace(WORKSPACE)["haltingJobId"] == "own-1"
    (own,) = enqueue(stack, make_job("planted", WORKSPACE), tenant_id=OWNER)
    assert own.created


def test_the_redrive_refuses_a_message_naming_another_tenant_without_a_halt(owned: Owned) -> None:
    stack = owned.stack
    bind(stack, WORKSPACE, None)  # no binding: any sender acts as the owner, but never as another tenant
    foreign = dead_letter(sender_client(stack, "STRANGERKEY000000001"), stack, "planted", "mallory")
    dlq = DeadLetterQueue(stack.services.sqs, stack.dlq_url, final_wait_seconds=0)

    (result,) = dlq.redrive(
        stack.guard,
        select_workspace=lambda workspace_id: workspace_id == WORKSPACE,
        owner_of=registered_owners(stack.services.dynamodb, stack.table_name),
    )

    assert (result.message_id, result.outcome, result.deleted) == (foreign, RedriveOutcome.REFUSED, True)
    assert stack.item(f"msg#{foreign}")["namedTenantId"] == "mallory"
    assert stack.workspace(WORKSPACE)["state"] == "ACTIVE"
    assert stack.job("planted", OWNER) is None


def test_the_redrive_leaves_a_bound_workspaces_message_when_the_apis_sender_is_unknown(owned: Owned) -> None:
    # Given a DLQ message the API may have sent, and a redrive that does not know the API's SenderId
    stack = owned.stack
    dead_letter(sender_client(stack, "SOMEKEY0000000000001"), stack, "maybe-api", None)
    dlq = DeadLetterQueue(stack.services.sqs, stack.dlq_url, final_wait_seconds=0)

    (result,) = dlq.redrive(
        stack.guard,
        select_workspace=lambda workspace_id: workspace_id == WORKSPACE,
        owner_of=registered_owners(stack.services.dynamodb, stack.table_name),
    )

    # Then it is neither refused nor parked: it stays in the DLQ, and the detail says what to do
    assert (result.outcome, result.deleted) == (RedriveOutcome.LEFT, False)
    assert "ApiSenderId" in result.detail
    assert stack.queue_depth(stack.dlq_url) == 1


# ---- over a real HTTP connection: the emulator stamps each sender's principal ---------------------------------------


def test_senders_are_told_apart_by_the_senderid_the_emulator_stamps(
    server_stack: Stack, register_git_workspace: Any, tmp_path: Path, lambda_context: Any
) -> None:
    # Given acme's workspace bound to a role its producer assumes (a role of the emulator's IAM, a session of its STS)
    stack = server_stack
    git = register_git_workspace(stack, WORKSPACE, {"README.md": b"acme\n"}, tenant_id=OWNER)
    session = stack.session
    trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:*"}]}
    role = session.client("iam").create_role(
        RoleName=f"producer-{stack.table_name}"[:64], AssumeRolePolicyDocument=json.dumps(trust)
    )["Role"]
    credentials = session.client("sts").assume_role(RoleArn=role["Arn"], RoleSessionName="acme-producer")["Credentials"]
    producer = boto3.Session(
        aws_access_key_id=credentials["AccessKeyId"],
        aws_secret_access_key=credentials["SecretAccessKey"],
        aws_session_token=credentials["SessionToken"],
        region_name=REGION,
    ).client("sqs")
    bind(stack, WORKSPACE, [role["RoleId"]])

    # When the producer and a stranger (another access key) each send a job naming acme, over HTTP
    for sqs, job_id in ((producer, "own-1"), (sender_client(stack, "STRANGERKEY000000001"), "planted")):
        sqs.send_message(
            QueueUrl=stack.queue_url,
            MessageBody=json.dumps(planted_body(job_id, OWNER)),
            MessageGroupId=f"ws#{WORKSPACE}",
            MessageDeduplicationId=job_id,
        )
    event = stack.receive()
    response = worker_of(stack, git, tmp_path).handle(event, lambda_context())

    # Then each message carries its sender's principal, and only the bound producer's job runs as acme's
    senders = [record["attributes"]["SenderId"] for record in event["Records"]]
    assert senders == [f"{role['RoleId']}:acme-producer", principal_id("STRANGERKEY000000001")]
    assert response == {"batchItemFailures": []}
    assert stack.job("own-1", OWNER)["status"] == JobStatus.SUCCEEDED
    assert git.branch(WORKSPACE) == ["own-1"]
    (planted,) = [r["messageId"] for r in event["Records"] if json.loads(r["body"])["jobId"] == "planted"]
    assert stack.item(f"msg#{planted}")["senderId"] == principal_id("STRANGERKEY000000001")
    assert stack.job("planted", OWNER) is None
    assert stack.workspace(WORKSPACE)["state"] == "ACTIVE"
