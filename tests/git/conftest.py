"""Real git repositories for the git workspace tests: bare remotes made with dulwich in tmp_path, no git binary."""

from __future__ import annotations

import base64
import os
import stat
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
from dulwich.objects import Blob, Commit, ObjectID, Tree
from dulwich.refs import Ref
from dulwich.repo import Repo

from agent_jobs.models import ApplyPatchJob
from job_worker.jobs.git_workspace import GitRemote, GitWorkspaceStore

BASE_BRANCH = "main"
SEED_FILES: Mapping[str, bytes] = {
    "README.md": b"# demo\n",
    "src/app.py": b'import os\n\n\ndef main():\n    print("hello")\n',
    "docs/notes.txt": "".join(f"line {n}\n" for n in range(1, 31)).encode(),
    "tail.txt": b"first\nlast",
    "old/name.txt": b"alpha\nbeta\ngamma\n",
    "scripts/check.sh": b"#!/bin/sh\nexit 0\n",
}
EXECUTABLES = frozenset({"scripts/check.sh"})


def diff(*lines: str) -> str:
    """A patch from its lines (written one per argument, so blank context lines keep their leading space)."""
    return "\n".join(lines) + "\n"


def write_tree(repo: Repo, files: Mapping[str, bytes]) -> ObjectID:
    """Store `files` (path -> content) as blobs and trees in `repo`; returns the root tree."""
    folders: dict[str, dict[bytes, tuple[int, ObjectID]]] = {"": {}}
    for path, content in sorted(files.items()):
        blob = Blob.from_string(content)
        repo.object_store.add_object(blob)
        *parents, name = path.split("/")
        for depth in range(len(parents)):
            folders.setdefault("/".join(parents[: depth + 1]), {})
        mode = 0o100755 if path in EXECUTABLES else 0o100644
        folders["/".join(parents)][name.encode()] = (mode, blob.id)
    for folder in sorted(folders, key=lambda f: f.count("/") if f else -1, reverse=True):
        tree = Tree()
        for entry, (mode, sha) in folders[folder].items():
            tree.add(entry, mode, sha)
        repo.object_store.add_object(tree)
        if folder:
            parent, _, folder_name = folder.rpartition("/")
            folders[parent][folder_name.encode()] = (stat.S_IFDIR, tree.id)
        else:
            return tree.id
    raise AssertionError("unreachable: the root folder is written last")


def commit_files(
    remote: Path, branch: str, files: Mapping[str, bytes], message: str, parents: list[ObjectID] | None = None
) -> ObjectID:
    """Commit `files` as the whole tree on `branch` of the bare repository `remote`, as a person pushing would."""
    with Repo(str(remote)) as repo:
        commit = Commit()
        commit.tree = write_tree(repo, files)
        commit.parents = parents if parents is not None else []
        commit.author = commit.committer = b"Maintainer <maintainer@example.com>"
        commit.author_time = commit.commit_time = int(time.time())
        commit.author_timezone = commit.commit_timezone = 0
        commit.message = message.encode()
        repo.object_store.add_object(commit)
        repo.refs[Ref(f"refs/heads/{branch}".encode())] = commit.id
        return commit.id


def remote_ref(remote: Path, branch: str) -> str | None:
    """The branch's commit as the remote itself has it (not through any workspace)."""
    with Repo(str(remote)) as repo:
        sha = repo.refs.as_dict().get(Ref(f"refs/heads/{branch}".encode()))
        return sha.decode() if sha else None


@pytest.fixture
def make_remote(tmp_path: Path) -> Callable[..., Path]:
    """A bare remote in tmp_path; seeded with one commit of SEED_FILES on main unless `empty`."""

    def make(name: str = "origin", *, empty: bool = False) -> Path:
        path = tmp_path / "remotes" / f"{name}.git"
        path.parent.mkdir(exist_ok=True)
        Repo.init_bare(str(path), mkdir=True, default_branch=BASE_BRANCH.encode()).close()
        if not empty:
            commit_files(path, BASE_BRANCH, SEED_FILES, "Initial commit\n")
        return path

    return make


@pytest.fixture
def remote(make_remote: Callable[..., Path]) -> Path:
    return make_remote()


@pytest.fixture
def make_store(tmp_path: Path, remote: Path) -> Callable[..., GitWorkspaceStore]:
    """A GitWorkspaceStore with its own cache folder: one per execution environment (worker)."""

    def make(worker: str = "worker-1", url: str | None = None) -> GitWorkspaceStore:
        def resolve(workspace_id: str) -> GitRemote:
            return GitRemote(url=url or str(remote), branch=f"agent/{workspace_id}", base_branch=BASE_BRANCH)

        return GitWorkspaceStore(tmp_path / "caches" / worker, resolve)

    return make


def apply_patch_job(
    job_id: str, patch: str | bytes, message: str = "change", workspace_id: str = "ws-1"
) -> ApplyPatchJob:
    """An apply_patch job of `patch`: text as it is, bytes as a base64 patch (patchEncoding base64)."""
    payload: dict[str, str] = {"patch": patch, "commitMessage": message} if isinstance(patch, str) else {}
    if isinstance(patch, bytes):
        payload = {"patch": base64.b64encode(patch).decode(), "patchEncoding": "base64", "commitMessage": message}
    return ApplyPatchJob.model_validate(
        {"jobId": job_id, "workspaceId": workspace_id, "type": "apply_patch", "payload": payload}
    )


def real_git(cwd: Path, *args: str) -> bytes:
    """Run Debian's git in `cwd` with a fixed identity and no user or system configuration; its output as bytes."""
    environment = {
        **os.environ,
        "GIT_CONFIG_NOSYSTEM": "1",
        "HOME": str(cwd.parent),
        "GIT_AUTHOR_NAME": "Agent",
        "GIT_AUTHOR_EMAIL": "agent@example.com",
        "GIT_COMMITTER_NAME": "Agent",
        "GIT_COMMITTER_EMAIL": "agent@example.com",
    }
    return subprocess.run(["git", *args], cwd=cwd, env=environment, capture_output=True, check=True).stdout


def committed_change(
    remote: Path,
    tmp_path: Path,
    prepare: Callable[[Path], object] | None,
    change: Callable[[Path], object],
    message: str,
) -> Path:
    """A clone of `remote` where `prepare` (when given) was committed and pushed to the base branch, then `change` was
    committed after it (every file as the steps left it): `git diff HEAD~1` or `git format-patch -1` is the change."""
    clone = tmp_path / "clone"
    real_git(tmp_path, "clone", "-q", str(remote), str(clone))
    if prepare is not None:
        prepare(clone)
        real_git(clone, "add", "-A")
        real_git(clone, "commit", "-q", "-m", "base")
        real_git(clone, "push", "-q", "origin", BASE_BRANCH)
    change(clone)
    real_git(clone, "add", "-A")
    real_git(clone, "commit", "-q", "-m", message)
    return clone


def branch_tree_id(remote: Path, branch: str = "agent/ws-1") -> str:
    """The tree id of `branch`'s commit in `remote`, read with dulwich."""
    with Repo(str(remote)) as repo:
        commit = repo[repo.refs[Ref(f"refs/heads/{branch}".encode())]]
        return repo[commit.tree].id.decode()  # type: ignore[attr-defined]
