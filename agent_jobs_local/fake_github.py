"""A fake of GitHub's pull-request REST API on localhost, with request recording and programmable faults.

It serves `GET` and `POST /repos/{owner}/{repo}/pulls` (under an optional path prefix, as GitHub Enterprise Server
serves `/api/v3`) over real HTTP, keeps pull requests in memory, checks the bearer token when it was given one (without
one it accepts any request, as the local demo's workspaces have no token), and answers with GitHub's shapes: 401
"Bad credentials", 404 "Not Found", 422 "Validation Failed" when a pull request already exists.

    with FakeGitHub() as github:          # or github.start() ... github.stop()
        github.add_repository("agents", "ws-00")
        ...  # GitHubClient(token, api_url=github.url)
        github.list_pulls()               # what it holds

The tests of `jobs.github` use it, and the local demo serves it to the worker processes for their `open_pr` jobs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

ALREADY_EXISTS_MESSAGE = "A pull request already exists for {label}."


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any


@dataclass(frozen=True)
class Fault:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    method: str | None = None  # None: the next request of any method


@dataclass
class FakePull:
    number: int
    owner: str
    repo: str
    head: str
    base: str
    title: str
    body: str
    state: str = "open"

    def as_json(self, base_url: str) -> dict[str, Any]:
        return {
            "number": self.number,
            "state": self.state,
            "title": self.title,
            "body": self.body,
            "url": f"{base_url}/repos/{self.owner}/{self.repo}/pulls/{self.number}",
            "html_url": f"https://github.example/{self.owner}/{self.repo}/pull/{self.number}",
            "head": {"ref": self.head, "label": f"{self.owner}:{self.head}"},
            "base": {"ref": self.base, "label": f"{self.owner}:{self.base}"},
        }


class FakeGitHub:
    """The server and its state. Callers arrange repositories and faults on it and read what it was asked.

    `token` None accepts requests with any Authorization header, or none. `any_repository` answers for every
    owner/repo as if it existed (a stand-in for a user's own repositories), else only for those added.
    `start()`/`stop()`, the context manager and `running()` serve it on a free loopback port; `url` (also
    `base_url`) is its API URL while it runs, or `served_at` when another server serves it (the local git server).
    """

    def __init__(
        self,
        *,
        token: str | None = None,
        path_prefix: str = "",
        any_repository: bool = False,
        served_at: str | None = None,
    ) -> None:
        self.token = token
        self.path_prefix = path_prefix.rstrip("/")
        self.any_repository = any_repository
        self.served_at = served_at
        self.repositories: set[tuple[str, str]] = set()
        self.pulls: list[FakePull] = []
        self.requests: list[RecordedRequest] = []
        self.race_next_create = False
        self._faults: deque[Fault] = deque()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        if self.served_at is not None:
            return self.served_at
        if self._server is None:
            raise RuntimeError("the fake GitHub is not running: start() it first")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}{self.path_prefix}"

    @property
    def url(self) -> str:
        """The API URL to give a GitHub client (`api_url`), path prefix included."""
        return self.base_url

    def add_repository(self, owner: str, repo: str) -> None:
        self.repositories.add((owner, repo))

    def add_pull(self, owner: str, repo: str, *, head: str, base: str, title: str = "existing") -> FakePull:
        with self._lock:
            return self._create(owner, repo, head=head, base=base, title=title, body="")

    def fail_next(
        self, count: int, status: int, *, headers: dict[str, str] | None = None, method: str | None = None
    ) -> None:
        """The next `count` requests (of `method`, or any) get `status` with GitHub's error body."""
        body = {"message": _STATUS_MESSAGES.get(status, "Error"), "documentation_url": "https://docs.github.com"}
        for _ in range(count):
            self._faults.append(Fault(status, dict(headers or {}), body, method))

    def rate_limit_next(self, count: int, *, reset_in_seconds: int = 1) -> None:
        """The next `count` requests get GitHub's primary rate-limit answer: 403 with x-ratelimit-remaining 0."""
        headers = {
            "x-ratelimit-limit": "5000",
            "x-ratelimit-remaining": "0",
            "x-ratelimit-reset": str(int(time.time()) + reset_in_seconds),
        }
        body = {"message": "API rate limit exceeded for user ID 1.", "documentation_url": "https://docs.github.com"}
        for _ in range(count):
            self._faults.append(Fault(403, headers, body))

    def requests_of(self, method: str) -> list[RecordedRequest]:
        return [request for request in self.requests if request.method == method]

    def open_pulls(self, owner: str, repo: str, head: str) -> list[FakePull]:
        return [p for p in self.pulls if (p.owner, p.repo, p.head, p.state) == (owner, repo, head, "open")]

    def list_pulls(self) -> list[FakePull]:
        """Every pull request it holds (open or not, any repository), in the order they were opened; copies."""
        with self._lock:
            return [dataclasses.replace(pull) for pull in self.pulls]

    def start(self) -> FakeGitHub:
        if self._server is not None:
            raise RuntimeError("the fake GitHub is already running")
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="fake-github", daemon=True)
        self._server, self._thread = server, thread
        thread.start()
        return self

    def stop(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> FakeGitHub:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    @contextmanager
    def running(self) -> Iterator[FakeGitHub]:
        self.start()
        try:
            yield self
        finally:
            self.stop()

    def _next_fault(self, method: str) -> Fault | None:
        for fault in self._faults:
            if fault.method in (None, method):
                self._faults.remove(fault)
                return fault
        return None

    def _create(self, owner: str, repo: str, *, head: str, base: str, title: str, body: str) -> FakePull:
        pull = FakePull(len(self.pulls) + 1, owner, repo, head, base, title, body)
        self.pulls.append(pull)
        return pull

    def answer(self, method: str, raw_path: str, headers: dict[str, str], body: Any) -> tuple[int, dict[str, str], Any]:
        """GitHub's answer to one request (called by the HTTP handler, one request at a time)."""
        parsed = urllib.parse.urlsplit(raw_path)
        query = dict(urllib.parse.parse_qsl(parsed.query))
        with self._lock:
            self.requests.append(RecordedRequest(method, parsed.path, query, headers, body))
            fault = self._next_fault(method)
            if fault is not None:
                return fault.status, fault.headers, fault.body
            if self.token is not None and headers.get("authorization") != f"Bearer {self.token}":
                return 401, {}, {"message": "Bad credentials", "documentation_url": "https://docs.github.com"}
            path = parsed.path
            if not path.startswith(self.path_prefix + "/"):
                return 404, {}, {"message": "Not Found"}
            parts = path[len(self.path_prefix) :].strip("/").split("/")
            if len(parts) != 4 or parts[0] != "repos" or parts[3] != "pulls":
                return 404, {}, {"message": "Not Found"}
            owner, repo = parts[1], parts[2]
            if not self.any_repository and (owner, repo) not in self.repositories:
                return 404, {}, {"message": "Not Found", "documentation_url": "https://docs.github.com"}
            if method == "GET":
                return 200, {}, self._list(owner, repo, query)
            if method == "POST":
                return self._post(owner, repo, body)
            return 404, {}, {"message": "Not Found"}

    def _list(self, owner: str, repo: str, query: dict[str, str]) -> list[dict[str, Any]]:
        state = query.get("state", "open")
        found = []
        for pull in self.pulls:
            if (pull.owner, pull.repo) != (owner, repo) or state not in ("all", pull.state):
                continue
            if "head" in query and query["head"] != f"{owner}:{pull.head}":
                continue
            if "base" in query and query["base"] != pull.base:
                continue
            found.append(pull.as_json(self.base_url))
        return found

    def _post(self, owner: str, repo: str, body: Any) -> tuple[int, dict[str, str], Any]:
        if not isinstance(body, dict) or not all(isinstance(body.get(key), str) for key in ("title", "head", "base")):
            missing = {"resource": "PullRequest", "code": "missing_field", "field": "title"}
            return 422, {}, {"message": "Validation Failed", "errors": [missing]}
        head, base = body["head"], body["base"]
        exists = any(p.base == base for p in self.open_pulls(owner, repo, head))
        if self.race_next_create:
            # Another worker's create lands first; ours then meets GitHub's uniqueness check.
            self.race_next_create = False
            if not exists:
                self._create(owner, repo, head=head, base=base, title=body["title"], body="(the other worker's)")
            exists = True
        if exists:
            error = {
                "resource": "PullRequest",
                "code": "custom",
                "message": ALREADY_EXISTS_MESSAGE.format(label=f"{owner}:{head}"),
            }
            return 422, {}, {"message": "Validation Failed", "errors": [error]}
        pull = self._create(owner, repo, head=head, base=base, title=body["title"], body=str(body.get("body", "")))
        return 201, {}, pull.as_json(self.base_url)


_STATUS_MESSAGES = {
    401: "Bad credentials",
    404: "Not Found",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Server Error",
    503: "Service Unavailable",
}


def _handler_for(fake: FakeGitHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self._serve()

        def do_POST(self) -> None:
            self._serve()

        def log_message(self, format: str, *args: Any) -> None:  # keep the test output quiet
            pass

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = None
            headers = {key.lower(): value for key, value in self.headers.items()}
            status, answer_headers, answer = fake.answer(self.command, self.path, headers, body)
            payload = json.dumps(answer).encode() if answer is not None else b""
            # A worker killed at its Timeout mid-request has closed the connection: GitHub does not mind either.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(payload)))
                for name, value in answer_headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)

    return Handler
