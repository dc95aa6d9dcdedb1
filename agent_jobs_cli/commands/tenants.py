"""`tenants share`: a tenant's share of the worker's invocations (AWS credentials on the table, not the API).

The share is the stack's WorkerTenantShare unless the tenant has its own (`concurrencyShare` on its `tenant#<id>`
item). Only whoever holds the stack's AWS credentials sets it: no tenant token, operator scope included, reaches it.
"""

from __future__ import annotations

from typing import Annotated

import typer

from agent_jobs_cli.commands.dlq import aws_call
from agent_jobs_cli.context import CliError, JsonOption, handle_errors, out, print_json, state_of


@handle_errors
def tenants_share(
    ctx: typer.Context,
    tenant: Annotated[str, typer.Argument(help="The tenant (its tenant_id claim).")],
    set_share: Annotated[
        int | None,
        typer.Option("--set", help="Give the tenant its own share: invocations at once (0: never deferred)."),
    ] = None,
    default: Annotated[
        bool, typer.Option("--default", help="Take the tenant's own share away: the stack's applies.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Show, set (--set N) or remove (--default) a tenant's own share of the worker's invocations."""
    from pydantic import TypeAdapter, ValidationError

    from agent_jobs.models import TenantId
    from agent_jobs.tenant_shares import MAX_SHARE, TenantShares

    try:
        TypeAdapter(TenantId).validate_python(tenant)
    except ValidationError:
        raise CliError(f"'{tenant}' is not a tenant id: 1 to 64 letters, digits, '.', '_' and '-'") from None
    if set_share is not None and default:
        raise CliError("--set and --default contradict each other: give one")
    if set_share is not None and not 0 <= set_share <= MAX_SHARE:
        raise CliError(f"--set takes 0 (never deferred) to {MAX_SHARE} invocations, not {set_share}")
    target = state_of(ctx).target
    shares = TenantShares(target.dynamodb(), target.table_name, default_share=0)
    if set_share is not None or default:
        aws_call("writing the tenant's share", lambda: shares.set_override(tenant, None if default else set_share))
    own = aws_call("reading the tenant's share", lambda: shares.override(tenant))
    if as_json:
        print_json({"tenantId": tenant, "share": own})
        return
    if own is None:
        out().print(f"{tenant} has no share of its own: the stack's WorkerTenantShare applies.")
    else:
        out().print(f"{tenant}'s own share: {own} invocation(s) at once" + (" (never deferred)" if own == 0 else "."))
