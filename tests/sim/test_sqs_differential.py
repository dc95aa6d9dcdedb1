"""SimSQS and moto's server (the `moto_server` emulator, over HTTP) run the same call sequences and must agree.

Where moto departs from what SQS documents, the test says so: it asserts that SimSQS does what SQS does and that
moto still does the other thing, so the test fails the day moto changes. The emulator corrects some of moto's FIFO
behaviour before it serves (agent_jobs_local/emulator_sqs.py): SequenceNumbers increasing in acceptance order
instead of random digits, deduplication by scope and window answered with the original message, an expired batch
redelivered in group order, each call atomic. The tests marked so below agree with moto only with those corrections.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import boto3
import pytest

from tests.conftest import REGION
from tests.sim.sqs_calls import (
    Side,
    bodies,
    by_group,
    counts,
    depth,
    fifo_queue,
    outcome,
    queue_arn,
    receive,
    send,
    sim_side,
    with_dead_letter_queue,
)


@pytest.fixture
def both(moto_server: str) -> dict[str, Side]:
    moto = boto3.client("sqs", endpoint_url=moto_server, region_name=REGION)
    return {"sim": sim_side(), "moto": Side("moto", moto, lambda seconds: None)}


def run(both: dict[str, Side], sequence: Callable[[Side], Any]) -> tuple[Any, Any]:
    """The sequence's observations on the simulation and on moto."""
    return sequence(both["sim"]), sequence(both["moto"])


def test_sqs_group_delivered_in_order_and_blocked_while_in_flight(both: dict[str, Side]) -> None:
    # Holds for moto with the emulator's redelivery correction: moto alone skips a group's expired first messages.
    def sequence(side: Side) -> Any:
        url = fifo_queue(side)
        for i in range(3):
            send(side, url, f"a{i}", "a", f"a{i}")
        first = receive(side, url, 1)
        blocked = receive(side, url)
        side.sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=first[0]["ReceiptHandle"], VisibilityTimeout=0)
        again = receive(side, url)
        return bodies(first), bodies(blocked), counts(again), receive(side, url), depth(side, url)

    sim, moto = run(both, sequence)
    assert sim == moto == (["a0"], [], [("a0", 2), ("a1", 1), ("a2", 1)], [], (0, 3, 0))


def test_sqs_one_receive_serves_several_groups_each_in_order(both: dict[str, Side]) -> None:
    def sequence(side: Side) -> Any:
        url = fifo_queue(side)
        for group, count in (("a", 2), ("b", 2), ("c", 1)):
            for i in range(count):
                send(side, url, f"{group}{i}", group, f"{group}{i}")
        received = receive(side, url)
        handles = {m["Body"]: m["ReceiptHandle"] for m in received}
        for body in ("b0", "b1"):
            side.sqs.delete_message(QueueUrl=url, ReceiptHandle=handles[body])
        still_blocked = receive(side, url)
        send(side, url, "b2", "b", "b2")
        return by_group(received), bodies(still_blocked), bodies(receive(side, url))

    sim, moto = run(both, sequence)
    assert sim == moto == ({"a": ["a0", "a1"], "b": ["b0", "b1"], "c": ["c0"]}, [], ["b2"])


def test_sqs_sequence_numbers_are_twenty_digits_and_increase(both: dict[str, Side]) -> None:
    # Holds for moto only with the emulator's correction: moto alone answers random digits.
    def sequence(side: Side) -> Any:
        url = fifo_queue(side)
        sent = [send(side, url, f"m{i}", "g", f"m{i}")["SequenceNumber"] for i in range(4)]
        received = [m["Attributes"]["SequenceNumber"] for m in receive(side, url)]
        shaped = all(len(n) == 20 and n.isdigit() for n in sent)
        return shaped, sent == sorted(sent) and len(set(sent)) == 4, received == sent

    sim, moto = run(both, sequence)
    assert sim == moto == (True, True, True)


def test_sqs_receive_count_and_first_receive_timestamp(both: dict[str, Side]) -> None:
    def sequence(side: Side) -> Any:
        url = fifo_queue(side)
        send(side, url, "m", "g", "m")
        first = receive(side, url)[0]
        side.sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0)
        second = receive(side, url)[0]
        return (
            first["Attributes"]["ApproximateReceiveCount"],
            second["Attributes"]["ApproximateReceiveCount"],
            first["ReceiptHandle"] != second["ReceiptHandle"],
            first["MessageId"] == second["MessageId"],
            sorted(second["Attributes"]),
        )

    sim, moto = run(both, sequence)
    assert sim == moto
    assert sim[:4] == ("1", "2", True, True)


def test_sqs_redrive_moves_a_message_received_max_receive_count_times(both: dict[str, Side]) -> None:
    # SQS: "When the ReceiveCount for a message exceeds the maxReceiveCount for a queue, Amazon SQS moves the
    # message to a dead-letter queue": the receive after the maxReceiveCount-th one moves it, and the next message
    # of its group becomes deliverable.
    attribute = {"tenantId": {"DataType": "String", "StringValue": "t1"}}

    def sequence(side: Side) -> Any:
        url, dlq = with_dead_letter_queue(side, 2)
        send(side, url, "m0", "g", "m0", MessageAttributes=attribute)
        send(side, url, "m1", "g", "m1")
        seen = []
        for _ in range(2):
            message = receive(side, url, 1)[0]
            seen.append(counts([message]))
            side.sqs.change_message_visibility(
                QueueUrl=url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
            )
        after = receive(side, url)
        dead = receive(side, dlq)
        moved = [(m["Body"], m["Attributes"]["MessageGroupId"], m.get("MessageAttributes")) for m in dead]
        return seen, counts(after), moved, counts(dead), depth(side, url), depth(side, dlq)

    sim, moto = run(both, sequence)
    assert sim == moto
    assert sim[:3] == ([[("m0", 1)], [("m0", 2)]], [("m1", 1)], [("m0", "g", attribute)])


def test_sqs_deduplicates_within_the_window(both: dict[str, Side]) -> None:
    def sequence(side: Side) -> Any:
        url = fifo_queue(side)
        first = send(side, url, "x", "g", "d")
        again = send(side, url, "y", "g", "d")
        return first, again, bodies(receive(side, url))

    (sim_first, sim_again, sim_bodies), (moto_first, moto_again, moto_bodies) = run(both, sequence)
    assert sim_bodies == moto_bodies == ["x"]
    # SQS answers a duplicate with the MessageId and SequenceNumber of the message it deduplicated against (the
    # product records them). Holds for moto only with the emulator's correction: moto alone answers with new ones.
    for first, again in ((sim_first, sim_again), (moto_first, moto_again)):
        assert (again["MessageId"], again["SequenceNumber"]) == (first["MessageId"], first["SequenceNumber"])


def test_sqs_deduplication_outlives_the_deletion_of_the_message(both: dict[str, Side]) -> None:
    # SQS: a message sent with a deduplication id already accepted within the 5-minute interval is accepted but not
    # delivered, whether or not the first was since deleted. Holds for moto only with the emulator's correction: moto
    # alone forgets the id once its message is deleted.
    def sequence(side: Side) -> Any:
        url = fifo_queue(side)
        send(side, url, "x", "g", "d")
        side.sqs.delete_message(QueueUrl=url, ReceiptHandle=receive(side, url)[0]["ReceiptHandle"])
        send(side, url, "x again", "g", "d")
        return depth(side, url)

    sim, moto = run(both, sequence)
    assert sim == moto == (0, 0, 0)


def test_sqs_deduplication_scope_message_group(both: dict[str, Side]) -> None:
    # SQS: with DeduplicationScope=messageGroup a deduplication id is unique within its message group only. Holds for
    # moto only with the emulator's correction: moto alone deduplicates across the whole queue whatever the scope.
    def sequence(side: Side) -> Any:
        url = fifo_queue(side, DeduplicationScope="messageGroup", FifoThroughputLimit="perMessageGroupId")
        send(side, url, "1", "g1", "d")
        send(side, url, "2", "g2", "d")
        send(side, url, "3", "g2", "d")
        return depth(side, url)

    sim, moto = run(both, sequence)
    assert sim == moto == (2, 0, 0)


def test_sqs_content_based_deduplication(both: dict[str, Side]) -> None:
    def sequence(side: Side) -> Any:
        url = fifo_queue(side, ContentBasedDeduplication="true")
        for body in ("x", "x", "y"):
            send(side, url, body, "g")
        received = receive(side, url)
        return bodies(received), [m["Attributes"]["MessageDeduplicationId"] for m in received]

    sim, moto = run(both, sequence)
    assert sim == moto == (["x", "y"], [hashlib.sha256(b).hexdigest() for b in (b"x", b"y")])


def test_sqs_message_digests(both: dict[str, Side]) -> None:
    attributes = {
        "tenantId": {"DataType": "String", "StringValue": "t1"},
        "attempt": {"DataType": "Number", "StringValue": "3"},
        "blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xff"},
    }

    def sequence(side: Side) -> Any:
        url = fifo_queue(side)
        sent = send(side, url, "body ✓", "g", "d", MessageAttributes=attributes)
        got = receive(side, url)[0]
        return sent["MD5OfMessageBody"], sent["MD5OfMessageAttributes"], got["MD5OfBody"], got["MD5OfMessageAttributes"]

    sim, moto = run(both, sequence)
    assert sim == moto
    assert sim[0] == hashlib.md5("body ✓".encode(), usedforsecurity=False).hexdigest()


def test_sqs_batch_validation(both: dict[str, Side]) -> None:
    def entry(entry_id: str, body: str = "b", **fields: Any) -> dict[str, Any]:
        return {
            "Id": entry_id,
            "MessageBody": body,
            "MessageGroupId": "g",
            "MessageDeduplicationId": entry_id,
            **fields,
        }

    def sequence(side: Side) -> Any:
        url = fifo_queue(side)
        batch = side.sqs.send_message_batch
        no_group = {"Id": "n", "MessageBody": "b", "MessageDeduplicationId": "n"}
        ok = batch(QueueUrl=url, Entries=[entry(f"e{i}", f"m{i}") for i in range(10)])
        return (
            [s["Id"] for s in ok["Successful"]],
            ok["Failed"],
            outcome(lambda: batch(QueueUrl=url, Entries=[])),
            outcome(lambda: batch(QueueUrl=url, Entries=[entry(f"x{i}") for i in range(11)])),
            outcome(lambda: batch(QueueUrl=url, Entries=[entry("same"), entry("same")])),
            outcome(lambda: batch(QueueUrl=url, Entries=[entry("not.valid")])),
            outcome(lambda: batch(QueueUrl=url, Entries=[entry("fine"), no_group])),
            bodies(receive(side, url)),
        )

    sim, moto = run(both, sequence)
    assert sim == moto
    assert sim[2:7] == (
        ("EmptyBatchRequest", "AWS.SimpleQueueService.EmptyBatchRequest"),
        ("TooManyEntriesInBatchRequest", "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"),
        ("BatchEntryIdsNotDistinct", "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"),
        ("InvalidBatchEntryId", "AWS.SimpleQueueService.InvalidBatchEntryId"),
        ("ClientError", "MissingParameter"),
    )
    assert sim[-1] == [f"m{i}" for i in range(10)]  # the refused batch sent nothing


def test_sqs_request_errors(both: dict[str, Side]) -> None:
    def sequence(side: Side) -> Any:
        url = fifo_queue(side)
        sqs = side.sqs
        return (
            outcome(lambda: sqs.get_queue_url(QueueName="sim-no-such-queue.fifo")),
            outcome(lambda: sqs.send_message(QueueUrl=url, MessageBody="b", MessageDeduplicationId="d")),
            outcome(lambda: sqs.send_message(QueueUrl=url, MessageBody="b", MessageGroupId="g")),
            outcome(lambda: send(side, url, "b", "g", "d", DelaySeconds=5)),
            outcome(lambda: sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=11)),
            outcome(lambda: sqs.delete_message(QueueUrl=url, ReceiptHandle="never-issued")),
        )

    sim, moto = run(both, sequence)
    assert (
        sim
        == moto
        == (
            ("QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue"),
            ("ClientError", "MissingParameter"),
            ("ClientError", "InvalidParameterValue"),
            ("ClientError", "InvalidParameterValue"),
            ("ClientError", "InvalidParameterValue"),
            ("ReceiptHandleIsInvalid", "ReceiptHandleIsInvalid"),
        )
    )


def test_sqs_stale_receipt_handles(both: dict[str, Side]) -> None:
    # SQS, FIFO queues: only the latest receive's handle, while its visibility timeout lasts, deletes the message
    # or changes its visibility; an older one is refused with InvalidParameterValue ("The receipt handle has
    # expired."). moto accepts any handle the message ever had and deletes it.
    def sequence(side: Side) -> Any:
        url = fifo_queue(side)
        send(side, url, "m", "g", "m")
        old = receive(side, url)[0]["ReceiptHandle"]
        side.sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=old, VisibilityTimeout=0)
        latest = receive(side, url)[0]["ReceiptHandle"]
        stale = outcome(lambda: side.sqs.delete_message(QueueUrl=url, ReceiptHandle=old))
        return stale, depth(side, url), latest

    (sim_stale, sim_depth, _), (moto_stale, moto_depth, _) = run(both, sequence)
    assert sim_stale == ("ClientError", "InvalidParameterValue")
    assert sim_depth == (0, 1, 0)
    assert moto_stale == ("ok", "")
    assert moto_depth == (0, 0, 0)


def test_sqs_handle_whose_visibility_timeout_ended(both: dict[str, Side]) -> None:
    # SQS, FIFO queues: the handle expires with the visibility timeout, even if nobody received the message since.
    def sequence(side: Side) -> Any:
        url = fifo_queue(side)
        send(side, url, "m", "g", "m")
        handle = receive(side, url)[0]["ReceiptHandle"]
        side.sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=0)
        return outcome(lambda: side.sqs.delete_message(QueueUrl=url, ReceiptHandle=handle)), depth(side, url)

    sim, moto = run(both, sequence)
    assert sim == (("ClientError", "InvalidParameterValue"), (1, 0, 0))
    assert moto == (("ok", ""), (0, 0, 0))


def test_sqs_handle_of_a_deleted_message(both: dict[str, Side]) -> None:
    # A repeated delete succeeds on both. Changing the visibility of a deleted message: SQS refuses it with
    # InvalidParameterValue ("Message does not exist or is not available for visibility timeout change"); moto
    # with ReceiptHandleIsInvalid.
    def sequence(side: Side) -> Any:
        url = fifo_queue(side)
        send(side, url, "m", "g", "m")
        handle = receive(side, url)[0]["ReceiptHandle"]
        side.sqs.delete_message(QueueUrl=url, ReceiptHandle=handle)
        again = outcome(lambda: side.sqs.delete_message(QueueUrl=url, ReceiptHandle=handle))
        visibility = outcome(
            lambda: side.sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=5)
        )
        return again, visibility

    sim, moto = run(both, sequence)
    assert sim == (("ok", ""), ("ClientError", "InvalidParameterValue"))
    assert moto == (("ok", ""), ("ReceiptHandleIsInvalid", "ReceiptHandleIsInvalid"))


def test_sqs_batch_delete_and_visibility_report_each_entry(both: dict[str, Side]) -> None:
    def sequence(side: Side) -> Any:
        url = fifo_queue(side)
        for i in range(2):
            send(side, url, f"m{i}", f"g{i}", f"m{i}")
        handles = {m["Body"]: m["ReceiptHandle"] for m in receive(side, url)}
        visibility = side.sqs.change_message_visibility_batch(
            QueueUrl=url,
            Entries=[
                {"Id": "a", "ReceiptHandle": handles["m0"], "VisibilityTimeout": 60},
                {"Id": "b", "ReceiptHandle": "never-issued", "VisibilityTimeout": 60},
            ],
        )
        deleted = side.sqs.delete_message_batch(
            QueueUrl=url,
            Entries=[{"Id": "a", "ReceiptHandle": handles["m1"]}, {"Id": "b", "ReceiptHandle": "never-issued"}],
        )
        return [
            ([s["Id"] for s in r["Successful"]], [(f["Id"], f["Code"], f["SenderFault"]) for f in r["Failed"]])
            for r in (visibility, deleted)
        ], depth(side, url)

    sim, moto = run(both, sequence)
    assert sim == moto == ([(["a"], [("b", "ReceiptHandleIsInvalid", True)])] * 2, (0, 1, 0))


def test_sqs_message_move_task(both: dict[str, Side]) -> None:
    # SQS supports StartMessageMoveTask from a FIFO dead-letter queue back to its source; moto 5.2.5 has no such
    # operation (its server answers 500).
    def sequence(side: Side) -> Any:
        url, dlq = with_dead_letter_queue(side, 1)
        send(side, url, "m", "g", "m")
        handle = receive(side, url)[0]["ReceiptHandle"]
        side.sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=0)
        receive(side, url)  # moves it
        moved = outcome(lambda: side.sqs.start_message_move_task(SourceArn=queue_arn(side, dlq)))
        return moved, depth(side, url), depth(side, dlq)

    sim, moto = run(both, sequence)
    assert sim == (("ok", ""), (1, 0, 0), (0, 0, 0))
    assert moto == (("ClientError", "500"), (0, 0, 0), (1, 0, 0))
