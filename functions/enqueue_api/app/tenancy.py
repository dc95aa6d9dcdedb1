"""Who the caller is: the tenant of the verified token (the only place a tenant is derived), its scopes and name."""

from __future__ import annotations

from http import HTTPStatus
from typing import Final

from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEventV2
from pydantic import TypeAdapter, ValidationError

from agent_jobs.models import TenantId
from agent_jobs.settings import Settings

from .errors import RequestRefused

TENANT_CLAIM: Final = "tenant_id"
# Operator actions (resume, skip) need this scope in the token, for the caller's own tenant only.
OPERATOR_SCOPE: Final = "agent-jobs/operator"


_tenant_id_adapter: TypeAdapter[str] = TypeAdapter(TenantId)


def caller_tenant(event: APIGatewayProxyEventV2, settings: Settings) -> str:
    """The tenant of the caller: the verified JWT's `tenant_id` claim. The only place a tenant is derived; the body
    is never consulted.

    Fails closed: a request without an authorizer context (a route deployed without the authorizer, a direct
    invocation) is 401; one that went through an authorizer without yielding a usable `tenant_id` claim (another
    authorizer kind, a token without the claim) is 403.
    """
    if not event.request_context.get("authorizer"):
        raise RequestRefused(HTTPStatus.UNAUTHORIZED, "authentication required: send a bearer token for your tenant")
    tenant = event.request_context.authorizer.jwt_claim.get(TENANT_CLAIM)
    if not isinstance(tenant, str) or not _is_valid_tenant(tenant):
        raise RequestRefused(
            HTTPStatus.FORBIDDEN,
            f"the access token has no usable '{TENANT_CLAIM}' claim; ask for a token issued for your tenant",
        )
    return tenant


def caller_scopes(event: APIGatewayProxyEventV2) -> frozenset[str]:
    """The scopes of the verified token: the authorizer's `jwt.scopes`, else its `scope` (space-separated) or `scp`
    claim. A request without an authorizer has none."""
    authorizer = (event.raw_event.get("requestContext") or {}).get("authorizer") or {}
    jwt = authorizer.get("jwt") or {}
    scopes = jwt.get("scopes")
    if not scopes:
        claims = jwt.get("claims") or {}
        scopes = claims.get("scope") or claims.get("scp") or []
    if isinstance(scopes, str):
        scopes = scopes.split()
    return frozenset(str(scope) for scope in scopes)


def require_operator(event: APIGatewayProxyEventV2, settings: Settings) -> str:
    """The caller's tenant, if the caller holds the operator scope (operator actions act only on its own tenant)."""
    tenant = caller_tenant(event, settings)
    if OPERATOR_SCOPE not in caller_scopes(event):
        raise RequestRefused(
            HTTPStatus.FORBIDDEN, f"this action needs the '{OPERATOR_SCOPE}' scope; ask for an operator token"
        )
    return tenant


def _is_valid_tenant(tenant: str) -> bool:
    try:
        _tenant_id_adapter.validate_python(tenant)
    except ValidationError:
        return False
    return True


def caller_name(event: APIGatewayProxyEventV2, tenant: str) -> str:
    """Who acts, for a job's history: the token's subject, else the tenant's operator."""
    jwt = ((event.raw_event.get("requestContext") or {}).get("authorizer") or {}).get("jwt") or {}
    subject = (jwt.get("claims") or {}).get("sub")
    return str(subject) if isinstance(subject, str) and subject else f"operator of {tenant}"
