"""The checkout a test run gets: a .tar.gz passed inline (base64) or by a presigned https URL, checked against its
sha256 and unpacked without letting a member land outside the folder or the archive outgrow its limits.

Standard library only (urllib, tarfile): the sandbox function runs with the interpreter alone.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
import re
import ssl
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from test_sandbox.runner import SandboxRequestError

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_READ_CHUNK = 1024 * 1024


def _limit(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    try:
        value = int(raw) if raw else default
    except ValueError:
        return default
    return value if value > 0 else default


@dataclass(frozen=True)
class ArchiveLimits:
    """How large a checkout may be: the archive itself, what it unpacks to, and how many entries it has."""

    archive_bytes: int = 256 * 1024 * 1024
    extracted_bytes: int = 1024 * 1024 * 1024
    members: int = 100_000
    download_timeout_seconds: float = 30.0

    @classmethod
    def from_environment(cls) -> ArchiveLimits:
        """SANDBOX_MAX_ARCHIVE_BYTES, SANDBOX_MAX_EXTRACTED_BYTES and SANDBOX_MAX_MEMBERS; a missing or invalid value
        keeps the default."""
        defaults = cls()
        return cls(
            archive_bytes=_limit("SANDBOX_MAX_ARCHIVE_BYTES", defaults.archive_bytes),
            extracted_bytes=_limit("SANDBOX_MAX_EXTRACTED_BYTES", defaults.extracted_bytes),
            members=_limit("SANDBOX_MAX_MEMBERS", defaults.members),
        )


def load_archive(spec: Any, limits: ArchiveLimits) -> bytes:
    """The archive's bytes, from `{"inline", "sha256"}` or `{"url", "sha256", "size"}`, once its sha256 matches."""
    if not isinstance(spec, dict):
        raise SandboxRequestError('"archive" must be {"inline", "sha256"} or {"url", "sha256", "size"}')
    expected = spec.get("sha256")
    if not isinstance(expected, str) or not _SHA256.fullmatch(expected):
        raise SandboxRequestError('"archive.sha256" must be the 64 lowercase hex digits of the archive\'s sha256')
    if "inline" in spec:
        data = _inline(spec["inline"], limits)
    elif "url" in spec:
        data = _download(spec["url"], spec.get("size"), limits)
    else:
        raise SandboxRequestError('"archive" has neither "inline" nor "url"')
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise SandboxRequestError(
            f"the archive's sha256 is {actual}, not the {expected} it was sent with; the checkout was changed or cut"
            " short on the way: run the job again"
        )
    return data


def extract_archive(data: bytes, destination: Path, limits: ArchiveLimits) -> int:
    """Unpack the .tar.gz `data` into the empty folder `destination`; returns the number of members.

    Every member is checked before anything is written: at most `limits.members` of them and `limits.extracted_bytes`
    in all (a gzip bomb is refused on the headers it declares, before its data is inflated); only files, folders and
    links, each with a relative path that stays in the folder, links whose targets stay in it too, and nothing
    written through a link. tarfile's "data" filter checks the same again where the interpreter has it (3.11.4+),
    and clears setuid bits and ownership.
    """
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            members: list[tarfile.TarInfo] = []
            links: set[PurePosixPath] = set()
            total = 0
            for member in archive:
                _refuse_unsafe_member(member, links)
                members.append(member)
                total += max(member.size, 0)
                if len(members) > limits.members:
                    raise SandboxRequestError(
                        f"the checkout has more than {limits.members} entries (SANDBOX_MAX_MEMBERS); test a smaller"
                        " tree or raise the limit"
                    )
                if total > limits.extracted_bytes:
                    raise SandboxRequestError(
                        f"the checkout unpacks to more than {limits.extracted_bytes} bytes"
                        " (SANDBOX_MAX_EXTRACTED_BYTES); test a smaller tree or raise the limit"
                    )
            if hasattr(tarfile, "data_filter"):
                archive.extractall(destination, members=members, filter="data")
            else:
                archive.extractall(destination, members=[_owned_by_us(member) for member in members])
    except _FILTER_ERRORS as error:
        raise SandboxRequestError(f"the checkout has an unsafe entry, refused: {error}") from error
    except (tarfile.TarError, EOFError, OSError, ValueError) as error:
        raise SandboxRequestError(f"the checkout is not a readable .tar.gz: {error}") from error
    return len(members)


_FILTER_ERRORS: tuple[type[Exception], ...] = (tarfile.FilterError,) if hasattr(tarfile, "FilterError") else ()


def _refuse_unsafe_member(member: tarfile.TarInfo, links: set[PurePosixPath]) -> None:
    """A checkout holds files, folders and links with relative paths that never climb, never through a link."""
    path = _safe_path(member.name)
    if any(parent in links for parent in path.parents):
        raise _unsafe(member.name, "is written through a link")
    if member.issym():
        target = member.linkname
        if target.startswith("/") or _climbs(path.parent / target):
            raise _unsafe(member.name, f"links to {target!r}, outside the checkout")
        links.add(path)
    elif member.islnk():
        _safe_path(member.linkname)
    elif not (member.isfile() or member.isdir()):
        raise _unsafe(member.name, "is not a file, a folder or a link")


def _safe_path(name: str) -> PurePosixPath:
    if name.startswith("/") or ".." in PurePosixPath(name).parts:
        raise _unsafe(name, "is absolute or leaves the folder")
    return PurePosixPath(name)


def _climbs(path: PurePosixPath) -> bool:
    depth = 0
    for part in path.parts:
        depth += -1 if part == ".." else 0 if part == "." else 1
        if depth < 0:
            return True
    return False


def _unsafe(name: str, why: str) -> SandboxRequestError:
    return SandboxRequestError(f"the checkout has an unsafe entry, refused: {name!r} {why}")


def _owned_by_us(member: tarfile.TarInfo) -> tarfile.TarInfo:
    """What the data filter does to a member's ownership and mode, for interpreters without it."""
    member.uid, member.gid, member.uname, member.gname = os.getuid(), os.getgid(), "", ""
    member.mode &= 0o755
    return member


def _inline(encoded: Any, limits: ArchiveLimits) -> bytes:
    if not isinstance(encoded, str):
        raise SandboxRequestError('"archive.inline" must be the base64 text of the .tar.gz')
    if len(encoded) // 4 * 3 > limits.archive_bytes:
        raise SandboxRequestError(
            f"the archive is larger than {limits.archive_bytes} bytes (SANDBOX_MAX_ARCHIVE_BYTES)"
        )
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as error:
        raise SandboxRequestError(f'"archive.inline" is not valid base64: {error}') from error


def _download(url: Any, size: Any, limits: ArchiveLimits) -> bytes:
    if not isinstance(url, str) or urllib.parse.urlsplit(url).scheme != "https":
        raise SandboxRequestError('"archive.url" must be an https URL (a presigned GET of the archive)')
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise SandboxRequestError('"archive.size" must be the archive\'s size in bytes')
    if size > limits.archive_bytes:
        raise SandboxRequestError(
            f"the archive is larger than {limits.archive_bytes} bytes (SANDBOX_MAX_ARCHIVE_BYTES)"
        )
    buffer = bytearray()
    try:
        with _https_opener().open(url, timeout=limits.download_timeout_seconds) as response:
            while chunk := response.read(_READ_CHUNK):
                buffer += chunk
                if len(buffer) > size:
                    raise SandboxRequestError(f"the archive at the URL is larger than the {size} bytes announced")
    except urllib.error.HTTPError as error:
        # 403: the presigned URL expired or is not valid; 404: the object is gone. Either way the worker uploads anew.
        raise SandboxRequestError(
            f"the archive could not be downloaded: HTTP {error.code}; run the job again", permanent=False
        ) from error
    except (urllib.error.URLError, OSError) as error:
        raise SandboxRequestError(f"the archive could not be downloaded: {error}", permanent=False) from error
    if len(buffer) != size:
        raise SandboxRequestError(f"the archive at the URL has {len(buffer)} bytes, not the {size} announced")
    return bytes(buffer)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A presigned GET answers with the object or an error; a redirect could lead off https, so it is an error."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _https_opener() -> urllib.request.OpenerDirector:
    # A context per download verifies against the trust store as configured now (SSL_CERT_FILE included).
    return urllib.request.build_opener(
        urllib.request.HTTPSHandler(context=ssl.create_default_context()), _NoRedirects()
    )


def _too_large(limits: ArchiveLimits) -> SandboxRequestError:
    return SandboxRequestError(
        f"the archive is larger than {limits.archive_bytes} bytes (SANDBOX_MAX_ARCHIVE_BYTES); test a smaller tree"
    )
