"""`make demo`: the whole system on this machine under a faulty workload, then the verification report."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from agent_jobs_local.fake_github import FakeGitHub
from agent_jobs_local.poller import EventSourcePoller, InvocationRecord
from agent_jobs_local.runtime import LocalRuntime
from agent_jobs_local.template import DEFAULT_TEMPLATE_PATH, TemplateModel, load_template
from agent_jobs_local.workload import (
    BASE_BRANCH,
    GITHUB_OWNER,
    Agents,
    Plan,
    PullRequestSeen,
    Report,
    WorkloadConfig,
    branch_of_workspace,
    create_remote,
    make_plan,
    register_workspaces,
    remote_path,
    scan_items,
    verify,
)

SETTLED = {"SUCCEEDED", "PARKED", "REJECTED", "DEAD", "SKIPPED"}


def run_demo(
    config: WorkloadConfig,
    *,
    time_scale: float = 0.05,
    concurrency: int | None = None,
    run_dir: Path | None = None,
    template_path: Path = DEFAULT_TEMPLATE_PATH,
    console: Console | None = None,
    drain_timeout: float | None = None,
) -> Report:
    """Create a bare git remote per workspace, start the local runtime and a fake GitHub, register the workspaces
    through the HTTP API, run the workload through it, wait until the queue is empty, verify against the table, the
    remotes' branches and the pull requests GitHub holds. `drain_timeout` (default 600 s plus 1 s per job) is how long
    the run may take before it is verified as it stands."""
    console = console or Console(stderr=True)
    run_dir = (run_dir or Path(tempfile.mkdtemp(prefix="agent-jobs-demo-"))).resolve()
    if (run_dir / "remotes").exists():
        # Branches left by an earlier run would read as double applies and foreign commits: start from nothing.
        raise FileExistsError(f"{run_dir} holds the git remotes of an earlier run; give a new or empty --run-dir")
    marker_dir, log_dir, workspaces_root = run_dir / "faults", run_dir / "logs", run_dir / "workspaces"
    for folder in (marker_dir, log_dir, workspaces_root):
        folder.mkdir(parents=True, exist_ok=True)
    plan = make_plan(config)
    model = TemplateModel(load_template(template_path), stack_name="x")
    timeout = model.worker.function.timeout_seconds * time_scale
    if concurrency is None:
        concurrency = demo_concurrency(model)
    if drain_timeout is None:
        drain_timeout = 600 + plan.total
    bootstrap = {
        "plan": {job_id: str(fault) for job_id, fault in plan.faults.items()},
        "marker_dir": str(marker_dir),
        "slow_seconds": timeout * 1.5,
        "log_dir": str(log_dir),
    }
    started = time.monotonic()
    return _run_with_runtime(
        plan,
        config,
        time_scale=time_scale,
        concurrency=concurrency,
        template_path=template_path,
        console=console,
        drain_timeout=drain_timeout,
        dirs=(marker_dir, log_dir, workspaces_root),
        bootstrap=bootstrap,
        timeout=timeout,
        run_dir=run_dir,
        started=started,
    )


def demo_concurrency(model: TemplateModel, cpus: int | None = None) -> int:
    """The demo's worker concurrency: the template's MaximumConcurrency, but at most 3 environments per CPU.

    Each Lambda execution environment has CPU of its own; here every environment shares this machine's. Twenty
    environments on two cores gave each a tenth of a core, so a job that takes a fraction of a second took most of a
    time-scaled Timeout, invocations timed out, and their replacements' cold starts took the CPU the rest needed.
    Three per CPU keeps the cores busy while one environment waits on git or the emulator."""
    return max(1, min(EventSourcePoller.template_concurrency(model), 3 * (cpus or os.cpu_count() or 1)))


def _run_with_runtime(
    plan: Plan,
    config: WorkloadConfig,
    *,
    time_scale: float,
    concurrency: int | None,
    template_path: Path,
    console: Console,
    drain_timeout: float,
    dirs: tuple[Path, Path, Path],
    bootstrap: dict[str, Any],
    timeout: float,
    run_dir: Path,
    started: float,
) -> Report:
    marker_dir, log_dir, workspaces_root = dirs
    remotes_root = run_dir / "remotes"  # the runtime's WORKSPACES_REMOTE_ROOT; the demo tenant's remotes in it
    remotes = {ws: create_remote(remote_path(remotes_root, ws), ws) for ws in plan.by_workspace}
    github = FakeGitHub()
    for ws in plan.by_workspace:
        github.add_repository(GITHUB_OWNER, ws)
    with (
        github,
        LocalRuntime(
            template_path=template_path,
            time_scale=time_scale,
            workspaces_root=workspaces_root,
            worker_bootstrap="agent_jobs_local.faults:install",
            bootstrap_config=bootstrap,
            api_bootstrap="agent_jobs_local.faults:log_to_file",
            api_bootstrap_config={"log_dir": str(log_dir), "name": "api"},
            concurrency=concurrency,
            remotes_root=remotes_root,
            # The fake GitHub listens on this machine: registrations may name it, no other private host.
            allowed_private_hosts=[urlsplit(github.url).netloc],
        ) as runtime,
    ):
        console.print(f"[bold]Agent Jobs local runtime[/]  API {runtime.api_url}  emulator {runtime.endpoint_url}")
        registered = register_workspaces(runtime.api_url, remotes, github.url)
        console.print(
            f"{len(registered)} workspaces registered (PUT /workspaces): bare git remotes under {run_dir / 'remotes'},"
            f" pull requests to the fake GitHub at {github.url}"
        )
        console.print(
            f"{plan.total} jobs, {len(plan.by_workspace)} workspaces, {config.agents} agents; time scale {time_scale}"
            f" (worker Timeout {timeout:.1f}s), up to {runtime.poller.concurrency} concurrent worker invocations;"
            f" faults: {len(plan.faults)} worker faults, poison in {plan.poison_workspace}; run folder {run_dir}"
        )
        session = boto3.Session(region_name=runtime.resources.region)
        sqs = session.client("sqs", endpoint_url=runtime.endpoint_url)
        dynamodb = session.client("dynamodb", endpoint_url=runtime.endpoint_url)
        agents = Agents(plan, runtime.api_url, sqs, runtime.resources.queue_url)
        table = runtime.resources.table_name

        with Progress(
            TextColumn("{task.description:<28}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        ) as progress:
            accepted = progress.add_task("accepted through the API", total=plan.total)
            settled = progress.add_task("settled by the workers", total=plan.total)
            submitter = threading.Thread(
                target=agents.run, kwargs={"on_accepted": lambda: progress.advance(accepted)}, daemon=True
            )
            submitter.start()
            deadline = time.monotonic() + drain_timeout
            while time.monotonic() < deadline:
                done = settled_jobs(scan_items(dynamodb, table))
                progress.update(settled, completed=done)
                if not submitter.is_alive() and runtime.poller.drain(timeout=1):
                    break
                time.sleep(0.5)
            submitter.join(timeout=5)
            items = scan_items(dynamodb, table)
            progress.update(settled, completed=settled_jobs(items))

        stats: Any = runtime.poller.stats
        write_invocation_log(runtime.poller.invocation_log(), log_dir / "invocations.jsonl")
        pulls = [
            PullRequestSeen(f"{pull.owner}/{pull.repo}", pull.head, pull.base, pull.number, pull.state)
            for pull in github.list_pulls()
        ]
    return verify(
        plan,
        agents.submissions,
        items,
        remote_branches(remotes, run_dir / "report-cache"),
        marker_dir=marker_dir,
        log_dir=log_dir,
        poller_stats=stats,
        seconds=time.monotonic() - started,
        pull_requests=pulls,
    )


def remote_branches(remotes: dict[str, Path], cache_root: Path) -> Callable[[str], list[str]]:
    """The jobIds of the `Agent-Job-Id` trailers on each remote's workspace branch, oldest first, read from the git
    remote itself (fetched into a cache of the report's own, not the workers')."""
    from job_worker.jobs.git_workspace import GitRemote, GitWorkspaceStore

    store = GitWorkspaceStore(
        cache_root=cache_root,
        resolve=lambda ws: GitRemote(url=str(remotes[ws]), branch=branch_of_workspace(ws), base_branch=BASE_BRANCH),
    )
    return lambda ws: [commit.job_id for commit in store.open(ws).history()]


def write_invocation_log(records: list[InvocationRecord], path: Path) -> None:
    """Every worker invocation of the run, a JSON object per line (poller, cold start, outcome, duration, ...)."""
    with path.open("w") as log:
        for record in records:
            log.write(json.dumps(dataclasses.asdict(record)) + "\n")


def settled_jobs(items: list[dict[str, Any]]) -> int:
    return sum(1 for item in items if str(item["pk"]).startswith("job#") and item.get("status") in SETTLED)


def print_report(report: Report, console: Console) -> None:
    """The report's lines, "ok" or "FAIL" beside each check only, then each halted workspace's reason whole (an
    operator reads it to decide between retry and skip), then the verdict. Text the run produced (reasons, failures)
    is printed as text, never read as rich markup."""
    table = Table(title="Agent Jobs: verification report", show_lines=False)
    table.add_column("check")
    table.add_column("figure", justify="right")
    table.add_column("", justify="center")
    for line in report.rows():
        verdict = "" if line.holds is None else "[green]ok[/]" if line.holds else "[red]FAIL[/]"
        table.add_row(Text(line.what), Text(line.figure), verdict)
    console.print(table)
    for workspace, reason in sorted(report.halted.items()):
        console.print(
            Text.assemble(("halted ", "bold"), workspace, ": ", reason or "(no reason recorded)"), soft_wrap=True
        )
    if report.ok:
        console.print("[bold green]every invariant held[/]: no double apply, no lost job, order kept, halt contained")
    else:
        for failure in report.failures:
            console.print(Text.assemble(("FAILED ", "bold red"), failure), soft_wrap=True)
