"""GitWorkspace on real git repositories: the apply_patch handler runs on it unchanged, and the workspace fences it.

Every remote is a bare repository in tmp_path; every "worker" is a GitWorkspaceStore with its own cache folder, as two
Lambda execution environments would have.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from dulwich.client import get_transport_and_path
from dulwich.objects import Blob as GitBlob
from dulwich.objects import Commit as GitCommit
from dulwich.objects import ObjectID
from dulwich.refs import Ref
from dulwich.repo import Repo

from agent_jobs.models import RunTestsJob
from agent_jobs.patch_limits import PatchLimits
from job_worker.jobs import apply_patch, run_tests
from job_worker.jobs.context import JobContext
from job_worker.jobs.git import transport
from job_worker.jobs.git_workspace import (
    DEFAULT_IDENTITY,
    GitCredentials,
    GitRemote,
    GitWorkspace,
    GitWorkspaceStore,
    JobAlreadyOnBranchError,
    job_id_of,
)
from job_worker.jobs.patching import PatchDoesNotApplyError
from job_worker.jobs.workspace import ROOT_HEAD, HeadMovedError, Workspace, WorkspaceStore
from tests.git.conftest import BASE_BRANCH, SEED_FILES, apply_patch_job, commit_files, diff, remote_ref

BRANCH = "agent/ws-1"
StoreFactory = Callable[..., GitWorkspaceStore]


def context(workspace: Workspace) -> JobContext:
    return JobContext(workspace=workspace, remaining_ms=lambda: 60_000)


def append_line(n: int) -> str:
    """A patch that appends `job n` to journal.txt, which the first one creates: each applies only after the last."""
    if n == 1:
        return diff("--- /dev/null", "+++ b/journal.txt", "@@ -0,0 +1 @@", "+job 1")
    start = max(1, n - 3)
    context_lines = [f" job {k}" for k in range(start, n)]
    header = f"@@ -{start},{len(context_lines)} +{start},{len(context_lines) + 1} @@"
    return diff("--- a/journal.txt", "+++ b/journal.txt", header, *context_lines, f"+job {n}")


def branch_job_ids(remote: Path) -> list[str]:
    """The jobIds of the branch's commits above main, oldest first, read from the remote with dulwich itself."""
    with Repo(str(remote)) as repo:
        branch = repo.refs[Ref(f"refs/heads/{BRANCH}".encode())]
        base = repo.refs[Ref(f"refs/heads/{BASE_BRANCH}".encode())]
        walker = repo.get_walker(include=[branch], exclude=[base], order="topo", reverse=True)
        return [job_id_of(entry.commit.message) or "<no trailer>" for entry in walker]


def object_count(path: Path) -> int:
    with Repo(str(path)) as repo:
        return sum(1 for _ in repo.object_store)


# -- the Workspace protocol, on a real remote -------------------------------------------------------------------


def test_git_workspace_store_satisfies_the_protocols(make_store: StoreFactory) -> None:
    store: WorkspaceStore = make_store()
    workspace: Workspace = store.open("ws-1")

    assert workspace.workspace_id == "ws-1"
    with pytest.raises(ValueError, match="not a workspace id"):
        store.open("../escape")


def test_git_workspace_head_before_the_first_commit_is_the_base_branch(remote: Path, make_store: StoreFactory) -> None:
    workspace = make_store().open("ws-1")

    assert workspace.head() == remote_ref(remote, BASE_BRANCH)
    assert workspace.history() == []
    assert workspace.find_commit("job-1") is None
    assert remote_ref(remote, BRANCH) is None  # nothing is created until the first commit


def test_git_workspace_commit_creates_the_branch_with_the_trailer_and_author(
    remote: Path, make_store: StoreFactory
) -> None:
    workspace = make_store().open("ws-1")
    base = workspace.head()

    made = workspace.commit(
        job_id="job-1", message="Say more", patch=append_line(1), expected_head=base, author="Ada <ada@example.com>"
    )

    assert remote_ref(remote, BRANCH) == made.sha == workspace.head()
    assert made.parent == base
    assert made.message == "Say more\n\nAgent-Job-Id: job-1\n"
    assert workspace.history() == [
        # Read back from git, the patch text is not there: git keeps the tree.
        type(made)(sha=made.sha, parent=base, job_id="job-1", message=made.message, patch="")
    ]
    with Repo(str(remote)) as repo:
        git_commit = repo.object_store[ObjectID(made.sha.encode())]
        assert isinstance(git_commit, GitCommit)
        assert git_commit.author == b"Ada <ada@example.com>"
        assert git_commit.committer == DEFAULT_IDENTITY.encode()


def test_git_workspace_commit_on_an_empty_remote_starts_from_root_head(
    make_remote: Callable[..., Path], make_store: StoreFactory
) -> None:
    empty = make_remote("empty", empty=True)
    workspace = make_store(url=str(empty)).open("ws-1")
    assert workspace.head() == ROOT_HEAD

    made = workspace.commit(job_id="job-1", message="First", patch=append_line(1), expected_head=ROOT_HEAD)

    assert made.parent == ROOT_HEAD
    assert remote_ref(empty, BRANCH) == made.sha
    assert [c.job_id for c in workspace.history()] == ["job-1"]


def test_git_workspace_checkout_writes_the_commit_tree(tmp_path: Path, make_store: StoreFactory) -> None:
    workspace = make_store().open("ws-1")
    made = workspace.commit(job_id="job-1", message="m", patch=append_line(1), expected_head=workspace.head())

    workspace.checkout(made.sha, tmp_path / "checkout")

    files = {
        str(p.relative_to(tmp_path / "checkout")): p.read_bytes()
        for p in (tmp_path / "checkout").rglob("*")
        if p.is_file()
    }
    assert files == {**SEED_FILES, "journal.txt": b"job 1\n"}
    assert os.access(tmp_path / "checkout" / "scripts" / "check.sh", os.X_OK)  # modes survive the round trip
    with pytest.raises(ValueError, match="empty folder"):
        workspace.checkout(made.sha, tmp_path / "checkout")


def test_git_workspace_commit_keeps_modes_through_a_rename(make_store: StoreFactory, tmp_path: Path) -> None:
    workspace = make_store().open("ws-1")
    rename = diff(
        "diff --git a/scripts/check.sh b/bin/check.sh",
        "similarity index 100%",
        "rename from scripts/check.sh",
        "rename to bin/check.sh",
    )

    made = workspace.commit(job_id="job-1", message="move", patch=rename, expected_head=workspace.head())
    workspace.checkout(made.sha, tmp_path / "out")

    assert not (tmp_path / "out" / "scripts").exists()  # a folder left empty disappears, as in git
    assert os.access(tmp_path / "out" / "bin" / "check.sh", os.X_OK)


def test_git_workspace_commit_of_a_patch_that_does_not_apply_moves_nothing(
    remote: Path, make_store: StoreFactory
) -> None:
    workspace = make_store().open("ws-1")
    stale = diff("--- a/README.md", "+++ b/README.md", "@@ -1 +1 @@", "-# other title", "+# new title")

    with pytest.raises(PatchDoesNotApplyError, match=r"^README.md, hunk 1 of 1: line 1 expected '# other title'"):
        apply_patch.run(apply_patch_job("job-1", stale), context(workspace))

    assert remote_ref(remote, BRANCH) is None


def test_git_workspace_commit_refuses_a_patch_over_its_limits_before_touching_the_remote(
    remote: Path, tmp_path: Path
) -> None:
    # Given a workspace whose patches may have 1 hunk, on a remote that cannot be reached
    unreachable = GitRemote(url=str(tmp_path / "nowhere.git"), branch="agent/ws-1", base_branch=BASE_BRANCH)
    store = GitWorkspaceStore(tmp_path / "caches", lambda _: unreachable, patch_limits=PatchLimits(max_hunks=1))
    patch = diff("--- a/notes.txt", "+++ b/notes.txt", "@@ -1 +1 @@", "-a", "+b", "@@ -3 +3 @@", "-c", "+d")

    # Then the patch is refused for its hunks, a permanent error, without reading the remote
    with pytest.raises(PatchDoesNotApplyError, match=r"^<patch>: the patch has 2 hunks; the limit is 1 "):
        store.open("ws-1").commit(job_id="job-1", message="m", patch=patch, expected_head=ROOT_HEAD)


def test_git_workspace_pull_requests_belong_to_the_forge_client(make_store: StoreFactory) -> None:
    workspace = make_store().open("ws-1")

    with pytest.raises(NotImplementedError, match=r"jobs\.github"):
        workspace.find_open_pull_request(BRANCH)
    with pytest.raises(NotImplementedError, match=r"jobs\.github"):
        workspace.open_pull_request(BRANCH, "title", "body")


# -- exactly once: the handler, duplicates, races and stale workers ----------------------------------------------


def test_apply_patch_handler_on_a_git_workspace_commits_a_job_once(remote: Path, make_store: StoreFactory) -> None:
    # Given the real apply_patch handler, delivered the same job twice (a redelivery after a crash, say)
    workspace = make_store().open("ws-1")
    job = apply_patch_job("job-1", append_line(1))

    first = apply_patch.run(job, context(workspace))
    second = apply_patch.run(job, context(workspace))

    # Then the second finds the first's trailer and adds nothing
    assert first["alreadyApplied"] is False
    assert second == {"commit": first["commit"], "alreadyApplied": True}
    assert branch_job_ids(remote) == ["job-1"]


def test_apply_patch_handler_a_second_worker_finds_the_commit_of_the_first(
    remote: Path, make_store: StoreFactory
) -> None:
    job = apply_patch_job("job-1", append_line(1))
    first = apply_patch.run(job, context(make_store("worker-1").open("ws-1")))

    # A worker that never saw this workspace (cold cache) still finds the trailer on the remote branch.
    second = apply_patch.run(job, context(make_store("worker-2").open("ws-1")))

    assert second == {"commit": first["commit"], "alreadyApplied": True}
    assert branch_job_ids(remote) == ["job-1"]


def test_apply_patch_handler_interleaved_workers_on_one_job_make_one_commit(
    remote: Path, make_store: StoreFactory
) -> None:
    # Given two workers holding the same job, both past find_commit and both having read the same head
    job = apply_patch_job("job-1", append_line(1))
    worker_1, worker_2 = make_store("worker-1").open("ws-1"), make_store("worker-2").open("ws-1")
    head_1, head_2 = worker_1.head(), worker_2.head()
    assert head_1 == head_2

    # When worker 2 commits first, worker 1's commit on the head it read is refused
    won = worker_2.commit(job_id=job.job_id, message="m", patch=job.payload.patch, expected_head=head_2)
    with pytest.raises(HeadMovedError):
        worker_1.commit(job_id=job.job_id, message="m", patch=job.payload.patch, expected_head=head_1)

    # Then the handler's retry finds worker 2's trailer: one commit
    assert apply_patch.run(job, context(worker_1)) == {"commit": won.sha, "alreadyApplied": True}
    assert branch_job_ids(remote) == ["job-1"]


def test_git_workspace_commit_refuses_a_job_already_on_the_head_it_is_given(
    remote: Path, make_store: StoreFactory
) -> None:
    # Given worker 1 looked for the job's commit (none), then worker 2 committed the job, then worker 1 read the head
    job = apply_patch_job("job-1", append_line(1))
    worker_1, worker_2 = make_store("worker-1").open("ws-1"), make_store("worker-2").open("ws-1")
    assert worker_1.find_commit(job.job_id) is None
    won = worker_2.commit(job_id=job.job_id, message="m", patch=append_line(1), expected_head=worker_2.head())
    head = worker_1.head()

    # When worker 1 commits the job on that head, the workspace refuses a second commit of the job
    with pytest.raises(JobAlreadyOnBranchError) as raised:
        worker_1.commit(job_id=job.job_id, message="m", patch=append_line(1), expected_head=head)

    assert raised.value.commit.sha == won.sha
    assert isinstance(raised.value, HeadMovedError)  # so the handler looks again, and finds it
    assert apply_patch.run(job, context(worker_1)) == {"commit": won.sha, "alreadyApplied": True}
    assert branch_job_ids(remote) == ["job-1"]


class _OvertakenWorkspace(GitWorkspace):
    """A worker that is overtaken in the worst place: after its push's check passed, before the remote updates.

    `rival` runs inside the push, right after this worker approved the remote's current head (all real: another
    worker commits to the same remote at that moment). Only the remote's own compare-and-swap can stop this push.
    """

    def __init__(self, workspace: GitWorkspace, rival: Callable[[], object]) -> None:
        super().__init__(workspace.workspace_id, workspace.remote, workspace.cache_path)
        self._rival: Callable[[], object] | None = rival

    def _push(
        self, repo: Repo, ref: Ref, new: ObjectID, still_expected: Callable[[Mapping[Ref, ObjectID]], bool]
    ) -> bool:
        def approve_then_get_overtaken(refs: Mapping[Ref, ObjectID]) -> bool:
            approved = still_expected(refs)
            if approved and self._rival is not None:
                rival, self._rival = self._rival, None
                rival()
            return approved

        return super()._push(repo, ref, new, approve_then_get_overtaken)


def test_apply_patch_handler_overtaken_inside_the_push_finds_the_rival_commit(
    remote: Path, make_store: StoreFactory
) -> None:
    # Given two workers with the same job: worker 2 runs the whole handler while worker 1 is inside its push
    job = apply_patch_job("job-1", append_line(1))
    worker_2 = make_store("worker-2").open("ws-1")
    rival_results: list[dict[str, Any]] = []
    worker_1 = _OvertakenWorkspace(
        make_store("worker-1").open("ws-1"), lambda: rival_results.append(apply_patch.run(job, context(worker_2)))
    )

    result = apply_patch.run(job, context(worker_1))

    # Then the remote refused worker 1's update (its old value was stale), and worker 1's retry found the trailer
    assert rival_results[0]["alreadyApplied"] is False
    assert result == {"commit": rival_results[0]["commit"], "alreadyApplied": True}
    assert branch_job_ids(remote) == ["job-1"]
    assert remote_ref(remote, BRANCH) == rival_results[0]["commit"]


def test_git_workspace_remote_refuses_a_push_whose_old_value_went_stale(remote: Path, make_store: StoreFactory) -> None:
    # Given worker 1 approved the remote head H, then worker 2 moved the branch before worker 1's update landed
    worker_2 = make_store("worker-2").open("ws-1")
    worker_2.commit(job_id="job-0", message="m", patch=append_line(1), expected_head=worker_2.head())
    moved_to: list[str] = []

    def rival() -> None:
        moved_to.append(
            worker_2.commit(job_id="job-2", message="m", patch=append_line(2), expected_head=worker_2.head()).sha
        )

    worker_1 = _OvertakenWorkspace(make_store("worker-1").open("ws-1"), rival)
    head = worker_1.head()

    with pytest.raises(HeadMovedError):
        worker_1.commit(job_id="job-1", message="m", patch=append_line(2), expected_head=head)

    assert remote_ref(remote, BRANCH) == moved_to[0]
    assert branch_job_ids(remote) == ["job-0", "job-2"]


def test_git_workspace_stale_worker_cannot_move_the_branch(remote: Path, make_store: StoreFactory) -> None:
    # Given a worker that read the head, then stalled while another worker applied two jobs
    stale = make_store("worker-1").open("ws-1")
    stale_head = stale.head()
    fresh = make_store("worker-2").open("ws-1")
    for n in (1, 2):
        apply_patch.run(apply_patch_job(f"job-{n}", append_line(n)), context(fresh))
    branch_before = remote_ref(remote, BRANCH)

    # When it wakes up and commits on the head it read, for the first job's slot or a new one
    for job_id in ("job-1", "job-9"):
        with pytest.raises(HeadMovedError):
            stale.commit(job_id=job_id, message="late", patch=append_line(1), expected_head=stale_head)

    # Then the branch is where the fresh worker left it
    assert remote_ref(remote, BRANCH) == branch_before
    assert branch_job_ids(remote) == ["job-1", "job-2"]


def test_git_workspace_first_commit_refused_when_the_branch_appeared_or_the_base_moved(
    remote: Path, make_store: StoreFactory
) -> None:
    worker_1, worker_2 = make_store("worker-1").open("ws-1"), make_store("worker-2").open("ws-1")
    base = worker_1.head()

    # The base moved: the branch would start from a commit that is no longer the base's head.
    moved_base = commit_files(
        remote, BASE_BRANCH, {**SEED_FILES, "NEW": b"x\n"}, "Upstream\n", [ObjectID(base.encode())]
    )
    with pytest.raises(HeadMovedError):
        worker_1.commit(job_id="job-1", message="m", patch=append_line(1), expected_head=base)

    # Another worker created the branch first: the branch must not exist for a commit on the base's head.
    worker_2.commit(job_id="job-1", message="m", patch=append_line(1), expected_head=moved_base.decode())
    with pytest.raises(HeadMovedError):
        worker_1.commit(job_id="job-2", message="m", patch=append_line(1), expected_head=moved_base.decode())
    assert branch_job_ids(remote) == ["job-1"]


def test_git_workspace_a_ref_being_updated_by_another_process_counts_as_moved(
    remote: Path, make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transport, "STALE_REF_LOCK_WAIT_SECONDS", 0.2)
    workspace = make_store().open("ws-1")
    apply_patch.run(apply_patch_job("job-1", append_line(1)), context(workspace))
    head = workspace.head()
    # Another worker is inside its push (it holds the remote's push turn) and holds the branch ref's lock, as git and
    # dulwich do while they update it.
    lock = remote / "refs" / "heads" / f"{BRANCH}.lock"
    with (remote / transport.LOCAL_PUSH_TURN).open("a") as turn:
        fcntl.flock(turn, fcntl.LOCK_SH)
        lock.write_bytes(b"")
        try:
            with pytest.raises(HeadMovedError):
                workspace.commit(job_id="job-2", message="m", patch=append_line(2), expected_head=head)
            assert lock.exists()  # a live writer's lock is left alone
        finally:
            lock.unlink()
    assert remote_ref(remote, BRANCH) == head


def test_git_workspace_a_ref_lock_left_by_a_killed_worker_does_not_block_the_branch(
    remote: Path, make_store: StoreFactory
) -> None:
    # Given a worker killed while it updated the remote branch (its lock file written, never renamed): its flock on
    # the push turn died with it
    workspace = make_store().open("ws-1")
    apply_patch.run(apply_patch_job("job-1", append_line(1)), context(workspace))
    head = workspace.head()
    (remote / "refs" / "heads" / f"{BRANCH}.lock").write_bytes(b"0" * 40 + b"\n")

    # When the next job of the workspace commits
    made = workspace.commit(job_id="job-2", message="m", patch=append_line(2), expected_head=head)

    # Then the stale lock is gone and the branch moved by compare-and-swap from where it was
    assert remote_ref(remote, BRANCH) == made.sha
    assert branch_job_ids(remote) == ["job-1", "job-2"]
    assert not (remote / "refs" / "heads" / f"{BRANCH}.lock").exists()


def test_git_workspace_a_worker_killed_while_updating_its_cache_leaves_no_lasting_lock(
    remote: Path, make_store: StoreFactory
) -> None:
    # Given a worker whose process was killed after its push, while it updated the branch's ref in its own cache (a
    # crash or a timeout: the cache in /tmp outlives the process), leaving the ref's lock file there
    store = make_store("worker-1")
    apply_patch.run(apply_patch_job("job-1", append_line(1)), context(store.open("ws-1")))
    cache = store.open("ws-1").cache_path
    (cache / "refs" / "heads" / f"{BRANCH}.lock").write_bytes(b"0" * 40 + b"\n")

    # When the same execution environment runs the next jobs
    for n in (2, 3):
        apply_patch.run(apply_patch_job(f"job-{n}", append_line(n)), context(store.open("ws-1")))

    # Then they apply: the lock file had no live writer
    assert branch_job_ids(remote) == ["job-1", "job-2", "job-3"]
    assert not list((cache / "refs").rglob("*.lock"))


def test_git_workspace_a_worker_killed_while_writing_an_object_to_its_cache_leaves_no_lasting_lock(
    remote: Path, make_store: StoreFactory
) -> None:
    # Given a worker killed while it wrote the blob of job-2's journal into its cache (git writes an object to a lock
    # file, then renames it): the lock file stays, and a retry of job-2 writes the same object, of the same name
    store = make_store("worker-1")
    apply_patch.run(apply_patch_job("job-1", append_line(1)), context(store.open("ws-1")))
    cache = store.open("ws-1").cache_path
    blob = GitBlob.from_string(b"job 1\njob 2\n").id.decode()
    (cache / "objects" / blob[:2]).mkdir(exist_ok=True)
    (cache / "objects" / blob[:2] / f"{blob[2:]}.lock").write_bytes(b"half an object")

    # When the same execution environment runs job-2 again, and the job after it
    for n in (2, 3):
        apply_patch.run(apply_patch_job(f"job-{n}", append_line(n)), context(store.open("ws-1")))

    # Then they apply, with the object whole in the cache: the lock file had no live writer
    assert branch_job_ids(remote) == ["job-1", "job-2", "job-3"]
    assert not list(cache.rglob("*.lock"))
    with Repo(str(cache)) as repo:
        assert repo.object_store[ObjectID(blob.encode())].as_raw_string() == b"job 1\njob 2\n"


def test_apply_patch_handler_racing_workers_in_threads_make_one_commit_per_job(
    remote: Path, make_store: StoreFactory
) -> None:
    # Given 4 workers (own caches), each delivered the same 5 jobs in order, released together for every job
    workers = [make_store(f"worker-{w}").open("ws-1") for w in range(4)]
    jobs = [apply_patch_job(f"job-{n}", append_line(n)) for n in range(1, 6)]
    results: dict[str, list[dict[str, Any]]] = {job.job_id: [] for job in jobs}
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(workers))

    def deliver(workspace: Workspace) -> None:
        for job in jobs:
            barrier.wait()
            try:
                results[job.job_id].append(apply_patch.run(job, context(workspace)))
            except BaseException as error:  # a thread's failure must fail the test, not vanish
                errors.append(error)
            barrier.wait()  # the next job starts once every worker is done with this one, as the FIFO group orders

    threads = [threading.Thread(target=deliver, args=(w,)) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    # Then each job took effect exactly once, in order, whichever worker won its race
    assert errors == []
    assert branch_job_ids(remote) == [job.job_id for job in jobs]
    for job_id, outcomes in results.items():
        assert sum(not outcome["alreadyApplied"] for outcome in outcomes) == 1, job_id
        assert len({outcome["commit"] for outcome in outcomes}) == 1, job_id


def test_git_workspace_history_is_the_order_of_the_applied_jobs(
    remote: Path, make_store: StoreFactory, tmp_path: Path
) -> None:
    # Given ten jobs applied in order by two workers taking turns (each delivered some jobs twice)
    workers = [make_store("worker-1").open("ws-1"), make_store("worker-2").open("ws-1")]
    job_ids = [f"job-{n:02d}" for n in range(1, 11)]
    for n, job_id in enumerate(job_ids, start=1):
        job = apply_patch_job(job_id, append_line(n), message=f"Job {n}")
        apply_patch.run(job, context(workers[n % 2]))
        if n % 3 == 0:
            assert apply_patch.run(job, context(workers[(n + 1) % 2]))["alreadyApplied"] is True

    # Then the branch holds one commit per job, in order, each on its predecessor
    history = workers[0].history()
    assert [c.job_id for c in history] == job_ids == branch_job_ids(remote)
    assert [c.parent for c in history[1:]] == [c.sha for c in history[:-1]]
    assert history[0].parent == remote_ref(remote, BASE_BRANCH)
    assert workers[1].history() == history
    workers[0].checkout(history[-1].sha, tmp_path / "tree")
    assert (tmp_path / "tree" / "journal.txt").read_text() == "".join(f"job {n}\n" for n in range(1, 11))


def test_git_workspace_cold_and_warm_caches_see_the_latest_head(remote: Path, make_store: StoreFactory) -> None:
    # Given a warm worker that fetched the branch, then another worker that applied three more jobs
    warm = make_store("warm").open("ws-1")
    writer = make_store("writer").open("ws-1")
    apply_patch.run(apply_patch_job("job-1", append_line(1)), context(writer))
    assert warm.head() == remote_ref(remote, BRANCH)
    before = object_count(warm.cache_path)
    for n in (2, 3, 4):
        apply_patch.run(apply_patch_job(f"job-{n}", append_line(n)), context(writer))

    # When the warm worker and a brand-new one (cold cache) read the head
    cold = make_store("cold").open("ws-1")
    latest = remote_ref(remote, BRANCH)

    # Then both see the latest head; the warm one fetched only the new objects, not the repository again, and the cold
    # one no more than the warm one holds
    assert warm.head() == cold.head() == latest
    fetched = object_count(warm.cache_path) - before
    assert fetched == 3 * 3  # per job: a commit, its root tree and the journal blob
    assert object_count(cold.cache_path) <= before + fetched
    # and both see the same history (the shallow caches deepened as far as the branch goes)
    assert (
        [c.job_id for c in warm.history()] == [c.job_id for c in cold.history()] == ["job-1", "job-2", "job-3", "job-4"]
    )


def test_git_workspace_works_over_a_file_url(remote: Path, make_store: StoreFactory) -> None:
    workspace = make_store(url=remote.as_uri()).open("ws-1")
    client, _ = get_transport_and_path(remote.as_uri())

    apply_patch.run(apply_patch_job("job-1", append_line(1)), context(workspace))

    assert type(client).__name__ == "LocalGitClient"
    assert branch_job_ids(remote) == ["job-1"]


# -- test results: stored in the remote, so any worker reuses them -----------------------------------------------


def test_git_workspace_test_results_are_shared_through_the_remote(remote: Path, make_store: StoreFactory) -> None:
    worker_1, worker_2 = make_store("worker-1").open("ws-1"), make_store("worker-2").open("ws-1")
    head = apply_patch.run(apply_patch_job("job-1", append_line(1)), context(worker_1))["commit"]
    run_job = RunTestsJob.model_validate({"jobId": "tests-1", "workspaceId": "ws-1", "type": "run_tests"})

    first = run_tests.run(run_job, context(worker_1))
    second = run_tests.run(run_job, context(worker_2))  # another execution environment: only the remote is shared

    assert first["reused"] is False
    assert second == {**first, "reused": True}
    assert worker_2.stored_test_result("tests-1", head) == {k: v for k, v in first.items() if k != "reused"}
    assert worker_2.stored_test_result("tests-2", head) is None
    with Repo(str(remote)) as repo:
        assert Ref(f"refs/agent-jobs/tests/tests-1/{head}".encode()) in repo.refs.as_dict()


def test_git_workspace_first_stored_test_result_wins(make_store: StoreFactory) -> None:
    worker_1, worker_2 = make_store("worker-1").open("ws-1"), make_store("worker-2").open("ws-1")
    head = worker_1.head()

    worker_1.store_test_result("tests-1", head, {"outcome": "passed"})
    worker_2.store_test_result("tests-1", head, {"outcome": "failed"})

    assert worker_1.stored_test_result("tests-1", head) == {"outcome": "passed"}
    assert worker_2.stored_test_result("tests-1", head) == {"outcome": "passed"}
    with pytest.raises(ValueError, match="commit sha"):
        worker_1.store_test_result("tests-1", "not-a-sha", {})


# -- what git itself says about the result ----------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git binary")
def test_git_workspace_commits_are_valid_for_git_itself(remote: Path, make_store: StoreFactory) -> None:
    workspace = make_store().open("ws-1")
    for n in (1, 2):
        apply_patch.run(apply_patch_job(f"job-{n}", append_line(n)), context(workspace))
    workspace.store_test_result("job-2", workspace.head(), {"outcome": "passed"})

    fsck = subprocess.run(["git", "fsck", "--strict"], cwd=remote, capture_output=True, text=True, check=False)
    trailers = subprocess.run(
        ["git", "log", "--format=%(trailers:key=Agent-Job-Id,valueonly)", "--reverse", f"{BASE_BRANCH}..{BRANCH}"],
        cwd=remote,
        capture_output=True,
        text=True,
        check=True,
    )

    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
    assert trailers.stdout.split() == ["job-1", "job-2"]


def test_git_remote_keeps_tokens_out_of_its_display_url() -> None:
    remote = GitRemote(url="https://bot:s3cret@git.example.com/org/repo.git", branch="agent/ws-1")
    with_credentials = GitRemote(
        url="https://git.example.com/org/repo.git", branch="agent/ws-1", credentials=GitCredentials("bot", "s3cret")
    )

    assert remote.display_url == "https://git.example.com/org/repo.git"
    assert "s3cret" not in repr(with_credentials)


def test_git_remote_refuses_bad_branch_names() -> None:
    with pytest.raises(ValueError, match="valid git branch name"):
        GitRemote(url="/tmp/x.git", branch="bad..name")
    with pytest.raises(ValueError, match="must differ"):
        GitRemote(url="/tmp/x.git", branch="main", base_branch="main")
