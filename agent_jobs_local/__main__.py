"""`python -m agent_jobs_local demo|local`: the whole system on this machine, no AWS account and no Docker."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from rich.console import Console

REPO = Path(__file__).resolve().parent.parent
# Like sam local: the layer's package (as at /opt/python) and the worker's code (as at /var/task, for its workspace
# store, which the report reads) are importable by the tool itself.
for folder in (REPO / "functions" / "job_worker", REPO / "layers" / "shared"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent_jobs_local", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="run a faulty multi-agent workload and verify every invariant")
    demo.add_argument("--jobs", type=int, default=500)
    demo.add_argument("--workspaces", type=int, default=20)
    demo.add_argument("--agents", type=int, default=6)
    demo.add_argument("--crashes-per-kind", type=int, default=3)
    demo.add_argument("--slow-jobs", type=int, default=2)
    demo.add_argument("--seed", type=int, default=7)
    demo.add_argument("--time-scale", type=float, default=0.02, help="multiplies Timeout and visibility timeout")
    demo.add_argument("--concurrency", type=int, default=None, help="default: the template's MaximumConcurrency")
    demo.add_argument("--run-dir", type=Path, default=None, help="where logs, fault markers and workspaces go")

    local = commands.add_parser("local", help="run the stack for manual use (curl the API, watch the worker)")
    local.add_argument("--endpoint-url", default=None, help="an emulator or account to use instead of moto's server")
    local.add_argument("--api-port", type=int, default=3000)
    local.add_argument("--env-file", type=Path, default=Path("env.local.json"))
    local.add_argument(
        "--connection-file",
        type=Path,
        default=Path(".agent-jobs/local.json"),
        help="where to write the connection file the agent-jobs command line reads",
    )
    local.add_argument("--workspaces-root", type=Path, default=Path(".local/workspaces"))
    local.add_argument("--time-scale", type=float, default=1.0)

    args = parser.parse_args(argv)
    console = Console(stderr=True)
    if args.command == "demo":
        from agent_jobs_local.demo import print_report, run_demo
        from agent_jobs_local.workload import WorkloadConfig

        config = WorkloadConfig(
            jobs=args.jobs,
            workspaces=args.workspaces,
            agents=args.agents,
            crashes_per_kind=args.crashes_per_kind,
            slow_jobs=args.slow_jobs,
            seed=args.seed,
        )
        report = run_demo(config, time_scale=args.time_scale, concurrency=args.concurrency, run_dir=args.run_dir)
        print_report(report, Console())
        return 0 if report.ok else 1

    from agent_jobs_local.runtime import LocalRuntime

    args.workspaces_root.mkdir(parents=True, exist_ok=True)
    with LocalRuntime(
        endpoint_url=args.endpoint_url,
        api_port=args.api_port,
        workspaces_root=args.workspaces_root.resolve(),
        time_scale=args.time_scale,
    ) as runtime:
        runtime.write_env_file(args.env_file)
        runtime.write_connection_file(args.connection_file)
        resources = runtime.resources
        console.print(f"[bold]Agent Jobs local stack[/] (stack name {resources.queue_name.removesuffix('-jobs.fifo')})")
        console.print(f"  API          {runtime.api_url}   (POST /jobs, GET /jobs/{{jobId}})")
        console.print(f"  emulator     {runtime.endpoint_url}")
        console.print(f"  queue        {resources.queue_url}")
        console.print(f"  DLQ          {resources.dlq_url}")
        console.print(f"  table        {resources.table_name}")
        console.print(f"  payloads     s3://{resources.payload_bucket}  (jobs whose message would be too large)")
        console.print(f"  workspaces   {args.workspaces_root}")
        console.print(
            f"  env file     {args.env_file}  (sam local invoke/start-api --env-vars {args.env_file})\n"
            f"  CLI          {args.connection_file}  (agent-jobs reads it: agent-jobs halted, ...)"
        )
        console.print("Ctrl-C stops everything.")
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            while not stop.wait(5):
                stats = runtime.poller.stats
                console.print(
                    f"[dim]invocations {stats.invocations}, records deleted {stats.records_deleted},"
                    f" reported failed {stats.records_reported_failed}, crashes {stats.crashes},"
                    f" timeouts {stats.timeouts}[/]"
                )
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
