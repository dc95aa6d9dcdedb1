"""The first job on a cold cache: what a new execution environment's first apply_patch on a workspace costs, beside
`git clone --depth 1` + `git apply` + `git commit` + `git push` of the same patch measured in the same run.

A cold cache fetches the tips of the branch and its base at depth 1 (`jobs.git.transport`), so the first job must
cost what the tip tree costs, not what the history does. Two synthetic repositories with the same tip tree
(SMALL_COMMITS and LARGE_COMMITS commits, built with `git fast-import`: every commit of the history rewrites a file of
the tip, the last one restores them all; then repacked as `git gc` leaves a bare repository, bitmaps and all) show
whether it does. The goals: the first job within 2x of the shallow clone's time plus a second; the worker's peak
memory within a 256 MB Lambda function's; the long history's first job within 1.3x of the short one's. Each is
measured over a file-system remote and over smart HTTP (`git http-backend`, git's own server, which can deepen a
shallow client as GitHub's can). Over a file-system remote the worker's process serves its own fetch, so what
dulwich's serving side reads counts too: it loads every bitmap of the remote's packs before any fetch, one at depth
1 too, which the long history's peak memory shows.

Every job runs in a fresh process, as in a new execution environment: the worker's code (as at /var/task and
/opt/python) with its default limits, a cache folder of its own, one apply_patch job of a new workspace. Its time is
the job's (the process's start and the worker's imports are the cold start section's); its peak memory is the whole
process's (`ru_maxrss` from `os.wait4`, see `run_measured`), which over a file-system remote also holds the remote's
side of the fetch (dulwich serves it in the worker's process), as git's figure holds its upload-pack's. The git runs
alternate with the worker's, and the two synthetic repositories' runs with each other, so the machine's noise falls
on all; each figure is the median of the runs.

Real repositories are optional rows: bare repositories (or git folders) named in AGENT_JOBS_BENCH_REPOS, comma
separated, each with a job that adds a new file on its HEAD's branch. They are never written: each is served through a
repository of the run's own that borrows its objects (`objects/info/alternates`) and copies its refs. The quick run
(tests) leaves them out.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from agent_jobs_bench.figures import Comparison, Figure, Goal
from agent_jobs_bench.git_http_backend import git_http_backend

BENCHMARK = "First job on a cold cache"
COMMAND = ".venv/bin/python -m agent_jobs_bench --only cold_first_job"
REPOS_VARIABLE = "AGENT_JOBS_BENCH_REPOS"
PROJECT_ROOT = Path(__file__).resolve().parent.parent
WORKER_PATH = [PROJECT_ROOT / "functions" / "job_worker", PROJECT_ROOT / "layers" / "shared"]
BASE_BRANCH = "main"
SMALL_COMMITS = 500
LARGE_COMMITS = 50_000
QUICK_SMALL_COMMITS = 50
QUICK_LARGE_COMMITS = 2_000
TIP_FOLDERS = 60  # x TIP_FILES_PER_FOLDER files of about 1.6 KB: 3,000 files, about 5 MB
TIP_FILES_PER_FOLDER = 50
QUICK_TIP_FOLDERS = 10
QUICK_TIP_FILES_PER_FOLDER = 20
FILE_LINES = 40
RUNS = 5
REAL_RUNS = 3
QUICK_RUNS = 1
MIB = 1024 * 1024
ALLOWANCE_FACTOR = 2.0
ALLOWANCE_SECONDS = 1.0
RSS_GOAL = Goal(256, Comparison.AT_MOST, "worker peak RSS under 256 MiB (a 256 MB Lambda function)")
HISTORY_GOAL = Goal(1.3, Comparison.AT_MOST, "the long history's first job within 1.3x of the short one's (same tip)")
PROTOCOLS = ("file", "http")
IDENTITY = {
    "GIT_AUTHOR_NAME": "Agent",
    "GIT_AUTHOR_EMAIL": "agent@example.com",
    "GIT_COMMITTER_NAME": "Agent Jobs",
    "GIT_COMMITTER_EMAIL": "agent-jobs@localhost",
}

# Starts a command (argv[2:]) and writes its peak RSS in KiB (its ru_maxrss) to the file argv[1]; exits with its status.
_LAUNCHER = """
import os, sys
pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ)
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as rss:
    rss.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""
# What the fresh process runs: the worker's imports, then one apply_patch job on a cold cache, timed.
_JOB = """
import json, sys, time
from pathlib import Path
from agent_jobs.models import ApplyPatchJob
from job_worker.jobs import apply_patch
from job_worker.jobs.context import JobContext
from job_worker.jobs.git_workspace import GitRemote, GitWorkspaceStore

url, base_branch, cache_root, workspace_id, job_id, patch_file = sys.argv[1:]
remote = GitRemote(url=url, branch=f"agent/{workspace_id}", base_branch=base_branch)
store = GitWorkspaceStore(Path(cache_root), lambda _workspace_id: remote)
job = ApplyPatchJob.model_validate({
    "jobId": job_id,
    "workspaceId": workspace_id,
    "type": "apply_patch",
    "payload": {"patch": Path(patch_file).read_text(), "commitMessage": f"job {job_id}"},
})
started = time.perf_counter()
result = apply_patch.run(job, JobContext(workspace=store.open(workspace_id), remaining_ms=lambda: 600_000))
print(json.dumps({"seconds": time.perf_counter() - started, **result}))
"""


@dataclass(frozen=True)
class Remote:
    """A bare repository to run first jobs on: its path, base branch, and what the figures say about it."""

    name: str  # the folder's name, without .git
    label: str  # what the figures call it
    path: Path
    base_branch: str
    patch: str
    commits: int
    pack_bytes: int
    refs: int
    tip_files: int
    tip_bytes: int

    def describe(self) -> str:
        return (
            f"{self.commits:,} commits, {self.pack_bytes / MIB:.1f} MiB of packs, {self.refs:,} ref(s); tip:"
            f" {self.tip_files:,} files, {self.tip_bytes / MIB:.1f} MiB"
        )


@dataclass(frozen=True)
class Run:
    """One first job (or one git clone + apply + commit + push): its seconds and its processes' peak RSS in bytes."""

    seconds: float
    peak_rss: int
    process_seconds: float = 0.0


@dataclass(frozen=True)
class Case:
    """The runs of the worker and of git for one remote over one protocol."""

    remote: Remote
    protocol: str
    worker: list[Run]
    git: list[Run]
    git_no_checkout: list[Run]

    @property
    def worker_median(self) -> Run:
        return _median(self.worker)

    @property
    def git_median(self) -> Run:
        return _median(self.git)

    @property
    def git_no_checkout_median(self) -> Run:
        return _median(self.git_no_checkout)


def _median(runs: list[Run]) -> Run:
    """Each figure's median over `runs`."""
    return Run(
        seconds=statistics.median(run.seconds for run in runs),
        peak_rss=int(statistics.median(run.peak_rss for run in runs)),
        process_seconds=statistics.median(run.process_seconds for run in runs),
    )


# ---- processes, measured ---------------------------------------------------------------------------------------------


def run_measured(command: list[str], *, cwd: Path, env: dict[str, str]) -> tuple[str, int]:
    """Run `command` to its end; its standard output and its peak RSS in bytes.

    The peak is `ru_maxrss` from `os.wait4`, taken by a small launcher process (`_LAUNCHER`), not by this one: Linux
    counts into a process's ru_maxrss the high-water mark of the memory it was started from (the parent's, shared
    until exec), so a command started from this process would show this process's own peak. The launcher's is
    `launcher_floor()`: the smallest figure a command can show."""
    with tempfile.NamedTemporaryFile(dir=cwd, prefix="rss-") as rss, tempfile.TemporaryFile() as err:
        completed = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _LAUNCHER, rss.name, *command],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            check=False,
        )
        if completed.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"{' '.join(command)} ended with status {completed.returncode}:\n{err.read()[-3000:]!r}")
        return completed.stdout.decode(), int(Path(rss.name).read_text()) * 1024


def launcher_floor(folder: Path) -> int:
    """The peak RSS in bytes that `run_measured` shows for a command that uses next to no memory (`true`)."""
    return run_measured(["true"], cwd=folder, env=dict(os.environ))[1]


def worker_job(url: str, remote: Remote, folder: Path, run: str) -> Run:
    """The first job of a new workspace, in a fresh process with a cold cache of its own."""
    patch_file = folder / "job.patch"
    patch_file.write_text(remote.patch)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(str(path) for path in WORKER_PATH)}
    workspace = f"ws-cold-{run}"
    command = [sys.executable, "-c", _JOB, url, remote.base_branch, str(folder / "caches"), workspace]
    started = time.perf_counter()
    output, peak_rss = run_measured([*command, f"job-{run}", str(patch_file)], cwd=folder, env=environment)
    process_seconds = time.perf_counter() - started
    result = json.loads(output.strip().splitlines()[-1])
    if result.get("alreadyApplied") is not False:
        raise RuntimeError(f"the first job of {workspace} on {url} did not apply: {result}")
    shutil.rmtree(folder / "caches")
    return Run(seconds=result["seconds"], peak_rss=peak_rss, process_seconds=process_seconds)


def git_job(url: str, remote: Remote, folder: Path, run: str, *, checkout: bool = True) -> Run:
    """`git clone --depth 1` of the base branch, `git apply` of the same patch, `git commit`, `git push` to a new
    branch: seconds and the largest peak RSS of the four. Without `checkout`, what the worker does (it writes no
    files): the clone writes none (`--no-checkout`), its index is read from the tip (`git read-tree`) and the patch
    applied to it alone (`git apply --cached`)."""
    patch_file = folder / "job.patch"
    patch_file.write_text(remote.patch)
    work = folder / "clone"
    environment = {**os.environ, **IDENTITY, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(folder)}
    clone = ["git", "clone", "--quiet", "--depth", "1", "--branch", remote.base_branch, url, str(work)]
    if checkout:
        prepare = [clone, ["git", "-C", str(work), "apply", "--index", str(patch_file)]]
    else:
        prepare = [
            [*clone, "--no-checkout"],
            ["git", "-C", str(work), "read-tree", "HEAD"],
            ["git", "-C", str(work), "apply", "--cached", str(patch_file)],
        ]
    branch = f"git{'' if checkout else '-no-checkout'}/run-{run}"
    commands = [
        *prepare,
        ["git", "-C", str(work), "commit", "--quiet", "--message", f"job git-{run}"],
        ["git", "-C", str(work), "push", "--quiet", "origin", f"HEAD:refs/heads/{branch}"],
    ]
    started = time.perf_counter()
    peak_rss = max(run_measured(command, cwd=folder, env=environment)[1] for command in commands)
    seconds = time.perf_counter() - started
    shutil.rmtree(work)
    return Run(seconds=seconds, peak_rss=peak_rss, process_seconds=seconds)


def measure(remotes: list[Remote], urls: dict[str, str], protocol: str, runs: int, folder: Path) -> list[Case]:
    """`runs` first jobs of the worker and of git (with and without a checkout) on each of `remotes` (at
    `urls[remote.name]`), each on a branch of its own: the worker's and git's runs alternate, and so do the remotes',
    so the machine's noise falls on all."""
    kinds = ("worker", "git", "git_no_checkout")
    runs_of: dict[tuple[str, str], list[Run]] = {(remote.name, kind): [] for remote in remotes for kind in kinds}
    for n in range(runs):
        for remote in remotes:
            url, place, run = urls[remote.name], folder / f"{remote.name}-{protocol}-{n}", f"{protocol}-{n}"
            place.mkdir()
            runs_of[remote.name, "worker"].append(worker_job(url, remote, place, run))
            runs_of[remote.name, "git"].append(git_job(url, remote, place, run))
            runs_of[remote.name, "git_no_checkout"].append(git_job(url, remote, place, run, checkout=False))
            shutil.rmtree(place)
    return [Case(remote, protocol, *(runs_of[remote.name, kind] for kind in kinds)) for remote in remotes]


# ---- the synthetic repositories ----------------------------------------------------------------------------------


_WORDS = ("value", "count", "item", "index", "result", "total", "name", "size", "limit", "offset", "key", "node")


def tip_files(folders: int, per_folder: int) -> dict[str, bytes]:
    """The tip tree of both synthetic repositories: `folders` x `per_folder` source-like files (same seed, same
    bytes)."""
    rng = random.Random(20261206)
    files: dict[str, bytes] = {"README.md": b"# synthetic\n"}
    for folder in range(folders):
        for number in range(per_folder):
            lines = [f'"""Module {number} of package {folder}."""\n']
            for line in range(FILE_LINES - 1):
                a, b = rng.choice(_WORDS), rng.choice(_WORDS)
                lines.append(f"{a}_{line} = compute({b}, {rng.randrange(1 << 20)})  # {a} from {b}\n")
            files[f"src/pkg{folder:03}/mod{number:03}.py"] = "".join(lines).encode()
    return files


def _fast_import_stream(files: dict[str, bytes], commits: int) -> Iterator[bytes]:
    """The tip's blobs (marks 1..N); a first commit of them all; commits that each rewrite one file (a line added);
    a last commit that restores the tip tree, its blobs by mark."""
    paths = sorted(files)
    for mark, path in enumerate(paths, start=1):
        yield b"blob\nmark :%d\ndata %d\n" % (mark, len(files[path])) + files[path] + b"\n"
    yield b"reset refs/heads/%s\n" % BASE_BRANCH.encode()
    whole = b"".join(b"M 100644 :%d %s\n" % (mark, path.encode()) for mark, path in enumerate(paths, start=1))
    for n in range(1, commits + 1):
        message = b"change %d\n" % n
        yield (
            b"commit refs/heads/%s\nmark :%d\n" % (BASE_BRANCH.encode(), len(paths) + n)
            + b"committer Dev <dev@example.com> %d +0000\n" % (1_600_000_000 + n)
            + b"data %d\n" % len(message)
            + message
        )
        if n > 1:
            yield b"from :%d\n" % (len(paths) + n - 1)
        if n == 1:
            yield whole
        elif n == commits:
            yield b"deleteall\n" + whole
        else:
            path = paths[n % len(paths)]
            content = files[path] + b"# revision %d\n" % n
            yield b"M 100644 inline %s\ndata %d\n" % (path.encode(), len(content)) + content + b"\n"
    yield b"done\n"


def synthetic_remote(path: Path, files: dict[str, bytes], commits: int) -> Remote:
    """A bare repository of `commits` commits whose tip tree is `files`, built by `git fast-import` and repacked as
    a served repository is (`git repack -a -d`)."""
    subprocess.run(["git", "init", "--quiet", "--bare", "--initial-branch", BASE_BRANCH, str(path)], check=True)
    importer = subprocess.Popen(["git", "-C", str(path), "fast-import", "--quiet", "--done"], stdin=subprocess.PIPE)
    assert importer.stdin is not None
    for chunk in _fast_import_stream(files, commits):
        importer.stdin.write(chunk)
    importer.stdin.close()
    if importer.wait() != 0:
        raise RuntimeError("git fast-import failed")
    subprocess.run(["git", "-C", str(path), "repack", "-a", "-d", "--quiet"], check=True)
    remote = describe(path, BASE_BRANCH, synthetic_patch(files))
    return replace(remote, label=f"synthetic, {remote.commits:,} commits")


def synthetic_patch(files: dict[str, bytes]) -> str:
    """A line added to the end of the tip's first module, and a new file."""
    path = "src/pkg000/mod000.py"
    lines = files[path].decode().splitlines(keepends=True)
    count = len(lines)
    context = "".join(f" {line}" for line in lines[-3:])
    return (
        f"--- a/{path}\n+++ b/{path}\n@@ -{count - 2},3 +{count - 2},4 @@\n{context}+added = compute(value, 1)\n"
        '--- /dev/null\n+++ b/src/pkg000/new_module.py\n@@ -0,0 +1,2 @@\n+"""A new module."""\n+new = 1\n'
    )


# ---- real repositories -------------------------------------------------------------------------------------------


REAL_PATCH = "--- /dev/null\n+++ b/AGENT_JOBS_FIRST_JOB.md\n@@ -0,0 +1,2 @@\n+# First job\n+Added by a first job.\n"


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout.strip()


def real_remote(source: Path, folder: Path) -> Remote:
    """A bare repository in `folder` that serves `source`'s refs from `source`'s objects (alternates): the runs push
    there, never into `source`."""
    git_dir = Path(_git("-C", str(source), "rev-parse", "--absolute-git-dir"))
    base_branch = _git("-C", str(git_dir), "symbolic-ref", "--short", "HEAD")
    name = git_dir.name.removesuffix(".git") if git_dir.name not in (".git", "repo") else git_dir.parent.name
    path = folder / f"{name.replace('+', '-')}.git"
    subprocess.run(["git", "init", "--quiet", "--bare", "--initial-branch", base_branch, str(path)], check=True)
    (path / "objects" / "info" / "alternates").write_text(f"{git_dir / 'objects'}\n")
    refs = _git("-C", str(git_dir), "for-each-ref", "--format=%(objectname) %(refname)")
    (path / "packed-refs").write_text(refs + "\n")
    # Its packs are the source's: counted there.
    pack_bytes = sum(pack.stat().st_size for pack in (git_dir / "objects" / "pack").glob("*.pack"))
    return replace(describe(path, base_branch, REAL_PATCH), label=name, pack_bytes=pack_bytes)


def describe(path: Path, base_branch: str, patch: str) -> Remote:
    """`path` as a Remote: its commits on `base_branch`, its packs, its tip tree's files and bytes."""
    commits = int(_git("-C", str(path), "rev-list", "--count", base_branch))
    pack_bytes = sum(pack.stat().st_size for pack in (path / "objects" / "pack").glob("*.pack"))
    sizes = _git("-C", str(path), "ls-tree", "-r", "-l", base_branch).splitlines()
    blobs = [int(line.split()[3]) for line in sizes if line.split()[1] == "blob"]
    name = path.name.removesuffix(".git")
    refs = len(_git("-C", str(path), "for-each-ref", "--format=%(refname)").splitlines())
    return Remote(name, name, path, base_branch, patch, commits, pack_bytes, refs, len(blobs), sum(blobs))


def real_sources() -> list[Path]:
    return [Path(item.strip()) for item in os.environ.get(REPOS_VARIABLE, "").split(",") if item.strip()]


# ---- figures -----------------------------------------------------------------------------------------------------


def _where(case: Case) -> str:
    return "file remote" if case.protocol == "file" else "smart HTTP"


def case_figures(case: Case, runs: int, floor: int) -> list[Figure]:
    """The worker's time beside git's, with its goal (2x git's plus a second), and its peak RSS beside git's."""
    worker, git = case.worker_median, case.git_median
    allowance = ALLOWANCE_FACTOR * git.seconds + ALLOWANCE_SECONDS
    startup = worker.process_seconds - worker.seconds
    note = (
        f"{case.remote.describe()}; median of {runs} run(s), each a fresh process with a cold cache (its start and"
        f" imports, {startup:.2f} s here, left out); baseline: git clone --depth 1 + git apply + git commit + git push"
        f" of the same patch over the same {_where(case)}, alternating with the worker's runs; git without writing"
        f" the tip's files, as the worker (clone --no-checkout + read-tree + apply --cached + commit + push):"
        f" {case.git_no_checkout_median.seconds:.2f} s"
    )
    rss_note = (
        "the job's whole process (ru_maxrss from os.wait4)"
        + (
            ", the remote's side of the fetch included (dulwich serves a file remote in the worker's process)"
            if case.protocol == "file"
            else ""
        )
        + "; baseline: the largest of git's four processes (each with the children it waited for: upload-pack,"
        " index-pack, remote-http)"
        f"; {floor / MIB:.1f} MiB is the floor of both (a command that uses nothing shows it: the launcher's)"
    )
    return [
        Figure(
            BENCHMARK,
            f"first apply_patch, cold cache, {case.remote.label} ({_where(case)})",
            round(worker.seconds, 2),
            "s",
            COMMAND,
            baseline=round(git.seconds, 2),
            goal=Goal(
                round(allowance, 2),
                Comparison.AT_MOST,
                f"within 2x of the shallow clone plus 1 s (<= {allowance:.2f} s here)",
            ),
            note=note,
        ),
        Figure(
            BENCHMARK,
            f"worker peak RSS, first apply_patch, {case.remote.label} ({_where(case)})",
            round(worker.peak_rss / MIB, 1),
            "MiB",
            COMMAND,
            baseline=round(git.peak_rss / MIB, 1),
            goal=RSS_GOAL,
            note=rss_note,
        ),
    ]


def history_figure(small: Case, large: Case) -> Figure:
    """The first job at LARGE_COMMITS commits against SMALL_COMMITS, same tip tree; git's ratio as the baseline."""
    worker = large.worker_median.seconds / small.worker_median.seconds
    git = large.git_median.seconds / small.git_median.seconds
    return Figure(
        BENCHMARK,
        f"first apply_patch, {large.remote.commits:,} / {small.remote.commits:,} commits ({_where(large)})",
        round(worker, 2),
        "x",
        COMMAND,
        baseline=round(git, 2),
        goal=HISTORY_GOAL,
        note="same tip tree; the ratio of the medians above; baseline: the same ratio for the shallow clone",
    )


def _url(remote: Remote, protocol: str, base_url: str) -> str:
    return f"file://{remote.path}" if protocol == "file" else f"{base_url}/{remote.path.name}"


def run(quick: bool = False) -> list[Figure]:
    small_commits, large_commits = (
        (QUICK_SMALL_COMMITS, QUICK_LARGE_COMMITS) if quick else (SMALL_COMMITS, LARGE_COMMITS)
    )
    folders, per_folder = (
        (QUICK_TIP_FOLDERS, QUICK_TIP_FILES_PER_FOLDER) if quick else (TIP_FOLDERS, TIP_FILES_PER_FOLDER)
    )
    runs = QUICK_RUNS if quick else RUNS
    with tempfile.TemporaryDirectory(prefix="agent-jobs-cold-bench-") as temporary:
        root = Path(temporary)
        served, work = root / "served", root / "work"
        served.mkdir()
        work.mkdir()
        files = tip_files(folders, per_folder)
        synthetic = [
            synthetic_remote(served / "synthetic-small.git", files, small_commits),
            synthetic_remote(served / "synthetic-large.git", files, large_commits),
        ]
        real = [] if quick else [real_remote(source, served) for source in real_sources()]
        floor = launcher_floor(work)
        figures: list[Figure] = []
        with git_http_backend(served) as base_url:
            for protocol in PROTOCOLS:
                urls = {remote.name: _url(remote, protocol, base_url) for remote in synthetic}
                small, large = measure(synthetic, urls, protocol, runs, work)
                figures += [*case_figures(small, runs, floor), *case_figures(large, runs, floor)]
                figures.append(history_figure(small, large))
            for remote in real:
                for protocol in PROTOCOLS:
                    urls = {remote.name: _url(remote, protocol, base_url)}
                    (case,) = measure([remote], urls, protocol, REAL_RUNS, work)
                    figures += case_figures(case, REAL_RUNS, floor)
        return figures
