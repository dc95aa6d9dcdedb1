"""GitWorkspace.apply_once, the whole of an apply_patch job on a git workspace: how often it fetches its remote.

Fetches are counted at dulwich's client (every fetch of a local remote goes through `LocalGitClient.fetch_pack`).
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


class FetchCount:
    """The fetches made so far, by any workspace of this process."""

    def __init__(self) -> None:
        self.total = 0


@pytest.fixture
def fetches(monkeypatch: pytest.MonkeyPatch) -> FetchCount:
    count = FetchCount()
    fetch_pack = LocalGitClient.fetch_pack

    def counted(self: LocalGitClient, *args: Any, **kwargs: Any) -> Any:
        count.total += 1
        return fetch_pack(self, *args, **kwargs)

    monkeypatch.setattr(LocalGitClient, "fetch_pack", counted)
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


def test_apply_once_fetches_once_on_the_happy_path(make_store: StoreFactory, fetches: FetchCount) -> None:
    # Given a worker whose cache is warm (it applied a job of the workspace before)
    workspace = make_store().open("ws-1")
    run(workspace, "job-1", append_line(1))

    # When it applies the next job, then is delivered that job again
    before = fetches.total
    applied = run(workspace, "job-2", append_line(2))
    after_apply = fetches.total
    again = run(workspace, "job-2", append_line(2))

    # Then each took one fetch: the trailer look, the patch and the push all work from it
    assert after_apply - before == 1
    assert fetches.total - after_apply == 1
    assert again == {"commit": applied["commit"], "alreadyApplied": True}
    assert branch_job_ids_of(workspace) == ["job-1", "job-2"]


def test_apply_once_on_a_cold_cache_fetches_once(make_store: StoreFactory, fetches: FetchCount) -> None:
    run(make_store("cold").open("ws-1"), "job-1", append_line(1))

    assert fetches.total == 1


@pytest.mark.parametrize("rival_job", ["job-0", "job-1"])
def test_apply_once_fetches_again_when_the_branch_moves_between_its_fetch_and_its_push(
    remote: Path, make_store: StoreFactory, fetches: FetchCount, rival_job: str
) -> None:
    # Given a worker whose branch another worker moves after its fetch, with another job (job-0) or with this very
    # job (job-1, a redelivery run at once elsewhere)
    rival_results: list[dict[str, Any]] = []
    rival_fetches: list[int] = []
    other = make_store("worker-2").open("ws-1")

    def rival() -> None:
        before = fetches.total
        rival_results.append(run(other, rival_job, append_line(1)))
        rival_fetches.append(fetches.total - before)

    worker = _RivalBeforePush(make_store("worker-1").open("ws-1"), rival)

    # When the worker applies job-1
    before = fetches.total
    result = run(worker, "job-1", append_line(1) if rival_job == "job-1" else OWN_FILE)

    # Then its push was refused, and it fetched once more, looked for its trailer again and (for another job) applied
    # its patch on the new head: one commit per job, in order
    assert fetches.total - before - sum(rival_fetches) == 2
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
    remote: Path, make_store: StoreFactory, fetches: FetchCount
) -> None:
    # Given a branch that another worker moves before each of this worker's pushes
    other = make_store("worker-2").open("ws-1")
    rival_jobs = iter(range(1, 10))
    rival_fetches: list[int] = []

    def rival() -> None:
        n, before = next(rival_jobs), fetches.total
        run(other, f"rival-{n}", append_line(n))
        rival_fetches.append(fetches.total - before)

    worker = _RivalBeforePush(make_store("worker-1").open("ws-1"), rival, rounds=apply_patch.MAX_HEAD_RACES)

    # When the worker applies its job
    with pytest.raises(RetryableJobError, match="kept moving"):
        run(worker, "job-1", OWN_FILE)

    # Then it tried MAX_HEAD_RACES times, one fetch each, and the branch holds the rival's jobs only
    assert fetches.total - sum(rival_fetches) == apply_patch.MAX_HEAD_RACES
    assert branch_job_ids(remote) == [f"rival-{n}" for n in range(1, apply_patch.MAX_HEAD_RACES + 1)]


def branch_job_ids_of(workspace: GitWorkspace) -> list[str]:
    return [commit.job_id for commit in workspace.history()]
