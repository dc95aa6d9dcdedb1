"""Bearer tokens verified as an API Gateway HTTP API JWT authorizer verifies them, for the places that have no such
authorizer in front of them: the local runtime's API, and the producer function under `sam local start-api` (which
skips JWT authorizers).

The token comes from the Authorization header with or without a `Bearer ` prefix; it must be RS256 (never `none`,
HS256 or another algorithm), name the `kid` of a known key, be signed by it, come from the issuer, name the audience
in `aud` or `client_id`, and be within exp / nbf / iat, with a little leeway for clock skew. Anything else: None (401).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

# The local development issuer and audience (the template's JwtIssuer and JwtAudience defaults).
LOCAL_ISSUER: Final = "agent-jobs-local"
LOCAL_AUDIENCE: Final = "agent-jobs"
ALGORITHM: Final = "RS256"
# API Gateway tolerates a little clock skew between the issuer and itself.
DEFAULT_LEEWAY_SECONDS: Final = 60
_BEARER: Final = "bearer "


def key_id(public_key: rsa.RSAPublicKey) -> str:
    """The RFC 7638 JWK thumbprint (SHA-256, base64url) of `public_key`: the same key always has the same kid."""
    jwk = RSAAlgorithm.to_jwk(public_key, as_dict=True)
    canonical = json.dumps({name: jwk[name] for name in ("e", "kty", "n")}, separators=(",", ":"), sort_keys=True)
    return base64.urlsafe_b64encode(hashlib.sha256(canonical.encode()).digest()).rstrip(b"=").decode()


def public_key_from_pem(pem: str) -> rsa.RSAPublicKey:
    """The RSA public key in `pem` (SubjectPublicKeyInfo); ValueError if it holds anything else."""
    loaded = serialization.load_pem_public_key(pem.encode())
    if not isinstance(loaded, rsa.RSAPublicKey):
        raise ValueError("not an RSA public key")
    return loaded


def public_key_pem(public_key: rsa.RSAPublicKey) -> str:
    """`public_key` as PEM (SubjectPublicKeyInfo), as `public_key_from_pem` reads it."""
    return public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def bearer_token(authorization: str | None) -> str | None:
    """The token in an Authorization header value, with or without its `Bearer ` prefix (as API Gateway takes it)."""
    if authorization is None:
        return None
    value = authorization.strip()
    if value[: len(_BEARER)].lower() == _BEARER:
        value = value[len(_BEARER) :].strip()
    return value or None


class JwtVerifier:
    """An HTTP API JWT authorizer's checks: `verifier(headers)` is the token's claims, or None (API Gateway's 401).

    `keys` maps kid to public key (API Gateway's JWKS); `audiences` are the authorizer's audience entries, matched
    against `aud` or, failing that, `client_id`.
    """

    def __init__(
        self,
        *,
        issuer: str,
        audiences: Iterable[str],
        keys: Mapping[str, rsa.RSAPublicKey],
        leeway_seconds: int = DEFAULT_LEEWAY_SECONDS,
    ) -> None:
        self.issuer = issuer
        self.audiences = frozenset(audiences)
        self.keys = dict(keys)
        self.leeway_seconds = leeway_seconds

    def __call__(self, headers: Mapping[str, str]) -> dict[str, Any] | None:
        return self.verify(bearer_token(headers.get("authorization")))

    def verify(self, token: str | None) -> dict[str, Any] | None:
        if not token:
            return None
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            return None
        # Only RS256 with a known kid: `none`, HMAC (signed with the public key as a secret) and others never verify.
        if header.get("alg") != ALGORITHM:
            return None
        public_key = self.keys.get(str(header.get("kid")))
        if public_key is None:
            return None
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                public_key,
                algorithms=[ALGORITHM],
                issuer=self.issuer,
                leeway=self.leeway_seconds,
                options={"require": ["exp", "iss"], "verify_aud": False},
            )
        except jwt.InvalidTokenError:
            return None
        # PyJWT has checked exp, nbf and iat (an iat in the future is refused, as API Gateway does).
        return claims if self._audience_matches(claims) else None

    def _audience_matches(self, claims: Mapping[str, Any]) -> bool:
        # API Gateway: the token's `aud` must match an audience entry; a token without `aud` may match by `client_id`.
        audience = claims.get("aud")
        if audience is None:
            audience = claims.get("client_id")
        names = [audience] if isinstance(audience, str) else audience if isinstance(audience, list) else []
        return any(isinstance(name, str) and name in self.audiences for name in names)


def key_verifier(
    public_key: rsa.RSAPublicKey, issuer: str = LOCAL_ISSUER, audiences: Iterable[str] = (LOCAL_AUDIENCE,)
) -> JwtVerifier:
    """A verifier of tokens signed by `public_key`'s private half (default issuer and audience: the local ones)."""
    return JwtVerifier(issuer=issuer, audiences=audiences, keys={key_id(public_key): public_key})


__all__ = [
    "ALGORITHM",
    "DEFAULT_LEEWAY_SECONDS",
    "LOCAL_AUDIENCE",
    "LOCAL_ISSUER",
    "JwtVerifier",
    "bearer_token",
    "key_id",
    "key_verifier",
    "public_key_from_pem",
    "public_key_pem",
]
