"""A tenant's file-system remote must not reach another tenant's repository through git's own pointers: an
alternates file, a symbolic link in place of objects/ or refs/ (or of one object or ref), a `.git` file or a
`commondir` file. The worker reads and writes a local remote in its own process, so each of these would hand one
tenant's objects (and secrets in them) to another tenant's workspace. Each is refused before the remote is read,
saying what to fix; a remote that only borrows from its own tenant's repositories still works."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from dulwich.objects import Blob
from dulwich.repo import Repo

from job_worker.jobs import apply_patch
from job_worker.jobs.context import JobContext
from job_worker.jobs.errors import PermanentJobError
from job_worker.jobs.git_workspace import GitRemote, GitWorkspaceStore
from tests.git.conftest import BASE_BRANCH, apply_patch_job, commit_files

SECRET = b"acme's signing key\n"


@pytest.fixture
def remotes(tmp_path: Path) -> Path:
    """The remotes root, with acme's repository holding a secret on main."""
    root = tmp_path / "remotes"
    victim = root / "acme" / "secret.git"
    victim.parent.mkdir(parents=True)
    Repo.init_bare(str(victim), mkdir=True, default_branch=BASE_BRANCH.encode()).close()
    commit_files(victim, BASE_BRANCH, {"key.pem": SECRET}, "secret\n")
    (root / "mallory").mkdir()
    return root


def mallory_remote(remotes: Path, name: str = "evil.git") -> Path:
    path = remotes / "mallory" / name
    Repo.init_bare(str(path), mkdir=True, default_branch=BASE_BRANCH.encode()).close()
    return path


def victim(remotes: Path) -> Path:
    return remotes / "acme" / "secret.git"


def point_main_at_the_secret(remote: Path, remotes: Path) -> None:
    (remote / "refs" / "heads" / BASE_BRANCH).write_text((victim(remotes) / "refs" / "heads" / BASE_BRANCH).read_text())


def borrow_objects(remote: Path, remotes: Path) -> None:
    (remote / "objects" / "info" / "alternates").write_text(f"{victim(remotes) / 'objects'}\n")
    point_main_at_the_secret(remote, remotes)


def link_objects(remote: Path, remotes: Path) -> None:
    shutil.rmtree(remote / "objects")
    (remote / "objects").symlink_to(victim(remotes) / "objects")
    point_main_at_the_secret(remote, remotes)


def link_one_pack(remote: Path, remotes: Path) -> None:
    with Repo(str(victim(remotes))) as repo:  # pack the secret, then link its pack files into mallory's remote
        repo.object_store.pack_loose_objects()
    for pack in (victim(remotes) / "objects" / "pack").iterdir():
        (remote / "objects" / "pack" / pack.name).symlink_to(pack)
    point_main_at_the_secret(remote, remotes)


def link_refs(remote: Path, remotes: Path) -> None:
    borrow_objects(remote, remotes)  # (refused for its alternates too: remove them to see the refs refused alone)
    (remote / "objects" / "info" / "alternates").unlink()
    shutil.rmtree(remote / "refs")
    (remote / "refs").symlink_to(victim(remotes) / "refs")


def dot_git_file(remote: Path, remotes: Path) -> None:
    shutil.rmtree(remote)
    remote.mkdir()
    (remote / ".git").write_text(f"gitdir: {victim(remotes)}\n")


def commondir_file(remote: Path, remotes: Path) -> None:
    (remote / "commondir").write_text(f"{victim(remotes)}\n")


ESCAPES: dict[str, Callable[[Path, Path], None]] = {
    "alternates": borrow_objects,
    "objects-symlink": link_objects,
    "pack-symlink": link_one_pack,
    "refs-symlink": link_refs,
    "dot-git-file": dot_git_file,
    "commondir": commondir_file,
}


def store_for(remote: Path, remotes: Path, tmp_path: Path) -> GitWorkspaceStore:
    return GitWorkspaceStore(
        tmp_path / "caches",
        lambda ws: GitRemote(
            str(remote), f"agent/{ws}", BASE_BRANCH, owner="mallory", confined_to=str(remotes / "mallory")
        ),
    )


@pytest.mark.parametrize("escape", list(ESCAPES))
def test_a_remote_that_reaches_another_tenants_repository_is_refused(
    remotes: Path, tmp_path: Path, escape: str
) -> None:
    # Given mallory's remote, inside mallory's folder, made to reach acme's repository
    remote = mallory_remote(remotes)
    ESCAPES[escape](remote, remotes)

    # When a job of mallory's workspace reads it
    workspace = store_for(remote, remotes, tmp_path).open("ws-m")
    with pytest.raises(PermanentJobError) as refused:
        workspace.head()

    # Then it is refused, saying what reaches out, and nothing of acme's reached mallory's cache
    assert "reaches outside" in str(refused.value)
    secret = Blob.from_string(SECRET).id
    for cache in (tmp_path / "caches").glob("*.git"):
        with Repo(str(cache)) as repo:
            assert secret not in repo.object_store


def test_a_remote_that_borrows_from_its_own_tenants_repository_works(remotes: Path, tmp_path: Path) -> None:
    # Given two remotes of mallory's, one borrowing the other's objects (a fork beside its upstream)
    upstream = mallory_remote(remotes, "upstream.git")
    commit_files(upstream, BASE_BRANCH, {"README.md": b"mine\n"}, "mine\n")
    fork = mallory_remote(remotes, "fork.git")
    (fork / "objects" / "info" / "alternates").write_text("../../upstream.git/objects\n")
    (fork / "refs" / "heads" / BASE_BRANCH).write_text((upstream / "refs" / "heads" / BASE_BRANCH).read_text())

    workspace = store_for(fork, remotes, tmp_path).open("ws-m")
    workspace.checkout(workspace.head(), tmp_path / "checkout")

    assert (tmp_path / "checkout" / "README.md").read_bytes() == b"mine\n"


def test_without_a_confining_root_a_local_remote_is_read_as_it_is(remotes: Path, tmp_path: Path) -> None:
    # A store of no tenant (the worker's own tests, a single-tenant setup) follows git's pointers as git does
    remote = mallory_remote(remotes)
    borrow_objects(remote, remotes)
    store = GitWorkspaceStore(tmp_path / "caches", lambda ws: GitRemote(str(remote), f"agent/{ws}", BASE_BRANCH))
    workspace = store.open("ws-m")
    workspace.checkout(workspace.head(), tmp_path / "checkout")
    assert (tmp_path / "checkout" / "key.pem").read_bytes() == SECRET
    assert os.path.isdir(remotes / "acme")


def test_a_push_into_object_folders_linked_to_another_tenants_store_is_refused_and_writes_nothing(
    remotes: Path, tmp_path: Path
) -> None:
    # Given mallory's workspace with a warm cache (its next job pushes without fetching: its objects go loose into
    # the remote's objects/<xx>/ folders)
    remote = mallory_remote(remotes)
    commit_files(remote, BASE_BRANCH, {"README.md": b"mine\n"}, "mine\n")
    workspace = store_for(remote, remotes, tmp_path).open("ws-m")
    patch = "--- /dev/null\n+++ b/a.txt\n@@ -0,0 +1 @@\n+a\n"
    apply_patch.run(apply_patch_job("job-1", patch, workspace_id="ws-m"), JobContext(workspace, lambda: 60_000))
    # and every loose-object folder of the remote made a link into acme's object store
    acme_objects = victim(remotes) / "objects"
    for prefix in (f"{n:02x}" for n in range(256)):
        folder = remote / "objects" / prefix
        shutil.rmtree(folder, ignore_errors=True)
        (acme_objects / prefix).mkdir(exist_ok=True)
        folder.symlink_to(acme_objects / prefix)
    acme_before = sorted(str(path) for path in acme_objects.rglob("*"))

    # When its next job pushes
    patch = "--- /dev/null\n+++ b/b.txt\n@@ -0,0 +1 @@\n+b\n"
    with pytest.raises(PermanentJobError, match="reaches outside"):
        apply_patch.run(apply_patch_job("job-2", patch, workspace_id="ws-m"), JobContext(workspace, lambda: 60_000))

    # Then nothing of mallory's was written into acme's store
    assert sorted(str(path) for path in acme_objects.rglob("*")) == acme_before
