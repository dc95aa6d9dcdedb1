"""The listings' `nextToken` cursors: opaque base64url JSON of where an index read stopped, checked to continue only
the caller's own listing."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any, Final

from agent_jobs.keys import workspace_key

from .errors import RequestRefused

_NEXT_TOKEN_VERSION: Final = 1
_NEXT_TOKEN_MAX_CHARS: Final = 2048
_NEXT_TOKEN_CHARS: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def encode_next_token(workspace_id: str, key: Mapping[str, Any]) -> str:
    """An opaque cursor: base64url JSON of where the index read stopped, bound to the workspace it was issued for."""
    document = {"v": _NEXT_TOKEN_VERSION, "ws": workspace_id, "pk": key["pk"], "at": key["acceptedAt"]}
    return base64.urlsafe_b64encode(json.dumps(document, separators=(",", ":")).encode()).decode().rstrip("=")


def decode_next_token(token: str | None, workspace_id: str) -> dict[str, Any] | None:
    """The index position a `nextToken` continues from, or a 400 when this API did not issue it for this workspace.

    The token is not signed: a client that edits one can only move its own cursor within this workspace (the query
    is always for the workspace in the path and the caller's own jobs), so what is checked is its shape and its
    binding to the workspace, which also keeps a malformed key from ever reaching DynamoDB.
    """
    if token is None or token == "":
        return None
    refused = RequestRefused(
        HTTPStatus.BAD_REQUEST,
        f"the nextToken is not one this API issued for workspace '{workspace_id}'; pass the nextToken of the previous "
        "page of this workspace's timeline unchanged, or leave it out to start from the oldest job",
    )
    if len(token) > _NEXT_TOKEN_MAX_CHARS or not set(token) <= _NEXT_TOKEN_CHARS:
        raise refused
    try:
        document = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (binascii.Error, ValueError):
        raise refused from None
    if not isinstance(document, dict) or set(document) != {"v", "ws", "pk", "at"}:
        raise refused
    pk, accepted_at = document["pk"], document["at"]
    if (
        document["v"] != _NEXT_TOKEN_VERSION
        or document["ws"] != workspace_id
        or not isinstance(pk, str)
        or not 0 < len(pk) <= 1024
        or not isinstance(accepted_at, int)
        or isinstance(accepted_at, bool)
        or not 0 <= accepted_at < 10**15
    ):
        raise refused
    return {"pk": pk, "workspaceId": workspace_id, "acceptedAt": accepted_at}


def encode_halted_token(key: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(key, sort_keys=True).encode()).decode().rstrip("=")


def decode_halted_token(token: str | None, tenant: str) -> dict[str, Any] | None:
    """Where the caller's listing continues, or a 422 when the token is not one this API gave the caller.

    The token is not signed: it is checked to be the halted index's key (the table's `pk` of a workspace item, its
    `workspaceId`, and `haltedTenant`) of the caller's own tenant, so an edited token can only move the caller's own
    cursor and never reaches DynamoDB as a start key it refuses.
    """
    if not token:
        return None
    try:
        key = None
        if len(token) <= _NEXT_TOKEN_MAX_CHARS and set(token) <= _NEXT_TOKEN_CHARS:
            key = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (ValueError, RecursionError):  # binascii.Error and UnicodeDecodeError are ValueErrors
        key = None
    # A token only continues the caller's own listing.
    if not (
        isinstance(key, dict)
        and set(key) == {"pk", "workspaceId", "haltedTenant"}
        and key["haltedTenant"] == tenant
        and isinstance(key["workspaceId"], str)
        and 0 < len(key["workspaceId"]) <= _NEXT_TOKEN_MAX_CHARS
        and key["pk"] == workspace_key(key["workspaceId"])
    ):
        raise RequestRefused(
            HTTPStatus.UNPROCESSABLE_ENTITY,
            "nextToken is not one this API returned to you; list again without it",
            [{"field": "nextToken", "message": "use the nextToken of the previous page as given"}],
        )
    return dict(key)
