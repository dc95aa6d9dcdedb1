"""Git's own smart HTTP server on loopback: `git http-backend` (the CGI program git ships) behind a small threaded
HTTP server, serving the bare repositories under one folder for fetch and push.

The worker reaches GitHub over smart HTTP; dulwich's own server (what `sam local`'s git server is) differs from git's
(it cannot deepen a shallow client, for one), so the benchmarks and tests of the deployed case use git's. Each request
runs one `git http-backend` process, whose answer is streamed back as it is written.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

_COPY_BYTES = 1 << 16


class _BackendHandler(BaseHTTPRequestHandler):
    root: ClassVar[Path]

    def do_GET(self) -> None:
        self._backend(b"")

    def do_POST(self) -> None:
        self._backend(self._body())

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _body(self) -> bytes:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                chunk = self.rfile.read(size)
                self.rfile.readline()
                if not size:
                    return b"".join(chunks)
                chunks.append(chunk)
        return self.rfile.read(int(self.headers.get("content-length") or 0))

    def _backend(self, body: bytes) -> None:
        path, _, query = self.path.partition("?")
        environment = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": str(self.root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "GIT_CONFIG_NOSYSTEM": "1",
            "HOME": str(self.root),
            # pushes without an authenticated user (loopback only)
            "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": "http.receivepack",
            "GIT_CONFIG_VALUE_0": "true",
            "REQUEST_METHOD": self.command,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "CONTENT_TYPE": self.headers.get("content-type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_ADDR": self.client_address[0],
        }
        for header in ("content-encoding", "git-protocol"):
            if header in self.headers:
                environment[f"HTTP_{header.upper().replace('-', '_')}"] = self.headers[header]
        git = shutil.which("git") or "git"
        with subprocess.Popen(
            [git, "http-backend"],
            env=environment,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        ) as backend:
            assert backend.stdin is not None
            assert backend.stdout is not None
            writer = threading.Thread(target=_write_and_close, args=(backend.stdin, body), daemon=True)
            writer.start()
            status, headers = 200, []
            while line := backend.stdout.readline().rstrip(b"\r\n"):
                name, _, value = line.decode("latin-1").partition(":")
                if name.lower() == "status":
                    status = int(value.split()[0])
                else:
                    headers.append((name, value.strip()))
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.end_headers()
            while chunk := backend.stdout.read(_COPY_BYTES):
                self.wfile.write(chunk)
            writer.join()


def _write_and_close(stream: object, body: bytes) -> None:
    try:
        stream.write(body)  # type: ignore[attr-defined]
    except BrokenPipeError:
        pass
    finally:
        stream.close()  # type: ignore[attr-defined]


@contextmanager
def git_http_backend(root: Path) -> Iterator[str]:
    """Serve the bare repositories under `root` at `http://127.0.0.1:<port>/<name>.git`; yields the base url."""
    handler = type("Handler", (_BackendHandler,), {"root": root})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
