"""`python -m agent_jobs_local demo|local|token`: the whole system on this machine, no AWS account and no Docker, and
bearer tokens for its API."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from rich.console import Console

from agent_jobs_local.auth import OPERATOR_SCOPE

REPO = Path(__file__).resolve().parent.parent
# Like sam local: the layer's package (as at /opt/python) and the worker's code (as at /var/task, for its workspace
# store, which the report reads) are importable by the tool itself.
for folder in (REPO / "functions" / "job_worker", REPO / "layers" / "shared"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


DEFAULT_TENANT = "default"


def print_token(tenant: str, *, operator: bool, ttl_seconds: int) -> int:
    """Print one token on stdout (nothing else, so `TOKEN=$(python -m agent_jobs_local token --tenant t)` works)."""
    from pydantic import TypeAdapter, ValidationError

    from agent_jobs.models import TenantId
    from agent_jobs_local.auth import mint_token

    if ttl_seconds <= 0:
        print("--ttl must be a positive number of seconds", file=sys.stderr)
        return 2
    try:
        TypeAdapter(TenantId).validate_python(tenant)
    except ValidationError:
        # The API refuses a token whose tenant_id it cannot use (403): say so now.
        print(
            f"--tenant '{tenant}' is not a tenant id: use 1 to 64 letters, digits, '.', '_' and '-', starting with a"
            " letter or digit",
            file=sys.stderr,
        )
        return 2
    print(mint_token(tenant, scopes=(OPERATOR_SCOPE,) if operator else (), ttl_seconds=ttl_seconds))
    return 0


def _add_local_command(commands: Any) -> None:
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
    local.add_argument("--tenant", default=DEFAULT_TENANT, help="the tenant of the printed tokens")


def _add_token_command(commands: Any) -> None:
    token = commands.add_parser("token", help="print a bearer token for the local API, signed with the development key")
    token.add_argument("--tenant", required=True, help="the tenant the token is for (its tenant_id claim)")
    token.add_argument("--operator", action="store_true", help=f"add the operator scope ({OPERATOR_SCOPE})")
    token.add_argument("--ttl", type=int, default=3600, help="seconds the token is valid (default 3600)")


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
    demo.add_argument("--time-scale", type=float, default=0.05, help="multiplies Timeout and visibility timeout")
    demo.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="default: the template's MaximumConcurrency, at most 3 per CPU of this machine",
    )
    demo.add_argument("--run-dir", type=Path, default=None, help="where logs, fault markers and workspaces go")

    _add_local_command(commands)
    _add_token_command(commands)

    args = parser.parse_args(argv)
    console = Console(stderr=True)
    if args.command == "token":
        return print_token(args.tenant, operator=args.operator, ttl_seconds=args.ttl)
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
        print_sandbox(console, runtime)
        console.print(f"  remotes      {runtime.remotes_root}  (a tenant's file-system remotes: <remotes>/<tenantId>/)")
        console.print(
            f"  env file     {args.env_file}  (sam local invoke/start-api --env-vars {args.env_file})\n"
            f"  CLI          {args.connection_file}  (agent-jobs reads it: agent-jobs halted, ...)"
        )
        print_local_tokens(console, runtime.api_url, args.tenant)
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


def print_sandbox(console: Console, runtime: Any) -> None:
    """The local Lambda endpoint of the directly invoked functions (the test sandbox), and whether it can sandbox."""
    endpoint = runtime.lambda_endpoint
    if endpoint is None:
        return
    names = ", ".join(endpoint.function_name(function_id) for function_id in endpoint.functions)
    console.print(
        f"  Lambda       {endpoint.url}  (Invoke of {names}; the workers' AWS_ENDPOINT_URL_LAMBDA): every run_tests"
        " in a new bubblewrap sandbox"
    )
    if endpoint.sandbox_error is not None:
        console.print(f"[bold red]  no sandbox:[/] {endpoint.sandbox_error}; run_tests jobs fail until it is fixed")


def print_local_tokens(console: Console, api_url: str, tenant: str) -> None:
    """A tenant token and an operator token (1 hour each; `python -m agent_jobs_local token` makes more), and a curl
    command that uses one."""
    from agent_jobs_local.auth import mint_token

    tenant_token = mint_token(tenant)
    operator_token = mint_token(tenant, scopes=(OPERATOR_SCOPE,))
    console.print(
        f"Tokens for tenant '{tenant}' (valid 1 hour; more with `python -m agent_jobs_local token --tenant T`):"
    )
    console.print(f"  tenant       {tenant_token}", soft_wrap=True)
    console.print(f"  operator     {operator_token}", soft_wrap=True)
    console.print("For example:")
    console.print(
        f"  curl -s {api_url}/jobs/job-1 -H 'Authorization: Bearer {tenant_token}'", soft_wrap=True, highlight=False
    )


if __name__ == "__main__":
    sys.exit(main())
