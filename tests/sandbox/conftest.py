"""Archives and events for the test sandbox's handler."""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
from collections.abc import Iterable
from typing import Any

COMMIT = "0123456789abcdef0123456789abcdef01234567"

Member = tuple[tarfile.TarInfo, bytes | None]


def file_member(name: str, content: bytes, mode: int = 0o644) -> Member:
    info = tarfile.TarInfo(name)
    info.size = len(content)
    info.mode = mode
    return info, content


def link_member(name: str, target: str, *, hard: bool = False) -> Member:
    info = tarfile.TarInfo(name)
    info.type = tarfile.LNKTYPE if hard else tarfile.SYMTYPE
    info.linkname = target
    return info, None


def tar_gz(members: Iterable[Member]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for info, content in members:
            archive.addfile(info, io.BytesIO(content) if content is not None else None)
    return buffer.getvalue()


def inline(data: bytes) -> dict[str, Any]:
    return {"inline": base64.b64encode(data).decode(), "sha256": hashlib.sha256(data).hexdigest()}


def sandbox_event(archive: dict[str, Any], argv: list[str], **overrides: Any) -> dict[str, Any]:
    return {
        "v": 1,
        "jobId": "job-1",
        "workspaceId": "ws-1",
        "tenantId": "tenant-a",
        "commit": COMMIT,
        "argv": argv,
        "timeoutSeconds": 30,
        "outputLimitBytes": 64 * 1024,
        "archive": archive,
        **overrides,
    }
