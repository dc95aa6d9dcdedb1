"""apply_patch against real git and GNU patch, on random edits (hypothesis).

A random tree of small files is committed with git: text (some lines not UTF-8, in Latin-1), binary files (random
bytes with NULs) and symbolic links, some under names git quotes (non-ASCII, a space, a quote, a backslash). A random
change of it (lines inserted, deleted and replaced, bytes changed, files added, deleted, emptied, renamed or copied
with or without edits, made executable or not, links retargeted) is committed after it, and
exported four ways: `git format-patch`, `git diff --binary`, `git diff -C --binary` (copies found), and `diff -ruN`
between the two trees. The worker applies each, sent as bytes (a base64 patch), to a workspace branch holding the
base tree. For git's formats the branch's tree must be git's, to the tree id (paths, modes, contents); for the plain
diff its files must be what GNU `patch -p1` makes of the base folder, or, where the plain diff only says that a binary
file differs (it carries no data, and GNU patch skips it), the worker must refuse the patch naming that file. A
`git diff` without `--binary` says the same of a binary file, and git apply and the worker both refuse it.

`make test` runs DIFFERENTIAL_EXAMPLES examples (default 25) of each format; `make differential` runs more
(DIFFERENTIAL_EXAMPLES=500).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from dulwich.refs import Ref
from dulwich.repo import Repo
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from job_worker.jobs import apply_patch
from job_worker.jobs.context import JobContext
from job_worker.jobs.git_workspace import GitRemote, GitWorkspaceStore
from tests.git.conftest import apply_patch_job, branch_tree_id, real_git

pytestmark = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("git", "diff", "patch")),
    reason="the differential test needs git, GNU diff and GNU patch (Debian: git diffutils patch)",
)

EXAMPLES = int(os.environ.get("DIFFERENTIAL_EXAMPLES", "25"))
BRANCH = "main"

# Few distinct lines, so that hunks have repeated context to be matched against, as real code has.
# A line of bytes that are not UTF-8 is held as text with lone surrogates (surrogateescape), one per byte.
LATIN_1 = "caf\udce9 na\udcefve"
LINES = st.sampled_from([f"line {n}" for n in range(8)] + ["", "    indented", "}", "return x", LATIN_1])
# Names git quotes in its headers too: non-ASCII, a space, a double quote, a backslash.
NAMES = st.sampled_from(
    [
        *("a.txt", "b.py", "c.md", "dir/d.txt", "dir/e.py", "dir/sub/f.txt", "g", "h.sh", "img.png", "dir/blob.bin"),
        *("dir/na\u00efve.txt", "sp ace.md", 'quo"te.txt', "back\\slash.txt"),
    ]
)
BYTES = st.binary(min_size=1, max_size=300).map(lambda data: b"\0" + data)  # a NUL: git takes it for binary


@dataclass(frozen=True)
class File:
    lines: tuple[str, ...]
    newline_at_end: bool = True
    executable: bool = False
    data: bytes | None = None  # a binary file's bytes (then `lines` is empty)
    link: str | None = None  # a symbolic link's target (then `lines` is empty)

    def content(self) -> bytes:
        if self.link is not None:
            return self.link.encode()
        if self.data is not None:
            return self.data
        text = "\n".join(self.lines)
        if self.lines and self.newline_at_end:
            text += "\n"
        return text.encode("utf-8", errors="surrogateescape")


TEXT_FILES = st.builds(
    File,
    lines=st.lists(LINES, min_size=0, max_size=12).map(tuple),
    newline_at_end=st.booleans(),
    executable=st.booleans(),
)
BINARY_FILES = st.builds(File, lines=st.just(()), executable=st.booleans(), data=BYTES)
LINKS = st.builds(File, lines=st.just(()), link=st.sampled_from(["a.txt", "dir/sub", "../outside", "missing"]))
FILES = st.one_of(TEXT_FILES, TEXT_FILES, BINARY_FILES, LINKS)
TREES = st.dictionaries(NAMES, FILES, min_size=1, max_size=5)


@st.composite
def edited_bytes(draw: st.DrawFn, data: bytes) -> bytes:
    """`data` with a few bytes changed, a run inserted or the end cut (git writes a delta or a literal)."""
    changed = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["change", "insert", "cut"]))
        at = draw(st.integers(1, len(changed)))
        if kind == "change" and at < len(changed):
            changed[at] = draw(st.integers(0, 255))
        elif kind == "insert":
            changed[at:at] = draw(st.binary(min_size=1, max_size=64))
        else:
            del changed[at : at + draw(st.integers(1, 16))]
    return bytes(changed or b"\0")


@st.composite
def edited(draw: st.DrawFn, file: File) -> File:
    """`file` with a few lines (or bytes) inserted, deleted or replaced, and maybe its last newline or mode changed."""
    if file.link is not None:
        return draw(st.one_of(LINKS, TEXT_FILES))  # another target, or a file in the link's place
    executable = not file.executable if draw(st.integers(0, 4)) == 0 else file.executable
    if file.data is not None:
        return File((), executable=executable, data=draw(edited_bytes(file.data)))
    lines = list(file.lines)
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["insert", "delete", "replace"]))
        if kind == "insert" or not lines:
            lines.insert(draw(st.integers(0, len(lines))), draw(LINES))
        else:
            index = draw(st.integers(0, len(lines) - 1))
            if kind == "delete":
                del lines[index]
            else:
                lines[index] = draw(LINES)
    newline_at_end = draw(st.booleans()) if draw(st.integers(0, 4)) == 0 else file.newline_at_end
    return File(tuple(lines), newline_at_end, executable)


# A base tree and the tree after an agent's change of it.
Change = tuple[dict[str, File], dict[str, File]]


@st.composite
def changes(draw: st.DrawFn) -> Change:
    """A base tree and the tree after an agent's change of it."""
    base = draw(TREES)
    after = dict(base)
    for name in sorted(base):
        action = draw(
            st.sampled_from(
                ["keep", "keep", "edit", "edit", "delete", "rename", "rename and edit", "copy", "copy and edit"]
            )
        )
        if action == "edit":
            after[name] = draw(edited(base[name]))
        elif action == "delete":
            del after[name]
        elif action.startswith(("rename", "copy")):
            target = draw(NAMES)  # no name is a folder of another: only a taken name clashes
            if target in after:
                continue
            moved = after[name] if action.startswith("copy") else after.pop(name)
            after[target] = draw(edited(moved)) if action.endswith("and edit") else moved
    for name in draw(st.lists(NAMES, max_size=2)):
        if name not in after:
            after[name] = draw(FILES)
    if after == base:  # a change there must be: a new file, then
        after["new.txt"] = File(tuple(draw(st.lists(LINES, min_size=1, max_size=3))))
    return base, after


def _git(cwd: Path, *args: str) -> str:
    return _git_bytes(cwd, *args).decode("utf-8", errors="surrogateescape")


def _git_bytes(cwd: Path, *args: str) -> bytes:
    return real_git(cwd, *args)


def _write_tree(root: Path, tree: Mapping[str, File]) -> None:
    if root.exists():
        for child in root.iterdir():
            if child.name != ".git":
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    root.mkdir(parents=True, exist_ok=True)
    for name, file in tree.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if file.link is not None:
            path.symlink_to(file.link)
            continue
        path.write_bytes(file.content())
        path.chmod(0o755 if file.executable else 0o644)


def _folder_files(root: Path) -> dict[str, tuple[bytes, bool]]:
    return {
        str(path.relative_to(root)): (path.read_bytes(), os.access(path, os.X_OK))
        for path in sorted(root.rglob("*"))
        if path.is_file() and ".git" not in path.relative_to(root).parts and not path.name.endswith((".orig", ".rej"))
    }


def _branch_files(remote: Path, branch: str) -> dict[str, tuple[bytes, bool]]:
    with Repo(str(remote)) as repo:
        tree = repo[repo.refs[Ref(f"refs/heads/{branch}".encode())]].tree  # type: ignore[attr-defined]
        return {
            os.fsdecode(entry.path): (repo[entry.sha].as_raw_string(), bool(entry.mode & 0o100))
            for entry in repo.object_store.iter_tree_contents(tree)
        }


@dataclass(frozen=True)
class Case:
    remote: Path
    clone: Path
    base_folder: Path
    after_folder: Path


def _case(root: Path, base: Mapping[str, File], after: Mapping[str, File]) -> Case:
    """The base tree committed and pushed to a bare remote's main, the change committed after it in the clone, and
    both trees as folders (for diff -ruN)."""
    work = root / uuid.uuid4().hex[:8]
    remote = work / "remote.git"
    work.mkdir(parents=True)
    Repo.init_bare(str(remote), mkdir=True, default_branch=BRANCH.encode()).close()
    clone = work / "clone"
    _git(work, "clone", "-q", str(remote), str(clone))
    _write_tree(clone, base)
    _git(clone, "add", "-A")
    _git(clone, "commit", "-q", "--allow-empty", "-m", "base")
    _git(clone, "push", "-q", "origin", f"HEAD:{BRANCH}")
    _write_tree(clone, after)
    _git(clone, "add", "-A")
    _git(clone, "commit", "-q", "--allow-empty", "-m", "change")
    base_folder, after_folder = work / "a", work / "b"
    _write_tree(base_folder, base)
    _write_tree(after_folder, after)
    return Case(remote, clone, base_folder, after_folder)


def _apply(case: Case, patch: bytes, store_root: Path) -> tuple[str | None, str | None]:
    """The worker's apply_patch of `patch` on a branch of the base tree: (None, error) when it refused it."""
    store = GitWorkspaceStore(
        store_root / uuid.uuid4().hex[:8],
        lambda workspace_id: GitRemote(url=str(case.remote), branch=f"agent/{workspace_id}", base_branch=BRANCH),
    )
    try:
        apply_patch.run(apply_patch_job("job-1", patch), JobContext(store.open("ws"), lambda: 60_000))
    except Exception as error:  # a refusal: compared with git's or GNU patch's below
        return None, f"{type(error).__name__}: {error}"
    return "applied", None


COMMON = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)


EXPORTS = {
    "format-patch": ("format-patch", "-1", "--stdout"),
    "git diff --binary": ("diff", "--binary", "HEAD~1", "HEAD"),
    "git diff -C --binary": ("diff", "-C", "--binary", "HEAD~1", "HEAD"),
}


@COMMON
@given(changes())
@pytest.mark.parametrize("exported", list(EXPORTS))
def test_a_git_format_patch_gives_gits_tree(exported: str, tmp_path: Path, change: Change) -> None:
    base, after = change
    case = _case(tmp_path, base, after)
    patch = _git_bytes(case.clone, *EXPORTS[exported])
    if base == after or not patch.strip():
        event("nothing to send")
        return  # nothing to send: an empty patch is refused at the API
    sections = patch.split(b"\ndiff --git ")[1:]
    event("a section without a hunk" if any(b"@@" not in s for s in sections) else "hunks only")
    event("a binary section" if b"\nGIT binary patch\n" in patch else "no binary section")
    event("a copy" if b"\ncopy from " in patch else "no copy")
    event("not UTF-8" if not _is_utf8(patch) else "UTF-8")
    applied, refusal = _apply(case, patch, tmp_path / "caches")
    shown = patch.decode("utf-8", errors="replace")
    assert refusal is None, f"{refusal}\n--- the patch:\n{shown}"
    assert applied == "applied"
    assert branch_tree_id(case.remote, "agent/ws") == _git(case.clone, "rev-parse", "HEAD^{tree}").strip(), shown


@COMMON
@given(changes())
def test_a_git_diff_without_its_binary_data_is_refused_as_git_apply_refuses_it(tmp_path: Path, change: Change) -> None:
    base, after = change
    case = _case(tmp_path, base, after)
    patch = _git_bytes(case.clone, "diff", "HEAD~1", "HEAD")
    if not patch.strip():
        event("nothing to send")
        return
    checked = subprocess.run(
        ["git", "apply", "--check", "-"], cwd=case.base_folder, input=patch, capture_output=True, check=False
    )
    _applied, refusal = _apply(case, patch, tmp_path / "caches")
    if b"\nBinary files " in patch:
        event("binary files without data")
        assert checked.returncode != 0  # git apply refuses it too
        assert refusal is not None
        assert "make it with git diff --binary" in refusal, refusal
        return
    event("text only")
    assert refusal is None, refusal
    assert branch_tree_id(case.remote, "agent/ws") == _git(case.clone, "rev-parse", "HEAD^{tree}").strip()


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


@COMMON
@given(changes())
def test_a_plain_diff_gives_what_gnu_patch_makes(tmp_path: Path, change: Change) -> None:
    base, after = change
    # diff -r follows symbolic links (a plain diff cannot say "this is a link"): those trees are git's formats' own.
    assume(not any(file.link is not None for file in (*base.values(), *after.values())))
    case = _case(tmp_path, base, after)
    made = subprocess.run(
        ["diff", "-ruN", case.base_folder.name, case.after_folder.name],
        cwd=case.base_folder.parent,
        capture_output=True,
        check=False,
    )
    assert made.returncode in (0, 1, 2), made.stderr
    if not made.stdout.strip():
        event("nothing to send")
        return  # no difference diff -N can show (an empty file added or deleted is invisible to it)
    applied, refusal = _apply(case, made.stdout, tmp_path / "caches")
    binary = [line for line in made.stdout.splitlines() if line.startswith(b"Binary files ")]
    if binary:
        # A plain diff only says a binary file differs: GNU patch skips it, and the worker refuses the whole patch,
        # naming the file, rather than apply the rest and leave that file behind.
        event("a binary file differs")
        named = binary[0].split(b" ")[2].split(b"/", 1)[1].decode("utf-8", errors="surrogateescape")
        assert refusal is not None
        assert named in refusal, refusal
        assert "git diff --binary" in refusal, refusal
        return
    gnu = case.base_folder.parent / "gnu"
    shutil.copytree(case.base_folder, gnu)
    patched = subprocess.run(
        ["patch", "-p1", "--batch", "--silent", "--no-backup-if-mismatch"],
        cwd=gnu,
        input=made.stdout,
        capture_output=True,
        check=False,
    )
    assert patched.returncode == 0, patched.stdout + patched.stderr

    event("a file deleted" if b"1970-01-01" in made.stdout else "no file deleted or added")
    shown = made.stdout.decode("utf-8", errors="replace")
    assert refusal is None, f"{refusal}\n--- the patch:\n{shown}"
    assert applied == "applied"
    # GNU patch leaves a file's mode alone; the contents must be the same, and the same files must exist.
    ours = {path: content for path, (content, _) in _branch_files(case.remote, "agent/ws").items()}
    theirs = {path: content for path, (content, _) in _folder_files(gnu).items()}
    assert ours == theirs, shown
