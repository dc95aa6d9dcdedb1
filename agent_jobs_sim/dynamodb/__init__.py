"""A DynamoDB subset in memory, used in place of a boto3 low-level client (`SimDynamoDB`).

What it models: tables with a HASH and optional RANGE key; global secondary indexes (sparse, projected as their
Projection says, eventually consistent with a lag asked per write and per index, one item's writes arriving in
order); GetItem, PutItem, UpdateItem, DeleteItem, Query, Scan, BatchGetItem and TransactWriteItems in the wire format,
with DynamoDB's expression language (conditions, filters, key conditions, updates, projections) and its request
validation (undefined and unused placeholders, reserved words, key attributes in an update, overlapping paths,
mismatched key types, items over 400 KB). Errors are the exception classes of a real botocore client, with
`error.response` as botocore parses AWS's answer.

What it does not: TTL expiry (an expired item stays until deleted), local secondary indexes, the 1 MB page limit,
capacity and throttling (BatchGetItem never leaves UnprocessedKeys), idempotency tokens, eventually consistent reads
of the table (every table read is strongly consistent), streams, and nested paths in UPDATED_OLD/UPDATED_NEW (the
whole top-level attribute is returned). For speed, a stored item shares its nested values with the request that
wrote it and the responses that read it: a caller must change neither in place (boto3's deserializer, which the
product reads with, builds new values).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent_jobs_local.template import TemplateModel, load_template
from agent_jobs_sim.dynamodb.client import SimDynamoDB

__all__ = ["SimDynamoDB", "create_tables_from_template"]


def create_tables_from_template(dynamodb: SimDynamoDB, template: Any = None, *, stack_name: str = "sim") -> str:
    """Create the table of template.yaml (or of `template`, a loaded template or a `TemplateModel`) in `dynamodb`
    with the CreateTable arguments provisioning sends; returns its name."""
    model = (
        template
        if isinstance(template, TemplateModel)
        else TemplateModel(template if template is not None else load_template(), stack_name=stack_name)
    )
    kwargs: Mapping[str, Any] = model.table_create_kwargs()
    dynamodb.create_table(**kwargs)
    return str(kwargs["TableName"])
