"""Binary patches (`literal` and `delta` hunks) and bytes that are not UTF-8, as real git writes them, applied as git
applies them; and what a hostile binary hunk gets: a refusal naming the file, in bounded work."""

from __future__ import annotations

import base64
import os
import subprocess
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from job_worker.jobs import apply_patch
from job_worker.jobs.binary_patches import blob_id
from job_worker.jobs.context import JobContext
from job_worker.jobs.git_workspace import GitWorkspaceStore
from job_worker.jobs.patching import PatchDoesNotApplyError, apply_parsed_patch, apply_patch_to_files, parse_patch
from tests.git.conftest import apply_patch_job, branch_tree_id, committed_change, real_git

pytestmark = pytest.mark.skipif(
    subprocess.run(["git", "--version"], capture_output=True, check=False).returncode != 0,
    reason="git is not installed: the patches are made by real git",
)

PICTURE = bytes(range(256)) * 40 + b"\0end"


def _git(clone: Path, *args: str) -> bytes:
    return real_git(clone, *args)


def _write(clone: Path, name: str | bytes, content: bytes) -> None:
    path = clone / os.fsdecode(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)


def _move(clone: Path, old: str, new: str, content: bytes) -> None:
    (clone / old).unlink()
    _write(clone, new, content)


Step = Callable[[Path], object]
CASES: dict[str, tuple[Step | None, Step]] = {
    "binary file added": (None, lambda clone: _write(clone, "img/logo.png", PICTURE)),
    "binary file changed (delta)": (
        lambda clone: _write(clone, "img/logo.png", PICTURE),
        lambda clone: _write(clone, "img/logo.png", PICTURE[:5000] + b"changed" + PICTURE[5000:]),
    ),
    "binary file replaced (literal)": (
        lambda clone: _write(clone, "img/logo.png", PICTURE),
        lambda clone: _write(clone, "img/logo.png", os.urandom(3000)),
    ),
    "binary file deleted": (
        lambda clone: _write(clone, "img/logo.png", PICTURE),
        lambda clone: (clone / "img/logo.png").unlink(),
    ),
    "binary file renamed and changed": (
        lambda clone: _write(clone, "img/logo.png", PICTURE),
        lambda clone: _move(clone, "img/logo.png", "assets/logo.png", PICTURE + b"more"),
    ),
    "Latin-1 text changed": (
        lambda clone: _write(clone, "legacy.txt", "caf\xe9\nna\xefve\n".encode("latin-1")),
        lambda clone: _write(clone, "legacy.txt", "caf\xe9\nna\xefve\ncr\xe8me\n".encode("latin-1")),
    ),
    "file named in Latin-1": (None, lambda clone: _write(clone, "caf\xe9.txt".encode("latin-1"), b"hello\n")),
}
FORMATS = {
    "format-patch": ("format-patch", "-1", "--stdout"),
    "git diff --binary": ("diff", "--binary", "-M", "HEAD~1", "HEAD"),
}


@pytest.mark.parametrize("exported", sorted(FORMATS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_binary_or_not_utf8_patch_sent_as_base64_is_applied_as_git_applies_it(
    case: str, exported: str, remote: Path, make_store: Callable[..., GitWorkspaceStore], tmp_path: Path
) -> None:
    # Given a clone of the workspace's remote, the case's base on main, and the agent's change committed by git
    clone = committed_change(remote, tmp_path, *CASES[case], message=case)
    patch = _git(clone, *FORMATS[exported])

    # When the worker runs it as an apply_patch job whose patch is base64 (patchEncoding base64)
    job = apply_patch_job("job-1", patch, message=case)
    assert job.payload.patch_encoding == "base64"
    result = apply_patch.run(job, JobContext(workspace=make_store().open("ws-1"), remaining_ms=lambda: 60_000))

    # Then the branch's tree is git's, to the tree id
    assert result["alreadyApplied"] is False
    assert branch_tree_id(remote) == _git(clone, "rev-parse", "HEAD^{tree}").decode().strip()


# -- hostile or stale binary hunks --------------------------------------------------------------------------------


def _base85_lines(data: bytes) -> str:
    """`data` as git's binary patch lines: a length character, then base85 of up to 52 bytes."""
    lines = []
    for start in range(0, len(data), 52):
        chunk = data[start : start + 52]
        length = chr(ord("A") + len(chunk) - 1) if len(chunk) <= 26 else chr(ord("a") + len(chunk) - 27)
        padded = chunk + b"\0" * (-len(chunk) % 4)
        lines.append(length + base64.b85encode(padded).decode()[: (len(chunk) + 3) // 4 * 5])
    return "\n".join(lines)


def _literal_patch(
    path: str, old: bytes | None, new: bytes, *, size: int | None = None, data: bytes | None = None
) -> str:
    deflated = zlib.compress(new) if data is None else data
    old_id = blob_id(old) if old is not None else "0" * 40
    header = f"diff --git a/{path} b/{path}\n" + ("new file mode 100644\n" if old is None else "")
    return (
        f"{header}index {old_id}..{blob_id(new)}{'' if old is None else ' 100644'}\n"
        f"GIT binary patch\nliteral {len(new) if size is None else size}\n{_base85_lines(deflated)}\n\n"
    )


def _reader(files: dict[str, bytes]) -> Callable[[str], bytes | None]:
    return files.get


def test_a_literal_hunk_made_here_applies_byte_for_byte() -> None:
    # The test's own encoder and git's agree (the cases above): this one checks the hostile cases start from a hunk
    # that applies.
    changes = apply_patch_to_files(_literal_patch("a.bin", b"old\0", PICTURE), _reader({"a.bin": b"old\0"}))
    assert [(c.path, c.content) for c in changes] == [("a.bin", PICTURE)]


def test_a_binary_hunk_for_other_old_content_is_refused_naming_the_file() -> None:
    patch = _literal_patch("a.bin", b"what the agent saw\0", PICTURE)
    with pytest.raises(PatchDoesNotApplyError) as refused:
        apply_patch_to_files(patch, _reader({"a.bin": b"what the branch holds\0"}))
    assert refused.value.path == "a.bin"
    assert "applies to blob" in refused.value.reason


def test_a_binary_hunk_without_full_blob_ids_is_refused() -> None:
    patch = _literal_patch("a.bin", b"old\0", PICTURE)
    abbreviated = patch.replace(blob_id(b"old\0"), blob_id(b"old\0")[:7]).replace(
        blob_id(PICTURE), blob_id(PICTURE)[:7]
    )
    with pytest.raises(PatchDoesNotApplyError, match="index line with both blob ids in full"):
        apply_patch_to_files(abbreviated, _reader({"a.bin": b"old\0"}))


def test_a_binary_hunk_stating_a_huge_size_is_refused_before_inflating() -> None:
    # 5 MB of zeros deflate to 5 KB: a hunk may state no more than MAX_BLOB_BYTES, whatever its data
    zeros = b"\0" * 5_000_000
    patch = _literal_patch("big.bin", None, zeros)
    parsed = parse_patch(patch, max_file_bytes=1_000_000)
    with pytest.raises(PatchDoesNotApplyError, match="1000000 bytes in all, the limit of MAX_BLOB_BYTES") as refused:
        apply_parsed_patch(parsed, _reader({}))
    assert refused.value.path == "big.bin"


def test_a_binary_hunk_whose_data_inflates_beyond_its_stated_size_is_refused() -> None:
    zeros = b"\0" * 5_000_000
    patch = _literal_patch("big.bin", None, zeros, size=100)  # states 100 bytes: at most 101 are ever inflated
    with pytest.raises(PatchDoesNotApplyError, match="does not inflate to the 100 bytes"):
        apply_patch_to_files(patch, _reader({}))


def test_a_binary_hunk_that_makes_other_content_than_its_blob_id_is_refused() -> None:
    patch = _literal_patch("a.bin", None, PICTURE, data=zlib.compress(PICTURE[:-1] + b"X"))
    with pytest.raises(PatchDoesNotApplyError, match="makes blob"):
        apply_patch_to_files(patch, _reader({}))


@pytest.mark.parametrize(
    ("delta", "why"),
    [
        (bytes([4, 8, 0x91, 0, 9]), "does not apply"),  # copy 9 bytes at offset 0 of a 4-byte file
        (bytes([4, 8, 0x7F]) + b"x", "does not apply"),  # insert 127 bytes of 1
        (bytes([4, 8, 0]), "does not apply"),  # the zero command
        (bytes([4, 8, 0x91]), "does not apply"),  # a copy cut short
        (bytes([4, 1]) + b"\x80" * 1000, "does not apply"),  # 65 MB of copies stated as 1 byte: stops at once
        (bytes([4, 0x80]), "ends inside its header"),
        (bytes([5, 8, 1]) + b"x", "applies to 5 bytes but the file has 4"),
    ],
)
def test_a_malformed_binary_delta_is_refused(delta: bytes, why: str) -> None:
    old = b"abc\0"
    patch = (
        f"diff --git a/a.bin b/a.bin\nindex {blob_id(old)}..{blob_id(b'whatever')} 100644\n"
        f"GIT binary patch\ndelta {len(delta)}\n{_base85_lines(zlib.compress(delta))}\n\n"
    )
    with pytest.raises(PatchDoesNotApplyError, match=why) as refused:
        apply_patch_to_files(patch, _reader({"a.bin": old}))
    assert refused.value.path == "a.bin"


def test_a_binary_data_line_that_is_not_base85_is_refused() -> None:
    header = "GIT binary patch\nliteral 5\n"
    patch = _literal_patch("a.bin", None, b"\0data").replace(header, header + 'E"""""\n')
    with pytest.raises(PatchDoesNotApplyError, match="binary data line"):
        apply_patch_to_files(patch, _reader({}))


def test_binary_hunks_of_one_patch_make_at_most_max_blob_bytes_in_all() -> None:
    # Each section alone is within the limit; together they are not (a few KB of zlib could make gigabytes)
    sections = [_literal_patch(f"zeros-{n}.bin", None, b"\0" * 400_000) for n in range(3)]
    parsed = parse_patch("".join(sections), max_file_bytes=1_000_000)
    with pytest.raises(PatchDoesNotApplyError, match="make more than 1000000 bytes in all") as refused:
        apply_parsed_patch(parsed, _reader({}))
    assert refused.value.path == "zeros-2.bin"
    assert "MAX_BLOB_BYTES" in refused.value.reason
    assert len(apply_parsed_patch(parse_patch("".join(sections[:2]), max_file_bytes=1_000_000), _reader({}))) == 2


def test_copies_of_one_patch_read_their_source_once_and_make_at_most_max_blob_bytes() -> None:
    big = b"line\n" * 100_000  # 500 KB
    reads: list[str] = []

    def read(path: str) -> bytes | None:
        reads.append(path)
        return big if path == "big.txt" else None

    def copies(count: int) -> str:
        return "".join(
            f"diff --git a/big.txt b/copy-{n}.txt\nsimilarity index 100%\ncopy from big.txt\ncopy to copy-{n}.txt\n"
            for n in range(count)
        )

    made = apply_parsed_patch(parse_patch(copies(2), max_file_bytes=1_000_000), read)
    assert [change.content for change in made] == [big, big]
    assert reads.count("big.txt") == 1
    with pytest.raises(PatchDoesNotApplyError, match="make more than 1000000 bytes in all"):
        apply_parsed_patch(parse_patch(copies(3), max_file_bytes=1_000_000), read)


def test_a_quoted_name_with_raw_bytes_from_git_with_quote_path_off_is_applied(
    remote: Path, make_store: Callable[..., GitWorkspaceStore], tmp_path: Path
) -> None:
    # git -c core.quotePath=false leaves a name's high bytes raw, and still quotes it for its tab
    clone = committed_change(
        remote,
        tmp_path,
        None,
        lambda clone: _write(clone, "caf\xe9\tx.txt".encode("latin-1"), b"hello\n"),
        message="a name in Latin-1 with a tab",
    )
    patch = _git(clone, "-c", "core.quotePath=false", "diff", "HEAD~1", "HEAD")
    assert b'"b/caf\xe9\\tx.txt"' in patch

    apply_patch.run(apply_patch_job("job-1", patch), JobContext(make_store().open("ws-1"), lambda: 60_000))

    assert branch_tree_id(remote) == _git(clone, "rev-parse", "HEAD^{tree}").decode().strip()
