"""Git's binary patches (`git diff --binary`, `git format-patch`): `literal` and `delta` hunks, applied as `git apply`
applies them.

A binary section of a git diff is its `diff --git` header, an `index <old>..<new>` line with both blob ids in full,
the `GIT binary patch` line, then a forward hunk and (optionally) a reverse one: each is `literal <size>` (the new
content) or `delta <size>` (a git delta of the old content), followed by lines of zlib-deflated data in git's base85
(a length character, `A`-`Z` for 1-26 bytes and `a`-`z` for 27-52, then 5 characters per 4 bytes), ending at a blank
line. Only the forward hunk is used.

As `git apply` does, and for the same reason (a binary hunk carries no context to check), the old content must be the
blob the index line names, and the result must be the blob it names as new: anything else is refused, naming the file.
What a hunk may inflate to is bounded before it is inflated (its stated size, and MAX_BLOB_BYTES), so a small patch
of a huge zero-filled file costs a few bytes of work, not gigabytes.
"""

from __future__ import annotations

import base64
import hashlib
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

BINARY_MARKER = "GIT binary patch"
NULL_BLOB_ID = "0" * 40

_HUNK_HEADER = re.compile(r"^(literal|delta) (\d+)$")
_INDEX = re.compile(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)(?: \d+)?$")
_FULL_ID = re.compile(r"^[0-9a-f]{40}$")


class BinaryPatchError(ValueError):
    """A binary hunk that is malformed or does not apply: the message says why (the caller names the file)."""


@dataclass(frozen=True)
class BinaryHunk:
    """A section's forward binary hunk: `literal` (the new content) or `delta` (of the old), `size` bytes inflated,
    `deflated` the hunk's data decoded from base85; `old_id` and `new_id` the blob ids of the section's index line."""

    kind: str
    size: int
    deflated: bytes
    old_id: str | None
    new_id: str | None


def binary_hunks(lines: Sequence[str]) -> dict[int, BinaryHunk]:
    """The binary hunk of each `diff --git` section of a patch's `lines` that has one, by the index of the section's
    `diff --git` line. Raises BinaryPatchError (with the section's header) for a malformed one."""
    found: dict[int, BinaryHunk] = {}
    section: int | None = None
    index_line: tuple[str, str] | None = None
    number = 0
    while number < len(lines):
        line = lines[number].rstrip("\r\n")
        number += 1
        if line.startswith("diff --git "):
            section, index_line = number - 1, None
        elif section is not None and (match := _INDEX.match(line)):
            index_line = (match[1], match[2])
        elif section is not None and line == BINARY_MARKER:
            hunk, number = _read_hunk(lines, number, lines[section].rstrip("\r\n"))
            old_id, new_id = index_line or (None, None)
            found[section] = BinaryHunk(hunk[0], hunk[1], hunk[2], old_id, new_id)
            section = None
    return found


def _read_hunk(lines: Sequence[str], number: int, where: str) -> tuple[tuple[str, int, bytes], int]:
    """The hunk that starts at `lines[number]` (its kind, size and deflated data) and the line after it."""
    header = lines[number].rstrip("\r\n") if number < len(lines) else ""
    match = _HUNK_HEADER.match(header)
    if match is None:
        raise BinaryPatchError(f"{where}: 'GIT binary patch' is not followed by 'literal <size>' or 'delta <size>'")
    data = bytearray()
    number += 1
    while number < len(lines) and (line := lines[number].rstrip("\r\n")):
        data += _base85_line(line, where)
        number += 1
    return (match[1], int(match[2]), bytes(data)), number


def _base85_line(line: str, where: str) -> bytes:
    length_char, encoded = line[:1], line[1:]
    if "A" <= length_char <= "Z":
        length = ord(length_char) - ord("A") + 1
    elif "a" <= length_char <= "z":
        length = ord(length_char) - ord("a") + 27
    else:
        raise BinaryPatchError(f"{where}: a binary data line starts with {length_char!r}, not a length character")
    if len(encoded) != (length + 3) // 4 * 5:
        raise BinaryPatchError(f"{where}: a binary data line of {length} bytes has {len(encoded)} base85 characters")
    try:
        return base64.b85decode(encoded)[:length]
    except ValueError as error:
        raise BinaryPatchError(f"{where}: a binary data line is not base85 ({error})") from error


def blob_id(content: bytes) -> str:
    """The git blob id of `content`."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content, usedforsecurity=False).hexdigest()


def apply_binary(hunk: BinaryHunk, original: bytes | None, max_bytes: int) -> bytes | None:
    """The content `hunk` makes of `original` (None: the file does not exist), or None when it deletes the file.

    Raises BinaryPatchError when the index line is not in full, the old content is not the blob it names, the hunk
    is malformed or larger than `max_bytes` inflated, or the result is not the blob the index line names."""
    if hunk.old_id is None or hunk.new_id is None or not (_FULL_ID.match(hunk.old_id) and _FULL_ID.match(hunk.new_id)):
        raise BinaryPatchError(
            "a binary patch needs an index line with both blob ids in full; make it with git diff --binary or git "
            "format-patch"
        )
    old = original or b""
    if original is not None and blob_id(original) != hunk.old_id:
        raise BinaryPatchError(f"the patch applies to blob {hunk.old_id[:12]} but the file is {blob_id(original)[:12]}")
    if original is None and hunk.old_id != NULL_BLOB_ID:
        raise BinaryPatchError(f"the patch applies to blob {hunk.old_id[:12]} but the file does not exist")
    if hunk.new_id == NULL_BLOB_ID:
        return None
    if hunk.size > max_bytes:
        raise BinaryPatchError(
            f"the binary hunk inflates to {hunk.size} bytes, above the {max_bytes}-byte limit of MAX_BLOB_BYTES"
        )
    data = _inflate(hunk.deflated, hunk.size)
    result = data if hunk.kind == "literal" else _apply_delta(old, data, max_bytes)
    if blob_id(result) != hunk.new_id:
        raise BinaryPatchError(f"the binary hunk makes blob {blob_id(result)[:12]}, not {hunk.new_id[:12]}")
    return result


def _inflate(deflated: bytes, size: int) -> bytes:
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(deflated, size + 1)  # one byte more than stated shows a hunk that lies
    except zlib.error as error:
        raise BinaryPatchError(f"the binary hunk's data is not zlib data ({error})") from error
    if len(data) != size or not inflater.eof:
        raise BinaryPatchError(f"the binary hunk's data does not inflate to the {size} bytes its header states")
    return data


def _varint(delta: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while at < len(delta):
        byte = delta[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at
    raise BinaryPatchError("the binary delta ends inside its header")


def _apply_delta(source: bytes, delta: bytes, max_bytes: int) -> bytes:
    """Git's delta format: the source's and the result's sizes, then copy (from the source) and insert commands. The
    sizes are checked here; dulwich's `apply_delta` (in C) runs the commands, never beyond the stated result."""
    source_size, at = _varint(delta, 0)
    result_size, at = _varint(delta, at)
    if source_size != len(source):
        raise BinaryPatchError(f"the binary delta applies to {source_size} bytes but the file has {len(source)}")
    if result_size > max_bytes:
        raise BinaryPatchError(
            f"the binary delta makes {result_size} bytes, above the {max_bytes}-byte limit of MAX_BLOB_BYTES"
        )
    # The git library, imported only when a delta is applied: the module stays cheap to import at a cold start.
    from dulwich.errors import ApplyDeltaError
    from dulwich.pack import apply_delta

    try:
        return b"".join(apply_delta(source, delta))
    except ApplyDeltaError as error:
        raise BinaryPatchError(f"the binary delta does not apply ({error})") from error
