"""The local emulator: moto's server in its own process, numbering FIFO messages in the order the queue accepts them
and stamping each with its sender's principal."""

from __future__ import annotations

import contextlib
import inspect
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest

from agent_jobs_local.emulator import ATOMIC_QUEUE_OPERATIONS, Emulator
from agent_jobs_local.principals import principal_id

REGION = "us-east-1"


def fifo_queue(endpoint: str) -> tuple[Any, str]:
    sqs = boto3.client("sqs", endpoint_url=endpoint, region_name=REGION)
    url = sqs.create_queue(
        QueueName=f"seq-{uuid.uuid4().hex[:8]}.fifo",
        Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "false", "VisibilityTimeout": "30"},
    )["QueueUrl"]
    return sqs, url


def receive_all(sqs: Any, url: str, expected: int) -> list[dict[str, Any]]:
    """Every message in queue order (a FIFO group is delivered again only once its batch is deleted)."""
    received: list[dict[str, Any]] = []
    while len(received) < expected:
        messages = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["All"], WaitTimeSeconds=0
        ).get("Messages", [])
        assert messages, f"the queue ran dry after {len(received)} of {expected} messages"
        received.extend(messages)
        sqs.delete_message_batch(
            QueueUrl=url, Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)]
        )
    return received


def test_emulator_numbers_fifo_messages_in_send_order(moto_server: str) -> None:
    # Given 50 messages sent to one group, singly and in batches
    sqs, url = fifo_queue(moto_server)
    sent: list[str] = []
    for n in range(20):
        sent.append(
            sqs.send_message(QueueUrl=url, MessageBody=str(n), MessageGroupId="g", MessageDeduplicationId=f"d{n}")[
                "SequenceNumber"
            ]
        )
    for start in range(20, 50, 10):
        entries = [
            {"Id": str(n), "MessageBody": str(n), "MessageGroupId": "g", "MessageDeduplicationId": f"d{n}"}
            for n in range(start, start + 10)
        ]
        sent.extend(
            entry["SequenceNumber"] for entry in sqs.send_message_batch(QueueUrl=url, Entries=entries)["Successful"]
        )

    # When every message is received
    received = receive_all(sqs, url, 50)

    # Then they come in send order, numbered increasingly, with the numbers the sends returned
    assert [m["Body"] for m in received] == [str(n) for n in range(50)]
    numbers = [m["Attributes"]["SequenceNumber"] for m in received]
    assert numbers == sent
    assert all(len(number) == 20 and number.isdigit() for number in numbers)
    assert numbers == sorted(numbers, key=int)
    assert len(set(numbers)) == 50


def test_emulator_numbers_follow_queue_order_with_concurrent_senders(moto_server: str) -> None:
    # Given 4 senders racing to send 15 messages each to one group
    sqs, url = fifo_queue(moto_server)

    def send(sender: int) -> None:
        client = boto3.client("sqs", endpoint_url=moto_server, region_name=REGION)
        for n in range(15):
            client.send_message(
                QueueUrl=url, MessageBody=f"{sender}-{n}", MessageGroupId="g", MessageDeduplicationId=f"{sender}-{n}"
            )

    senders = [threading.Thread(target=send, args=(sender,)) for sender in range(4)]
    for thread in senders:
        thread.start()
    for thread in senders:
        thread.join()

    # Then the order the queue delivers them in (its acceptance order) is SequenceNumber order
    numbers = [int(m["Attributes"]["SequenceNumber"]) for m in receive_all(sqs, url, 60)]
    assert numbers == sorted(numbers)
    assert len(set(numbers)) == 60


def test_emulator_redelivers_an_expired_fifo_batch_in_group_order(moto_server: str) -> None:
    # Given two groups whose messages were all received and not deleted (an invocation that crashed)
    sqs = boto3.client("sqs", endpoint_url=moto_server, region_name=REGION)
    url = sqs.create_queue(
        QueueName=f"redeliver-{uuid.uuid4().hex[:8]}.fifo", Attributes={"FifoQueue": "true", "VisibilityTimeout": "1"}
    )["QueueUrl"]
    groups = {"a": ["a0", "a1", "a2"], "b": ["b0", "b1"]}
    for group, bodies in groups.items():
        for body in bodies:
            sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=group, MessageDeduplicationId=body)
    first = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert len(first) == 5

    # When their visibility timeout has passed and they are received again
    time.sleep(1.5)
    again = [m["Body"] for m in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]]

    # Then each group comes back from its first message, in order (moto alone delivers a2 and b1 first)
    assert again
    for bodies in groups.values():
        delivered = [body for body in again if body in bodies]
        assert delivered == bodies[: len(delivered)]


def test_emulator_keeps_a_group_in_flight_for_a_whole_receive(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch's messages expire microseconds apart. moto re-reads the groups in flight each time it meets an expired
    message; a group freed mid-receive had its first messages skipped already and gave out a later one ahead of them
    (a job delivered ahead of two earlier jobs of its workspace). In-process moto, the expiry forced mid-receive."""
    from moto import mock_aws
    from moto.sqs import models

    from agent_jobs_local.emulator import patch_fifo_redelivery_order

    groups_seen: list[set[str]] = []

    def receive_during_which_the_batch_expires(self: Any, queue_name: str, *args: Any, **kwargs: Any) -> Any:
        queue = self.get_queue(queue_name)
        for message in queue.pending_messages:
            message.visible_at = 0  # the received batch's visibility ends while this receive runs
        groups_seen.append(set(queue.pending_message_groups))
        return []

    monkeypatch.setattr(models.SQSBackend, "receive_message", receive_during_which_the_batch_expires)
    monkeypatch.setattr(models.Queue, "pending_message_groups", models.Queue.__dict__["pending_message_groups"])
    with mock_aws():
        sqs = boto3.client("sqs", region_name=REGION)
        url = sqs.create_queue(QueueName="expiry.fifo", Attributes={"FifoQueue": "true", "VisibilityTimeout": "30"})[
            "QueueUrl"
        ]
        for body in ("j6", "j7", "j8"):
            sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId="ws", MessageDeduplicationId=body)
        backend = models.sqs_backends["123456789012"][REGION]
        queue = backend.get_queue("expiry.fifo")
        for message in queue._messages[:2]:  # j6 and j7 received by an invocation that then died
            message.mark_received(visibility_timeout=30)
            queue.pending_messages.add(message)

        patch_fifo_redelivery_order()
        backend.receive_message("expiry.fifo", 10, 0, 30)
        after = set(queue.pending_message_groups)

    # The group stayed in flight for the whole receive, though j6 and j7 expired during it; afterwards it is free
    assert groups_seen == [{"ws"}]
    assert after == set()


def test_emulator_answers_and_stops() -> None:
    emulator = Emulator().start()
    try:
        with urllib.request.urlopen(f"{emulator.url}/moto-api/data.json", timeout=5) as response:
            assert response.status == 200
        assert emulator.running
        url = emulator.url
    finally:
        emulator.stop()

    assert not emulator.running
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{url}/moto-api/data.json", timeout=2)


def _process_gone(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    try:
        state = next(line for line in status.read_text().splitlines() if line.startswith("State:"))
    except (FileNotFoundError, ProcessLookupError):
        return True
    return "zombie" in state or "(Z)" in state


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads process states from /proc")
def test_emulator_exits_when_its_parent_dies() -> None:
    # Given a process that started an emulator
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from agent_jobs_local.emulator import Emulator; e = Emulator().start(); "
            "print(e._process.pid, flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert parent.stdout is not None
    emulator_pid = int(parent.stdout.readline())

    # When that process is killed without a chance to stop it
    parent.kill()
    parent.wait()

    # Then the emulator goes too
    deadline = time.monotonic() + 15
    while not _process_gone(emulator_pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _process_gone(emulator_pid)


def test_emulator_launcher_applies_every_correction(monkeypatch: pytest.MonkeyPatch) -> None:
    # What `python -m agent_jobs_local.emulator` runs before moto serves, here in-process (restored afterwards): every
    # SQS call and every DynamoDB item operation ends up behind the atomicity wrappers the race tests below exercise.
    from moto.dynamodb import models as dynamodb_models
    from moto.sqs import models as sqs_models
    from moto.sqs import responses as sqs_responses

    from agent_jobs_local.emulator import apply_fidelity_patches
    from agent_jobs_local.emulator_dynamodb import _TABLE_OPERATIONS
    from agent_jobs_local.emulator_sqs import _DEDUPLICATING
    from agent_jobs_local.emulator_sqs import PATCHED as _PATCHED

    queue_operations = (*ATOMIC_QUEUE_OPERATIONS, "receive_message")
    for name in queue_operations:
        monkeypatch.setattr(sqs_models.SQSBackend, name, getattr(sqs_models.SQSBackend, name))
    for name in ("add_message", "pending_message_groups"):
        monkeypatch.setattr(sqs_models.Queue, name, sqs_models.Queue.__dict__[name])
    for name in _TABLE_OPERATIONS:
        monkeypatch.setattr(dynamodb_models.DynamoDBBackend, name, getattr(dynamodb_models.DynamoDBBackend, name))
    for name in ("send_message", "send_message_batch"):
        monkeypatch.setattr(sqs_responses.SQSResponse, name, getattr(sqs_responses.SQSResponse, name))
    monkeypatch.setattr(sqs_models.Message, "__init__", sqs_models.Message.__init__)
    # moto's own add_message: the in-process stack fixture may have corrected it in this process already
    monkeypatch.setattr(sqs_models.Queue, "add_message", inspect.unwrap(sqs_models.Queue.add_message))
    assert not getattr(sqs_models.SQSBackend.delete_message, _PATCHED, False)
    assert not getattr(sqs_models.Queue.add_message, _DEDUPLICATING, False)

    apply_fidelity_patches()

    for name in ("send_message", "send_message_batch"):
        assert getattr(getattr(sqs_responses.SQSResponse, name), _PATCHED, False), name
    for name in queue_operations:
        assert getattr(getattr(sqs_models.SQSBackend, name), _PATCHED, False), name
    assert getattr(sqs_models.Queue.add_message, _DEDUPLICATING, False)
    for name in _TABLE_OPERATIONS:
        assert getattr(getattr(dynamodb_models.DynamoDBBackend, name), _PATCHED, False), name


def test_emulator_stamps_each_message_with_the_principal_of_its_senders_key(moto_server: str) -> None:
    # Given a FIFO queue whose messages move to a dead-letter queue on their second receive, and two senders' keys
    sqs, dlq_url = fifo_queue(moto_server)
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    _, url = fifo_queue(moto_server)
    sqs.set_queue_attributes(
        QueueUrl=url, Attributes={"RedrivePolicy": f'{{"deadLetterTargetArn": "{dlq_arn}", "maxReceiveCount": "1"}}'}
    )

    def sender(key: str) -> Any:
        return boto3.client(
            "sqs", endpoint_url=moto_server, region_name=REGION, aws_access_key_id=key, aws_secret_access_key=key
        )

    # When each sends one message, singly or in a batch
    sender("PRODUCERKEYA00000001").send_message(
        QueueUrl=url, MessageBody="a", MessageGroupId="a", MessageDeduplicationId="a"
    )
    sender("PRODUCERKEYB00000001").send_message_batch(
        QueueUrl=url, Entries=[{"Id": "b", "MessageBody": "b", "MessageGroupId": "b", "MessageDeduplicationId": "b"}]
    )

    # Then each carries its own key's principal, the same as the key always gives, and keeps it in the DLQ
    first = sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["All"], VisibilityTimeout=0
    )["Messages"]
    senders = {m["Body"]: m["Attributes"]["SenderId"] for m in first}
    assert senders == {"a": principal_id("PRODUCERKEYA00000001"), "b": principal_id("PRODUCERKEYB00000001")}
    assert sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []) == []  # moved to the DLQ
    dead = receive_all(sqs, dlq_url, 2)
    assert {m["Body"]: m["Attributes"]["SenderId"] for m in dead} == senders


def test_emulator_failed_transactions_never_undo_concurrent_writes(moto_server: str) -> None:
    # Given a table, one client whose transactions keep failing their condition, and another counting up an item
    dynamodb = boto3.client("dynamodb", endpoint_url=moto_server, region_name=REGION)
    table = f"tx-{uuid.uuid4().hex[:8]}"
    dynamodb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    dynamodb.put_item(TableName=table, Item={"pk": {"S": "locked"}, "state": {"S": "HALTED"}})
    for start_at in range(0, 400, 25):  # a table large enough that a transaction's backup takes a while
        dynamodb.batch_write_item(
            RequestItems={
                table: [
                    {"PutRequest": {"Item": {"pk": {"S": f"filler-{n}"}, "data": {"S": "x" * 200}}}}
                    for n in range(start_at, start_at + 25)
                ]
            }
        )
    writes = 150
    stop = threading.Event()

    def failing_transactions() -> None:
        client = boto3.client("dynamodb", endpoint_url=moto_server, region_name=REGION)
        while not stop.is_set():
            with contextlib.suppress(client.exceptions.TransactionCanceledException):
                client.transact_write_items(
                    TransactItems=[
                        {
                            "ConditionCheck": {
                                "TableName": table,
                                "Key": {"pk": {"S": "locked"}},
                                "ConditionExpression": "#s = :active",
                                "ExpressionAttributeNames": {"#s": "state"},
                                "ExpressionAttributeValues": {":active": {"S": "ACTIVE"}},
                            }
                        },
                        {"Put": {"TableName": table, "Item": {"pk": {"S": "other"}}}},
                    ]
                )

    thread = threading.Thread(target=failing_transactions)
    thread.start()
    try:
        # When the counter is incremented meanwhile
        for _ in range(writes):
            dynamodb.update_item(
                TableName=table,
                Key={"pk": {"S": "counter"}},
                UpdateExpression="ADD n :one",
                ExpressionAttributeValues={":one": {"N": "1"}},
            )
    finally:
        stop.set()
        thread.join()
    # Then no rollback of a failed transaction took any increment with it
    item = dynamodb.get_item(TableName=table, Key={"pk": {"S": "counter"}})["Item"]
    assert int(item["n"]["N"]) == writes


def _race_two_receivers(patched: bool, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Two receivers of one FIFO group, the first paused right after it snapshots the groups in flight, the second
    receiving meanwhile: what each handed out. In-process moto, so the interleaving is forced, not hoped for."""
    from moto import mock_aws
    from moto.sqs import models

    from agent_jobs_local.emulator import ATOMIC_QUEUE_OPERATIONS, patch_atomic_queue_operations

    for name in (*ATOMIC_QUEUE_OPERATIONS, "receive_message"):
        monkeypatch.setattr(models.SQSBackend, name, getattr(models.SQSBackend, name))  # restored after the test
    if patched:
        patch_atomic_queue_operations()
    original_groups = models.Queue.pending_message_groups
    paused, resume = threading.Event(), threading.Event()

    def groups_then_pause(queue: Any) -> set[str]:
        groups: set[str] = original_groups.fget(queue)  # type: ignore[attr-defined]
        if threading.current_thread().name == "first" and not paused.is_set():
            paused.set()
            resume.wait(timeout=1)  # the second receiver runs now, unless a lock keeps it out
        return groups

    monkeypatch.setattr(models.Queue, "pending_message_groups", property(groups_then_pause))
    with mock_aws():
        sqs = boto3.client("sqs", region_name=REGION)
        url = sqs.create_queue(QueueName="race.fifo", Attributes={"FifoQueue": "true", "VisibilityTimeout": "30"})[
            "QueueUrl"
        ]
        for n in range(2):
            sqs.send_message(QueueUrl=url, MessageBody=str(n), MessageGroupId="g", MessageDeduplicationId=str(n))
        backend = models.sqs_backends["123456789012"][REGION]
        handed_out: list[str] = []

        def receive() -> None:
            handed_out.extend(m.body for m in backend.receive_message("race.fifo", 1, 0, 30))

        first = threading.Thread(target=receive, name="first")
        first.start()
        paused.wait(timeout=5)
        second = threading.Thread(target=receive, name="second")
        second.start()
        second.join(timeout=0.5)
        resume.set()
        first.join()
        second.join()
        return sorted(handed_out)


def test_emulator_atomic_receives_hand_a_group_to_one_consumer(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _race_two_receivers(patched=True, monkeypatch=monkeypatch) == ["0"]


def test_unpatched_moto_hands_one_group_to_two_consumers(monkeypatch: pytest.MonkeyPatch) -> None:
    # the gap the patch closes: both messages of group g out at once, to two consumers
    assert _race_two_receivers(patched=False, monkeypatch=monkeypatch) == ["0", "1"]


def _transaction_scenario(monkeypatch: pytest.MonkeyPatch, *, patched: bool) -> dict[str, Any]:
    """Transactions that succeed, fail a condition half-way and fail validation, each after earlier writes of its
    own, on in-process moto (restored afterwards): what each answered and what the table holds at the end."""
    from moto import mock_aws
    from moto.dynamodb import models

    from agent_jobs_local.emulator import patch_atomic_table_operations
    from agent_jobs_local.emulator_dynamodb import _TABLE_OPERATIONS

    for name in _TABLE_OPERATIONS:
        monkeypatch.setattr(models.DynamoDBBackend, name, getattr(models.DynamoDBBackend, name))
    if patched:
        patch_atomic_table_operations()
    answers: list[Any] = []
    with mock_aws():
        dynamodb: Any = boto3.client("dynamodb", region_name=REGION)
        for table, keys in (("hash", ["pk"]), ("range", ["pk", "sk"])):
            dynamodb.create_table(
                TableName=table,
                KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}]
                + [{"AttributeName": k, "KeyType": "RANGE"} for k in keys[1:]],
                AttributeDefinitions=[{"AttributeName": k, "AttributeType": "S"} for k in keys],
                BillingMode="PAY_PER_REQUEST",
            )
        dynamodb.put_item(TableName="hash", Item={"pk": {"S": "kept"}, "n": {"N": "1"}})
        dynamodb.put_item(TableName="hash", Item={"pk": {"S": "guard"}, "n": {"N": "1"}})
        dynamodb.put_item(TableName="range", Item={"pk": {"S": "p"}, "sk": {"S": "kept"}, "n": {"N": "1"}})
        update_kept = {
            "Update": {
                "TableName": "hash",
                "Key": {"pk": {"S": "kept"}},
                "UpdateExpression": "ADD n :one",
                "ExpressionAttributeValues": {":one": {"N": "1"}},
            }
        }
        delete_range = {"Delete": {"TableName": "range", "Key": {"pk": {"S": "p"}, "sk": {"S": "kept"}}}}
        put_new = {"Put": {"TableName": "range", "Item": {"pk": {"S": "p"}, "sk": {"S": "new"}}}}
        put_hash_new = {"Put": {"TableName": "hash", "Item": {"pk": {"S": "new"}}}}
        failing_check = {
            "ConditionCheck": {
                "TableName": "hash",
                "Key": {"pk": {"S": "guard"}},
                "ConditionExpression": "n = :none",
                "ExpressionAttributeValues": {":none": {"N": "-1"}},
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }
        bad_update = {
            "Update": {
                "TableName": "hash",
                "Key": {"pk": {"S": "other"}},
                "UpdateExpression": "ADD n :x",
                "ExpressionAttributeValues": {":x": {"S": "not a number"}},
            }
        }
        transactions = [
            [update_kept, delete_range, put_new, put_hash_new, failing_check],  # fails last: the writes come undone
            [update_kept, put_new, bad_update],  # fails on a write's own error
            [update_kept, put_hash_new, put_new],  # succeeds
            [update_kept, update_kept],  # one item twice: refused before any write
        ]
        for items in transactions:
            try:
                dynamodb.transact_write_items(TransactItems=items)
                answers.append("ok")
            except dynamodb.exceptions.ClientError as error:
                answers.append((error.response["Error"]["Code"], error.response.get("CancellationReasons")))
        state = {table: dynamodb.scan(TableName=table)["Items"] for table in ("hash", "range")}
    return {"answers": answers, "state": state}


def test_emulator_transactions_answer_and_roll_back_as_moto_does(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given the same transactions run by moto's own TransactWriteItems and by the emulator's
    unpatched = _transaction_scenario(monkeypatch, patched=False)
    patched = _transaction_scenario(monkeypatch, patched=True)
    # Then every answer (cancellation reasons included) and the table's final contents are the same
    assert patched == unpatched
    assert patched["answers"][2] == "ok"
    assert patched["answers"][0][0] == "TransactionCanceledException"
    assert {item["pk"]["S"]: item["n"]["N"] for item in patched["state"]["hash"] if "n" in item} == {
        "kept": "2",
        "guard": "1",
    }


def test_emulator_transactions_never_copy_a_whole_table(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a table that cannot be copied (moto copied every table a transaction names: a call's cost grew with the
    # table, 250 ms per call at 5,000 items, and the local runtime slowed down as a run went on)
    from moto.dynamodb.models.table import Table

    def refuse(self: Any, memo: Any) -> Any:
        raise AssertionError("a transaction copied a whole table")

    monkeypatch.setattr(Table, "__deepcopy__", refuse, raising=False)
    # When the scenario's transactions run (successes and rollbacks alike), Then none copies a table
    result = _transaction_scenario(monkeypatch, patched=True)
    assert result["answers"][2] == "ok"
    assert {item["sk"]["S"] for item in result["state"]["range"]} == {"kept", "new"}
