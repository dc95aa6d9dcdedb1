"""Direct producers: who may send a workspace's jobs straight to the queue.

SQS stamps every message with `SenderId`, the IAM principal that sent it: an IAM user's unique id (`AIDA...`), or for
a role its unique id and session name (`AROA...:<session name>`; a Lambda function's session is its name). The
sender cannot choose it, so it is the one thing a message says about its sender that the worker can trust: the body
and the message attributes are the sender's word.

A workspace's owner may bind its direct producers in its registration (`directProducers`): then the worker runs a
direct message for that workspace only when its SenderId is one of them (a role's unique id admits every session of
the role). The stack's own enqueue API is always the owner's: it checked the tenant before it recorded and sent the
job, and it is recognised by its role's unique id (`API_SENDER_ID`). Without a binding, any principal allowed to
SendMessage on the queue may send a job as the workspace's owner: SendMessage is a platform-trusted permission.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Final

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

MAX_DIRECT_PRODUCERS: Final = 10
# IAM unique ids are 16 to 128 characters (the prefix included); a role session name is 2 to 64 characters.
_USER_ID: Final = r"AIDA[A-Z0-9]{12,124}"
_ROLE_ID: Final = r"AROA[A-Z0-9]{12,124}"
_SESSION_NAME: Final = r"[A-Za-z0-9_+=,.@-]{2,64}"
SENDER_ID_PATTERN: Final = re.compile(rf"{_USER_ID}|{_ROLE_ID}(?::{_SESSION_NAME})?")
SENDER_ID_FORMS: Final = (
    "an IAM user's unique id (AIDA...), a role's unique id (AROA..., every session of the role) or one session of a "
    "role (AROA...:<session name>), as SQS reports it in a message's SenderId"
)
_FIND_IT: Final = (
    "find a role's with `aws iam get-role --role-name NAME --query Role.RoleId`, a user's with "
    "`aws iam get-user --user-name NAME --query User.UserId`"
)


def _check_sender_id(value: str) -> str:
    if SENDER_ID_PATTERN.fullmatch(value):
        return value
    if value.startswith("arn:"):
        raise PydanticCustomError(
            "sender_id_arn", f"a direct producer is named by its unique id, not its ARN: {_FIND_IT}"
        )
    raise PydanticCustomError("sender_id", f"a direct producer is {SENDER_ID_FORMS}; {_FIND_IT}")


def _check_sender_ids(values: list[str]) -> list[str]:
    if len(values) > MAX_DIRECT_PRODUCERS:
        raise PydanticCustomError(
            "direct_producers_count",
            f"at most {MAX_DIRECT_PRODUCERS} direct producers: bind a role (AROA...) that your producers assume "
            "instead of each of them",
        )
    seen: set[str] = set()
    for value in values:
        if value in seen:
            raise PydanticCustomError("direct_producers_repeated", f"{value} is listed twice: list each sender once")
        seen.add(value)
    return values


# The pattern and the count are shown in the schema and checked by the validators, whose errors say what to do.
SenderId = Annotated[
    str,
    Field(min_length=16, max_length=193, json_schema_extra={"pattern": f"^(?:{SENDER_ID_PATTERN.pattern})$"}),
    AfterValidator(_check_sender_id),
]
DirectProducers = Annotated[
    list[SenderId], Field(json_schema_extra={"maxItems": MAX_DIRECT_PRODUCERS}), AfterValidator(_check_sender_ids)
]


def is_principal(sender_id: str, principal: str) -> bool:
    """`sender_id` is `principal` itself, or, when `principal` is a role's unique id, one of its sessions."""
    return sender_id == principal or (":" not in principal and sender_id.startswith(principal + ":"))


def sender_admitted(sender_id: str | None, bound: Sequence[str] | None, *, api_sender_id: str | None) -> bool:
    """A direct message of `sender_id` is the workspace owner's to run: the stack's enqueue API sent it, or the owner
    bound no direct producers (None), or the sender is one of those bound (an empty binding admits the API alone)."""
    if sender_id and api_sender_id and is_principal(sender_id, api_sender_id):
        return True
    if bound is None:
        return True
    return bool(sender_id) and any(is_principal(str(sender_id), principal) for principal in bound)


def unbound_sender_reason(sender_id: str | None, workspace_id: str) -> str:
    """Why a message of a sender the owner did not bind was refused, for the operator's record."""
    return (
        f"sender {sender_id or '(none)'} is not one of the direct producers bound to workspace {workspace_id} "
        "(directProducers of its registration): refused, nothing was applied"
    )


def other_tenant_reason(tenant_id: str, workspace_id: str) -> str:
    """Why a message naming another tenant than the workspace's owner was refused, for the operator's record."""
    return (
        f"message names tenant {tenant_id} but workspace {workspace_id} belongs to another tenant: refused, nothing "
        "was applied"
    )
