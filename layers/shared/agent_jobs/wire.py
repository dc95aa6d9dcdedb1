"""The queue message as a published contract: the JSON Schema of a job message body, for producers that send to the
jobs queue directly. Generated from the job model, so the document and the worker's parse cannot disagree; the file
in the repository (`MESSAGE_SCHEMA_FILE`) is this function's output, and a test keeps it so.

    python -m agent_jobs.wire > schemas/job-message.v1.schema.json
"""

from __future__ import annotations

import json
from typing import Any

from agent_jobs.models import MESSAGE_VERSION, JobMessage, PayloadRef, _job_request_adapter

_ENVELOPE = (
    "Send with SQS SendMessage to the jobs queue (FIFO): MessageGroupId `ws#<workspaceId>` (the workspace's group: "
    "one job of a workspace runs at a time, in the order sent); a MessageDeduplicationId that is the same for every "
    "send of one job, e.g. sha256(`<jobId>:<type>`) hex; optional message attributes `tenantId` (String, the "
    "workspace owner) and `type` (String, the job type). The workspace must be registered (PUT /workspaces/{id}); "
    "the job's tenant is always the workspace owner, and a message naming another tenant is REJECTED."
)


def queue_message_schema() -> dict[str, Any]:
    """The JSON Schema (2020-12) of a version-`MESSAGE_VERSION` job message body."""
    request = _job_request_adapter().json_schema(by_alias=True)
    message = JobMessage.model_json_schema(by_alias=True)["properties"]
    defs: dict[str, Any] = {**request["$defs"], "PayloadRef": PayloadRef.model_json_schema(by_alias=True)}
    common = {
        "v": {
            "const": MESSAGE_VERSION,
            "default": MESSAGE_VERSION,
            "description": f"The message format's version. Left out, the message is version {MESSAGE_VERSION}; any "
            "other version is REJECTED.",
        },
        "tenantId": {
            **message["tenantId"]["anyOf"][0],
            "description": "The workspace owner (may instead, or also, be the `tenantId` message attribute). Left "
            "out, the job is the owner's; another tenant is REJECTED.",
        },
        "payloadHash": {
            **message["payloadHash"],
            "description": "Optional: sha256 hex of the compact, key-sorted UTF-8 JSON "
            '{"payload", "type", "workspaceId"} (non-ASCII characters as they are, not escaped), with or without the '
            "payload fields that have defaults. Left out, the worker derives it; any other hash is REJECTED.",
        },
        "payloadRef": {
            "$ref": "#/$defs/PayloadRef",
            "description": "Written by the API for a payload too large for a message, in place of `payload` (then "
            "`payloadHash` is required); a direct producer sends `payload`.",
        },
    }
    for name in ("ApplyPatchJob", "RunTestsJob", "OpenPrJob"):
        variant = defs[name]
        properties = variant["properties"]
        variant["properties"] = {"v": common["v"], **properties, **{k: common[k] for k in common if k != "v"}}
        variant["required"] = [field for field in variant["required"] if field != "payload"]
        variant["oneOf"] = [
            {"required": ["payload"], "not": {"required": ["payloadRef"]}},
            {"required": ["payloadRef", "payloadHash"], "not": {"required": ["payload"]}},
        ]
        variant.pop("title", None)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"urn:agent-jobs:job-message:v{MESSAGE_VERSION}",
        "title": f"Agent Jobs queue message, version {MESSAGE_VERSION}",
        "description": _ENVELOPE,
        "oneOf": [{"$ref": f"#/$defs/{name}"} for name in ("ApplyPatchJob", "RunTestsJob", "OpenPrJob")],
        "discriminator": {"propertyName": "type"},
        "$defs": defs,
    }


def render() -> str:
    """The schema file's text."""
    return json.dumps(queue_message_schema(), indent=2, sort_keys=False) + "\n"


if __name__ == "__main__":
    print(render(), end="")
