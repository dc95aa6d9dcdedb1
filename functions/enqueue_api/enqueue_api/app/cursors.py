"""The listings' `nextToken`: one opaque cursor for every listing, base64url JSON of where an index read stopped,
bound to what the listing is of (the workspace of a timeline, the tenant of the halted list).

A cursor is not signed: what is checked is its shape and its binding, so an edited token can only move the caller's
own cursor within the same listing and never reaches DynamoDB as a start key it would refuse. Every listing answers a
token it did not issue with the same 400.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Final

from agent_jobs.keys import workspace_key

from .errors import RequestRefused

_VERSION: Final = 1
_MAX_CHARS: Final = 2048
_CHARS: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
_MAX_STRING: Final = 1024
_MAX_POSITION: Final = 10**15  # epoch milliseconds, with room to spare


@dataclass(frozen=True)
class Cursor:
    """The cursors of one listing: the fields a token holds besides its version, each a string or a whole number,
    and the advice a refused token gets."""

    fields: Mapping[str, type[str] | type[int]]
    issued_for: str
    restart: str

    def encode(self, values: Mapping[str, str | int]) -> str:
        document = {"v": _VERSION, **{name: values[name] for name in self.fields}}
        return base64.urlsafe_b64encode(json.dumps(document, separators=(",", ":")).encode()).decode().rstrip("=")

    def decode(self, token: str | None, **bound: str) -> dict[str, Any] | None:
        """The fields of `token`, or None without one; a 400 unless this listing issued it with the `bound` values."""
        if token is None or token == "":
            return None
        document = _document(token)
        if not (
            isinstance(document, dict)
            and set(document) == {"v", *self.fields}
            and document["v"] == _VERSION
            and all(_is_field(document[name], kind) for name, kind in self.fields.items())
            and all(document[name] == value for name, value in bound.items())
        ):
            raise RequestRefused(
                HTTPStatus.BAD_REQUEST,
                f"the nextToken is not one this API issued for {self.issued_for.format(**bound)}; pass the nextToken "
                f"of the previous page unchanged, or leave it out to {self.restart}",
            )
        return {name: document[name] for name in self.fields}


def _document(token: str) -> Any:
    if len(token) > _MAX_CHARS or not set(token) <= _CHARS:
        return None
    try:
        return json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (ValueError, RecursionError):  # binascii.Error and UnicodeDecodeError are ValueErrors
        return None


def _is_field(value: Any, kind: type[str] | type[int]) -> bool:
    if kind is str:
        return isinstance(value, str) and 0 < len(value) <= _MAX_STRING
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _MAX_POSITION


TIMELINE: Final = Cursor(
    {"ws": str, "pk": str, "at": int},
    issued_for="workspace '{ws}'",
    restart="start from the oldest job",
)
HALTED: Final = Cursor(
    {"tenant": str, "ws": str},
    issued_for="your list of halted workspaces",
    restart="start from the first page",
)


def encode_timeline_token(workspace_id: str, key: Mapping[str, Any]) -> str:
    """Where a workspace's timeline (the index `byWorkspace`) continues, bound to the workspace."""
    return TIMELINE.encode({"ws": workspace_id, "pk": key["pk"], "at": key["acceptedAt"]})


def decode_timeline_token(token: str | None, workspace_id: str) -> dict[str, Any] | None:
    """The start key of the timeline page `token` continues from, None for the first page."""
    fields = TIMELINE.decode(token, ws=workspace_id)
    if fields is None:
        return None
    return {"pk": fields["pk"], "workspaceId": workspace_id, "acceptedAt": fields["at"]}


def encode_halted_token(key: Mapping[str, Any]) -> str:
    """Where the tenant's list of halted workspaces (the halted index) continues, bound to the tenant."""
    return HALTED.encode({"tenant": key["haltedTenant"], "ws": key["workspaceId"]})


def decode_halted_token(token: str | None, tenant: str) -> dict[str, Any] | None:
    """The start key of the halted page `token` continues from, None for the first page: the item's key is derived
    from its workspaceId, never taken from the token."""
    fields = HALTED.decode(token, tenant=tenant)
    if fields is None:
        return None
    return {"pk": workspace_key(fields["ws"]), "workspaceId": fields["ws"], "haltedTenant": tenant}
