"""What a push sends (`jobs.git.new_objects`): the new commit and what it changes, read without the branch's history.

The cache here holds only the head the remote advertises (its commit, trees and files), as a shallow first fetch
leaves it: a push that walked the history would fail to read the commits below the head.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from dulwich.objects import Blob, ObjectID, Tree
from dulwich.refs import Ref
from dulwich.repo import Repo

from job_worker.jobs.git.commits import DEFAULT_IDENTITY, commit_of, new_commit
from job_worker.jobs.git.new_objects import objects_to_send
from job_worker.jobs.git.remote import GitRemote
from job_worker.jobs.git.transport import RemoteTransport
from job_worker.jobs.git.trees import patched_tree
from job_worker.jobs.limits import GitLimits
from job_worker.jobs.patching import parse_patch
from tests.git.conftest import BASE_BRANCH, SEED_FILES, commit_files, diff

BRANCH_REF = Ref(b"refs/heads/agent/ws-1")


def _long_history(remote: Path, commits: int) -> ObjectID:
    head = commit_files(remote, BASE_BRANCH, SEED_FILES, "Initial commit\n")
    for n in range(commits):
        head = commit_files(remote, BASE_BRANCH, {**SEED_FILES, "count.txt": f"{n}\n".encode()}, f"{n}\n", [head])
    return head


def _copy_head_only(remote: Path, head: ObjectID, cache: Path) -> Repo:
    """A bare repository with the head commit, its trees and its files, and nothing of the history below it."""
    repo = Repo.init_bare(str(cache), mkdir=True)
    with Repo(str(remote)) as source:
        commit = source.object_store[head]
        pending = [commit_of(source.object_store, head.decode()).tree]
        repo.object_store.add_object(commit)
        while pending:
            obj = source.object_store[pending.pop()]
            repo.object_store.add_object(obj)
            if isinstance(obj, Tree):
                pending.extend(entry.sha for entry in obj.iteritems())
    return repo


def test_a_push_of_one_commit_on_a_long_history_reads_only_the_head_and_sends_only_the_change(tmp_path: Path) -> None:
    remote = tmp_path / "origin.git"
    Repo.init_bare(str(remote), mkdir=True).close()
    head = _long_history(remote, 40)
    cache = _copy_head_only(remote, head, tmp_path / "cache.git")
    patch = parse_patch(diff("--- a/src/app.py", "+++ b/src/app.py", "@@ -5 +5 @@", '-    print("hello")', "+    pass"))
    tree = patched_tree(cache.object_store, commit_of(cache.object_store, head.decode()).tree, patch)
    commit = new_commit(tree, parents=[head], message="change\n", author=DEFAULT_IDENTITY)
    cache.object_store.add_object(commit)

    sent = objects_to_send(cache.object_store, {head}, [commit.id])
    # the commit, the root tree, src/ and src/app.py; none of the 5 unchanged files or the docs/ folders
    assert len(sent) == 4
    assert isinstance(cache.object_store[sent[-1]], Blob)

    transport = RemoteTransport(GitRemote(url=str(remote), branch="agent/ws-1"), GitLimits())
    assert transport.push(cache, BRANCH_REF, commit.id, lambda refs: BRANCH_REF not in refs)
    cache.close()
    fsck = subprocess.run(["git", "-C", str(remote), "fsck", "--strict"], capture_output=True, text=True, check=False)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
    assert subprocess.check_output(["git", "-C", str(remote), "show", "agent/ws-1:src/app.py"], text=True).endswith(
        "    pass\n"
    )


def test_objects_to_send_sends_a_whole_new_history_when_the_remote_has_none_of_it(tmp_path: Path) -> None:
    source = tmp_path / "source.git"
    Repo.init_bare(str(source), mkdir=True).close()
    head = _long_history(source, 3)
    with Repo(str(source)) as repo:
        sent = set(objects_to_send(repo.object_store, set(), [head]))
        assert sent == set(repo.object_store)  # 4 commits, their trees and files: all there is
