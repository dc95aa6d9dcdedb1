"""The whole system on this machine, no AWS account and no Docker: `demo`, `local`, and bearer tokens for its API.

`python -m agent_jobs_local demo|local|token` runs `local_runtime_app`, the same commands; its `token` checks the
tenant id the way the API will and prints nothing else, so `TOKEN=$(python -m agent_jobs_local token --tenant t)`
works.
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated, Any, Final

import typer
from rich.console import Console

from agent_jobs_cli.context import OPERATOR_SCOPE, handle_errors, mint_local_token

REPO: Final = Path(__file__).resolve().parents[2]
DEFAULT_TENANT: Final = "default"


def importable_like_sam_local() -> None:
    """Like sam local: the layer's package (as at /opt/python) and the worker's code (as at /var/task, for its workspace
    store, which the demo's report reads) are importable by the tool itself."""
    for folder in (REPO / "functions" / "job_worker", REPO / "layers" / "shared"):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))


@handle_errors
def token(
    tenant: Annotated[str, typer.Option("--tenant", help="The token's tenant_id claim.")],
    operator: Annotated[bool, typer.Option("--operator", help=f"Add the '{OPERATOR_SCOPE}' scope.")] = False,
    ttl_seconds: Annotated[int, typer.Option("--ttl", min=60, help="Lifetime in seconds.")] = 3600,
) -> None:
    """Mint a token from the local development key (local runtime only): export AGENT_JOBS_TOKEN=$(agent-jobs token
    --tenant T --operator)."""
    typer.echo(mint_local_token(tenant, operator=operator, ttl_seconds=ttl_seconds))


def demo(
    jobs: Annotated[int, typer.Option("--jobs")] = 500,
    workspaces: Annotated[int, typer.Option("--workspaces")] = 20,
    agents: Annotated[int, typer.Option("--agents")] = 6,
    crashes_per_kind: Annotated[int, typer.Option("--crashes-per-kind")] = 3,
    slow_jobs: Annotated[int, typer.Option("--slow-jobs")] = 2,
    seed: Annotated[int, typer.Option("--seed")] = 7,
    time_scale: Annotated[
        float, typer.Option("--time-scale", help="Multiplies Timeout and visibility timeout.")
    ] = 0.05,
    concurrency: Annotated[
        int | None,
        typer.Option("--concurrency", help="Default: the template's MaximumConcurrency, at most 3 per CPU."),
    ] = None,
    run_dir: Annotated[
        Path | None, typer.Option("--run-dir", help="Where logs, fault markers and workspaces go.")
    ] = None,
) -> None:
    """Run a faulty multi-agent workload on the local stack and verify every invariant (exit 1 when one fails)."""
    importable_like_sam_local()
    from agent_jobs_local.demo import print_report, run_demo
    from agent_jobs_local.workload import WorkloadConfig

    config = WorkloadConfig(
        jobs=jobs,
        workspaces=workspaces,
        agents=agents,
        crashes_per_kind=crashes_per_kind,
        slow_jobs=slow_jobs,
        seed=seed,
    )
    report = run_demo(config, time_scale=time_scale, concurrency=concurrency, run_dir=run_dir)
    print_report(report, Console())
    if not report.ok:
        raise typer.Exit(1)


def local(
    endpoint_url: Annotated[
        str | None, typer.Option("--endpoint-url", help="An emulator or account to use instead of moto's server.")
    ] = None,
    api_port: Annotated[int, typer.Option("--api-port")] = 3000,
    env_file: Annotated[Path, typer.Option("--env-file")] = Path("env.local.json"),
    connection_file: Annotated[
        Path,
        typer.Option("--connection-file", help="Where to write the connection file the agent-jobs command reads."),
    ] = Path(".agent-jobs/local.json"),
    workspaces_root: Annotated[Path, typer.Option("--workspaces-root")] = Path(".local/workspaces"),
    log_dir: Annotated[
        Path,
        typer.Option(
            "--log-dir",
            help="Where the functions' logs, metrics and Python warnings go (a file per execution environment).",
        ),
    ] = Path(".local/logs"),
    time_scale: Annotated[float, typer.Option("--time-scale")] = 1.0,
    tenant: Annotated[str | None, typer.Option("--tenant", help="The tenant of the printed tokens.")] = None,
    sam_local: Annotated[
        bool,
        typer.Option(
            "--sam-local",
            help="For `sam local`: serve the emulator where its containers reach this machine (the docker bridge's"
            " address on Linux) and register the events/ files' workspaces for their tenant (tenant-demo, then the"
            " default --tenant).",
        ),
    ] = False,
    sam_local_lambda_port: Annotated[
        int,
        typer.Option(
            "--sam-local-lambda-port",
            help="With --sam-local: the port of `sam local start-lambda`, where the worker's run_tests jobs invoke the"
            " test sandbox (AWS_ENDPOINT_URL_LAMBDA of env.local.json).",
        ),
    ] = 3002,
) -> None:
    """Run the stack for manual use (curl the API, watch the worker) until Ctrl-C; writes env.local.json (sam local)
    and .agent-jobs/local.json (agent-jobs)."""
    importable_like_sam_local()
    from agent_jobs_local.git_server import local_ca_path
    from agent_jobs_local.github_stand_in import GitHubStandIn
    from agent_jobs_local.runtime import LocalRuntime
    from agent_jobs_local.runtime_files import LOOPBACK, container_reachable_host
    from agent_jobs_local.sam_local import SAMPLE_TENANT, SERVED_OVER_HTTPS, SampleWorkspaces

    console = Console(stderr=True)
    workspaces_root.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    # As a Lambda function's output goes to its log group: the terminal keeps the stack and its counts.
    log_hook = "agent_jobs_local.faults:log_to_file"
    listen_host = container_reachable_host() if sam_local else LOOPBACK
    tenant = tenant or (SAMPLE_TENANT if sam_local else DEFAULT_TENANT)
    with contextlib.ExitStack() as stack:
        remotes_root = workspaces_root.resolve().parent / "remotes"
        samples = stack.enter_context(SampleWorkspaces(remotes_root, git_host=listen_host)) if sam_local else None
        # `sam local`'s git server holds LOCAL_GIT_SERVER with --sam-local; the stand-in serves plain `make local`.
        github = None if sam_local else stack.enter_context(GitHubStandIn())
        runtime = stack.enter_context(
            LocalRuntime(
                endpoint_url=endpoint_url,
                api_port=api_port,
                workspaces_root=workspaces_root.resolve(),
                time_scale=time_scale,
                worker_bootstrap=log_hook,
                bootstrap_config={"log_dir": str(log_dir.resolve()), "name": "worker"},
                api_bootstrap=log_hook,
                api_bootstrap_config={"log_dir": str(log_dir.resolve()), "name": "api"},
                listen_host=listen_host,
                allowed_private_hosts=samples.allowed_private_hosts if samples else (),
                sam_local_env=samples.sam_local_env if samples else None,
                local_env=github.function_env if github else None,
            )
        )
        if samples is not None:
            samples.register(runtime.api_url)
        runtime.write_env_file(
            env_file, container_values=samples.container_values(sam_local_lambda_port) if samples else None
        )
        runtime.write_connection_file(connection_file)
        print_stack(
            console, runtime, env_file=env_file, connection_file=connection_file, workspaces_root=workspaces_root
        )
        console.print(
            f"  logs         {log_dir}  (the worker's and the API's logs, metrics, warnings: tail -f {log_dir}/*.log)"
        )
        if samples is not None:
            console.print(
                f"  sam local    {env_file} (--env-vars); the events' workspaces {', '.join(samples.remotes)} of"
                f" {SAMPLE_TENANT} registered (their pull requests go to a fake GitHub at {samples.github.url})"
            )
            if samples.git_server is not None:
                console.print(
                    f"  git server   https://{samples.git_server.container_netloc}/{SAMPLE_TENANT}/  (for containers:"
                    f" {', '.join(SERVED_OVER_HTTPS)}; its CA {local_ca_path()})"
                )
        print_state(console, runtime)
        if github is not None:
            print_github_stand_in(console, github, runtime.remotes_root, tenant)
        print_local_tokens(console, runtime.api_url, tenant)
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
        if runtime.emulator is not None:
            console.print(f"Stopped: its workspaces and jobs are gone; the remotes under {runtime.remotes_root} stay.")


def print_state(console: Console, runtime: Any) -> None:
    """Where the stack's state lives, and so what a restart keeps."""
    if runtime.emulator is None:
        console.print(f"  state        kept by {runtime.endpoint_url or 'AWS'} (--endpoint-url), not by this process")
        return
    # moto's server keeps the queues and the table in memory only: a restart starts with none of either.
    console.print(
        f"[bold yellow]  state is in memory:[/] workspaces and jobs are gone when this process ends; the remotes"
        f" under {runtime.remotes_root} stay",
        soft_wrap=True,
    )


def print_github_stand_in(console: Console, github: Any, remotes_root: Path, tenant: str) -> None:
    """The GitHub stand-in, and how to register a workspace whose open_pr jobs open pull requests on it."""
    cli = "agent-jobs" if tenant == DEFAULT_TENANT else f"agent-jobs --tenant {tenant}"
    remote = remotes_root / tenant / "my-repo.git"
    api_url = github.api_url(tenant)
    register = [
        *cli.split(),
        "workspaces",
        "register",
        "my-repo",
        "--remote-url",
        str(remote),
        "--branch",
        "agent/my-repo",
        "--base-branch",
        "main",
        "--test-command",
        "unit=python3 -m unittest",
        "--github-repository",
        "you/my-repo",
        "--github-api-url",
        api_url,
    ]
    console.print(
        f"  GitHub       {api_url}  (a stand-in for GitHub's pull-request API: a folder per tenant,"
        f" /<tenantId>/github, each tenant's workspaces only their own; its CA {github.ca_certificate_path})",
        soft_wrap=True,
    )
    console.print(
        "A workspace of your own repository that opens pull requests there (--base-branch: its default branch):",
        soft_wrap=True,
    )
    console.print(f"  git clone --bare YOUR_REPOSITORY {shlex.quote(str(remote))}", soft_wrap=True, highlight=False)
    console.print(f"  {shlex.join(register)}", soft_wrap=True, highlight=False, markup=False)
    console.print(f"  {cli} enqueue open_pr my-repo --title 'Agent changes' --wait", soft_wrap=True, highlight=False)
    console.print(
        f"  curl --cacert {shlex.quote(str(github.ca_certificate_path))} {api_url}/repos/you/my-repo/pulls",
        soft_wrap=True,
        highlight=False,
    )


def print_stack(
    console: Console, runtime: Any, *, env_file: Path, connection_file: Path, workspaces_root: Path
) -> None:
    """Where everything of the running local stack is."""
    resources = runtime.resources
    console.print(f"[bold]Agent Jobs local stack[/] (stack name {resources.queue_name.removesuffix('-jobs.fifo')})")
    console.print(f"  API          {runtime.api_url}   (POST /jobs, GET /jobs/{{jobId}})")
    console.print(f"  emulator     {runtime.endpoint_url}")
    console.print(f"  queue        {resources.queue_url}")
    console.print(f"  DLQ          {resources.dlq_url}")
    console.print(f"  table        {resources.table_name}")
    console.print(f"  payloads     s3://{resources.payload_bucket}  (jobs whose message would be too large)")
    console.print(f"  workspaces   {workspaces_root}")
    print_sandbox(console, runtime)
    console.print(f"  remotes      {runtime.remotes_root}  (a tenant's file-system remotes: <remotes>/<tenantId>/)")
    console.print(
        f"  env file     {env_file}  (sam local invoke/start-api --env-vars {env_file})\n"
        f"  CLI          {connection_file}  (agent-jobs reads it: agent-jobs halted, ...)"
    )


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
    for warning in endpoint.bound_warnings:
        console.print(f"[bold yellow]  unbounded:[/] {warning}")


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


def container_host() -> None:
    """Print the address `sam local`'s containers reach this machine at, as `local --sam-local` serves on it (the
    docker bridge's on Linux, 127.0.0.1 with Docker Desktop): `sam local start-lambda --host` takes it."""
    from agent_jobs_local.runtime_files import container_reachable_host

    print(container_reachable_host())


def checked_token(
    tenant: Annotated[str, typer.Option("--tenant", help="The tenant the token is for (its tenant_id claim).")],
    operator: Annotated[bool, typer.Option("--operator", help=f"Add the operator scope ({OPERATOR_SCOPE}).")] = False,
    ttl: Annotated[int, typer.Option("--ttl", help="Seconds the token is valid.")] = 3600,
) -> None:
    """Print a bearer token for the local API, signed with the development key (exit 2 on a bad tenant or ttl)."""
    importable_like_sam_local()
    status = print_token(tenant, operator=operator, ttl_seconds=ttl)
    if status:
        raise typer.Exit(status)


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


local_runtime_app = typer.Typer(
    name="python -m agent_jobs_local",
    help="Agent Jobs on this machine, no AWS account and no Docker: `demo`, `local`, and bearer tokens for its API.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
local_runtime_app.command("demo")(demo)
local_runtime_app.command("local")(local)
local_runtime_app.command("token")(checked_token)
local_runtime_app.command("container-host")(container_host)
