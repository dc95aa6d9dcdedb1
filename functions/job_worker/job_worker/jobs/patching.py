"""Applying an agent's patch to file contents, without a git binary.

`apply_patch_to_files` takes a git-format diff (`diff --git`, `new file mode`, `deleted file mode`,
`rename from`/`rename to`, `copy from`/`copy to`, `old mode`/`new mode`, `GIT binary patch`: `jobs.binary_patches`)
or a plain unified diff (`---`/`+++`/`@@`) and returns the new content of every file it touches. A patch is text or
bytes; bytes that are not UTF-8 (files and names in a legacy encoding) are carried as lone surrogates and written back
as the same bytes (`patch_text`). It checks every hunk's context and removed lines against the current content, as
`git apply` does: a hunk applies at the line it states or, when those lines moved, at the nearest place where all of
them match (never with fuzz) within PATCH_SEARCH_WINDOW_LINES lines of it. Anything else is a
`PatchDoesNotApplyError` that names the file and the hunk.

A patch's work is bounded (`agent_jobs.patch_limits`): a patch over PATCH_MAX_BYTES or PATCH_MAX_HUNKS is refused
before it is parsed, and the search for a hunk whose lines moved costs time linear in the window and the hunk, not in
the file, so a hostile patch cannot hold a worker for long.

Plain diffs are read as `git apply` reads them, with two differences: paths keep their first component unless it is
the usual `a/`/`b/` prefix, and a plain diff whose hunks only add lines (`@@ -0,0 +1,N @@`) creates its file when
the file is missing, as GNU patch does. A git-format diff says `new file mode` to create a file. Unlike `git apply`,
a file one section of the patch writes cannot be changed again by a later section (git diff never writes that).
"""

from __future__ import annotations

import re
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from unidiff.constants import DEV_NULL, LINE_TYPE_ADDED, LINE_TYPE_CONTEXT, LINE_TYPE_NO_NEWLINE, LINE_TYPE_REMOVED
from unidiff.errors import UnidiffParseError
from unidiff.patch import Hunk, PatchedFile, PatchSet

from agent_jobs.patch_limits import PatchLimits, hunk_count_error, patch_bytes_error, patch_hunks_error
from agent_jobs.settings import DEFAULT_MAX_BLOB_BYTES
from job_worker.jobs.binary_patches import (
    BINARY_MARKER,
    NULL_BLOB_ID,
    BinaryHunk,
    BinaryPatchError,
    apply_binary,
    binary_hunks,
)
from job_worker.jobs.errors import PermanentJobError

REGULAR_FILE_MODE = 0o100644
EXECUTABLE_FILE_MODE = 0o100755
SYMLINK_MODE = 0o120000
FILE_MODES = frozenset({REGULAR_FILE_MODE, EXECUTABLE_FILE_MODE, SYMLINK_MODE})

PATCH_AS_A_WHOLE = "<patch>"
"""The path a `PatchDoesNotApplyError` names when the patch as a whole is at fault (unparseable, empty)."""

_FIX_IT = "regenerate the patch against the branch head"
_SHOWN_LINE_CHARS = 80
_C_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}
_GIT_PREFIX = re.compile(r"^[abciow12]/")
# A `diff -u` header's time stamp (`2026-12-04 17:55:30.123456789 +0100`): `diff -N` dates a file that is absent on
# one side at the Unix epoch, in the local time zone.
_TIMESTAMP = re.compile(
    r"^(?P<date>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?:\.\d+)?(?: (?P<sign>[+-])(?P<hours>\d{2})(?P<minutes>\d{2}))?$"
)
_CODE_POINTS = 0x110000  # a line of a search window is one character of a string, its code point the line's number


class PatchDoesNotApplyError(PermanentJobError):
    """The patch cannot be applied to the workspace as it is: the message names the file and, if one, the hunk."""

    def __init__(self, path: str, hunk_number: int | None, reason: str, *, hunk_count: int | None = None) -> None:
        self.path = path
        self.hunk_number = hunk_number
        self.hunk_count = hunk_count
        self.reason = reason
        where = path
        if hunk_number is not None:
            where += f", hunk {hunk_number}" + (f" of {hunk_count}" if hunk_count else "")
        super().__init__(f"{where}: {reason}")


@dataclass(frozen=True)
class FileChange:
    """One file the patch touches, in patch order.

    `content` None deletes `path`. `old_path` is set for a rename: it no longer exists afterwards, and `path` takes
    its mode unless `mode` says otherwise. `mode` (a git file mode) is set only when the patch states one.
    """

    path: str
    content: bytes | None
    old_path: str | None = None
    mode: int | None = None
    copied_from: str | None = None  # a copy: `path` takes this file's mode unless `mode` says otherwise; it stays


@dataclass(frozen=True)
class _FileEntry:
    old_path: str | None  # None: the patch creates the file
    new_path: str | None  # None: the patch deletes the file
    hunks: Sequence[Hunk]
    git_format: bool
    new_mode: int | None
    binary: BinaryHunk | None = None  # a `GIT binary patch` section's forward hunk (then `hunks` is empty)
    copy: bool = False  # `copy from`/`copy to`: old_path stays


@dataclass(frozen=True)
class ParsedPatch:
    """A patch within its limits, parsed (`parse_patch`): what `apply_parsed_patch` applies to files."""

    entries: Sequence[_FileEntry]
    search_window_lines: int
    max_file_bytes: int = DEFAULT_MAX_BLOB_BYTES

    def binary_bytes(self) -> int:
        """What the patch's binary hunks state they make, in all (bounded by max_file_bytes when applied)."""
        return sum(entry.binary.size for entry in self.entries if entry.binary is not None)


def patch_text(patch: str | bytes) -> str:
    """A patch as text: bytes that are not UTF-8 (a file in a legacy encoding) become lone surrogates, which every
    line written back to a file turns into the same bytes again (`surrogateescape`)."""
    return patch.decode("utf-8", errors="surrogateescape") if isinstance(patch, bytes) else patch


def parse_patch(
    patch: str | bytes, limits: PatchLimits | None = None, *, max_file_bytes: int = DEFAULT_MAX_BLOB_BYTES
) -> ParsedPatch:
    """Check `patch` against `limits` (the defaults of PatchLimits when None) before parsing it, then parse it.
    A binary hunk may make a file of at most `max_file_bytes` (MAX_BLOB_BYTES).

    Raises PatchDoesNotApplyError when the patch is over its limits or cannot be parsed.
    """
    limits = limits or PatchLimits()
    text = patch_text(patch)
    too_large = patch_bytes_error(text, limits) or patch_hunks_error(text, limits)
    if too_large:
        raise PatchDoesNotApplyError(PATCH_AS_A_WHOLE, None, too_large)
    entries = _parse(text)
    too_many = hunk_count_error(len(entries), limits, "file sections")
    if too_many:
        raise PatchDoesNotApplyError(PATCH_AS_A_WHOLE, None, too_many)
    return ParsedPatch(entries, limits.search_window_lines, max_file_bytes)


def apply_patch_to_files(
    patch: str | bytes, read: Callable[[str], bytes | None], limits: PatchLimits | None = None
) -> list[FileChange]:
    """Apply `patch` to the files `read` returns (None: no such file) and return what changed, in patch order.

    Raises PatchDoesNotApplyError when the patch is over `limits` (the defaults of PatchLimits when None), cannot be
    parsed, creates a file that exists, modifies or deletes one that does not, or has a hunk whose context or removed
    lines differ from the file's content at its line and within the search window around it.
    """
    return apply_parsed_patch(parse_patch(patch, limits), read)


def apply_parsed_patch(patch: ParsedPatch, read: Callable[[str], bytes | None]) -> list[FileChange]:
    """`apply_patch_to_files` of a patch parsed already."""
    # What earlier entries of this patch did. A file one of them removed may come back (a rename, then a new file
    # of the old name; a file that becomes a symlink), but one of them wrote is not written again: each such section
    # would copy the whole file, so a small patch of many sections of one large file could take minutes and gigabytes.
    overlay: dict[str, bytes | None] = {}

    def current(path: str) -> bytes | None:
        if path not in overlay:
            return read(path)
        if overlay[path] is not None:
            raise PatchDoesNotApplyError(
                path,
                None,
                "an earlier section of the patch changes this file too; send one section per file, as git "
                "diff writes it",
            )
        return None

    originals: dict[str, bytes | None] = {}

    def original(path: str) -> bytes | None:
        # A copy is of its source as it was before the patch (git diff -C writes it so; git apply reads it so), read
        # once however many sections copy it.
        if path not in originals:
            originals[path] = read(path)
        return originals[path]

    # What binary hunks and copies make is not bounded by the patch's own size (a few bytes of zlib inflate to
    # megabytes; a copy section is one line): all of it together stays within one file's limit, MAX_BLOB_BYTES.
    made = 0
    changes: list[FileChange] = []
    for entry in patch.entries:
        if entry.binary is not None:
            made = _within_made_bytes(entry, made + entry.binary.size, patch.max_file_bytes)
        source = original if entry.copy else current
        change = _apply_entry(entry, current, source, patch.search_window_lines, patch.max_file_bytes)
        if entry.copy:
            made = _within_made_bytes(entry, made + len(change.content or b""), patch.max_file_bytes)
        if change.old_path is not None:
            overlay[change.old_path] = None
        overlay[change.path] = change.content
        changes.append(change)
    return changes


def _within_made_bytes(entry: _FileEntry, made: int, limit: int) -> int:
    if made > limit:
        raise PatchDoesNotApplyError(
            entry.new_path or entry.old_path or PATCH_AS_A_WHOLE,
            None,
            f"the patch's binary hunks and copies make more than {limit} bytes in all, the limit of MAX_BLOB_BYTES: "
            "split the change into several apply_patch jobs (they run in order), or raise MAX_BLOB_BYTES",
        )
    return made


def _parse(patch: str) -> list[_FileEntry]:
    try:
        patched_files = PatchSet(patch)
    except UnidiffParseError as error:
        raise PatchDoesNotApplyError(PATCH_AS_A_WHOLE, None, f"not a unified diff ({error}); {_FIX_IT}") from error
    if not patched_files:
        raise PatchDoesNotApplyError(
            PATCH_AS_A_WHOLE, None, f"no file changes found (no '---'/'+++' headers); {_FIX_IT}"
        )
    if BINARY_MARKER not in patch:
        return [_file_entry(patched) for patched in patched_files]
    # unidiff keeps no binary data: each `diff --git` section's binary hunk (or None), in order, read beside it.
    lines = patch.split("\n")
    try:
        found = binary_hunks(lines)
    except BinaryPatchError as error:
        raise PatchDoesNotApplyError(PATCH_AS_A_WHOLE, None, f"{error}; {_FIX_IT}") from error
    sections: dict[str, deque[BinaryHunk | None]] = defaultdict(deque)
    for number, line in enumerate(lines):
        if line.startswith("diff --git "):
            sections[line.rstrip("\r")].append(found.get(number))

    def binary_of(patched: PatchedFile) -> BinaryHunk | None:
        info = list(patched.patch_info or [])
        queue = sections.get(info[0].rstrip("\r\n")) if info and info[0].startswith("diff --git ") else None
        return queue.popleft() if queue else None

    return [_file_entry(patched, binary_of(patched)) for patched in patched_files]


def _file_entry(patched: PatchedFile, binary: BinaryHunk | None = None) -> _FileEntry:
    info = list(patched.patch_info or [])
    git_format = bool(info) and info[0].startswith("diff --git ")
    extended = {key: value for key, value in (_extended_header(line) for line in info) if key}
    shown = _strip_prefix(_unquote(patched.target_file if patched.target_file != DEV_NULL else patched.source_file))
    if (patched.is_binary_file or "GIT binary patch" in extended) and binary is None:
        raise PatchDoesNotApplyError(
            shown, None, "the patch says the binary file differs but carries no data; make it with git diff --binary"
        )
    old_path, new_path, copy = _paths(patched, extended, git_format)
    if binary is not None:
        # A binary section has no ---/+++ lines: which side is absent is its blob ids and its new/deleted file mode.
        old_path = None if binary.old_id == NULL_BLOB_ID and "new file mode" in extended else old_path
        new_path = None if binary.new_id == NULL_BLOB_ID and "deleted file mode" in extended else new_path
    for path in (old_path, new_path):
        if path is not None:
            _check_path(path)
    new_mode = _mode(patched.target_mode, new_path or old_path or shown)
    old_mode = _mode(patched.source_mode, old_path or shown)
    changes_mode = new_mode is not None and (old_path is None or new_mode != old_mode)
    if (
        not patched
        and binary is None
        and old_path == new_path
        and not changes_mode
        and old_path is not None
        and new_path is not None
    ):
        raise PatchDoesNotApplyError(new_path, None, f"the patch has no hunks for this file; {_FIX_IT}")
    return _FileEntry(
        old_path, new_path, list(patched), git_format, new_mode if changes_mode else None, binary=binary, copy=copy
    )


def _paths(patched: PatchedFile, extended: dict[str, str], git_format: bool) -> tuple[str | None, str | None, bool]:
    """The file a section changes before and after (None: absent on that side), and whether it is a copy."""
    old_path = None if patched.source_file == DEV_NULL else _strip_prefix(_unquote(patched.source_file), git_format)
    new_path = None if patched.target_file == DEV_NULL else _strip_prefix(_unquote(patched.target_file), git_format)
    if git_format and "rename from" in extended and "rename to" in extended:
        return _unquote(extended["rename from"]), _unquote(extended["rename to"]), False
    if git_format and "copy from" in extended and "copy to" in extended:
        return _unquote(extended["copy from"]), _unquote(extended["copy to"]), True
    if not git_format and old_path is not None and new_path is not None:
        old_path = new_path  # a plain diff names the file it patches in `+++` (`--- x.orig` / `+++ x`)
        # `diff -N` writes a file absent on one side as empty, dated at the epoch: git apply and GNU patch create it
        # (absent before) or delete it (absent after, when the hunks leave it empty), and so does this.
        if _at_epoch(patched.target_timestamp):
            new_path = None
        elif _at_epoch(patched.source_timestamp):
            old_path = None
    return old_path, new_path, False


def _at_epoch(timestamp: str | None) -> bool:
    """Whether a plain diff's header time stamp is the Unix epoch (in whatever time zone it is written)."""
    match = _TIMESTAMP.match((timestamp or "").strip())
    if match is None:
        return False
    when = datetime.strptime(match["date"], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    if match["sign"]:
        offset = timedelta(hours=int(match["hours"]), minutes=int(match["minutes"]))
        when -= offset if match["sign"] == "+" else -offset
    return when == datetime(1970, 1, 1, tzinfo=UTC)


def _extended_header(line: str) -> tuple[str, str]:
    for key in ("rename from", "rename to", "copy from", "copy to"):
        if line.startswith(key + " "):
            return key, line[len(key) + 1 :].rstrip("\r\n")
    for key in ("GIT binary patch", "new file mode", "deleted file mode"):
        if line.startswith(key):
            return key, ""
    return "", ""


def _mode(text: str | None, path: str) -> int | None:
    if text is None:
        return None
    mode = int(text, 8)
    if mode not in FILE_MODES:
        raise PatchDoesNotApplyError(path, None, f"file mode {text} is not supported (submodules cannot be patched)")
    return mode


def _unquote(name: str) -> str:
    """Undo git's C-style quoting of unusual paths (`"sp\\303\\251cial"` → `spécial`)."""
    if not (len(name) >= 2 and name.startswith('"') and name.endswith('"')):
        return name
    out = bytearray()
    body, index = name[1:-1], 0
    while index < len(body):
        char = body[index]
        if char != "\\":
            out += char.encode("utf-8", errors="surrogateescape")  # git leaves bytes raw with core.quotePath=false
            index += 1
            continue
        escape = body[index + 1 : index + 2]
        if escape in _C_ESCAPES:
            out.append(_C_ESCAPES[escape])
            index += 2
        elif re.fullmatch(r"[0-3][0-7]{2}", body[index + 1 : index + 4]):
            out.append(int(body[index + 1 : index + 4], 8))
            index += 4
        else:
            raise PatchDoesNotApplyError(name, None, "badly quoted path in the patch headers")
    return out.decode("utf-8", errors="surrogateescape")


def _strip_prefix(path: str, git_format: bool = True) -> str:
    if git_format:
        return _GIT_PREFIX.sub("", path, count=1)
    return path[2:] if path.startswith(("a/", "b/")) else path


def _check_path(path: str) -> None:
    parts = path.split("/")
    if not path or path.startswith("/") or any(part in ("", ".", "..", ".git") for part in parts) or "\0" in path:
        raise PatchDoesNotApplyError(path, None, "the path must be relative, inside the repository and not in .git")


def _apply_entry(
    entry: _FileEntry,
    current: Callable[[str], bytes | None],
    source: Callable[[str], bytes | None],
    window: int,
    max_file_bytes: int,
) -> FileChange:
    """The change `entry` makes; `source` reads the file it starts from, `current` any other."""
    if entry.binary is not None:
        return _apply_binary_entry(entry, entry.binary, current, source, max_file_bytes)
    if entry.old_path is None:
        assert entry.new_path is not None  # unidiff never yields /dev/null on both sides
        if current(entry.new_path) is not None:
            raise PatchDoesNotApplyError(entry.new_path, None, f"the patch creates this file but it exists; {_FIX_IT}")
        content = _apply_hunks(entry.new_path, b"", entry.hunks, window)
        return FileChange(entry.new_path, content, mode=entry.new_mode or REGULAR_FILE_MODE)

    original = source(entry.old_path)
    if original is None:
        only_additions = all(hunk.source_length == 0 for hunk in entry.hunks)
        if entry.git_format or not only_additions or entry.new_path is None:
            raise PatchDoesNotApplyError(entry.old_path, None, f"no such file in the workspace; {_FIX_IT}")
        # A plain diff that only adds lines creates its file, as GNU patch does.
        return FileChange(entry.new_path, _apply_hunks(entry.new_path, b"", entry.hunks, window), mode=entry.new_mode)

    content = _apply_hunks(entry.old_path, original, entry.hunks, window) if entry.hunks else original
    if entry.new_path is None:
        if content:
            remaining = content.count(b"\n") + (not content.endswith(b"\n"))
            raise PatchDoesNotApplyError(
                entry.old_path, None, f"the patch deletes this file but {remaining} of its lines are not in the patch"
            )
        return FileChange(entry.old_path, None)
    return _moved(entry, entry.old_path, entry.new_path, content, current)


def _moved(
    entry: _FileEntry, old_path: str, new_path: str, content: bytes, current: Callable[[str], bytes | None]
) -> FileChange:
    """The change of a section that keeps its file, renames it or copies it."""
    if new_path == old_path:
        return FileChange(new_path, content, mode=entry.new_mode)
    if current(new_path) is not None:
        what = "copies" if entry.copy else "renames"
        raise PatchDoesNotApplyError(new_path, None, f"the patch {what} a file to this path but it exists")
    if entry.copy:
        return FileChange(new_path, content, mode=entry.new_mode, copied_from=old_path)
    return FileChange(new_path, content, old_path=old_path, mode=entry.new_mode)


def _apply_binary_entry(
    entry: _FileEntry,
    hunk: BinaryHunk,
    current: Callable[[str], bytes | None],
    source: Callable[[str], bytes | None],
    max_file_bytes: int,
) -> FileChange:
    path = entry.new_path or entry.old_path
    assert path is not None
    original = None if entry.old_path is None else source(entry.old_path)
    if entry.old_path is None and entry.new_path is not None and current(entry.new_path) is not None:
        raise PatchDoesNotApplyError(entry.new_path, None, f"the patch creates this file but it exists; {_FIX_IT}")
    if entry.old_path is not None and original is None:
        raise PatchDoesNotApplyError(entry.old_path, None, f"no such file in the workspace; {_FIX_IT}")
    try:
        content = apply_binary(hunk, original, max_file_bytes)
    except BinaryPatchError as error:
        raise PatchDoesNotApplyError(path, None, f"binary patch: {error}; {_FIX_IT}") from error
    if entry.new_path is None or content is None:
        if entry.new_path is not None or entry.old_path is None:
            raise PatchDoesNotApplyError(path, None, "the binary patch's blob ids and file headers disagree")
        return FileChange(entry.old_path, None)
    if entry.old_path is None:
        return FileChange(entry.new_path, content, mode=entry.new_mode or REGULAR_FILE_MODE)
    return _moved(entry, entry.old_path, entry.new_path, content, current)


def _split_lines(content: bytes) -> list[bytes]:
    """Lines with their `\\n`; the last one lacks it when the file does not end with a newline."""
    lines = content.split(b"\n")
    last = lines.pop()
    return [line + b"\n" for line in lines] + ([last] if last else [])


def _hunk_sides(hunk: Hunk) -> tuple[list[bytes], list[bytes]]:
    """The hunk's lines before (context + removed) and after (context + added), as file bytes."""
    before: list[bytes] = []
    after: list[bytes] = []
    previous: list[list[bytes]] = []
    for line in hunk:
        if line.line_type == LINE_TYPE_NO_NEWLINE:
            # "\ No newline at end of file" applies to the line just above it, on the side(s) that line belongs to.
            for side in previous:
                side[-1] = side[-1].removesuffix(b"\n")
            continue
        value = line.value if line.value.endswith("\n") else line.value + "\n"
        text = value.encode("utf-8", errors="surrogateescape")
        if line.line_type == LINE_TYPE_CONTEXT:
            before.append(text)
            after.append(text)
            previous = [before, after]
        elif line.line_type == LINE_TYPE_REMOVED:
            before.append(text)
            previous = [before]
        elif line.line_type == LINE_TYPE_ADDED:
            after.append(text)
            previous = [after]
        else:
            previous = []  # a blank separator line after the hunk, not part of it
    return before, after


def _apply_hunks(path: str, content: bytes, hunks: Sequence[Hunk], window: int) -> bytes:
    lines = _split_lines(content)
    result: list[bytes] = []
    cursor = 0  # lines before this index are settled: a hunk cannot apply above the previous one
    drift = 0  # how far the previous hunk was from its stated line; the next one is looked for there first
    for number, hunk in enumerate(hunks, start=1):
        before, after = _hunk_sides(hunk)
        stated = hunk.source_start - 1 if hunk.source_length > 0 else hunk.source_start
        at = _find(lines, before, stated + drift, cursor, window)
        if at is None:
            reason = _mismatch(lines, before, max(stated, 0), cursor)
            if before and stated >= cursor:
                reason += f", and its lines are not within {window} lines of it either (PATCH_SEARCH_WINDOW_LINES)"
            raise PatchDoesNotApplyError(path, number, f"{reason}; {_FIX_IT}", hunk_count=len(hunks))
        result.extend(lines[cursor:at])
        result.extend(after)
        cursor = at + len(before)
        drift = at - stated
    result.extend(lines[cursor:])
    return b"".join(result)


def _find(lines: list[bytes], before: list[bytes], preferred: int, cursor: int, window: int) -> int | None:
    """Where `before` matches `lines`: at `preferred`, else at the nearest place at or after `cursor` and at most
    `window` lines from `preferred` (above it when two are as near)."""
    last_start = len(lines) - len(before)
    if cursor <= preferred <= last_start and lines[preferred : preferred + len(before)] == before:
        return preferred
    if not before:
        return None  # a hunk with no context and nothing removed only applies where it says
    low, high = max(cursor, preferred - window), min(last_start, preferred + window)
    if low > high:
        return None
    at = _nearest(lines[low : high + len(before)], before, preferred - low)
    return None if at is None else low + at


def _nearest(region: list[bytes], before: list[bytes], preferred: int) -> int | None:
    """Where in `region` `before` matches nearest to `preferred` (above it when two are as near), in time linear in
    their lengths: each line becomes one character (its number among the region's distinct lines), and str.find,
    whose worst case is linear, looks for the hunk's string below `preferred` and, in the reversed string, above."""
    numbers = dict(zip(region, range(len(region)), strict=True))  # a line's number: where it last is in the region
    if any(line not in numbers for line in before):
        return None
    text, needle = (
        "".join(map(chr, map(numbers.__getitem__, lines)))
        if len(region) <= _CODE_POINTS
        else "".join([chr(numbers[line] % _CODE_POINTS) for line in lines])
        for lines in (region, before)
    )
    size, length = len(text), len(needle)

    def matches(at: int) -> bool:  # false only when two line numbers share a code point (over 1,114,112 lines)
        return region[at : at + length] == before

    below = text.find(needle, max(preferred, 0))
    while below >= 0 and not matches(below):
        below = text.find(needle, below + 1)
    reversed_text, reversed_needle = text[::-1], needle[::-1]
    # A match at `at` in text is one at `size - at - length` in the reversed text: the first there from the point
    # that stands for `preferred - 1` is the last match above `preferred`.
    start = size - min(preferred, size - length + 1) + 1 - length
    above = reversed_text.find(reversed_needle, max(start, 0)) if preferred > 0 else -1
    while above >= 0 and not matches(size - above - length):
        above = reversed_text.find(reversed_needle, above + 1)
    above = size - above - length if above >= 0 else -1
    if above >= 0 and (below < 0 or preferred - above <= below - preferred):
        return above
    return below if below >= 0 else None


def _mismatch(lines: list[bytes], before: list[bytes], stated: int, cursor: int) -> str:
    if stated < cursor:
        return f"overlaps the previous hunk (starts at line {stated + 1}, the previous one ends at line {cursor})"
    if not before:
        return f"inserts after line {stated} but the file has {len(lines)} lines"
    for offset, expected in enumerate(before):
        index = stated + offset
        found = _show(lines[index]) if index < len(lines) else "end of file"
        if index >= len(lines) or lines[index] != expected:
            return f"line {index + 1} expected {_show(expected)} found {found}"
    return f"its lines match at line {stated + 1} only out of order with the other hunks"


def _show(line: bytes) -> str:
    text = line.decode("utf-8", errors="replace").removesuffix("\n")
    if len(text) > _SHOWN_LINE_CHARS:
        text = text[: _SHOWN_LINE_CHARS - 3] + "..."
    # Two lines can differ only in the newline at the end of the file: say so, or the message would show no difference.
    return repr(text) + ("" if line.endswith(b"\n") else " (no newline at end of file)")
