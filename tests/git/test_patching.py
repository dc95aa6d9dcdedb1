"""jobs.patching: every kind of change, as a git-format and as a plain unified diff, and the patches that must fail."""

from __future__ import annotations

import random
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from agent_jobs.patch_limits import PatchLimits
from job_worker.jobs.errors import PermanentJobError
from job_worker.jobs.patching import (
    EXECUTABLE_FILE_MODE,
    PATCH_AS_A_WHOLE,
    REGULAR_FILE_MODE,
    FileChange,
    PatchDoesNotApplyError,
    apply_patch_to_files,
)
from tests.git.conftest import SEED_FILES, diff

# Each kind of change: (git-format patch, plain unified diff of the same change, the files it changes).
# The git-format ones are what `git diff --cached -M` prints; the plain ones what it prints with --no-renames and
# without the git header lines. A rename has no plain form: the plain diff deletes and adds.
RENAMED_CONTENT = b"alpha\nBETA\ngamma\n"
CASES: dict[str, tuple[str, str, Mapping[str, bytes | None]]] = {
    "add": (
        diff(
            "diff --git a/new.txt b/new.txt",
            "new file mode 100644",
            "index 0000000..422c2b7",
            "--- /dev/null",
            "+++ b/new.txt",
            "@@ -0,0 +1,2 @@",
            "+a",
            "+b",
        ),
        diff("--- /dev/null", "+++ b/new.txt", "@@ -0,0 +1,2 @@", "+a", "+b"),
        {"new.txt": b"a\nb\n"},
    ),
    "modify": (
        diff(
            "diff --git a/src/app.py b/src/app.py",
            "index 3b6b41c..6bf40aa 100644",
            "--- a/src/app.py",
            "+++ b/src/app.py",
            "@@ -2,4 +2,4 @@ import os",
            " ",
            " ",
            " def main():",
            '-    print("hello")',
            '+    print("hello, world")',
        ),
        diff(
            "--- a/src/app.py",
            "+++ b/src/app.py",
            "@@ -2,4 +2,4 @@ import os",
            " ",
            " ",
            " def main():",
            '-    print("hello")',
            '+    print("hello, world")',
        ),
        {"src/app.py": b'import os\n\n\ndef main():\n    print("hello, world")\n'},
    ),
    "delete": (
        diff(
            "diff --git a/old/name.txt b/old/name.txt",
            "deleted file mode 100644",
            "index 85c3040..0000000",
            "--- a/old/name.txt",
            "+++ /dev/null",
            "@@ -1,3 +0,0 @@",
            "-alpha",
            "-beta",
            "-gamma",
        ),
        diff("--- a/old/name.txt", "+++ /dev/null", "@@ -1,3 +0,0 @@", "-alpha", "-beta", "-gamma"),
        {"old/name.txt": None},
    ),
    "rename": (
        diff(
            "diff --git a/old/name.txt b/new/name.txt",
            "similarity index 100%",
            "rename from old/name.txt",
            "rename to new/name.txt",
        ),
        diff(
            "--- /dev/null",
            "+++ b/new/name.txt",
            "@@ -0,0 +1,3 @@",
            "+alpha",
            "+beta",
            "+gamma",
            "--- a/old/name.txt",
            "+++ /dev/null",
            "@@ -1,3 +0,0 @@",
            "-alpha",
            "-beta",
            "-gamma",
        ),
        {"old/name.txt": None, "new/name.txt": b"alpha\nbeta\ngamma\n"},
    ),
    "rename_and_modify": (
        diff(
            "diff --git a/old/name.txt b/new/name.txt",
            "similarity index 70%",
            "rename from old/name.txt",
            "rename to new/name.txt",
            "index 85c3040..e50310a 100644",
            "--- a/old/name.txt",
            "+++ b/new/name.txt",
            "@@ -1,3 +1,3 @@",
            " alpha",
            "-beta",
            "+BETA",
            " gamma",
        ),
        diff(
            "--- /dev/null",
            "+++ b/new/name.txt",
            "@@ -0,0 +1,3 @@",
            "+alpha",
            "+BETA",
            "+gamma",
            "--- a/old/name.txt",
            "+++ /dev/null",
            "@@ -1,3 +0,0 @@",
            "-alpha",
            "-beta",
            "-gamma",
        ),
        {"old/name.txt": None, "new/name.txt": RENAMED_CONTENT},
    ),
    "multi_hunk": (
        diff(
            "diff --git a/docs/notes.txt b/docs/notes.txt",
            "index ac9837c..923cd5e 100644",
            "--- a/docs/notes.txt",
            "+++ b/docs/notes.txt",
            "@@ -1,6 +1,6 @@",
            " line 1",
            " line 2",
            "-line 3",
            "+line three",
            " line 4",
            " line 5",
            " line 6",
            "@@ -24,7 +24,7 @@ line 23",
            " line 24",
            " line 25",
            " line 26",
            "-line 27",
            "+line twenty-seven",
            " line 28",
            " line 29",
            " line 30",
        ),
        diff(
            "--- a/docs/notes.txt",
            "+++ b/docs/notes.txt",
            "@@ -1,6 +1,6 @@",
            " line 1",
            " line 2",
            "-line 3",
            "+line three",
            " line 4",
            " line 5",
            " line 6",
            "@@ -24,7 +24,7 @@ line 23",
            " line 24",
            " line 25",
            " line 26",
            "-line 27",
            "+line twenty-seven",
            " line 28",
            " line 29",
            " line 30",
        ),
        {
            "docs/notes.txt": SEED_FILES["docs/notes.txt"]
            .replace(b"line 3\n", b"line three\n", 1)
            .replace(b"line 27\n", b"line twenty-seven\n")
        },
    ),
    "no_newline_at_eof_kept": (
        diff(
            "diff --git a/tail.txt b/tail.txt",
            "index 3db2aff..a054364 100644",
            "--- a/tail.txt",
            "+++ b/tail.txt",
            "@@ -1,2 +1,2 @@",
            " first",
            "-last",
            "\\ No newline at end of file",
            "+last line",
            "\\ No newline at end of file",
        ),
        diff(
            "--- a/tail.txt",
            "+++ b/tail.txt",
            "@@ -1,2 +1,2 @@",
            " first",
            "-last",
            "\\ No newline at end of file",
            "+last line",
            "\\ No newline at end of file",
        ),
        {"tail.txt": b"first\nlast line"},
    ),
    "no_newline_at_eof_fixed": (
        diff(
            "diff --git a/tail.txt b/tail.txt",
            "index 3db2aff..a763886 100644",
            "--- a/tail.txt",
            "+++ b/tail.txt",
            "@@ -1,2 +1,2 @@",
            " first",
            "-last",
            "\\ No newline at end of file",
            "+last",
        ),
        diff(
            "--- a/tail.txt",
            "+++ b/tail.txt",
            "@@ -1,2 +1,2 @@",
            " first",
            "-last",
            "\\ No newline at end of file",
            "+last",
        ),
        {"tail.txt": b"first\nlast\n"},
    ),
    "several_files": (
        diff(
            "diff --git a/src/app.py b/src/app.py",
            "index 3b6b41c..9c59e24 100644",
            "--- a/src/app.py",
            "+++ b/src/app.py",
            "@@ -1,5 +1 @@",
            "-import os",
            "-",
            "-",
            "-def main():",
            '-    print("hello")',
            "+first",
            "diff --git a/tail.txt b/tail.txt",
            "index 3db2aff..6b0b469 100644",
            "--- a/tail.txt",
            "+++ b/tail.txt",
            "@@ -1,2 +1,3 @@",
            " first",
            "-last",
            "\\ No newline at end of file",
            "+last",
            "+more",
            "\\ No newline at end of file",
        ),
        diff(
            "--- a/src/app.py",
            "+++ b/src/app.py",
            "@@ -1,5 +1 @@",
            "-import os",
            "-",
            "-",
            "-def main():",
            '-    print("hello")',
            "+first",
            "--- a/tail.txt",
            "+++ b/tail.txt",
            "@@ -1,2 +1,3 @@",
            " first",
            "-last",
            "\\ No newline at end of file",
            "+last",
            "+more",
            "\\ No newline at end of file",
        ),
        {"src/app.py": b"first\n", "tail.txt": b"first\nlast\nmore"},
    ),
}
FORMATS = ("git", "plain")


def apply_to_seed(patch: str, files: Mapping[str, bytes] = SEED_FILES) -> dict[str, bytes]:
    """The files after `patch`, computed from the FileChanges the way a workspace applies them."""
    result = dict(files)
    for change in apply_patch_to_files(patch, result.get):
        if change.old_path is not None:
            del result[change.old_path]
        if change.content is None:
            del result[change.path]
        else:
            result[change.path] = change.content
    return result


def expected_files(changes: Mapping[str, bytes | None]) -> dict[str, bytes]:
    result = dict(SEED_FILES)
    for path, content in changes.items():
        if content is None:
            del result[path]
        else:
            result[path] = content
    return result


@pytest.mark.parametrize("form", FORMATS)
@pytest.mark.parametrize("kind", CASES)
def test_apply_patch_to_files_applies_each_kind_of_change(kind: str, form: str) -> None:
    git_patch, plain_patch, changes = CASES[kind]

    result = apply_to_seed(git_patch if form == "git" else plain_patch)

    assert result == expected_files(changes)


def test_apply_patch_to_files_reports_a_rename_with_its_old_path() -> None:
    changes = apply_patch_to_files(CASES["rename_and_modify"][0], SEED_FILES.get)

    assert changes == [FileChange("new/name.txt", RENAMED_CONTENT, old_path="old/name.txt")]


@pytest.mark.skipif(shutil.which("git") is None, reason="cross-check needs the git binary")
@pytest.mark.parametrize("form", FORMATS)
@pytest.mark.parametrize("kind", CASES)
def test_apply_patch_to_files_agrees_with_git_apply(kind: str, form: str, tmp_path: Path) -> None:
    # Given the seed files in a folder, and the same patch applied by `git apply` there
    for path, content in SEED_FILES.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(content)
    patch = CASES[kind][0] if form == "git" else CASES[kind][1]
    subprocess.run(["git", "apply", "-"], cwd=tmp_path, input=patch.encode(), check=True, capture_output=True)
    by_git = {str(p.relative_to(tmp_path)): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}

    # Then ours gives the same files, byte for byte
    assert apply_to_seed(patch) == by_git


def test_apply_patch_to_files_names_the_file_and_hunk_that_do_not_apply() -> None:
    # Given notes.txt whose line 24 changed since the patch was made
    files = dict(SEED_FILES)
    files["docs/notes.txt"] = files["docs/notes.txt"].replace(b"line 24\n", b"line 24 changed\n")

    with pytest.raises(PatchDoesNotApplyError) as raised:
        apply_patch_to_files(CASES["multi_hunk"][0], files.get)

    assert str(raised.value).startswith(
        "docs/notes.txt, hunk 2 of 2: line 24 expected 'line 24' found 'line 24 changed'"
    )
    assert "regenerate the patch against the branch head" in str(raised.value)
    assert (raised.value.path, raised.value.hunk_number, raised.value.hunk_count) == ("docs/notes.txt", 2, 2)
    assert isinstance(raised.value, PermanentJobError)  # the job is DEAD and its workspace halts, not retried


def test_apply_patch_to_files_says_when_only_the_newline_at_end_of_file_differs() -> None:
    files = dict(SEED_FILES, **{"tail.txt": b"first\nlast\n"})

    with pytest.raises(PatchDoesNotApplyError, match=r"tail.txt, hunk 1 of 1: line 2 expected 'last' \(no newline"):
        apply_patch_to_files(CASES["no_newline_at_eof_kept"][0], files.get)


def test_apply_patch_to_files_finds_hunks_whose_lines_moved() -> None:
    # Given two lines inserted at the top of notes.txt after the patch was made: both hunks are 2 lines further down
    files = dict(SEED_FILES)
    files["docs/notes.txt"] = b"new 1\nnew 2\n" + files["docs/notes.txt"]

    result = apply_to_seed(CASES["multi_hunk"][0], files)

    assert result["docs/notes.txt"] == b"new 1\nnew 2\n" + expected_files(CASES["multi_hunk"][2])["docs/notes.txt"]


@pytest.mark.parametrize(
    ("patch", "path", "reason"),
    [
        (
            diff("--- /dev/null", "+++ b/README.md", "@@ -0,0 +1 @@", "+again"),
            "README.md",
            "creates this file but it exists",
        ),
        (
            diff("diff --git a/gone.py b/gone.py", "--- a/gone.py", "+++ b/gone.py", "@@ -1 +1 @@", "-a", "+b"),
            "gone.py",
            "no such file",
        ),
        (diff("--- a/gone.py", "+++ /dev/null", "@@ -1 +0,0 @@", "-a"), "gone.py", "no such file"),
        (diff("--- a/gone.py", "+++ b/gone.py", "@@ -1 +1 @@", "-a", "+b"), "gone.py", "no such file"),
        (
            diff("--- a/old/name.txt", "+++ /dev/null", "@@ -1,2 +0,0 @@", "-alpha", "-beta"),
            "old/name.txt",
            "deletes this file but 1 of its lines are not in the patch",
        ),
        (
            diff("diff --git a/README.md b/tail.txt", "rename from README.md", "rename to tail.txt"),
            "tail.txt",
            "renames a file to this path but it exists",
        ),
        (diff("--- /dev/null", "+++ b/../escape.txt", "@@ -0,0 +1 @@", "+x"), "../escape.txt", "must be relative"),
        (diff("--- /dev/null", "+++ b/.git/hooks/pre-commit", "@@ -0,0 +1 @@", "+x"), ".git/hooks/pre-commit", ".git"),
        # A plain diff's side dated at the epoch deletes or creates its file: still only inside the repository
        (
            diff(
                "--- a/../escape.txt\t2026-12-04 10:00:00.000000000 +0000",
                "+++ b/../escape.txt\t1970-01-01 00:00:00.000000000 +0000",
                "@@ -1 +0,0 @@",
                "-x",
            ),
            "../escape.txt",
            "must be relative",
        ),
        (
            diff(
                "--- a/.git/hooks/pre-commit\t1970-01-01 01:00:00.000000000 +0100",
                "+++ b/.git/hooks/pre-commit\t2026-12-04 10:00:00.000000000 +0000",
                "@@ -0,0 +1 @@",
                "+x",
            ),
            ".git/hooks/pre-commit",
            ".git",
        ),
        (
            diff(
                "diff --git a/logo.png b/logo.png",
                "index 1111111..2222222 100644",
                "Binary files a/logo.png and b/logo.png differ",
            ),
            "logo.png",
            "the binary file differs but carries no data; make it with git diff --binary",
        ),
    ],
)
def test_apply_patch_to_files_refuses_a_change_the_workspace_cannot_take(patch: str, path: str, reason: str) -> None:
    with pytest.raises(PatchDoesNotApplyError) as raised:
        apply_patch_to_files(patch, SEED_FILES.get)

    assert raised.value.path == path
    assert raised.value.hunk_number is None
    assert reason in str(raised.value)


@pytest.mark.parametrize(
    "patch",
    [
        "this is not a diff\n",
        diff("@@ -1 +1 @@", "-a", "+b"),  # a hunk without file headers
        diff("--- a/README.md", "+++ b/README.md", "@@ -1,3 +1,3 @@", " # demo"),  # shorter than its header says
    ],
)
def test_apply_patch_to_files_refuses_what_is_not_a_unified_diff(patch: str) -> None:
    with pytest.raises(PatchDoesNotApplyError) as raised:
        apply_patch_to_files(patch, SEED_FILES.get)

    assert raised.value.path == PATCH_AS_A_WHOLE


def test_apply_patch_to_files_plain_insertion_at_line_zero_creates_or_prepends() -> None:
    # The product's own sample patches: `@@ -0,0 +1 @@` creates a missing file and prepends to an existing one.
    creates = diff("--- a/src/new.txt", "+++ b/src/new.txt", "@@ -0,0 +1 @@", "+change 1 by agent")
    prepends = diff("--- a/README.md", "+++ b/README.md", "@@ -0,0 +1 @@", "+change 2 by agent")

    assert apply_to_seed(creates)["src/new.txt"] == b"change 1 by agent\n"
    assert apply_to_seed(prepends)["README.md"] == b"change 2 by agent\n# demo\n"


def test_apply_patch_to_files_reads_modes_and_quoted_paths() -> None:
    mode_change = diff("diff --git a/tail.txt b/tail.txt", "old mode 100644", "new mode 100755")
    quoted = diff(
        'diff --git "a/\\303\\251 file.txt" "b/\\303\\251 file.txt"',
        "new file mode 100755",
        "index 0000000..587be6b",
        "--- /dev/null",
        '+++ "b/\\303\\251 file.txt"\t',
        "@@ -0,0 +1 @@",
        "+x",
    )

    assert apply_patch_to_files(mode_change, SEED_FILES.get) == [
        FileChange("tail.txt", SEED_FILES["tail.txt"], mode=EXECUTABLE_FILE_MODE)
    ]
    assert apply_patch_to_files(quoted, SEED_FILES.get) == [FileChange("é file.txt", b"x\n", mode=EXECUTABLE_FILE_MODE)]
    assert apply_patch_to_files(CASES["add"][1], SEED_FILES.get)[0].mode == REGULAR_FILE_MODE


def numbered_file(lines: int) -> bytes:
    return "".join(f"line {n}\n" for n in range(lines)).encode()


def scattered_hunks(hunks: int, lines: int, stated: random.Random, *, offset: int | None = None) -> str:
    """A patch of `hunks` one-line changes of a `numbered_file(lines)`, of lines 0, 2, 4 ...: each hunk states a
    random line of the file, or with `offset` one at most that far from its own."""
    out = ["--- a/big.txt", "+++ b/big.txt"]
    for number in range(hunks):
        actual = 2 * number
        near = max(1, actual + 1 + stated.randint(-offset, offset)) if offset is not None else 0
        line = near or stated.randrange(lines) + 1
        out += [f"@@ -{line},1 +{line},1 @@", f"-line {actual}", f"+new {actual}"]
    return diff(*out)


def test_apply_patch_to_files_bounds_the_search_for_hunks_stated_far_from_their_lines() -> None:
    # Given 4,000 hunks each stating a line far from the one it changes: a search of the whole file for each would
    # take tens of seconds of CPU, enough to hold an invocation until its Timeout on every delivery
    lines = 40_000
    patch = scattered_hunks(4_000, lines, random.Random(7))
    assert len(patch) > 150_000

    started = time.process_time()
    with pytest.raises(PatchDoesNotApplyError) as raised:
        apply_patch_to_files(patch, {"big.txt": numbered_file(lines)}.get)
    cpu = time.process_time() - started
    print(f"4,000 hunks stated far from their lines ({len(patch)} bytes): refused in {cpu:.3f} s of CPU")

    # Then the first hunk whose lines are not near its stated line fails the patch, saying why and which knob
    assert (raised.value.path, raised.value.hunk_number, raised.value.hunk_count) == ("big.txt", 1, 4_000)
    assert "not within 1000 lines of it either (PATCH_SEARCH_WINDOW_LINES)" in str(raised.value)
    assert isinstance(raised.value, PermanentJobError)


def test_apply_patch_to_files_finds_every_hunk_within_the_window_in_bounded_work() -> None:
    # Given 4,000 hunks each stated up to 490 lines away from its line (the search carries the previous hunk's
    # offset, so each is at most 980 lines from where it is looked for first)
    lines = 8_010
    patch = scattered_hunks(4_000, lines, random.Random(7), offset=490)

    started = time.process_time()
    [change] = apply_patch_to_files(patch, {"big.txt": numbered_file(lines)}.get)
    cpu = time.process_time() - started
    print(f"4,000 hunks within the search window ({len(patch)} bytes): applied in {cpu:.3f} s of CPU")

    # Then each applies at its own line
    assert change.content is not None
    changed = change.content.decode().splitlines()
    assert changed[:4] == ["new 0", "line 1", "new 2", "line 3"]
    assert changed[7_998:] == ["new 7998", "line 7999", *[f"line {n}" for n in range(8_000, lines)]]


@pytest.mark.parametrize(("moved", "applies"), [(5, True), (6, False)])
def test_apply_patch_to_files_looks_for_moved_lines_within_the_window_only(moved: int, applies: bool) -> None:
    # Given a hunk whose lines moved `moved` lines down, and a search window of 5 lines
    files = {"notes.txt": b"new\n" * moved + numbered_file(20)}
    patch = diff("--- a/notes.txt", "+++ b/notes.txt", "@@ -3,3 +3,3 @@", " line 2", "-line 3", "+LINE 3", " line 4")
    limits = PatchLimits(search_window_lines=5)

    if applies:
        [change] = apply_patch_to_files(patch, files.get, limits)
        assert change.content == files["notes.txt"].replace(b"line 3\n", b"LINE 3\n")
    else:
        with pytest.raises(PatchDoesNotApplyError) as raised:
            apply_patch_to_files(patch, files.get, limits)
        assert (raised.value.path, raised.value.hunk_number) == ("notes.txt", 1)
        assert "not within 5 lines of it either" in str(raised.value)


def test_apply_patch_to_files_prefers_the_nearest_place_above_on_a_tie() -> None:
    # Given the hunk's lines 3 lines above and 3 lines below its stated line (and farther away, too)
    files = {"f.txt": b"x\na\nb\nx\nx\nx\nx\na\nb\nx\na\nb\n"}
    patch = diff("--- a/f.txt", "+++ b/f.txt", "@@ -5,2 +5,2 @@", " a", "-b", "+B")

    [change] = apply_patch_to_files(patch, files.get)

    assert change.content == b"x\na\nB\nx\nx\nx\nx\na\nb\nx\na\nb\n"


def test_apply_patch_to_files_search_of_repeated_lines_stays_linear() -> None:
    # Given a file of blocks of 99 lines, all alike but the middle one, and 1,000 hunks, one per block, each stated up
    # to 450 lines away from its block: a line-by-line comparison at every place of the window would compare dozens
    # of lines at each of hundreds of places for every hunk
    blocks, stated = 1_000, random.Random(7)
    files = {"f.txt": b"".join(b"a\n" * 49 + f"b {m}\n".encode() + b"a\n" * 49 for m in range(blocks))}
    hunks = [
        line
        for m in range(blocks)
        for at in [max(1, 99 * m + 1 + stated.randint(-450, 450))]
        for line in (f"@@ -{at},99 +{at},99 @@", *[" a"] * 49, f"-b {m}", f"+B {m}", *[" a"] * 49)
    ]
    patch = diff("--- a/f.txt", "+++ b/f.txt", *hunks)

    started = time.process_time()
    [change] = apply_patch_to_files(patch, files.get)
    cpu = time.process_time() - started
    print(f"1,000 hunks of 99 lines alike but one ({len(patch)} bytes): applied in {cpu:.3f} s of CPU")

    # Then each hunk applied to its own block
    assert change.content == files["f.txt"].replace(b"b ", b"B ")


@pytest.mark.parametrize(
    ("limits", "limit"),
    [
        (PatchLimits(max_bytes=1024), "the patch is 2000 bytes; the limit is 1024 bytes (PATCH_MAX_BYTES)"),
        (PatchLimits(max_hunks=9), "the patch has 10 hunks; the limit is 9 (PATCH_MAX_HUNKS)"),
    ],
)
def test_apply_patch_to_files_refuses_a_patch_over_a_limit_before_parsing_it(limits: PatchLimits, limit: str) -> None:
    # Given a patch of 10 hunks and 2,000 bytes
    hunks = [line for n in range(1, 11) for line in (f"@@ -{n},1 +{n},1 @@", f"-line {n - 1}", f"+new {n - 1}")]
    patch = diff("--- a/big.txt", "+++ b/big.txt", *hunks)
    patch += "#" * (2000 - len(patch) - 1) + "\n"  # text after a diff is ignored, as git apply ignores it

    with pytest.raises(PatchDoesNotApplyError) as raised:
        apply_patch_to_files(patch, {"big.txt": numbered_file(20)}.get, limits)

    assert raised.value.path == PATCH_AS_A_WHOLE
    assert limit in str(raised.value)
    assert "split the change into several apply_patch jobs" in str(raised.value)
    assert len(apply_patch_to_files(patch, {"big.txt": numbered_file(20)}.get)) == 1  # the defaults take it


def test_apply_patch_to_files_counts_file_sections_against_the_hunk_limit() -> None:
    # Given a patch that only changes modes, of more files than PATCH_MAX_HUNKS: each section costs work
    patch = "".join(diff(f"diff --git a/f{n} b/f{n}", "old mode 100644", "new mode 100755") for n in range(4))

    with pytest.raises(
        PatchDoesNotApplyError, match=r"the patch has 4 file sections; the limit is 3 \(PATCH_MAX_HUNKS"
    ):
        apply_patch_to_files(patch, {f"f{n}": b"x\n" for n in range(4)}.get, PatchLimits(max_hunks=3))


def test_apply_patch_to_files_refuses_a_second_section_writing_one_file() -> None:
    # Given a 24 KB patch of 500 sections, each changing the first line of one 1 MB file again: each section would
    # copy the whole file (it took 3 s of CPU and kept 520 MB of contents)
    content = b"".join(b"line %d %s\n" % (n, b"x" * 30) for n in range(25_000))
    first = "line 0 " + "x" * 30
    sections = [
        line
        for n in range(500)
        for line in ("--- a/f.txt", "+++ b/f.txt", "@@ -1 +1 @@", f"-{first if n == 0 else f'v{n - 1}'}", f"+v{n}")
    ]
    patch = diff(*sections)

    started = time.process_time()
    with pytest.raises(PatchDoesNotApplyError) as raised:
        apply_patch_to_files(patch, {"f.txt": content}.get)
    cpu = time.process_time() - started
    print(f"500 sections of one {len(content):,}-byte file ({len(patch):,}-byte patch): refused in {cpu:.3f} s of CPU")

    # Then the second section is refused, naming the file
    assert (raised.value.path, raised.value.hunk_number) == ("f.txt", None)
    assert "an earlier section of the patch changes this file too" in str(raised.value)


def test_apply_patch_to_files_lets_a_later_section_bring_back_a_file_an_earlier_one_removed() -> None:
    # Given what git diff writes for a rename plus a new file of the old name, and for a file that becomes a symlink
    renamed_and_replaced = diff(
        "diff --git a/old/name.txt b/new/name.txt",
        "similarity index 100%",
        "rename from old/name.txt",
        "rename to new/name.txt",
        "diff --git a/old/name.txt b/old/name.txt",
        "new file mode 100644",
        "--- /dev/null",
        "+++ b/old/name.txt",
        "@@ -0,0 +1 @@",
        "+moved away",
    )
    becomes_a_symlink = diff(
        "diff --git a/tail.txt b/tail.txt",
        "deleted file mode 100644",
        "--- a/tail.txt",
        "+++ /dev/null",
        "@@ -1,2 +0,0 @@",
        "-first",
        "-last",
        "\\ No newline at end of file",
        "diff --git a/tail.txt b/tail.txt",
        "new file mode 120000",
        "--- /dev/null",
        "+++ b/tail.txt",
        "@@ -0,0 +1 @@",
        "+README.md",
        "\\ No newline at end of file",
    )

    assert apply_patch_to_files(renamed_and_replaced, SEED_FILES.get) == [
        FileChange("new/name.txt", SEED_FILES["old/name.txt"], old_path="old/name.txt"),
        FileChange("old/name.txt", b"moved away\n", mode=REGULAR_FILE_MODE),
    ]
    assert apply_patch_to_files(becomes_a_symlink, SEED_FILES.get) == [
        FileChange("tail.txt", None),
        FileChange("tail.txt", b"README.md", mode=0o120000),
    ]


def test_apply_patch_to_files_search_finds_what_a_line_by_line_search_finds() -> None:
    # Given random files and hunks of few distinct lines (many near matches), each stated at a random line
    from job_worker.jobs.patching import _find  # the search itself, against the plain definition of "nearest"

    def nearest(lines: list[bytes], before: list[bytes], preferred: int, cursor: int, window: int) -> int | None:
        places = [
            at
            for at in range(max(cursor, preferred - window), min(len(lines) - len(before), preferred + window) + 1)
            if lines[at : at + len(before)] == before
        ]
        return min(places, key=lambda at: (abs(at - preferred), at), default=None)

    draw = random.Random(11)
    for _ in range(3_000):
        lines = [draw.choice((b"a\n", b"b\n", b"c\n")) for _ in range(draw.randint(0, 40))]
        before = [draw.choice((b"a\n", b"b\n")) for _ in range(draw.randint(1, 4))]
        preferred, cursor, window = draw.randint(-3, 45), draw.randint(0, 10), draw.randint(0, 30)

        # Then the bounded search agrees with the plain one
        assert _find(lines, before, preferred, cursor, window) == nearest(lines, before, preferred, cursor, window), (
            lines,
            before,
            preferred,
            cursor,
            window,
        )
