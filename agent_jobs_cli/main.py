"""`agent-jobs`: the operator's command line for Agent Jobs.

By default it acts on the local runtime, from any folder: `make local` writes `.agent-jobs/local.json` in the project,
and `--connection-file` (or AGENT_JOBS_CONNECTION_FILE) names another; `--stack-name NAME` acts on a deployed stack
instead (its CloudFormation Outputs). API calls carry a bearer token: `--token` or AGENT_JOBS_TOKEN;
against the local runtime, when none is given, one is minted for `--tenant` from the local development key.
The `dlq`, `refused` and `tenants` commands use your AWS credentials on the queue and table directly, not the API.
`local`, `demo` and `bench` run the system and its benchmarks on this machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from agent_jobs_cli.commands import bench, dlq, jobs, local, plan, refused, registration, tenants, wait, workspaces
from agent_jobs_cli.context import CliState
from agent_jobs_cli.targets import CONNECTION_FILE_ENV, DEFAULT_CONNECTION_FILE, PROJECT_ROOT

app = typer.Typer(
    name="agent-jobs",
    help=__doc__,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
status_app = typer.Typer(help="Show one job or one workspace.", no_args_is_help=True)
dlq_app = typer.Typer(help="The dead-letter queue: list, show, redrive and drop (AWS credentials, not the API).")
app.add_typer(status_app, name="status")
app.add_typer(dlq_app, name="dlq", no_args_is_help=True)
tenants_app = typer.Typer(help="Tenants' shares of the worker (AWS credentials, not the API).")
app.add_typer(tenants_app, name="tenants", no_args_is_help=True)
workspaces_app = typer.Typer(help="Register a workspace (PUT /workspaces/{id}).")
app.add_typer(workspaces_app, name="workspaces", no_args_is_help=True)


@app.callback()
def main_options(
    ctx: typer.Context,
    stack_name: Annotated[
        str | None,
        typer.Option("--stack-name", envvar="AGENT_JOBS_STACK_NAME", help="Act on this deployed stack."),
    ] = None,
    region: Annotated[
        str | None, typer.Option("--region", envvar="AGENT_JOBS_REGION", help="The stack's region.")
    ] = None,
    token: Annotated[
        str | None, typer.Option("--token", envvar="AGENT_JOBS_TOKEN", help="Bearer token for the API.")
    ] = None,
    tenant: Annotated[
        str, typer.Option("--tenant", envvar="AGENT_JOBS_TENANT", help="Tenant of a minted local token.")
    ] = "default",
    connection_file: Annotated[
        Path | None,
        typer.Option(
            "--connection-file",
            envvar=CONNECTION_FILE_ENV,
            show_envvar=True,
            help="The local runtime's connection file, which `make local` writes. Without it: the first"
            f" {DEFAULT_CONNECTION_FILE} in the current folder or a folder above it, else the one in the project"
            f" this command is installed from ({PROJECT_ROOT or 'none: not installed from a checkout'}); a file"
            " found so is used only if you own it and its folder.",
        ),
    ] = None,
) -> None:
    """Operate Agent Jobs: enqueue and inspect jobs, watch workspaces, resume halted ones, redrive the DLQ."""
    ctx.obj = CliState(stack_name, region, token, tenant, connection_file)


# Jobs and workspaces, through the API.
app.command()(jobs.enqueue)
app.command()(wait.wait)
status_app.command("job")(jobs.status_job)
status_app.command("workspace")(workspaces.status_workspace)
app.command()(workspaces.jobs)
app.command()(workspaces.watch)
app.command()(workspaces.halted)
app.command()(workspaces.resume)
app.command()(local.token)
workspaces_app.command("register")(registration.register_command())
# The dead-letter queue, with AWS credentials.
dlq_app.command("list")(dlq.dlq_list)
dlq_app.command("show")(dlq.dlq_show)
dlq_app.command("drop")(dlq.dlq_drop)
dlq_app.command("redrive")(dlq.dlq_redrive)
app.command()(refused.refused)
tenants_app.command("share")(tenants.tenants_share)
# On this machine, without AWS.
app.command()(plan.plan)
app.command()(local.local)
app.command()(local.demo)
app.command()(bench.bench)


def main() -> None:
    app(prog_name="agent-jobs")
