"""apply_patch as a workspace grows: the time of one job at job 1, 100 and 1,000 of one workspace, and the first job on
a large repository, beside `git clone` + `git am` + `git push` of the same patch measured in the same run.

A job's cost must not grow with the jobs before it: its trailer lookup walks only the commits above the cache's index,
its push sends only the new commit's objects (written loose into a file-system remote, as git's receive-pack does),
and the cache is kept to few packs. The baseline is the same run without those (the whole branch walked for the
trailer, dulwich's own `generate_pack_data` for the push, a pack per push, the cache's packs never merged), as the
worker did before; it is run only up to BASELINE_JOBS jobs, as it slows down with each.

Every job adds a file of its own, spread over FOLDERS folders, so the tree a job rewrites stays about the same size:
a folder that grows by one file per job costs git and the worker alike, and is not what is measured here.

The large repository is built with real git (`git fast-import`): LARGE_COMMITS commits, each writing 10 KiB of random
(incompressible) bytes to one of 500 files, about 50 MB of pack. Its first job is a cold cache: the worker fetches the
base branch's tip at depth 1 (its 500 files, not their history), applies the patch and pushes; the baseline's
`git clone` fetches the whole history (`cold_first_job` sets the first job beside `git clone --depth 1`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agent_jobs_bench.figures import Comparison, Figure, Goal

BENCHMARK = "apply_patch as a workspace grows"
COMMAND = ".venv/bin/python -m agent_jobs_bench --only workspace_growth"
BASE_BRANCH = "main"
FOLDERS = 50
JOBS = 1000
BASELINE_JOBS = 200
WINDOW = 10  # the median of this many jobs around each point
QUICK_JOBS = 30
QUICK_BASELINE_JOBS = 30
QUICK_WINDOW = 4
LARGE_COMMITS = 5000
QUICK_LARGE_COMMITS = 100
LARGE_FILE_BYTES = 10 * 1024
FLAT_GOAL = Goal(2.0, Comparison.AT_MOST, "job 1,000 within 2x of job 1 (flat within the machine's noise)")


def _patch(n: int) -> str:
    return f"--- /dev/null\n+++ b/jobs/{n % FOLDERS}/job-{n}.txt\n@@ -0,0 +1 @@\n+job {n}\n"


def _job(n: int, workspace_id: str) -> Any:
    from agent_jobs.models import ApplyPatchJob

    return ApplyPatchJob.model_validate(
        {
            "jobId": f"job-{n}",
            "workspaceId": workspace_id,
            "type": "apply_patch",
            "payload": {"patch": _patch(n), "commitMessage": f"job {n}"},
        }
    )


def _store(root: Path, url: str, name: str) -> Any:
    from job_worker.jobs.git_workspace import GitRemote, GitWorkspaceStore
    from job_worker.jobs.limits import GitLimits

    def resolve(workspace_id: str) -> GitRemote:
        return GitRemote(url=url, branch=f"agent/{workspace_id}", base_branch=BASE_BRANCH)

    # The large repository is more than the default MAX_FETCH_BYTES: raised, as a worker serving it would be.
    return GitWorkspaceStore(root / "caches" / name, resolve, limits=GitLimits(max_fetch_bytes=1 << 30))


def _timed_job(store: Any, n: int, workspace_id: str = "ws-1") -> float:
    from job_worker.jobs import apply_patch
    from job_worker.jobs.context import JobContext

    workspace = store.open(workspace_id)
    started = time.perf_counter()
    result = apply_patch.run(_job(n, workspace_id), JobContext(workspace=workspace, remaining_ms=lambda: 600_000))
    elapsed = time.perf_counter() - started
    if result.get("alreadyApplied"):
        raise RuntimeError(f"job {n} was found already applied: the benchmark's jobs must all be new")
    return elapsed


@contextlib.contextmanager
def _before_the_fixes() -> Iterator[None]:
    """The worker as it was: the whole branch walked for every trailer lookup, dulwich's own pack generation for the
    push (its walk of everything the remote advertises, its search of every pack for deltas), a pack per push, no
    packs merged."""
    from dulwich.object_store import MissingObjectFinder

    from job_worker.jobs.git import branch, cache, trailer_index, transport

    def whole_branch(store: Any, _cache: Path, _branch: Any, head: Any, base: Any, **_: Any) -> Any:
        return trailer_index._walk(store, head, base, frozenset())[0] if head is not None else []

    def dulwich_objects(store: Any, have: Any, want: Any) -> list[Any]:
        return [sha for sha, _ in MissingObjectFinder(store, haves=have, wants=want)]

    def no_merge(*_: Any, **__: Any) -> bool:
        return False

    replaced = [
        (branch, "indexed_job_commits", whole_branch),
        (transport, "objects_to_send", dulwich_objects),
        (transport, "UNPACK_LIMIT", 0),  # a pack per push, as dulwich's receive writes it
        (cache, "consolidate", no_merge),
    ]
    saved = [(module, name, getattr(module, name)) for module, name, _ in replaced]
    for module, name, replacement in replaced:
        setattr(module, name, replacement)
    try:
        yield
    finally:
        for module, name, original in saved:
            setattr(module, name, original)


def _growth(root: Path, jobs: int, name: str) -> list[float]:
    from agent_jobs_local.workload import create_remote

    remote = root / f"{name}.git"
    create_remote(remote, remote.stem)
    store = _store(root, str(remote), name)
    return [_timed_job(store, n) for n in range(1, jobs + 1)]


def _at(times: list[float], job: int, window: int) -> float:
    """The median time in ms of the `window` jobs ending at job `job` (1-based), or starting at job 1."""
    start = max(0, min(job - window // 2, len(times) - window))
    return statistics.median(times[start : start + window]) * 1000


def _growth_figures(root: Path, quick: bool) -> list[Figure]:
    jobs, baseline_jobs, window = (
        (QUICK_JOBS, QUICK_BASELINE_JOBS, QUICK_WINDOW) if quick else (JOBS, BASELINE_JOBS, WINDOW)
    )
    times = _growth(root, jobs, "fixed")
    with _before_the_fixes():
        before = _growth(root, baseline_jobs, "before")
    middle = 100 if not quick else jobs // 3
    points = {1: _at(times, 1, window), middle: _at(times, middle, window), jobs: _at(times, jobs, window)}
    baselines = {point: _at(before, point, window) for point in points if point <= baseline_jobs}
    note = (
        f"one workspace on a file-system remote, one process; median of {window} jobs around each point; baseline: "
        f"the same run without the trailer index, the push's own object walk, loose pushes and pack merging (run to "
        f"job {baseline_jobs}: at job {baseline_jobs} it takes {_at(before, baseline_jobs, window):.1f} ms)"
    )
    figures = [
        Figure(
            BENCHMARK,
            f"apply_patch at job {point:,} of a workspace",
            round(value, 1),
            "ms",
            COMMAND,
            baseline=round(baselines[point], 1) if point in baselines else None,
            note=note,
        )
        for point, value in points.items()
    ]
    figures.append(
        Figure(
            BENCHMARK,
            f"apply_patch time, job {jobs:,} / job 1",
            round(points[jobs] / points[1], 2),
            "x",
            COMMAND,
            baseline=round(_at(before, baseline_jobs, window) / baselines[1], 2),
            goal=None if quick else FLAT_GOAL,
            note=f"baseline: job {baseline_jobs:,} / job 1 without the fixes"
            + (f" (not run to job {jobs:,})" if baseline_jobs < jobs else ""),
        )
    )
    return figures


def _fast_import_stream(commits: int) -> Iterator[bytes]:
    yield b"reset refs/heads/main\n"
    for n in range(1, commits + 1):
        message = f"change {n}\n".encode()
        content = os.urandom(LARGE_FILE_BYTES)
        header = f"commit refs/heads/main\nmark :{n}\ncommitter Dev <dev@example.com> {1_600_000_000 + n} +0000\n"
        yield header.encode() + b"data %d\n" % len(message) + message
        if n > 1:
            yield b"from :%d\n" % (n - 1)
        if n == 1:
            readme = b"# large\n"
            yield b"M 100644 inline README.md\ndata %d\n" % len(readme) + readme + b"\n"
        yield f"M 100644 inline data/{n % 500}.bin\n".encode() + b"data %d\n" % len(content) + content + b"\n"


def _large_remote(path: Path, commits: int) -> int:
    """A bare repository built by `git fast-import`; its size in bytes."""
    subprocess.run(["git", "init", "--quiet", "--bare", "--initial-branch", BASE_BRANCH, str(path)], check=True)
    importer = subprocess.Popen(["git", "-C", str(path), "fast-import", "--quiet"], stdin=subprocess.PIPE)
    assert importer.stdin is not None
    for chunk in _fast_import_stream(commits):
        importer.stdin.write(chunk)
    importer.stdin.close()
    if importer.wait() != 0:
        raise RuntimeError("git fast-import failed")
    return sum(file.stat().st_size for file in path.rglob("*") if file.is_file())


def _git_clone_and_am(root: Path, remote: Path, n: int) -> float:
    """`git clone` of the remote (its pack sent as to any client), `git am` of the job's patch, `git push`: seconds."""
    work = root / "git-clone"
    mail = root / "job.patch"
    mail.write_text(
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: Agent <agent@example.com>\nDate: Thu, 1 Jan 2026 00:00:00 +0000\n"
        f"Subject: [PATCH] job {n}\n\n---\n{_patch(n)}"
    )
    environment = {**os.environ, "GIT_COMMITTER_NAME": "Agent Jobs", "GIT_COMMITTER_EMAIL": "agent-jobs@localhost"}
    started = time.perf_counter()
    subprocess.run(["git", "clone", "--quiet", "--no-local", str(remote), str(work)], check=True, env=environment)
    subprocess.run(["git", "-C", str(work), "am", "--quiet", str(mail)], check=True, env=environment)
    subprocess.run(
        ["git", "-C", str(work), "push", "--quiet", "origin", "HEAD:refs/heads/agent/git"], check=True, env=environment
    )
    return time.perf_counter() - started


def _large_figures(root: Path, quick: bool) -> list[Figure]:
    commits = QUICK_LARGE_COMMITS if quick else LARGE_COMMITS
    remote = root / "large.git"
    size = _large_remote(remote, commits)
    git_seconds = _git_clone_and_am(root, remote, 1)
    shutil.rmtree(root / "git-clone")
    worker_seconds = _timed_job(_store(root, str(remote), "large"), 2, "ws-large")
    return [
        Figure(
            BENCHMARK,
            "first apply_patch on a large repository (cold cache)",
            round(worker_seconds, 2),
            "s",
            COMMAND,
            baseline=round(git_seconds, 2),
            note=(
                f"{commits:,} commits, {size / 1e6:.0f} MB on disk, built with git fast-import; file-system remote;"
                " baseline: git clone --no-local + git am + git push of the same patch, in the same run"
            ),
        )
    ]


def run(quick: bool = False) -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="agent-jobs-growth-bench-") as folder:
        root = Path(folder)
        return [*_growth_figures(root, quick), *_large_figures(root, quick)]
