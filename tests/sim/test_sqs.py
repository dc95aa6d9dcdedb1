"""SimSQS on its own: what moto cannot show (virtual time: delays, visibility timeouts, retention, the
deduplication window; the redrive back from a dead-letter queue), determinism, and the inspection a simulation
uses."""

from __future__ import annotations

import json
from typing import Any

import pytest
from botocore.exceptions import ClientError

from agent_jobs_sim.sqs import SimSQS
from agent_jobs_sim.sqs.errors import error_client
from tests.sim.sqs_calls import (
    START,
    Side,
    bodies,
    counts,
    depth,
    fifo_queue,
    queue_arn,
    receive,
    send,
    sim_side,
    with_dead_letter_queue,
)


@pytest.fixture
def side() -> Side:
    return sim_side()


def transcript(seed: int) -> list[Any]:
    """Everything a short history answers, on a fresh SimSQS drawn from `seed`."""
    side = sim_side(seed)
    url = fifo_queue(side)
    answers: list[Any] = [send(side, url, f"{g}{i}", g, f"{g}{i}") for g in "abcdef" for i in range(2)]
    answers.append(receive(side, url, 3))
    side.advance(31)
    answers.append(receive(side, url, 10))
    return [json.loads(json.dumps(answer, default=str)) for answer in answers]


def test_sqs_same_seed_same_history() -> None:
    assert transcript(3) == transcript(3)


def test_sqs_seed_chooses_which_groups_a_receive_serves() -> None:
    served = {tuple(bodies(transcript(seed)[-2])) for seed in range(12)}
    assert len(served) > 1
    for order in served:  # whatever the groups, each group's messages come first to last
        assert [b for b in order if b.endswith("1")] == [f"{b[0]}1" for b in order if b.endswith("1")]
        for body in order:
            if body.endswith("1"):
                assert f"{body[0]}0" in order[: order.index(body)]


def test_sqs_errors_are_the_real_clients_exception_classes(side: Side) -> None:
    with pytest.raises(error_client().exceptions.QueueDoesNotExist) as raised:
        side.sqs.get_queue_url(QueueName="nope.fifo")
    assert raised.value.response["Error"]["Code"] == "AWS.SimpleQueueService.NonExistentQueue"
    assert raised.value.operation_name == "GetQueueUrl"
    url = fifo_queue(side)
    with pytest.raises(error_client().exceptions.ReceiptHandleIsInvalid):
        side.sqs.delete_message(QueueUrl=url, ReceiptHandle="never-issued")


def test_sqs_visibility_timeout_returns_the_message_and_a_new_handle_replaces_the_old(side: Side) -> None:
    url = fifo_queue(side, VisibilityTimeout="30")
    send(side, url, "m", "g", "m")
    first = receive(side, url)
    assert side.sqs.next_timer() == START + 30
    side.advance(29)
    assert receive(side, url) == []
    side.advance(1)
    second = receive(side, url, VisibilityTimeout=5)
    assert counts(second) == [("m", 2)]
    assert second[0]["Attributes"]["ApproximateFirstReceiveTimestamp"] == str(int(START * 1000))
    with pytest.raises(ClientError, match="The receipt handle has expired"):
        side.sqs.delete_message(QueueUrl=url, ReceiptHandle=first[0]["ReceiptHandle"])
    side.advance(5)
    with pytest.raises(ClientError, match="The receipt handle has expired"):
        side.sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=second[0]["ReceiptHandle"], VisibilityTimeout=9)


def test_sqs_change_visibility_extends_and_zero_releases_the_group(side: Side) -> None:
    url = fifo_queue(side, VisibilityTimeout="10")
    for i in range(2):
        send(side, url, f"m{i}", "g", f"m{i}")
    handle = receive(side, url, 1)[0]["ReceiptHandle"]
    side.sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=100)
    side.advance(50)
    assert receive(side, url) == []
    assert [m["Body"] for m in side.sqs.in_flight(url)] == ["m0"]
    side.sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=0)
    assert counts(receive(side, url)) == [("m0", 2), ("m1", 1)]
    with pytest.raises(ClientError, match="VisibilityTimeout"):
        side.sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=43_201)


def test_sqs_queue_delay_holds_messages_back(side: Side) -> None:
    url = fifo_queue(side, DelaySeconds="20")
    send(side, url, "m", "g", "m")
    assert depth(side, url) == (0, 0, 1)
    assert receive(side, url) == []
    assert side.sqs.next_timer() == START + 20
    side.advance(20)
    assert bodies(receive(side, url)) == ["m"]


def test_sqs_deduplication_window_is_five_minutes(side: Side) -> None:
    url = fifo_queue(side)
    first = send(side, url, "x", "g", "d")
    side.advance(299)
    assert send(side, url, "x", "g", "d")["MessageId"] == first["MessageId"]
    side.advance(1)
    assert send(side, url, "x", "g", "d")["MessageId"] != first["MessageId"]
    assert depth(side, url) == (2, 0, 0)


def test_sqs_retention_drops_old_messages(side: Side) -> None:
    url = fifo_queue(side, MessageRetentionPeriod="60")
    send(side, url, "old", "g", "old")
    side.advance(30)
    send(side, url, "new", "g", "new")
    side.advance(30)
    assert [m["Body"] for m in side.sqs.messages(url)] == ["new"]
    assert bodies(receive(side, url)) == ["new"]


def test_sqs_redrive_frees_the_group_and_keeps_the_message(side: Side) -> None:
    url, dlq = with_dead_letter_queue(side, 1, VisibilityTimeout="10")
    attributes = {"tenantId": {"DataType": "String", "StringValue": "t1"}}
    sent = send(side, url, "poison", "g", "p", MessageAttributes=attributes)
    send(side, url, "next", "g", "n")
    assert bodies(receive(side, url, 1)) == ["poison"]
    side.advance(10)
    assert counts(receive(side, url)) == [("next", 1)]
    [dead] = side.sqs.messages(dlq)
    assert (dead["Body"], dead["MessageGroupId"], dead["MessageDeduplicationId"], dead["State"]) == (
        "poison",
        "g",
        "p",
        "visible",
    )
    assert (dead["MessageId"], dead["MessageAttributes"]) == (sent["MessageId"], attributes)


def test_sqs_message_move_task_returns_messages_to_their_source_in_order(side: Side) -> None:
    url, dlq = with_dead_letter_queue(side, 1)
    for i in range(3):
        send(side, url, f"m{i}", "g", f"m{i}")
    for _ in range(3):
        handle = receive(side, url, 1)[0]["ReceiptHandle"]
        side.sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=0)
    receive(side, url, 1)  # moves the last one
    assert [m["Body"] for m in side.sqs.messages(dlq)] == ["m0", "m1", "m2"]
    before = [m["SequenceNumber"] for m in side.sqs.messages(dlq)]
    task = side.sqs.start_message_move_task(SourceArn=queue_arn(side, dlq))
    moved = side.sqs.messages(url)
    assert [(m["Body"], m["MessageGroupId"], m["MessageDeduplicationId"], m["ReceiveCount"]) for m in moved] == [
        (f"m{i}", "g", f"m{i}", 0) for i in range(3)
    ]
    after = [m["SequenceNumber"] for m in moved]
    assert after == sorted(after)
    assert after[0] > before[-1]
    assert counts(receive(side, url)) == [("m0", 1), ("m1", 1), ("m2", 1)]
    [listed] = side.sqs.list_message_move_tasks(SourceArn=queue_arn(side, dlq))["Results"]
    assert (listed["TaskHandle"], listed["Status"], listed["ApproximateNumberOfMessagesMoved"]) == (
        task["TaskHandle"],
        "COMPLETED",
        3,
    )


def test_sqs_message_move_task_needs_a_dead_letter_queue(side: Side) -> None:
    url = fifo_queue(side)
    with pytest.raises(ClientError, match="Dead Letter Queue"):
        side.sqs.start_message_move_task(SourceArn=queue_arn(side, url))
    with pytest.raises(error_client().exceptions.ResourceNotFoundException):
        side.sqs.start_message_move_task(SourceArn="arn:aws:sqs:us-east-1:123456789012:none.fifo")


def test_sqs_batch_too_long_and_message_too_large(side: Side) -> None:
    url = fifo_queue(side, MaximumMessageSize="1024")
    with pytest.raises(ClientError, match="Message must be shorter than 1024 bytes"):
        send(side, url, "x" * 1025, "g", "d")
    entries = [
        {"Id": str(i), "MessageBody": "x" * 300_000, "MessageGroupId": "g", "MessageDeduplicationId": str(i)}
        for i in range(4)
    ]
    with pytest.raises(error_client().exceptions.BatchRequestTooLong):
        side.sqs.send_message_batch(QueueUrl=fifo_queue(side), Entries=entries)


def test_sqs_queue_attributes_and_creation(side: Side) -> None:
    url = fifo_queue(side, VisibilityTimeout="720")
    attributes = side.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["FifoQueue"] == "true"
    assert attributes["VisibilityTimeout"] == "720"
    assert attributes["QueueArn"].endswith(url.rsplit("/", 1)[1])
    name = url.rsplit("/", 1)[1]
    assert side.sqs.get_queue_url(QueueName=name)["QueueUrl"] == url
    assert side.sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true", "VisibilityTimeout": "720"})
    with pytest.raises(error_client().exceptions.QueueNameExists):
        side.sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true", "VisibilityTimeout": "1"})
    assert url in side.sqs.list_queues(QueueNamePrefix="sim-")["QueueUrls"]
    with pytest.raises(NotImplementedError):
        side.sqs.create_queue(QueueName="standard")
    side.sqs.purge_queue(QueueUrl=url)


def test_sqs_inspection(side: Side) -> None:
    url = fifo_queue(side)
    send(side, url, "a", "g", "a")
    send(side, url, "b", "h", "b")
    receive(side, url, 1)
    states = sorted(m["State"] for m in side.sqs.messages(url))
    assert states == ["in_flight", "visible"]
    assert len(side.sqs.in_flight(url)) == 1
    assert isinstance(side.sqs, SimSQS)


def test_sqs_dead_letter_retention_counts_from_the_move(side: Side) -> None:
    # FIFO queues reset a message's enqueue timestamp when it moves to the dead-letter queue.
    dlq = fifo_queue(side, MessageRetentionPeriod="60")
    policy = json.dumps({"deadLetterTargetArn": queue_arn(side, dlq), "maxReceiveCount": 1})
    url = fifo_queue(side, RedrivePolicy=policy, VisibilityTimeout="50")
    send(side, url, "m", "g", "m")
    receive(side, url)
    side.advance(50)
    assert receive(side, url) == []  # moved, at 50 s old
    side.advance(59)
    assert [m["Body"] for m in side.sqs.messages(dlq)] == ["m"]
    side.advance(1)
    assert side.sqs.messages(dlq) == []
