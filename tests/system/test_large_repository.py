"""A repository whose history is larger than the fetch limit, on the local runtime at its default limits (the worker
processes, the API over HTTP, moto's server): the first job succeeds, because a cold cache fetches the tips, not the
history; and a new local runtime (every cache cold) on the branch the first one wrote to runs a job again (it is found,
not applied twice) and the next one once."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

from agent_jobs.settings import DEFAULT_MAX_FETCH_BYTES
from agent_jobs_local.demo import remote_branches
from agent_jobs_local.runtime import LocalRuntime
from agent_jobs_local.workload import register_workspaces, remote_path
from tests.conftest import make_job
from tests.system.test_resume import TENANT, call

WORKSPACE = "big"
HISTORY_FILES = 50
FILE_BYTES = 100 * 1024


def large_history_remote(path: Path, commits: int) -> None:
    """A bare remote whose `main` has `commits` commits, each rewriting one of HISTORY_FILES files with FILE_BYTES of
    incompressible bytes (`git fast-import`): a history of commits * FILE_BYTES, a tip of HISTORY_FILES files."""
    path.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(path)], check=True)
    stream = bytearray()
    for n in range(commits):
        content = os.urandom(FILE_BYTES)
        stream += b"blob\nmark :%d\ndata %d\n%s\n" % (n + 1, len(content), content)
    readme = b"# big\n"
    for n in range(commits):
        message = b"revision %d\n" % n
        stream += b"commit refs/heads/main\ncommitter Maintainer <m@example.com> %d +0000\n" % (1_700_000_000 + n)
        stream += b"data %d\n%s" % (len(message), message)
        if n == 0:
            stream += b"M 100644 inline README.md\ndata %d\n%s\n" % (len(readme), readme)
        stream += b"M 100644 :%d history/%d.bin\n\n" % (n + 1, n % HISTORY_FILES)
    subprocess.run(["git", "-C", str(path), "fast-import", "--quiet"], input=bytes(stream), check=True)


def run_jobs(runtime: LocalRuntime, remote: Path, job_ids: list[str]) -> dict[str, Any]:
    """Register the workspace on `runtime`, send `job_ids` in order, and wait until each has ended; their records."""
    api = runtime.api_url
    register_workspaces(api, {WORKSPACE: remote}, github_api_url="https://api.github.com", tenant_id=TENANT)
    for job_id in job_ids:
        status, answer = call("POST", f"{api}/jobs", make_job(job_id, WORKSPACE).model_dump(by_alias=True))
        assert status == 202, answer
    deadline = time.monotonic() + 120
    records: dict[str, Any] = {}
    while time.monotonic() < deadline:
        records = {job_id: call("GET", f"{api}/jobs/{job_id}")[1] for job_id in job_ids}
        if all(record["status"] in {"SUCCEEDED", "DEAD", "REJECTED"} for record in records.values()):
            return records
        time.sleep(0.3)
    raise AssertionError(f"jobs did not end: {records}")


def test_a_history_over_the_fetch_limit_is_served_and_a_cold_runtime_applies_each_job_once(tmp_path: Path) -> None:
    # Given a remote whose history (about 110 MiB) is over the default MAX_FETCH_BYTES, its tip about 5 MiB
    remotes_root = tmp_path / "remotes"
    remote = remote_path(remotes_root, WORKSPACE, TENANT)
    large_history_remote(remote, commits=1100)
    packs = sum(pack.stat().st_size for pack in (remote / "objects" / "pack").glob("*.pack"))
    assert packs > DEFAULT_MAX_FETCH_BYTES

    # When the local runtime, at its default limits, runs the workspace's first job
    with LocalRuntime(workspaces_root=tmp_path / "first", remotes_root=remotes_root, time_scale=0.05) as runtime:
        first = run_jobs(runtime, remote, ["job-1"])

    # and a new local runtime (its workers' caches all cold) runs job 1 again, then job 2
    with LocalRuntime(workspaces_root=tmp_path / "second", remotes_root=remotes_root, time_scale=0.05) as runtime:
        second = run_jobs(runtime, remote, ["job-1", "job-2"])

    # Then every job succeeded, job 1's second run found its commit, and each took effect once, in order
    assert first["job-1"]["status"] == "SUCCEEDED", first["job-1"]
    assert [second[job_id]["status"] for job_id in ("job-1", "job-2")] == ["SUCCEEDED", "SUCCEEDED"], second
    assert second["job-1"]["result"]["alreadyApplied"] is True
    assert second["job-1"]["result"]["commit"] == first["job-1"]["result"]["commit"]
    assert remote_branches({WORKSPACE: remote}, tmp_path / "reader-cache")(WORKSPACE) == ["job-1", "job-2"]
