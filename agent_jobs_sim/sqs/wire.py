"""What SQS computes over a message on the wire: the MD5 digests it returns and the system attributes a receive
selects."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Mapping
from typing import Any, Final

SYSTEM_ATTRIBUTES: Final = (
    "ApproximateReceiveCount",
    "ApproximateFirstReceiveTimestamp",
    "SentTimestamp",
    "SequenceNumber",
    "MessageGroupId",
    "MessageDeduplicationId",
    "SenderId",
)
SENDER_ID: Final = "AIDASIMULATEDSENDER01"


def md5_of_body(body: str) -> str:
    return hashlib.md5(body.encode(), usedforsecurity=False).hexdigest()


def _field(value: bytes) -> bytes:
    return struct.pack("!I", len(value)) + value


def md5_of_attributes(attributes: Mapping[str, Mapping[str, Any]]) -> str:
    """SQS's digest of message attributes: per name in order, the length-prefixed name, data type, a transport
    byte (1 string, 2 binary) and the length-prefixed value."""
    digest = hashlib.md5(usedforsecurity=False)
    for name in sorted(attributes):
        value = attributes[name]
        data_type = str(value["DataType"])
        digest.update(_field(name.encode()) + _field(data_type.encode()))
        if "BinaryValue" in value:
            digest.update(b"\x02" + _field(bytes(value["BinaryValue"])))
        else:
            digest.update(b"\x01" + _field(str(value["StringValue"]).encode()))
    return digest.hexdigest()


def attributes_size(attributes: Mapping[str, Mapping[str, Any]]) -> int:
    """The bytes message attributes count toward the 256 KiB message limit: name, data type and value."""
    size = 0
    for name, value in attributes.items():
        payload = value.get("BinaryValue", value.get("StringValue", ""))
        size += len(name.encode()) + len(str(value["DataType"]).encode())
        size += len(payload) if isinstance(payload, bytes) else len(str(payload).encode())
    return size


def selected_system_attributes(names: Iterable[str], values: Mapping[str, str]) -> dict[str, str]:
    """The system attributes a receive asked for ("All" for every one)."""
    wanted = set(names)
    if "All" in wanted:
        return dict(values)
    return {name: values[name] for name in SYSTEM_ATTRIBUTES if name in wanted and name in values}


def selected_message_attributes(
    names: Iterable[str], attributes: Mapping[str, Mapping[str, Any]]
) -> dict[str, dict[str, Any]]:
    """The message attributes a receive asked for: "All", ".*", a name, or a prefix ending in ".*"."""
    wanted = list(names)
    if not wanted or not attributes:
        return {}
    if "All" in wanted or ".*" in wanted:
        return {name: dict(value) for name, value in attributes.items()}
    prefixes = tuple(name[:-2] for name in wanted if name.endswith(".*"))
    exact = set(wanted)
    return {
        name: dict(value)
        for name, value in attributes.items()
        if name in exact or (prefixes and name.startswith(prefixes))
    }
