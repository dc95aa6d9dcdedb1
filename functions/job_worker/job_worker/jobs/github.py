"""A small GitHub REST client for the `open_pr` job: open a pull request exactly once per head branch.

Only the standard library: the worker has no dependencies of its own. Every call is safe to repeat, because
`open_pull_request` looks for the open pull request of its head branch before it creates one, and treats GitHub's
"a pull request already exists" answer (another worker won the race, or our own earlier POST whose answer was lost)
as "found it". The token never appears in a message, a repr or a log line.
"""

from __future__ import annotations

import http.client
import json
import random
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.message import Message
from typing import Any

from job_worker.jobs.errors import PermanentJobError, RetryableJobError

API_VERSION = "2022-11-28"
USER_AGENT = "agent-jobs"
# GitHub's rules for owner (user or organisation) and repository names; anything else would change the URL's path.
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
_MESSAGE_LIMIT = 300


@dataclass(frozen=True)
class PullRequest:
    number: int
    url: str
    created: bool


@dataclass(frozen=True)
class _Answer:
    status: int
    headers: Mapping[str, str]
    body: Any


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    # urllib would resend the Authorization header to wherever a redirect points; a 3xx becomes an error instead.
    def redirect_request(  # noqa: PLR0917 (urllib's signature)
        self,
        req: urllib.request.Request,
        fp: Any,
        code: int,
        msg: str,
        headers: Message,
        newurl: str,
    ) -> urllib.request.Request | None:
        return None


class GitHubClient:
    """GitHub's REST API with bounded retries.

    Network errors, 5xx, 429 and rate-limited 403s are retried with exponential backoff and jitter (honouring
    `retry-after` and `x-ratelimit-reset` up to `max_backoff_seconds`), then raise `RetryableJobError` so the queue
    retries the job later. Answers that no retry can change (401, 404, other 4xx) raise `PermanentJobError` with what
    to fix. `api_url` is `https://api.github.com` or a GitHub Enterprise Server's `https://HOST/api/v3`;
    `host_check` (the workspace's bounds) may refuse it before each request. `ca_pem`, when given, is the one CA an
    https:// API is verified against instead of the system's (the `sam local` git server's).
    """

    def __init__(
        self,
        token: str,
        *,
        api_url: str = "https://api.github.com",
        timeout: float = 10,
        max_attempts: int = 4,
        sleep: Callable[[float], None] = time.sleep,
        backoff_base_seconds: float = 0.5,
        max_backoff_seconds: float = 20,
        host_check: Callable[[str], str | None] | None = None,
        ca_pem: str | None = None,
    ) -> None:
        parsed = urllib.parse.urlsplit(api_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"api_url must be an http(s) URL such as https://api.github.com, not {api_url!r}")
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self._token = token
        self.api_url = api_url.rstrip("/")
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.backoff_base_seconds = backoff_base_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self._sleep = sleep
        self._host_check = host_check
        handlers: list[urllib.request.BaseHandler] = [_RefuseRedirects()]
        if ca_pem:
            try:
                context = ssl.create_default_context(cadata=ca_pem)
            except (ssl.SSLError, ValueError) as error:
                raise PermanentJobError(f"the CA trusted for {api_url} is no usable certificate: {error}") from error
            handlers.append(urllib.request.HTTPSHandler(context=context))
        self._opener = urllib.request.build_opener(*handlers)

    def __repr__(self) -> str:
        return f"GitHubClient(api_url={self.api_url!r})"

    def open_pull_request(self, owner: str, repo: str, *, head: str, base: str, title: str, body: str) -> PullRequest:
        """Return the open pull request of `head` into `base`, creating it if there is none.

        `created` is False when the pull request was already open, including when our own create raced another
        worker's (or an earlier attempt of ours whose answer was lost on the network) and GitHub answered 422.
        """
        full_name = _repository(owner, repo)
        existing = self._find_open_pull_request(owner, repo, head=head, base=base)
        if existing is not None:
            return existing
        answer = self._call(
            "POST",
            f"/repos/{owner}/{repo}/pulls",
            full_name,
            payload={"title": title, "head": head, "base": base, "body": body},
            accept=(201, 422),
        )
        if answer.status == 201:
            return _pull_request(answer.body, created=True, full_name=full_name)
        if not _already_exists(answer.body):
            raise PermanentJobError(
                f"GitHub refused to open a pull request from {head} into {base} in {full_name} (422: "
                f"{_describe(answer.body)}); check that both branches exist and that {head} has commits {base} lacks"
            )
        # Someone opened it between our lookup and our create. GitHub's list can lag its write by a moment.
        for lookup in range(3):
            if lookup:
                self._sleep(self._backoff(lookup))
            existing = self._find_open_pull_request(owner, repo, head=head, base=base)
            if existing is not None:
                return existing
        raise RetryableJobError(
            f"GitHub says a pull request from {owner}:{head} into {base} already exists in {full_name}, but none is"
            " listed as open yet; will retry"
        )

    def _find_open_pull_request(self, owner: str, repo: str, *, head: str, base: str) -> PullRequest | None:
        full_name = f"{owner}/{repo}"
        query = {"head": f"{owner}:{head}", "base": base, "state": "open", "per_page": "100"}
        answer = self._call("GET", f"/repos/{owner}/{repo}/pulls", full_name, query=query)
        if not isinstance(answer.body, list):
            raise RetryableJobError(f"GitHub's list of pull requests of {full_name} is not a list; will retry")
        for pull in answer.body:
            if not isinstance(pull, dict):
                continue
            head_info = pull.get("head")
            head_ref = head_info.get("ref") if isinstance(head_info, dict) else None
            if pull.get("state", "open") == "open" and head_ref == head:
                return _pull_request(pull, created=False, full_name=full_name)
        return None

    def _call(
        self,
        method: str,
        path: str,
        full_name: str,
        *,
        query: Mapping[str, str] | None = None,
        payload: Mapping[str, Any] | None = None,
        accept: tuple[int, ...] = (200,),
    ) -> _Answer:
        url = self.api_url + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        what = f"{method} {path}"
        # Right before connecting, the whole URL: the name may resolve elsewhere than when the workspace was registered.
        refused = self._host_check(url) if self._host_check else None
        if refused:
            raise PermanentJobError(
                f"{refused}; register the workspace again (PUT /workspaces/...) with a githubApiUrl on a public host"
            )
        problem = ""
        for attempt in range(1, self.max_attempts + 1):
            try:
                answer = self._send(method, url, payload)
            except (OSError, http.client.HTTPException) as error:
                # URLError, timeouts, refused or reset connections, a server that hung up mid-answer.
                problem = f"could not reach GitHub at {self.api_url} ({_network_reason(error)})"
                wait = self._backoff(attempt)
            else:
                if answer.status in accept:
                    return answer
                wait_or_none = self._retry_wait(answer, attempt)
                if wait_or_none is None:
                    raise PermanentJobError(_permanent_message(answer, full_name, what))
                problem = f"GitHub answered {answer.status} to {what} for {full_name}: {_describe(answer.body)}"
                wait = wait_or_none
                if wait > self.max_backoff_seconds:
                    raise RetryableJobError(
                        f"{problem}; GitHub asks to wait {wait:.0f} s, longer than this job waits in one attempt;"
                        " will retry"
                    )
            if attempt < self.max_attempts:
                self._sleep(wait)
        raise RetryableJobError(f"{problem}; gave up after {self.max_attempts} attempts, will retry")

    def _send(self, method: str, url: str, payload: Mapping[str, Any] | None) -> _Answer:
        headers = {
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": API_VERSION,
            "User-Agent": USER_AGENT,
        }
        if self._token:  # a local or test server may take anonymous requests; GitHub then answers 401/404
            headers["Authorization"] = f"Bearer {self._token}"
        data = None
        if payload is not None:
            data = json.dumps(payload).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                return _Answer(response.status, _lower_keys(response.headers), _json(response.read()))
        except urllib.error.HTTPError as error:
            with error:
                try:
                    raw = error.read()
                except (OSError, http.client.HTTPException):
                    raw = b""
                return _Answer(error.code, _lower_keys(error.headers), _json(raw))

    def _retry_wait(self, answer: _Answer, attempt: int) -> float | None:
        """Seconds to wait before retrying `answer`, or None when retrying cannot help."""
        status, headers = answer.status, answer.headers
        rate_limited = status == 403 and (headers.get("x-ratelimit-remaining") == "0" or "retry-after" in headers)
        if not (status >= 500 or status == 429 or rate_limited):
            return None
        retry_after = _seconds(headers.get("retry-after"))
        if retry_after is not None:
            return retry_after
        reset = _seconds(headers.get("x-ratelimit-reset"))
        if headers.get("x-ratelimit-remaining") == "0" and reset is not None:
            return max(0.0, reset - time.time()) + 1  # the reset instant is whole seconds; be just past it
        return self._backoff(attempt)

    def _backoff(self, attempt: int) -> float:
        ceiling = min(self.max_backoff_seconds, self.backoff_base_seconds * 2.0 ** (attempt - 1))
        return ceiling * random.uniform(0.5, 1.0)  # jitter: workers that failed together do not retry together


def _repository(owner: str, repo: str) -> str:
    for kind, name in (("owner", owner), ("repository", repo)):
        if not _NAME.fullmatch(name) or name in (".", ".."):
            raise PermanentJobError(
                f"{name!r} is not a GitHub {kind} name (letters, digits, '-', '_', '.'); fix the workspace's repository"
            )
    return f"{owner}/{repo}"


def _pull_request(body: Any, *, created: bool, full_name: str) -> PullRequest:
    if not isinstance(body, dict) or not isinstance(body.get("number"), int):
        raise RetryableJobError(f"GitHub's answer about a pull request of {full_name} has no number; will retry")
    url = body.get("html_url") or body.get("url") or ""
    return PullRequest(number=body["number"], url=str(url), created=created)


def _already_exists(body: Any) -> bool:
    errors = body.get("errors") if isinstance(body, dict) else None
    if not isinstance(errors, list):
        return False
    return any(
        isinstance(error, dict) and "already exists" in str(error.get("message", "")).lower() for error in errors
    )


def _permanent_message(answer: _Answer, full_name: str, what: str) -> str:
    said = _describe(answer.body)
    prefix = f"GitHub answered {answer.status} to {what} for {full_name}"
    if answer.status == 401:
        return f"{prefix}: the token is missing or invalid ({said}); rotate the workspace's token"
    if answer.status == 403:
        return (
            f"{prefix}: the token may not do this ({said}); give it 'Pull requests: write' and 'Contents: read'"
            f" on {full_name}, or use another token"
        )
    if answer.status == 404:
        return (
            f"{prefix}: the repository does not exist or the token cannot see it ({said}); check the workspace's"
            " owner/repo and the token's repository access"
        )
    if 300 <= answer.status < 400:
        moved_to = answer.headers.get("location", "another address")
        return f"{prefix}: it moved to {moved_to}; update the workspace's repository or api_url"
    return f"{prefix} ({said}); this request cannot succeed as it is, fix the job or the workspace's repository"


def _describe(body: Any) -> str:
    if not isinstance(body, dict):
        return "no details"
    parts = [str(body.get("message") or "no message")]
    errors = body.get("errors")
    if isinstance(errors, list):
        parts += [str(e.get("message") or e.get("code") or e) if isinstance(e, dict) else str(e) for e in errors]
    text = "; ".join(parts)
    return text if len(text) <= _MESSAGE_LIMIT else text[: _MESSAGE_LIMIT - 3] + "..."


def _network_reason(error: BaseException) -> str:
    reason = error.reason if isinstance(error, urllib.error.URLError) else error
    return str(reason) or type(reason).__name__


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def _lower_keys(headers: Message | None) -> dict[str, str]:
    return {key.lower(): value for key, value in headers.items()} if headers is not None else {}


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP-date retry-after: fall back to our own backoff
