"""The product's producer sends through SimSQS, and a receive gives the records a Lambda SQS event carries: the
queue is created from template.yaml's own properties, the job table is moto's (in this process)."""

from __future__ import annotations

import random
from typing import Any, cast

from aws_lambda_powertools.utilities.parser.models import SqsModel

from agent_jobs.keys import workspace_group_id
from agent_jobs.models import JobMessage
from agent_jobs.producer import enqueue_job, enqueue_jobs
from agent_jobs_cli.deadletters import DeadLetterQueue
from agent_jobs_local.event_source import receive_event
from agent_jobs_sim.sqs import SimSQS
from tests.conftest import REGION, Stack, make_job, register_workspace


def template_queues(stack: Stack, sqs: SimSQS) -> tuple[str, str]:
    """The jobs queue and its dead-letter queue as template.yaml declares them: (queue URL, queue ARN). The names
    are the stack's, so the RedrivePolicy's ARN (resolved against the stack's resources) names the simulated DLQ."""
    model = stack.model
    for queue_id in (model.dead_letter_queue_id, model.jobs_queue_id):
        sqs.create_queue(
            QueueName=model.queue_name(queue_id), Attributes=model.queue_attributes(queue_id, stack.references)
        )
    url = sqs.get_queue_url(QueueName=model.queue_name(model.jobs_queue_id))["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return str(url), str(arn)


def test_sqs_producer_sends_through_the_simulation_and_a_receive_is_a_lambda_event(stack: Stack) -> None:
    clock = [1_800_000_000.0]
    sqs = SimSQS(lambda: clock[0], random.Random(11))
    url, arn = template_queues(stack, sqs)
    register_workspace(stack, "ws-sim")
    client = cast(Any, sqs)
    single = enqueue_job(make_job("sim-1", "ws-sim"), "tenant-1", guard=stack.guard, sqs=client, queue_url=url)
    batch = enqueue_jobs(
        [make_job(f"sim-{n}", "ws-sim") for n in (2, 3)], "tenant-1", guard=stack.guard, sqs=client, queue_url=url
    )
    repeat = enqueue_job(make_job("sim-1", "ws-sim"), "tenant-1", guard=stack.guard, sqs=client, queue_url=url)

    event = receive_event(client, url, queue_arn=arn, region=REGION, batch_size=10)

    records = SqsModel.model_validate(event).Records
    assert [JobMessage.model_validate_json(str(r.body)).job_id for r in records] == ["sim-1", "sim-2", "sim-3"]
    assert {r.attributes.MessageGroupId for r in records} == {workspace_group_id("ws-sim")}
    assert records[0].attributes.SequenceNumber == single.sequence_number
    assert [r.messageId for r in records][1:] == [item.message_id for item in batch]
    assert records[0].messageAttributes["tenantId"].stringValue == "tenant-1"
    assert not repeat.created
    assert stack.job("sim-1", "tenant-1")["messageId"] == single.message_id
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (attributes["VisibilityTimeout"], attributes["DeduplicationScope"]) == ("720", "messageGroup")
    assert len(sqs.in_flight(url)) == 3


def test_sqs_dead_letter_tool_reads_what_the_redrive_moved(stack: Stack) -> None:
    clock = [1_800_000_000.0]
    sqs = SimSQS(lambda: clock[0], random.Random(5))
    url, _ = template_queues(stack, sqs)
    dlq_url = sqs.get_queue_url(QueueName=stack.model.queue_name(stack.model.dead_letter_queue_id))["QueueUrl"]
    register_workspace(stack, "ws-sim")
    client = cast(Any, sqs)
    for n in (1, 2):
        enqueue_job(make_job(f"dead-{n}", "ws-sim"), "tenant-1", guard=stack.guard, sqs=client, queue_url=url)

    # Given every delivery fails until the queue's redrive policy moves both jobs
    while sqs.messages(url):
        assert sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages") or sqs.messages(dlq_url)
        clock[0] += 720

    listing = DeadLetterQueue(client, dlq_url, final_wait_seconds=0).read()

    assert [(m.job_id, m.workspace_id) for m in listing.messages] == [("dead-1", "ws-sim"), ("dead-2", "ws-sim")]
    assert listing.approximate_total == 2
    assert [m["State"] for m in sqs.messages(dlq_url)] == ["visible", "visible"]  # read leaves them in place
