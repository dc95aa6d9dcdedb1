"""A simulated SQS FIFO service with dead-letter queues and redrive, used in place of a boto3 SQS client.

`client` holds SimSQS (the client), `registry` the queues and their attributes, `sending` and `receiving` the
message calls, `redrive` the move tasks, `queue` one queue's state and `errors` the botocore exceptions raised.
"""

from __future__ import annotations

from agent_jobs_sim.sqs.client import SimSQS
from agent_jobs_sim.sqs.queue import MessageState

__all__ = ["MessageState", "SimSQS"]
