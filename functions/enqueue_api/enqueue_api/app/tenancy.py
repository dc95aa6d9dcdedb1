"""Who the caller is: the tenant of the verified token (the only place a tenant is derived), its scopes and name.

A route names the caller it needs as a parameter, `tenant: CallerTenant` or `tenant: OperatorTenant`: Powertools
resolves it before the route runs, so a request without a usable tenant (or scope) is refused before the route reads
or writes anything. Only the request's own shape (body pre-check, typed parameters) is checked before it: those answers
tell nothing about any tenant's data.
"""

from http import HTTPStatus
from typing import Annotated, Final, cast

from aws_lambda_powertools.event_handler.depends import Depends
from aws_lambda_powertools.event_handler.request import Request
from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEventV2
from pydantic import TypeAdapter, ValidationError

from agent_jobs.models import TenantId

from .context import logger
from .errors import RequestRefused

TENANT_CLAIM: Final = "tenant_id"
# Operator actions (resume, skip) need this scope in the token, for the caller's own tenant only.
OPERATOR_SCOPE: Final = "agent-jobs/operator"

_tenant_id_adapter: TypeAdapter[str] = TypeAdapter(TenantId)


def caller_tenant(request: Request) -> str:
    """The tenant of the caller: the verified JWT's `tenant_id` claim. The only place a tenant is derived; the body
    is never consulted.

    Fails closed: a request without an authorizer context (a route deployed without the authorizer, a direct
    invocation) is 401; one that went through an authorizer without yielding a usable `tenant_id` claim (another
    authorizer kind, a token without the claim) is 403.
    """
    event = _token_event(request)
    if not event.request_context.get("authorizer"):
        raise RequestRefused(HTTPStatus.UNAUTHORIZED, "authentication required: send a bearer token for your tenant")
    tenant = event.request_context.authorizer.jwt_claim.get(TENANT_CLAIM)
    if not isinstance(tenant, str) or not _is_valid_tenant(tenant):
        raise RequestRefused(
            HTTPStatus.FORBIDDEN,
            f"the access token has no usable '{TENANT_CLAIM}' claim; ask for a token issued for your tenant",
        )
    logger.append_keys(tenant_id=tenant)
    return tenant


def operator_tenant(request: Request) -> str:
    """The caller's tenant, if the caller holds the operator scope (operator actions act only on its own tenant)."""
    tenant = caller_tenant(request)
    if OPERATOR_SCOPE not in caller_scopes(_token_event(request)):
        raise RequestRefused(
            HTTPStatus.FORBIDDEN, f"this action needs the '{OPERATOR_SCOPE}' scope; ask for an operator token"
        )
    return tenant


CallerTenant = Annotated[str, Depends(caller_tenant)]
OperatorTenant = Annotated[str, Depends(operator_tenant)]


def _token_event(request: Request) -> APIGatewayProxyEventV2:
    """The request as the HTTP API (payload format 2.0) delivers it to this API's resolver."""
    return cast("APIGatewayProxyEventV2", request.resolved_event)


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
