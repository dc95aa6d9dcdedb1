"""GitWorkspace.apply_once, the whole of an apply_patch job on a git workspace: how often it reaches its remote.

Round trips are counted at dulwich's client: every fetch of a local remote goes through `LocalGitClient.fetch_pack`,
every push through `LocalGitClient.send_pack` (which reads the remote's refs and updates them in one call, as a push
over HTTP is one ref advertisement and one receive-pack request).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from dulwich.client import LocalGitClient
from dulwich.objects import ObjectID
from dulwich.refs import Ref
from dulwich.repo import Repo

from job_worker.jobs import apply_patch
from job_worker.jobs.context import JobContext
from job_worker.jobs.errors import RetryableJobError
from job_worker.jobs.git_workspace import GitWorkspace, GitWorkspaceStore
from job_worker.jobs.workspace import Workspace
from tests.git.conftest import apply_patch_job, diff, remote_ref
from tests.git.test_git_workspace import BRANCH, append_line, branch_job_ids

StoreFactory = Callable[..., GitWorkspaceStore]
# A patch that adds a file of its own: it applies on whatever head another worker left.
OWN_FILE = diff("--- /dev/null", "+++ b/own.txt", "@@ -0,0 +1 @@", "+own")


class RoundTrips:
    """The fetches and pushes made so far, by any workspace of this process."""

    def __init__(self) -> None:
        self.fetches = 0
        self.pushes = 0

    @property
    def total(self) -> int:
        return self.fetches + self.pushes

    def since(self, before: tuple[int, int]) -> tuple[int, int]:
        """(fetches, pushes) since `before` (a `mark`)."""
        return self.fetches - before[0], self.pushes - before[1]

    def mark(self) -> tuple[int, int]:
        return self.fetches, self.pushes


@pytest.fixture
def trips(monkeypatch: pytest.MonkeyPatch) -> RoundTrips:
    count = RoundTrips()
    fetch_pack, send_pack = LocalGitClient.fetch_pack, LocalGitClient.send_pack

    def counted_fetch(self: LocalGitClient, *args: Any, **kwargs: Any) -> Any:
        count.fetches += 1
        return fetch_pack(self, *args, **kwargs)

    def counted_push(self: LocalGitClient, *args: Any, **kwargs: Any) -> Any:
        count.pushes += 1
        return send_pack(self, *args, **kwargs)

    monkeypatch.setattr(LocalGitClient, "fetch_pack", counted_fetch)
    monkeypatch.setattr(LocalGitClient, "send_pack", counted_push)
    return count


def run(workspace: Workspace, job_id: str, patch: str) -> dict[str, Any]:
    return apply_patch.run(apply_patch_job(job_id, patch), JobContext(workspace=workspace, remaining_ms=lambda: 60_000))


class _RivalBeforePush(GitWorkspace):
    """A worker whose branch moves between its fetch and its push: `rival` runs right before each of its pushes, up to
    `rounds` times (all real: another worker commits to the same remote at that moment)."""

    def __init__(self, workspace: GitWorkspace, rival: Callable[[], object], rounds: int = 1) -> None:
        super().__init__(workspace.workspace_id, workspace.remote, workspace.cache_path)
        self._rival = rival
        self._rounds = rounds

    def _push(
        self, repo: Repo, ref: Ref, new: ObjectID, still_expected: Callable[[Mapping[Ref, ObjectID]], bool]
    ) -> bool:
        if self._rounds > 0:
            self._rounds -= 1
            self._rival()
        return super()._push(repo, ref, new, still_expected)


def test_apply_once_on_a_warm_cache_is_one_push_and_its_redelivery_none(
    make_store: StoreFactory, trips: RoundTrips
) -> None:
    # Given a worker whose cache is warm (it applied a job of the workspace before)
    workspace = make_store().open("ws-1")
    run(workspace, "job-1", append_line(1))

    # When it applies the next job, then is delivered that job again
    before = trips.mark()
    applied = run(workspace, "job-2", append_line(2))
    after_apply = trips.mark()
    again = run(workspace, "job-2", append_line(2))

    # Then the job was one push (the remote's compare-and-swap found the cache current), and its redelivery found
    # the job's commit in the cache without reaching the remote
    assert trips.since(before) == (0, 1)
    assert trips.since(after_apply) == (0, 0)
    assert again == {"commit": applied["commit"], "alreadyApplied": True}
    assert branch_job_ids_of(workspace) == ["job-1", "job-2"]


def test_apply_once_on_a_cold_cache_fetches_once_and_pushes_once(make_store: StoreFactory, trips: RoundTrips) -> None:
    run(make_store("cold").open("ws-1"), "job-1", append_line(1))

    assert trips.since((0, 0)) == (1, 1)


@pytest.mark.parametrize(
    ("patch", "trips_taken"),
    [
        # needs job-2's line: it does not apply on the cached head, so nothing is pushed before the fetch
        (append_line(3), (1, 1)),
        # applies on any head: the push on the cached head is refused by the remote's compare-and-swap
        (OWN_FILE, (1, 2)),
    ],
    ids=["needs-the-missed-job", "independent"],
)
def test_a_warm_cache_that_missed_a_job_fetches_and_applies_on_the_new_head(
    remote: Path, make_store: StoreFactory, trips: RoundTrips, patch: str, trips_taken: tuple[int, int]
) -> None:
    # Given two workers that applied job-1 and job-2: worker-1's cache still has the branch at job-1
    worker, other = make_store("worker-1").open("ws-1"), make_store("worker-2").open("ws-1")
    run(worker, "job-1", append_line(1))
    second = run(other, "job-2", append_line(2))

    # When worker-1 applies job-3
    before = trips.mark()
    result = run(worker, "job-3", patch)

    # Then it fetched once and applied the patch on job-2's commit: never refused as a patch that does not apply,
    # never committed on the head its cache had
    assert trips.since(before) == trips_taken
    assert result["alreadyApplied"] is False
    assert result["parent"] == second["commit"]
    assert branch_job_ids(remote) == ["job-1", "job-2", "job-3"]


def test_a_warm_cache_that_missed_this_very_job_finds_it_after_the_refused_push(
    remote: Path, make_store: StoreFactory, trips: RoundTrips
) -> None:
    # Given job-2 applied by another worker (a redelivery ran elsewhere), after worker-1's cache last saw the branch
    worker, other = make_store("worker-1").open("ws-1"), make_store("worker-2").open("ws-1")
    run(worker, "job-1", append_line(1))
    elsewhere = run(other, "job-2", append_line(2))

    # When worker-1 is delivered job-2 too
    before = trips.mark()
    result = run(worker, "job-2", append_line(2))

    # Then its push was refused, the fetch found the job's commit, and nothing was committed twice
    assert trips.since(before) == (1, 1)
    assert result == {"commit": elsewhere["commit"], "alreadyApplied": True}
    assert branch_job_ids(remote) == ["job-1", "job-2"]


@pytest.mark.parametrize("rival_job", ["job-0", "job-1"])
def test_apply_once_fetches_again_when_the_branch_moves_between_its_fetch_and_its_push(
    remote: Path, make_store: StoreFactory, trips: RoundTrips, rival_job: str
) -> None:
    # Given a worker (cold cache) whose branch another worker moves after its fetch, with another job (job-0) or with
    # this very job (job-1, a redelivery run at once elsewhere)
    rival_results: list[dict[str, Any]] = []
    rival_fetches: list[int] = []
    other = make_store("worker-2").open("ws-1")

    def rival() -> None:
        before = trips.fetches
        rival_results.append(run(other, rival_job, append_line(1)))
        rival_fetches.append(trips.fetches - before)

    worker = _RivalBeforePush(make_store("worker-1").open("ws-1"), rival)

    # When the worker applies job-1
    before = trips.fetches
    result = run(worker, "job-1", append_line(1) if rival_job == "job-1" else OWN_FILE)

    # Then its push was refused, and it fetched once more, looked for its trailer again and (for another job) applied
    # its patch on the new head: one commit per job, in order
    assert trips.fetches - before - sum(rival_fetches) == 2
    rival_commit = rival_results[0]["commit"]
    if rival_job == "job-1":
        assert result == {"commit": rival_commit, "alreadyApplied": True}
        assert branch_job_ids(remote) == ["job-1"]
    else:
        assert result["alreadyApplied"] is False
        assert result["parent"] == rival_commit
        assert branch_job_ids(remote) == ["job-0", "job-1"]
    assert remote_ref(remote, BRANCH) == (rival_commit if rival_job == "job-1" else result["commit"])


def test_apply_once_gives_up_retryably_when_the_branch_keeps_moving(
    remote: Path, make_store: StoreFactory, trips: RoundTrips
) -> None:
    # Given a branch that another worker moves before each of this worker's pushes
    other = make_store("worker-2").open("ws-1")
    rival_jobs = iter(range(1, 10))
    rival_fetches: list[int] = []

    def rival() -> None:
        n, before = next(rival_jobs), trips.fetches
        run(other, f"rival-{n}", append_line(n))
        rival_fetches.append(trips.fetches - before)

    worker = _RivalBeforePush(make_store("worker-1").open("ws-1"), rival, rounds=apply_patch.MAX_HEAD_RACES)

    # When the worker applies its job
    with pytest.raises(RetryableJobError, match="kept moving"):
        run(worker, "job-1", OWN_FILE)

    # Then it tried MAX_HEAD_RACES times, one fetch each, and the branch holds the rival's jobs only
    assert trips.fetches - sum(rival_fetches) == apply_patch.MAX_HEAD_RACES
    assert branch_job_ids(remote) == [f"rival-{n}" for n in range(1, apply_patch.MAX_HEAD_RACES + 1)]


def test_a_warm_cache_whose_pushes_keep_being_refused_still_fetches_max_head_races_times(
    remote: Path, make_store: StoreFactory, trips: RoundTrips
) -> None:
    # Given a warm worker whose branch another worker moves before each of its pushes, the push on its cached head
    # included
    other = make_store("worker-2").open("ws-1")
    warm = make_store("worker-1").open("ws-1")
    run(warm, "job-0", OWN_FILE)
    rival_jobs = iter(range(1, 10))

    def rival() -> None:
        n = next(rival_jobs)
        run(other, f"rival-{n}", append_line(n))

    worker = _RivalBeforePush(warm, rival, rounds=apply_patch.MAX_HEAD_RACES + 1)

    # When the worker applies its job
    with pytest.raises(RetryableJobError, match="kept moving"):
        run(worker, "job-1", diff("--- /dev/null", "+++ b/other.txt", "@@ -0,0 +1 @@", "+other"))

    # Then the cached round did not count against MAX_HEAD_RACES: the branch holds the rival's jobs after job-0 only
    assert branch_job_ids(remote) == ["job-0", *[f"rival-{n}" for n in range(1, apply_patch.MAX_HEAD_RACES + 2)]]


def branch_job_ids_of(workspace: GitWorkspace) -> list[str]:
    return [commit.job_id for commit in workspace.history()]
