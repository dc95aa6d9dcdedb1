"""Git's smart HTTP over TLS for `sam local` (`agent-jobs local --sam-local`): the sample workspaces' remotes, served
where `sam local`'s containers reach this machine, so that a worker run by `sam local invoke` fetches and pushes them.

A container sees none of this machine's folders, so a file-system remote is out of its reach; an https:// remote on
host.docker.internal is not. The server (dulwich's WSGI smart-HTTP application, one thread per request) serves
exactly the repositories it is given, each at `/<tenantId>/<name>.git`, on one address (the docker bridge's, never
every interface). Its certificate names host.docker.internal and is signed by a local CA created once beside the
development key (`.agent-jobs/dev-git-ca.pem`, its key mode 0600); the `sam local` env file gives the worker that CA
(LOCAL_GIT_CA) and this server's host:port (LOCAL_GIT_SERVER), which the functions honour only under `sam local`.
The same server gives each tenant's workspaces a GitHub API (a `FakeGitHub`) at `/<tenantId>/github`, so that their
`open_pr` jobs reach one over HTTPS too.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import ssl
import tempfile
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any, Final, Protocol

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from dulwich.repo import Repo
from dulwich.server import BackendRepo, DictBackend
from dulwich.web import WSGIRequestHandlerLogger, WSGIServerLogger, make_server, make_wsgi_chain

from agent_jobs_local.auth import dev_key_path
from agent_jobs_local.runtime_files import CONTAINER_HOST

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

    from agent_jobs_local.fake_github import FakeGitHub

CA_NAME: Final = "Agent Jobs local git CA"
CA_VALID_DAYS: Final = 3650
SERVER_VALID_DAYS: Final = 30


@dataclass(frozen=True)
class LocalCa:
    """The local CA: its certificate (PEM, what the worker trusts) and its key (signs the server's certificate)."""

    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def certificate_pem(self) -> str:
        return self.certificate.public_bytes(serialization.Encoding.PEM).decode()


def local_ca_path() -> Path:
    """Where the local CA lives: beside the development key (`.agent-jobs/dev-git-ca.pem`)."""
    return dev_key_path().parent / "dev-git-ca.pem"


def local_ca(path: Path | None = None) -> LocalCa:
    """The local CA at `path` (default `local_ca_path()`: key and certificate in one file), created if there is none."""
    path = path or local_ca_path()
    if path.exists():
        data = path.read_bytes()
        try:
            key = serialization.load_pem_private_key(data, password=None)
            if isinstance(key, ec.EllipticCurvePrivateKey):
                return LocalCa(x509.load_pem_x509_certificate(data), key)
        except ValueError:
            pass  # not a CA of ours (damaged, or something else): made anew
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CA_VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # key_cert_sign, crl_sign
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    # A new file renamed into place: mode 0600 whatever the one it replaces had.
    descriptor, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(descriptor, "wb") as file:
        file.write(key_pem + certificate.public_bytes(serialization.Encoding.PEM))
    os.replace(partial, path)
    return LocalCa(certificate, key)


def server_certificate(ca: LocalCa, host: str) -> tuple[bytes, bytes]:
    """A certificate (PEM) and its key (PEM) for host.docker.internal and the address `host`, signed by `ca`."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    names: list[x509.GeneralName] = [x509.DNSName(CONTAINER_HOST)]
    try:
        names.append(x509.IPAddress(ipaddress.ip_address(host)))
    except ValueError:
        names.append(x509.DNSName(host))
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CONTAINER_HOST)]))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=SERVER_VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        # Python's strict verification (3.13) wants both key identifiers.
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.certificate.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return certificate.public_bytes(serialization.Encoding.PEM), key_pem


class _ThreadingGitServer(ThreadingMixIn, WSGIServerLogger):
    daemon_threads = True


class _RequestHandler(WSGIRequestHandlerLogger):
    # A client that stops sending (a Content-Length longer than its body) holds its thread this long at most.
    timeout = 30


# The largest request body the GitHub stand-in reads (a pull request's title and body).
GITHUB_BODY_LIMIT_BYTES: Final = 1024 * 1024


class GitHubApis(Protocol):
    """Where the server finds a tenant's GitHub stand-in: `get("/<tenantId>/github")`, None for none (a mapping of
    those paths, or `github_stand_in.TenantGitHubs`, which makes one per tenant on first use)."""

    def get(self, key: str, /) -> FakeGitHub | None: ...


def with_github_apis(git: WSGIApplication, apis: GitHubApis) -> WSGIApplication:
    """`git`, except that a request below a tenant's `/<tenantId>/github` that `apis` has a stand-in for goes to that
    GitHub stand-in, with the path taken off (as a client of GitHub Enterprise Server's `/api/v3` sends it)."""

    def application(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        folder, _, rest = path.removeprefix("/").partition("/")
        api, separator, _ = rest.partition("/")
        prefix = f"/{folder}/{api}"
        github = apis.get(prefix) if path.startswith(prefix + "/") and separator else None
        if github is not None:
            return _github_answer(github, path[len(prefix) :], environ, start_response)
        return git(environ, start_response)

    return application


def _github_answer(
    github: FakeGitHub, path: str, environ: WSGIEnvironment, start_response: StartResponse
) -> Iterable[bytes]:
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length > GITHUB_BODY_LIMIT_BYTES:
        return _json_answer(start_response, 413, {}, {"message": "Payload too large"})
    raw = environ["wsgi.input"].read(length) if length > 0 else b""
    body: Any
    try:
        body = json.loads(raw) if raw else None
    except (ValueError, RecursionError):
        return _json_answer(start_response, 400, {}, {"message": "Problems parsing JSON"})
    headers = {key[5:].replace("_", "-").lower(): value for key, value in environ.items() if key.startswith("HTTP_")}
    query = environ.get("QUERY_STRING", "")
    status, answer_headers, answer = github.answer(
        environ["REQUEST_METHOD"], path + (f"?{query}" if query else ""), headers, body
    )
    return _json_answer(start_response, status, answer_headers, answer)


def _json_answer(start_response: StartResponse, status: int, headers: Mapping[str, str], answer: Any) -> list[bytes]:
    payload = json.dumps(answer).encode() if answer is not None else b""
    start_response(
        f"{status} {HTTPStatus(status).phrase}",
        [("Content-Type", "application/json; charset=utf-8"), ("Content-Length", str(len(payload))), *headers.items()],
    )
    return [payload]


class GitHttpsServer:
    """Smart HTTP over TLS for `repositories` (`/<tenantId>/<name>.git` -> bare repository folder) on `host`, and
    `github_apis` (`/<tenantId>/github` -> its GitHub stand-in: a mapping, or `TenantGitHubs`)."""

    def __init__(
        self,
        repositories: Mapping[str, Path],
        host: str,
        ca: LocalCa | None = None,
        port: int = 0,
        github_apis: GitHubApis | None = None,
    ) -> None:
        if host in ("0.0.0.0", "::", ""):
            raise ValueError("the git server listens on one address, never every interface")
        self.repositories = dict(repositories)
        self.github_apis: GitHubApis = github_apis if github_apis is not None else {}
        self.host = host
        self.ca = ca or local_ca()
        self._port = port
        self._server: _ThreadingGitServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the git server is not started")
        return int(self._server.server_address[1])

    @property
    def container_netloc(self) -> str:
        """host:port as a `sam local` container names this server (LOCAL_GIT_SERVER)."""
        return f"{CONTAINER_HOST}:{self.port}"

    def container_url(self, path: str) -> str:
        """The https:// URL of the repository at `path` (`/<tenantId>/<name>.git`) as a container reaches it."""
        return f"https://{self.container_netloc}{path}"

    def start(self) -> GitHttpsServer:
        repositories: dict[str, BackendRepo] = {path: Repo(str(folder)) for path, folder in self.repositories.items()}
        backend = DictBackend(repositories)
        server = make_server(
            self.host,
            self._port,
            with_github_apis(make_wsgi_chain(backend), self.github_apis),
            handler_class=_RequestHandler,
            server_class=_ThreadingGitServer,
        )
        certificate, key = server_certificate(self.ca, self.host)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        with tempfile.TemporaryDirectory(prefix="agent-jobs-git-tls-") as folder:
            chain = Path(folder) / "server.pem"
            chain.write_bytes(certificate + key)
            context.load_cert_chain(chain)
        # The handshake happens on the request's own thread, so a client that never completes one holds up nothing.
        server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="git-https", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


__all__ = [
    "GitHttpsServer",
    "GitHubApis",
    "LocalCa",
    "local_ca",
    "local_ca_path",
    "server_certificate",
    "with_github_apis",
]
