"""Who calls the local emulator: the access key each function signs its calls with, and the SenderId the emulator
gives a message sent with a key that moto's IAM and STS do not know.

SQS stamps a message with the principal that sent it (`SenderId`: an IAM user's unique id, or a role's id and session
name), and the worker trusts that alone to tell the stack's enqueue API from a direct producer. Locally each function
signs with a key of its own (`function_access_key`), the emulator turns a key into a stable principal id of an IAM
user's form (`principal_id`), and the template's `!GetAtt <Function>Role.RoleId` of that function resolves to the same
id, so the worker recognises the local API's messages as it recognises the deployed API's. Standard library only: the
emulator's process and the template reader both use it.
"""

from __future__ import annotations

import base64
import hashlib


def _digest(text: str, length: int) -> str:
    # Base32 letters and digits: what IAM unique ids and access key ids are made of.
    return base64.b32encode(hashlib.sha256(text.encode()).digest()).decode()[:length]


def function_access_key(stack_name: str, function_id: str) -> str:
    """The access key id a function of a local stack signs its calls to the emulator with (20 characters, as AWS's)."""
    return "AKIA" + _digest(f"{stack_name}/{function_id}", 16)


def principal_id(access_key_id: str) -> str:
    """The SenderId the emulator gives a message sent with `access_key_id` when moto knows no user or role session of
    it: an IAM user's unique id (AIDA and 17 characters), the same for the same key, another for another key."""
    return "AIDA" + _digest(access_key_id, 17)
