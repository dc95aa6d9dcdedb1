"""The jobs HTTP API as the CLI calls it: JSON in and out, a bearer token, `ApiError` carrying the API's message."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote, urlencode

DEFAULT_TIMEOUT_SECONDS: Final = 30


class ApiError(Exception):
    """An answer other than 2xx (status 0: the API could not be reached)."""

    def __init__(self, status: int, message: str, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.body = body


@dataclass
class ApiClient:
    base_url: str
    token: str | None = None
    timeout: float = DEFAULT_TIMEOUT_SECONDS

    def request(
        self, method: str, path: str, body: Any = None, query: dict[str, str | int | None] | None = None
    ) -> tuple[int, Any]:
        url = self.base_url.rstrip("/") + path
        params = {key: str(value) for key, value in (query or {}).items() if value is not None}
        if params:
            url += "?" + urlencode(params)
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.status, _json(response.read())
        except urllib.error.HTTPError as error:
            answer = _json(error.read())
            message = answer.get("message") if isinstance(answer, dict) else None
            raise ApiError(error.code, str(message or error.reason or f"HTTP {error.code}"), answer) from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise ApiError(0, f"cannot reach the API at {self.base_url} ({reason})") from None

    def get(self, path: str, query: dict[str, str | int | None] | None = None) -> Any:
        return self.request("GET", path, query=query)[1]

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body=body)[1]

    def pages(self, path: str, key: str, query: dict[str, str | int | None] | None = None) -> Iterator[Any]:
        """Every entry of a paginated list answer (`{key: [...], "nextToken": ...}`), following nextToken."""
        params = dict(query or {})
        seen_tokens: set[str] = set()
        while True:
            answer = self.get(path, params)
            yield from answer.get(key) or []
            token = answer.get("nextToken")
            if not token or token in seen_tokens:  # a token seen before would loop forever
                return
            seen_tokens.add(token)
            params["nextToken"] = token


def path_id(value: str) -> str:
    return quote(value, safe="")


def _json(raw: bytes) -> Any:
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except ValueError:
        return {"message": raw.decode("utf-8", "replace")[:500]}
