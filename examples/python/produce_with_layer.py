"""Submit jobs from Python with the layer's `enqueue_job`, as the API does: each job is recorded QUEUED before it is
sent, so a resubmission with another payload is refused (JobConflictError) instead of being dropped, and one for a
workspace the tenant has not registered is refused before anything is written.

    JOBS_QUEUE_URL=... JOBS_TABLE=... PYTHONPATH=layers/shared python produce_with_layer.py TENANT jobs.json
"""

from __future__ import annotations

import json
import os
import sys

import boto3

from agent_jobs.guard import JobGuard
from agent_jobs.models import job_request_adapter
from agent_jobs.producer import enqueue_job

guard = JobGuard(boto3.client("dynamodb"), os.environ["JOBS_TABLE"])
sqs = boto3.client("sqs")

if __name__ == "__main__":
    tenant_id = sys.argv[1]
    with open(sys.argv[2]) as jobs:
        for document in json.load(jobs):  # {jobId, workspaceId, type, payload}: a job names no tenant
            job = job_request_adapter.validate_python(document)
            result = enqueue_job(job, tenant_id, guard=guard, sqs=sqs, queue_url=os.environ["JOBS_QUEUE_URL"])
            print(json.dumps(result.as_response()))
