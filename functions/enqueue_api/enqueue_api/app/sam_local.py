"""Under `sam local start-api` only: the HTTP API's JWT authorizer, which SAM CLI skips.

Deployed, API Gateway verifies the bearer token and hands this function the claims in `requestContext.authorizer`;
`sam local start-api` sends every request without an authorizer context, so every route needing a tenant would answer
401. When SAM CLI runs the function (AWS_SAM_LOCAL is "true") and the `sam local` env file gives the local development
key's public half (LOCAL_JWT_PUBLIC_KEY), the function checks the Authorization header itself, as the authorizer
would (`agent_jobs.bearer_tokens`, the local runtime's API's verifier), and adds the verified claims where API Gateway
puts them. Nothing else of the request is read: a header that names a tenant, an unverified token, a token of another
key, issuer or audience adds nothing, and the route answers 401 as without a token.

An event that already carries an authorizer context is left as it is: API Gateway made it (deployed), or whoever
wrote the event file for `sam local invoke` did; `sam local start-api` never makes one.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from .context import logger

if TYPE_CHECKING:
    from agent_jobs.bearer_tokens import JwtVerifier
    from agent_jobs.settings import Settings


def with_local_authorizer(event: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """`event` with the claims of its verified bearer token as API Gateway's JWT authorizer context, when running under
    `sam local` with a local public key; else `event` unchanged."""
    public_key = settings.local_token_public_key
    if public_key is None:
        return event
    request_context = event.get("requestContext")
    if not isinstance(request_context, dict) or request_context.get("authorizer"):
        return event
    try:
        verifier = _verifier(public_key)
    except (ImportError, ValueError) as unusable:
        # A layer built without requirements-sam-local.txt, or a value that is no RSA public key: nothing verifies.
        logger.error(
            "LOCAL_JWT_PUBLIC_KEY is set but tokens cannot be verified: build with `make build-sam-local` and use the"
            " env file `make local` writes",
            extra={"reason": repr(unusable)},
        )
        return event
    headers = {str(name).lower(): value for name, value in (event.get("headers") or {}).items()}
    authorization = headers.get("authorization")
    claims = verifier({"authorization": authorization} if isinstance(authorization, str) else {})
    if claims is None:
        return event
    authorizer = {"jwt": {"claims": {name: _claim_text(value) for name, value in claims.items()}, "scopes": None}}
    return {**event, "requestContext": {**request_context, "authorizer": authorizer}}


@functools.cache
def _verifier(public_key_pem: str) -> JwtVerifier:
    # Imported here: outside `sam local` the function never loads the JWT library.
    from agent_jobs.bearer_tokens import key_verifier, public_key_from_pem

    return key_verifier(public_key_from_pem(public_key_pem))


def _claim_text(value: Any) -> str:
    """A claim as API Gateway passes it to the function: a string (numbers as digits, lists space-separated)."""
    if isinstance(value, list):
        return " ".join(str(item) for item in value)
    return str(value)
