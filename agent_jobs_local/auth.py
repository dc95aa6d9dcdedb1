"""Bearer tokens on this machine: a development signing key, tokens minted with it, and a verifier that does what an
API Gateway HTTP API JWT authorizer does with them.

The key (RSA 2048) is created on first use at `<repo>/.agent-jobs/dev-jwt-key.pem` (mode 0600; the directory is
ignored by git), or at the path in AGENT_JOBS_DEV_KEY. Its `kid` is the RFC 7638 thumbprint of the public key, so it
is stable for as long as the file is kept. Tokens carry iss `agent-jobs-local`, aud `agent-jobs`, sub, `tenant_id`,
`scope` (space-separated), iat, nbf and exp.

The verifier (`JwtVerifier`, `verify_authorization`) is the layer's `agent_jobs.bearer_tokens`, which follows the HTTP
API JWT authorizer; the producer function uses the same one under `sam local start-api`, given this key's public half
(`public_key_pem`, written to the `sam local` env file).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from agent_jobs.bearer_tokens import (
    ALGORITHM,
    LOCAL_AUDIENCE,
    LOCAL_ISSUER,
    JwtVerifier,
    bearer_token,
    key_id,
    key_verifier,
    public_key_pem,
)

REPO: Final = Path(__file__).resolve().parent.parent
DEV_KEY_ENV: Final = "AGENT_JOBS_DEV_KEY"
DEFAULT_DEV_KEY_PATH: Final = REPO / ".agent-jobs" / "dev-jwt-key.pem"
# The same scope as enqueue_api.app.OPERATOR_SCOPE (a test keeps them equal): operator actions need it.
OPERATOR_SCOPE: Final = "agent-jobs/operator"

_keys: dict[Path, DevSigningKey] = {}
_keys_lock = threading.Lock()


@dataclass(frozen=True)
class DevSigningKey:
    """The local development key: its private half signs tokens, its public half (under `kid`) verifies them."""

    private_key: rsa.RSAPrivateKey
    kid: str
    path: Path

    @property
    def public_key(self) -> rsa.RSAPublicKey:
        return self.private_key.public_key()


def dev_key_path() -> Path:
    """Where the development key lives: AGENT_JOBS_DEV_KEY, else `<repo>/.agent-jobs/dev-jwt-key.pem`."""
    configured = os.environ.get(DEV_KEY_ENV)
    return Path(configured).expanduser().resolve() if configured else DEFAULT_DEV_KEY_PATH


def dev_signing_key(path: Path | None = None) -> DevSigningKey:
    """The development key at `path` (default `dev_key_path()`), created (mode 0600) if there is none yet."""
    path = path or dev_key_path()
    with _keys_lock:
        key = _keys.get(path)
        if key is None:
            key = _load_or_create(path)
            _keys[path] = key
        return key


def _load_or_create(path: Path) -> DevSigningKey:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        # Written under a temporary name and linked into place: another process creating the key at the same time
        # cannot leave a half-written file, and the first link wins (the loser reads the winner's key below).
        temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(pem)
            with contextlib.suppress(FileExistsError):
                os.link(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)
    loaded = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(loaded, rsa.RSAPrivateKey):
        raise ValueError(f"{path} holds no RSA private key; delete it and a new development key is created")
    return DevSigningKey(private_key=loaded, kid=key_id(loaded.public_key()), path=path)


def sign_claims(claims: Mapping[str, Any], key: DevSigningKey | None = None) -> str:
    """`claims` as an RS256 JWT signed with the development key (header `kid` set): for tokens `mint_token` does not
    make, such as expired ones in tests."""
    key = key or dev_signing_key()
    return jwt.encode(dict(claims), key.private_key, algorithm=ALGORITHM, headers={"kid": key.kid})


def mint_token(tenant_id: str, *, scopes: Sequence[str] = (), ttl_seconds: int = 3600) -> str:
    """A bearer token for `tenant_id`, valid for `ttl_seconds`, signed with the development key: what the local API
    accepts (deployed, tokens come from the issuer the JwtIssuer parameter names)."""
    now = int(time.time())
    claims = {
        "iss": LOCAL_ISSUER,
        "aud": LOCAL_AUDIENCE,
        "sub": f"local:{tenant_id}",
        "tenant_id": tenant_id,
        "scope": " ".join(scopes),
        "iat": now,
        "nbf": now,
        "exp": now + ttl_seconds,
    }
    return sign_claims(claims)


def local_verifier(
    issuer: str = LOCAL_ISSUER, audiences: Iterable[str] = (LOCAL_AUDIENCE,), key: DevSigningKey | None = None
) -> JwtVerifier:
    """A verifier of tokens signed with the development key (default issuer and audience: the local ones)."""
    return key_verifier((key or dev_signing_key()).public_key, issuer, audiences)


def verify_authorization(headers: Mapping[str, str]) -> dict[str, Any] | None:
    """The claims of the development-key token in `headers` (lower-cased names), or None: the local API's default
    authorizer."""
    return local_verifier()(headers)


__all__ = [
    "DEV_KEY_ENV",
    "LOCAL_AUDIENCE",
    "LOCAL_ISSUER",
    "OPERATOR_SCOPE",
    "DevSigningKey",
    "JwtVerifier",
    "bearer_token",
    "dev_key_path",
    "dev_signing_key",
    "key_id",
    "local_verifier",
    "mint_token",
    "public_key_pem",
    "sign_claims",
    "verify_authorization",
]
