"""The limits on an apply_patch job's patch, shared by the API (which refuses a patch over them) and the worker (which
checks them again before any parsing: a message can reach the queue other ways).

Each limit bounds the work one patch can cost a worker: the bytes bound parsing, the hunks bound the searches, and
the search window bounds each search (`jobs.patching`). The API also refuses a "patch" that is no diff at all
(`not_a_diff_error`), which the worker's parser would refuse after the job was accepted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from agent_jobs.settings import Settings

DEFAULT_PATCH_MAX_BYTES: Final = 5_767_168  # MAX_REQUEST_BYTES: any patch the API can take at its defaults
DEFAULT_PATCH_MAX_HUNKS: Final = 5_000
DEFAULT_PATCH_SEARCH_WINDOW_LINES: Final = 1_000

_SPLIT_IT = "split the change into several apply_patch jobs (they run in order)"
# What every diff the worker can apply has: a git diff header, or a unified diff's file header and its first hunk.
_GIT_DIFF_HEADER = re.compile(r"^diff --git ", re.MULTILINE)
_UNIFIED_DIFF_FILE = re.compile(r"^--- [^\n]*\n\+\+\+ [^\n]*\n@@ -", re.MULTILINE)


@dataclass(frozen=True)
class PatchLimits:
    """PATCH_MAX_BYTES, PATCH_MAX_HUNKS and PATCH_SEARCH_WINDOW_LINES."""

    max_bytes: int = DEFAULT_PATCH_MAX_BYTES
    max_hunks: int = DEFAULT_PATCH_MAX_HUNKS
    search_window_lines: int = DEFAULT_PATCH_SEARCH_WINDOW_LINES

    @classmethod
    def from_settings(cls, settings: Settings) -> PatchLimits:
        return cls(settings.patch_max_bytes, settings.patch_max_hunks, settings.patch_search_window_lines)


def count_hunks(patch: str) -> int:
    """The hunk headers (`@@ -...`) of a unified diff, counted without parsing it: never fewer than a parser finds,
    which splits lines at `\\n` only and reads a hunk header only at the start of a line."""
    return patch.startswith("@@ -") + patch.count("\n@@ -")


def patch_bytes_error(patch: str, limits: PatchLimits) -> str | None:
    """Why `patch` is too large (PATCH_MAX_BYTES), or None."""
    size = len(patch.encode("utf-8", errors="surrogateescape"))
    if size <= limits.max_bytes:
        return None
    return (
        f"the patch is {size} bytes; the limit is {limits.max_bytes} bytes (PATCH_MAX_BYTES): {_SPLIT_IT}, or raise "
        "PATCH_MAX_BYTES in the environment of the API and worker functions"
    )


def patch_hunks_error(patch: str, limits: PatchLimits) -> str | None:
    """Why `patch` has too many hunks (PATCH_MAX_HUNKS), or None."""
    return hunk_count_error(count_hunks(patch), limits)


def hunk_count_error(hunks: int, limits: PatchLimits, what: str = "hunks") -> str | None:
    """Why `hunks` hunks (or file sections, `what`) are too many for one patch (PATCH_MAX_HUNKS), or None."""
    if hunks <= limits.max_hunks:
        return None
    return (
        f"the patch has {hunks} {what}; the limit is {limits.max_hunks} (PATCH_MAX_HUNKS): {_SPLIT_IT}, or raise "
        "PATCH_MAX_HUNKS in the environment of the API and worker functions"
    )


def not_a_diff_error(patch: str) -> str | None:
    """Why `patch` is no diff at all, or None: it has neither a git diff header (`diff --git`, which also starts a
    rename, a mode change or a binary file) nor a unified diff's file header with a hunk (`---`, `+++`, `@@ -`).
    Two searches of the text, no parsing: whether a diff applies is the worker's to find."""
    if _GIT_DIFF_HEADER.search(patch) or _UNIFIED_DIFF_FILE.search(patch):
        return None
    return (
        "the patch is not a diff: it has no git diff header (diff --git) and no file header with a hunk (--- a/<path>,"
        " +++ b/<path>, @@ -<line> ...); send what git diff (or diff -u) prints for the change"
    )
