"""The emulator's SQS deduplicates FIFO sends as SQS does: a send whose deduplication id the queue accepted (within
the queue, or within the message group when DeduplicationScope is messageGroup) in the last five minutes is accepted
and not enqueued, and answered with the MessageId and SequenceNumber of the message first accepted, whatever became
of that message. On moto in-process and on moto's server (the emulator), unless a test needs the clock."""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import boto3
import pytest
from moto import mock_aws

from agent_jobs_local.emulator import DEDUPLICATION_WINDOW_SECONDS
from agent_jobs_local.emulator_sqs import FifoDeduplication
from tests.conftest import REGION, Stack, WindowClock, deduplicate_on

WORKSPACE_A, WORKSPACE_B = "ws#ws-a", "ws#ws-b"


def send(sqs: Any, url: str, body: str, group: str, deduplication_id: str | None = None) -> dict[str, Any]:
    fields = {"MessageDeduplicationId": deduplication_id} if deduplication_id else {}
    return sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=group, **fields)  # type: ignore[no-any-return]


def place(answer: Mapping[str, object]) -> tuple[object, object]:
    """What a producer records of a send's answer: the message and its place in the queue."""
    return answer["MessageId"], answer["SequenceNumber"]


def fifo_queue(sqs: Any, **attributes: str) -> str:
    url: str = sqs.create_queue(
        QueueName=f"dedup-{uuid.uuid4().hex[:8]}.fifo", Attributes={"FifoQueue": "true", **attributes}
    )["QueueUrl"]
    return url


def drain(sqs: Any, url: str) -> list[dict[str, Any]]:
    """Every message the queue holds, in delivery order, each deleted once received."""
    received: list[dict[str, Any]] = []
    while messages := sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["All"], WaitTimeSeconds=0
    ).get("Messages", []):
        received.extend(messages)
        sqs.delete_message_batch(
            QueueUrl=url, Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)]
        )
    return received


def md5(text: str) -> str:
    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()


def test_emulator_answers_a_duplicate_send_with_the_message_first_accepted(any_stack: Stack) -> None:
    # Given the template's jobs queue holding one message sent with deduplication id d1
    sqs, url = any_stack.services.sqs, any_stack.queue_url
    first = send(sqs, url, "first", WORKSPACE_A, "d1")

    # When d1 is sent again to the same group, with another body
    again = send(sqs, url, "second", WORKSPACE_A, "d1")

    # Then the send succeeds, answered with the first message's MessageId and SequenceNumber (the digest is the
    # body's sent), and nothing is enqueued
    assert place(again) == place(first)
    assert again["MD5OfMessageBody"] == md5("second")
    assert any_stack.queue_depth() == 1
    assert [m["Body"] for m in drain(sqs, url)] == ["first"]


def test_emulator_answers_duplicate_batch_entries_with_the_messages_first_accepted(any_stack: Stack) -> None:
    # Given the template's jobs queue holding one message sent with deduplication id d1
    sqs, url = any_stack.services.sqs, any_stack.queue_url
    first = send(sqs, url, "first", WORKSPACE_A, "d1")

    # When a batch sends d1 again, a new d2, and d2 once more
    entries: list[Any] = [
        {"Id": "again", "MessageBody": "first again", "MessageGroupId": WORKSPACE_A, "MessageDeduplicationId": "d1"},
        {"Id": "new", "MessageBody": "new", "MessageGroupId": WORKSPACE_A, "MessageDeduplicationId": "d2"},
        {"Id": "new-again", "MessageBody": "new again", "MessageGroupId": WORKSPACE_A, "MessageDeduplicationId": "d2"},
    ]
    answer = sqs.send_message_batch(QueueUrl=url, Entries=entries)

    # Then every entry succeeds; each duplicate is answered with the message its id was first accepted with, and
    # only the new message joins the queue, behind the first
    assert not answer.get("Failed")
    by_entry = {entry["Id"]: entry for entry in answer["Successful"]}
    assert place(by_entry["again"]) == place(first)
    assert by_entry["again"]["MD5OfMessageBody"] == md5("first again")
    assert place(by_entry["new-again"]) == place(by_entry["new"])
    assert int(by_entry["new"]["SequenceNumber"]) > int(first["SequenceNumber"])
    assert [(m["Body"], m["MessageId"]) for m in drain(sqs, url)] == [
        ("first", first["MessageId"]),
        ("new", by_entry["new"]["MessageId"]),
    ]


def test_emulator_remembers_a_deduplication_id_after_its_message_was_deleted(any_stack: Stack) -> None:
    # Given a message sent, received and deleted
    sqs, url = any_stack.services.sqs, any_stack.queue_url
    first = send(sqs, url, "first", WORKSPACE_A, "d1")
    assert [m["MessageId"] for m in drain(sqs, url)] == [first["MessageId"]]

    # When its deduplication id is sent again, singly and in a batch, within the window
    again = send(sqs, url, "first", WORKSPACE_A, "d1")
    entry: Any = {"Id": "e", "MessageBody": "first", "MessageGroupId": WORKSPACE_A, "MessageDeduplicationId": "d1"}
    (batched,) = sqs.send_message_batch(QueueUrl=url, Entries=[entry])["Successful"]

    # Then both are answered with the deleted message's MessageId and SequenceNumber, and the queue stays empty
    assert place(again) == place(batched) == place(first)
    assert any_stack.queue_depth() == 0


def test_emulator_deduplicates_within_each_message_group_when_the_scope_is_message_group(any_stack: Stack) -> None:
    # Given the template's jobs queue: deduplication per message group (= per workspace)
    sqs, url = any_stack.services.sqs, any_stack.queue_url
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["DeduplicationScope"])["Attributes"]
    assert attributes["DeduplicationScope"] == "messageGroup"

    # When two workspaces' groups are sent the same deduplication id, and the second group is sent it again
    in_a = send(sqs, url, "a", WORKSPACE_A, "same")
    in_b = send(sqs, url, "b", WORKSPACE_B, "same")
    in_b_again = send(sqs, url, "b again", WORKSPACE_B, "same")

    # Then each group holds its own message (a sender in one group never suppresses another group's message), and
    # the repeat is answered with its own group's
    assert sorted((m["Body"], m["MessageId"]) for m in drain(sqs, url)) == [
        ("a", in_a["MessageId"]),
        ("b", in_b["MessageId"]),
    ]
    assert int(in_b["SequenceNumber"]) > int(in_a["SequenceNumber"])
    assert place(in_b_again) == place(in_b)


def test_emulator_deduplicates_across_message_groups_when_the_scope_is_the_queue(any_stack: Stack) -> None:
    # Given a FIFO queue deduplicating queue-wide
    sqs = any_stack.services.sqs
    url = fifo_queue(sqs, DeduplicationScope="queue")

    # When two groups are sent the same deduplication id
    in_a = send(sqs, url, "a", WORKSPACE_A, "same")
    in_b = send(sqs, url, "b", WORKSPACE_B, "same")

    # Then the second is a duplicate of the first: answered with it, not enqueued
    assert place(in_b) == place(in_a)
    assert [m["Body"] for m in drain(sqs, url)] == ["a"]


def test_emulator_deduplicates_content_based_ids_after_deletion_too(any_stack: Stack) -> None:
    # Given a queue with content-based deduplication, and a message sent without a deduplication id, then deleted
    sqs = any_stack.services.sqs
    url = fifo_queue(sqs, ContentBasedDeduplication="true")
    first = send(sqs, url, "x", WORKSPACE_A)
    (delivered,) = drain(sqs, url)
    assert delivered["Attributes"]["MessageDeduplicationId"] == hashlib.sha256(b"x").hexdigest()

    # When the same body is sent again, and another body
    again = send(sqs, url, "x", WORKSPACE_A)
    other = send(sqs, url, "y", WORKSPACE_A)

    # Then the same body is the deleted message's duplicate; the other is a new message
    assert place(again) == place(first)
    assert int(other["SequenceNumber"]) > int(first["SequenceNumber"])
    assert [m["Body"] for m in drain(sqs, url)] == ["y"]


def test_emulator_concurrent_duplicate_sends_are_all_answered_with_the_one_message_accepted(moto_server: str) -> None:
    # Given 8 senders racing to send the same deduplication id to one group
    url = fifo_queue(boto3.client("sqs", endpoint_url=moto_server, region_name=REGION))
    answers: list[dict[str, Any]] = []
    start = threading.Barrier(8)

    def sender(n: int) -> None:
        sqs = boto3.client("sqs", endpoint_url=moto_server, region_name=REGION)
        start.wait()
        answers.append(send(sqs, url, f"copy {n}", WORKSPACE_A, "d1"))

    threads = [threading.Thread(target=sender, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    # Then exactly one message was enqueued, and every sender was answered with it
    (message,) = drain(boto3.client("sqs", endpoint_url=moto_server, region_name=REGION), url)
    assert len(answers) == 8
    assert {place(answer) for answer in answers} == {(message["MessageId"], message["Attributes"]["SequenceNumber"])}


@pytest.fixture
def clocked_sqs(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, WindowClock]]:
    """In-process moto with the emulator's FIFO numbering and deduplication applied afresh (restored afterwards),
    deduplicating by a clock the test turns."""
    clock = WindowClock()
    deduplicate_on(clock, monkeypatch)
    with mock_aws():
        yield boto3.client("sqs", region_name=REGION), clock


@pytest.mark.aws
def test_emulator_accepts_a_deduplication_id_as_a_new_message_once_its_window_is_over(
    clocked_sqs: tuple[Any, WindowClock],
) -> None:
    # Given a message accepted, still in the queue, and its duplicate sent a second before the window ends
    sqs, clock = clocked_sqs
    url = fifo_queue(sqs)
    first = send(sqs, url, "first", WORKSPACE_A, "d1")
    clock.advance(DEDUPLICATION_WINDOW_SECONDS - 1)
    duplicate = send(sqs, url, "duplicate", WORKSPACE_A, "d1")
    assert place(duplicate) == place(first)

    # When the id is sent again once the window from the first send is over (a duplicate did not extend it)
    clock.advance(2)
    resent = send(sqs, url, "resent", WORKSPACE_A, "d1")

    # Then it is a new message, placed behind the first
    assert resent["MessageId"] != first["MessageId"]
    assert int(resent["SequenceNumber"]) > int(first["SequenceNumber"])
    assert [(m["Body"], m["MessageId"]) for m in drain(sqs, url)] == [
        ("first", first["MessageId"]),
        ("resent", resent["MessageId"]),
    ]


def test_fifo_deduplication_forgets_ids_whose_window_is_over() -> None:
    # Given 1,000 sends remembered
    clock = WindowClock()
    deduplication = FifoDeduplication(clock, window_seconds=10)
    for n in range(1_000):
        deduplication.remember((0, "", f"d{n}"), f"m{n}", f"{n:020d}")
    assert deduplication.accepted((0, "", "d999")) is not None

    # When their window is over and the next send is looked up
    clock.advance(10)
    assert deduplication.accepted((0, "", "d0")) is None

    # Then none is held any longer: memory is a window's worth of sends, not every send ever made
    assert len(deduplication) == 0
