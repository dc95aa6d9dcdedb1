"""Send jobs straight to the Agent Jobs queue with boto3 alone (no Agent Jobs code needed).

One message group per workspace: its jobs run one at a time, in the order sent.
    JOBS_QUEUE_URL=... python produce_boto3.py jobs.json
(jobs.json: a JSON list of {jobId, workspaceId, tenantId, type, payload})
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any

import boto3

sqs = boto3.client("sqs")  # AWS_ENDPOINT_URL, when set, points it at a local emulator


def send_job(queue_url: str, job: dict[str, Any]) -> dict[str, str]:
    job_id, job_type, tenant_id = job["jobId"], job["type"], job["tenantId"]
    sent = sqs.send_message(
        QueueUrl=queue_url,
        MessageBody=json.dumps({"v": 1, **job}),  # "v": 1 pins the message format; it may be left out
        MessageGroupId=f"ws#{job['workspaceId']}",
        # The same for every send of one job: a resend within five minutes is dropped by SQS, a later one by the worker.
        MessageDeduplicationId=hashlib.sha256(f"{job_id}:{job_type}".encode()).hexdigest(),
        MessageAttributes={
            "tenantId": {"DataType": "String", "StringValue": tenant_id},
            "type": {"DataType": "String", "StringValue": job_type},
        },
    )
    return {"jobId": job_id, "messageId": sent["MessageId"], "sequenceNumber": sent["SequenceNumber"]}


if __name__ == "__main__":
    with open(sys.argv[1]) as jobs:
        for job in json.load(jobs):  # one at a time: a workspace's jobs take effect in the order sent
            print(json.dumps(send_job(os.environ["JOBS_QUEUE_URL"], job)))
