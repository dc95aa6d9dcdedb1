"""An archive passed by URL: fetched over https (a presigned GET), bounded by its announced size, checked by sha256."""

from __future__ import annotations

import datetime
import hashlib
import http.server
import ipaddress
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from test_sandbox import app as sandbox_app
from tests.sandbox.conftest import file_member, sandbox_event, tar_gz

CHECKOUT = tar_gz([file_member("run.sh", b"#!/bin/sh\necho downloaded and ran\n", mode=0o755)])


class ArchiveServer:
    """An https server on 127.0.0.1 that answers GET /<name> with the bytes registered under that name."""

    def __init__(self, certificate: Path, key: Path) -> None:
        self.objects: dict[str, bytes] = {}
        objects = self.objects

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = objects.get(self.path.lstrip("/").split("?")[0])
                if body is None:
                    self.send_error(403, "Request has expired")
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certificate, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, name: str) -> str:
        return f"https://127.0.0.1:{self.server.server_address[1]}/{name}?X-Amz-Signature=abc"


def self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    certificate_path, key_path = folder / "cert.pem", folder / "key.pem"
    certificate_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return certificate_path, key_path


@pytest.fixture
def archive_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ArchiveServer]:
    certificate, key = self_signed_certificate(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate))  # the sandbox trusts this server as it trusts S3
    monkeypatch.setenv("SANDBOX_WORK_ROOT", str(tmp_path))
    server = ArchiveServer(certificate, key)
    yield server
    server.server.shutdown()
    server.server.server_close()


def by_url(server: ArchiveServer, name: str, data: bytes, *, size: int | None = None) -> dict[str, Any]:
    return {
        "url": server.url(name),
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data) if size is None else size,
    }


def test_sandbox_downloads_the_archive_and_runs_it(archive_server: ArchiveServer):
    archive_server.objects["checkout.tar.gz"] = CHECKOUT

    response = sandbox_app.lambda_handler(
        sandbox_event(by_url(archive_server, "checkout.tar.gz", CHECKOUT), ["./run.sh"]), None
    )

    assert (response["outcome"], response["outputTail"]) == ("passed", "downloaded and ran\n")


def test_sandbox_refuses_a_download_longer_than_announced(archive_server: ArchiveServer):
    archive_server.objects["checkout.tar.gz"] = CHECKOUT

    event = sandbox_event(by_url(archive_server, "checkout.tar.gz", CHECKOUT, size=len(CHECKOUT) - 1), ["./run.sh"])
    response = sandbox_app.lambda_handler(event, None)

    assert response["permanent"] is True
    assert "larger than" in response["error"]


def test_sandbox_refuses_a_download_whose_checksum_does_not_match(archive_server: ArchiveServer):
    archive_server.objects["checkout.tar.gz"] = CHECKOUT
    archive = by_url(archive_server, "checkout.tar.gz", CHECKOUT)
    archive["sha256"] = hashlib.sha256(b"what the worker packed").hexdigest()

    response = sandbox_app.lambda_handler(sandbox_event(archive, ["./run.sh"]), None)

    assert response["permanent"] is True
    assert "sha256" in response["error"]


def test_sandbox_expired_url_is_worth_a_retry(archive_server: ArchiveServer):
    response = sandbox_app.lambda_handler(
        sandbox_event(by_url(archive_server, "expired.tar.gz", CHECKOUT), ["./run.sh"]), None
    )

    assert response["permanent"] is False
    assert "HTTP 403" in response["error"]


def test_sandbox_does_not_trust_an_unknown_certificate(archive_server: ArchiveServer, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("SSL_CERT_FILE")
    archive_server.objects["checkout.tar.gz"] = CHECKOUT

    response = sandbox_app.lambda_handler(
        sandbox_event(by_url(archive_server, "checkout.tar.gz", CHECKOUT), ["./run.sh"]), None
    )

    assert response["permanent"] is False
    assert "certificate" in response["error"].lower()
