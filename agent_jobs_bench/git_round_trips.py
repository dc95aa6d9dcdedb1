"""Git round trips per apply_patch: how often the worker reaches a workspace's remote, and what that costs when each
request takes 100 ms, beside the naive pattern measured in the same run.

The naive pattern fetches the branch before every job (to look for the job's trailer and apply the patch on the
head), then pushes: what the worker did before a warm cache's push decided alone whether the cache was current. Both
run the worker's own `GitWorkspace.apply_once`; the naive one on a workspace whose cache is never trusted without a
fetch.

Two remotes: a bare repository on the local file system (round trips counted at dulwich's client: a fetch is one
`fetch_pack`, a push one `send_pack`), and the same repository served over smart HTTP on loopback by dulwich's own
`dulwich.web` (requests counted at the server). For the latency figures the server holds every request
`ROUND_TRIP_SECONDS` before answering, as a remote across the internet would (GitHub's round trips are 100-300 ms).
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from dulwich.client import LocalGitClient
from dulwich.repo import Repo
from dulwich.server import BackendRepo, DictBackend
from dulwich.web import make_wsgi_chain

from agent_jobs_bench.figures import Comparison, Figure, Goal

BENCHMARK = "Git round trips per apply_patch"
COMMAND = ".venv/bin/python -m agent_jobs_bench --only git_round_trips"
BASE_BRANCH = "main"
ROUND_TRIP_SECONDS = 0.1
JOBS = 20
QUICK_JOBS = 6
WARM_GOAL = Goal(1, Comparison.AT_MOST, "1 git round trip per job on a warm cache (the push)")
COLD_GOAL = Goal(2, Comparison.AT_MOST, "at most 2 git round trips on a cold cache")


def _seed_remote(path: Path) -> None:
    """A bare repository with one commit on main (a README), as a workspace's remote starts."""
    from agent_jobs_local.workload import create_remote

    create_remote(path, path.stem)


def _patch(n: int) -> str:
    """Job n's patch: a file of its own, so every job applies on whatever head the last one left."""
    return f"--- /dev/null\n+++ b/jobs/job-{n}.txt\n@@ -0,0 +1 @@\n+job {n}\n"


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class _HttpRemote:
    """`path` served over smart HTTP on 127.0.0.1, holding each request `delay` seconds; requests counted."""

    def __init__(self, path: Path) -> None:
        self.requests: Counter[str] = Counter()
        self.delay = 0.0
        repositories: dict[str, BackendRepo] = {"/": cast(BackendRepo, Repo(str(path)))}
        application = make_wsgi_chain(DictBackend(repositories))

        def counting(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            self.requests[environ["REQUEST_METHOD"]] += 1
            if self.delay:
                time.sleep(self.delay)
            return application(environ, start_response)

        self._server = make_server("127.0.0.1", 0, counting, server_class=WSGIServer, handler_class=_Quiet)
        self.url = f"http://127.0.0.1:{self._server.server_port}/"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextlib.contextmanager
def _counted_local_trips() -> Iterator[Counter[str]]:
    """Fetches and pushes of local remotes while inside, counted at dulwich's client."""
    trips: Counter[str] = Counter()
    fetch_pack, send_pack = LocalGitClient.fetch_pack, LocalGitClient.send_pack

    def counted_fetch(self: LocalGitClient, *args: Any, **kwargs: Any) -> Any:
        trips["fetch"] += 1
        return fetch_pack(self, *args, **kwargs)

    def counted_push(self: LocalGitClient, *args: Any, **kwargs: Any) -> Any:
        trips["push"] += 1
        return send_pack(self, *args, **kwargs)

    LocalGitClient.fetch_pack, LocalGitClient.send_pack = counted_fetch, counted_push  # type: ignore[method-assign]
    try:
        yield trips
    finally:
        LocalGitClient.fetch_pack, LocalGitClient.send_pack = fetch_pack, send_pack  # type: ignore[method-assign]


class _Worker:
    """One worker's git workspace on `url` (its own cache folder, and its own branch: the naive worker's pushes never
    make the other's cache stale); `naive`: it fetches before every job."""

    def __init__(self, root: Path, url: str, name: str, *, naive: bool) -> None:
        from job_worker.jobs.git_workspace import GitRemote, GitWorkspace, GitWorkspaceStore

        def resolve(workspace_id: str) -> GitRemote:
            return GitRemote(url=url, branch=f"agent/{workspace_id}", base_branch=BASE_BRANCH)

        self._store = GitWorkspaceStore(root / "caches" / name, resolve)
        self._workspace_id = "ws-naive" if naive else "ws-agent-jobs"
        self._naive = naive
        self._untrusting = _untrusting_workspace_class(GitWorkspace)

    def apply(self, n: int) -> dict[str, Any]:
        from agent_jobs.models import ApplyPatchJob
        from job_worker.jobs import apply_patch
        from job_worker.jobs.context import JobContext

        workspace = self._store.open(self._workspace_id)
        if self._naive:
            workspace.__class__ = self._untrusting
        job = ApplyPatchJob.model_validate(
            {
                "jobId": f"job-{n}",
                "workspaceId": self._workspace_id,
                "type": "apply_patch",
                "payload": {"patch": _patch(n), "commitMessage": f"job {n}"},
            }
        )
        return apply_patch.run(job, JobContext(workspace=workspace, remaining_ms=lambda: 60_000))


def _untrusting_workspace_class(base: type) -> type:
    """A GitWorkspace that never trusts its cache without a fetch (the naive pattern: fetch, then push)."""

    class Untrusting(base):  # type: ignore[misc]
        @contextlib.contextmanager
        def _cached_branch(self) -> Iterator[None]:
            yield None

    return Untrusting


def _local_figures(root: Path, jobs: int) -> list[Figure]:
    remote = root / "local.git"
    _seed_remote(remote)
    per_job: dict[str, float] = {}
    cold: dict[str, float] = {}
    for kind in ("agent-jobs", "naive"):
        worker = _Worker(root, str(remote), f"local-{kind}", naive=kind == "naive")
        offset = 0 if kind == "agent-jobs" else 1000
        with _counted_local_trips() as trips:
            worker.apply(offset)
            cold[kind] = trips.total()
            before = trips.total()
            for n in range(1, jobs + 1):
                worker.apply(offset + n)
            per_job[kind] = (trips.total() - before) / jobs
    note = (
        f"file remote, {jobs} jobs in a row on one workspace after a first job; round trips counted at dulwich's client"
        " (a fetch is one fetch_pack, a push one send_pack); naive: a fetch before every job, then the push"
    )
    return [
        Figure(
            BENCHMARK,
            "git round trips per apply_patch, warm cache, happy path (file remote)",
            per_job["agent-jobs"],
            "round trips",
            COMMAND,
            baseline=per_job["naive"],
            goal=WARM_GOAL,
            note=note,
        ),
        Figure(
            BENCHMARK,
            "git round trips of the first apply_patch, cold cache (file remote)",
            cold["agent-jobs"],
            "round trips",
            COMMAND,
            baseline=cold["naive"],
            goal=COLD_GOAL,
            note="the first job of a worker that has no cache of the workspace yet: one fetch, then the push",
        ),
    ]


def _http_figures(root: Path, jobs: int) -> list[Figure]:
    remote_path = root / "http.git"
    _seed_remote(remote_path)
    remote = _HttpRemote(remote_path)
    try:
        requests: dict[str, float] = {}
        latency: dict[str, list[float]] = {"agent-jobs": [], "naive": []}
        workers = {
            kind: _Worker(root, remote.url, f"http-{kind}", naive=kind == "naive") for kind in ("agent-jobs", "naive")
        }
        offsets = {"agent-jobs": 0, "naive": 1000}
        for kind, worker in workers.items():
            worker.apply(offsets[kind])  # warm the cache
            before = remote.requests.total()
            for n in range(1, jobs + 1):
                worker.apply(offsets[kind] + n)
            requests[kind] = (remote.requests.total() - before) / jobs
        remote.delay = ROUND_TRIP_SECONDS
        for n in range(jobs + 1, jobs + 1 + jobs):  # interleaved, so the machine's noise falls on both alike
            for kind, worker in workers.items():
                started = time.perf_counter()
                worker.apply(offsets[kind] + n)
                latency[kind].append(time.perf_counter() - started)
    finally:
        remote.close()
    medians = {kind: statistics.median(values) * 1000 for kind, values in latency.items()}
    return [
        Figure(
            BENCHMARK,
            "HTTP requests per apply_patch, warm cache, happy path (smart HTTP, dulwich.web)",
            requests["agent-jobs"],
            "requests",
            COMMAND,
            baseline=requests["naive"],
            note=(
                "one push is 2 requests (the ref advertisement git's protocol requires before any push, then the"
                " receive-pack request with the pack); the naive fetch adds the upload-pack advertisement, and an"
                " upload-pack request whenever the branch has news"
            ),
        ),
        Figure(
            BENCHMARK,
            f"apply_patch latency at {int(ROUND_TRIP_SECONDS * 1000)} ms per request, warm cache (median)",
            round(medians["agent-jobs"], 1),
            "ms",
            COMMAND,
            baseline=round(medians["naive"], 1),
            note=(
                f"median of {jobs} jobs each, the two workers interleaved; the server holds every request"
                f" {int(ROUND_TRIP_SECONDS * 1000)} ms"
            ),
        ),
    ]


def run(quick: bool = False) -> list[Figure]:
    jobs = QUICK_JOBS if quick else JOBS
    with tempfile.TemporaryDirectory(prefix="agent-jobs-git-bench-") as folder:
        root = Path(folder)
        return [*_local_figures(root, jobs), *_http_figures(root, jobs)]
