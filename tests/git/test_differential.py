"""apply_patch against real git and GNU patch, on random edits (hypothesis).

A random tree of small text files is committed with git; a random change of it (lines inserted, deleted and replaced,
files added, deleted, emptied, renamed with or without edits, made executable or not) is committed after it, and
exported three ways: `git format-patch`, `git diff`, and `diff -ruN` between the two trees. The worker applies each
to a workspace branch holding the base tree. For git's formats the branch's tree must be git's, to the tree id
(paths, modes, contents); for the plain diff its files must be what GNU `patch -p1` makes of the base folder.

`make test` runs DIFFERENTIAL_EXAMPLES examples (default 25) of each format; `make differential` runs more
(DIFFERENTIAL_EXAMPLES=500). Binary files are not in the edits: the worker refuses binary patches (see
docs/workspaces.md).
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
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from job_worker.jobs import apply_patch
from job_worker.jobs.context import JobContext
from job_worker.jobs.git_workspace import GitRemote, GitWorkspaceStore
from tests.git.conftest import apply_patch_job

pytestmark = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("git", "diff", "patch")),
    reason="the differential test needs git, GNU diff and GNU patch (Debian: git diffutils patch)",
)

EXAMPLES = int(os.environ.get("DIFFERENTIAL_EXAMPLES", "25"))
BRANCH = "main"

# Few distinct lines, so that hunks have repeated context to be matched against, as real code has.
LINES = st.sampled_from([f"line {n}" for n in range(8)] + ["", "    indented", "}", "return x"])
NAMES = st.sampled_from(["a.txt", "b.py", "c.md", "dir/d.txt", "dir/e.py", "dir/sub/f.txt", "g", "h.sh"])


@dataclass(frozen=True)
class File:
    lines: tuple[str, ...]
    newline_at_end: bool = True
    executable: bool = False

    def content(self) -> bytes:
        text = "\n".join(self.lines)
        if self.lines and self.newline_at_end:
            text += "\n"
        return text.encode()


FILES = st.builds(
    File,
    lines=st.lists(LINES, min_size=0, max_size=12).map(tuple),
    newline_at_end=st.booleans(),
    executable=st.booleans(),
)
TREES = st.dictionaries(NAMES, FILES, min_size=1, max_size=5)


@st.composite
def edited(draw: st.DrawFn, file: File) -> File:
    """`file` with a few lines inserted, deleted or replaced, and maybe its last newline or its mode changed."""
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
    executable = not file.executable if draw(st.integers(0, 4)) == 0 else file.executable
    return File(tuple(lines), newline_at_end, executable)


# A base tree and the tree after an agent's change of it.
Change = tuple[dict[str, File], dict[str, File]]


@st.composite
def changes(draw: st.DrawFn) -> Change:
    """A base tree and the tree after an agent's change of it."""
    base = draw(TREES)
    after = dict(base)
    for name in sorted(base):
        action = draw(st.sampled_from(["keep", "keep", "edit", "edit", "delete", "rename", "rename and edit"]))
        if action == "edit":
            after[name] = draw(edited(base[name]))
        elif action == "delete":
            del after[name]
        elif action.startswith("rename"):
            target = draw(NAMES)  # no name is a folder of another: only a taken name clashes
            if target in after:
                continue
            moved = after.pop(name)
            after[target] = draw(edited(moved)) if action == "rename and edit" else moved
    for name in draw(st.lists(NAMES, max_size=2)):
        if name not in after:
            after[name] = draw(FILES)
    if after == base:  # a change there must be: a new file, then
        after["new.txt"] = File(tuple(draw(st.lists(LINES, min_size=1, max_size=3))))
    return base, after


def _git(cwd: Path, *args: str) -> str:
    environment = {
        **os.environ,
        "GIT_CONFIG_NOSYSTEM": "1",
        "HOME": str(cwd),
        "GIT_AUTHOR_NAME": "Agent",
        "GIT_AUTHOR_EMAIL": "agent@example.com",
        "GIT_COMMITTER_NAME": "Agent",
        "GIT_COMMITTER_EMAIL": "agent@example.com",
    }
    return subprocess.run(["git", *args], cwd=cwd, env=environment, capture_output=True, text=True, check=True).stdout


def _write_tree(root: Path, tree: Mapping[str, File]) -> None:
    if root.exists():
        for child in root.iterdir():
            if child.name != ".git":
                shutil.rmtree(child) if child.is_dir() else child.unlink()
    root.mkdir(parents=True, exist_ok=True)
    for name, file in tree.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(file.content())
        path.chmod(0o755 if file.executable else 0o644)


def _folder_files(root: Path) -> dict[str, tuple[bytes, bool]]:
    return {
        str(path.relative_to(root)): (path.read_bytes(), os.access(path, os.X_OK))
        for path in sorted(root.rglob("*"))
        if path.is_file() and ".git" not in path.relative_to(root).parts and not path.name.endswith((".orig", ".rej"))
    }


def _branch_tree(remote: Path, branch: str) -> str:
    with Repo(str(remote)) as repo:
        return repo[repo[repo.refs[Ref(f"refs/heads/{branch}".encode())]].tree].id.decode()  # type: ignore[attr-defined]


def _branch_files(remote: Path, branch: str) -> dict[str, tuple[bytes, bool]]:
    with Repo(str(remote)) as repo:
        tree = repo[repo.refs[Ref(f"refs/heads/{branch}".encode())]].tree  # type: ignore[attr-defined]
        return {
            entry.path.decode(): (repo[entry.sha].as_raw_string(), bool(entry.mode & 0o100))
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


def _apply(case: Case, patch: str, store_root: Path) -> tuple[str | None, str | None]:
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


@COMMON
@given(changes())
@pytest.mark.parametrize("exported", ["format-patch", "git diff"])
def test_a_git_format_patch_gives_gits_tree(exported: str, tmp_path: Path, change: Change) -> None:
    base, after = change
    case = _case(tmp_path, base, after)
    if exported == "format-patch":
        patch = _git(case.clone, "format-patch", "-1", "--stdout")
    else:
        patch = _git(case.clone, "diff", "HEAD~1", "HEAD")
    if base == after or not patch.strip():
        event("nothing to send")
        return  # nothing to send: an empty patch is refused at the API
    event("a section without a hunk" if any("@@" not in s for s in patch.split("\ndiff --git ")[1:]) else "hunks only")
    applied, refusal = _apply(case, patch, tmp_path / "caches")
    assert refusal is None, f"{refusal}\n--- the patch:\n{patch}"
    assert applied == "applied"
    assert _branch_tree(case.remote, "agent/ws") == _git(case.clone, "rev-parse", "HEAD^{tree}").strip(), patch


@COMMON
@given(changes())
def test_a_plain_diff_gives_what_gnu_patch_makes(tmp_path: Path, change: Change) -> None:
    base, after = change
    case = _case(tmp_path, base, after)
    made = subprocess.run(
        ["diff", "-ruN", case.base_folder.name, case.after_folder.name],
        cwd=case.base_folder.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode in (0, 1), made.stderr
    if not made.stdout.strip():
        event("nothing to send")
        return  # no difference diff -N can show (an empty file added or deleted is invisible to it)
    gnu = case.base_folder.parent / "gnu"
    shutil.copytree(case.base_folder, gnu)
    patched = subprocess.run(
        ["patch", "-p1", "--batch", "--silent", "--no-backup-if-mismatch"],
        cwd=gnu,
        input=made.stdout,
        capture_output=True,
        text=True,
        check=False,
    )
    assert patched.returncode == 0, patched.stdout + patched.stderr

    event("a file deleted" if "1970-01-01" in made.stdout else "no file deleted or added")
    applied, refusal = _apply(case, made.stdout, tmp_path / "caches")
    assert refusal is None, f"{refusal}\n--- the patch:\n{made.stdout}"
    assert applied == "applied"
    # GNU patch leaves a file's mode alone; the contents must be the same, and the same files must exist.
    ours = {path: content for path, (content, _) in _branch_files(case.remote, "agent/ws").items()}
    theirs = {path: content for path, (content, _) in _folder_files(gnu).items()}
    assert ours == theirs, made.stdout
