"""The HTTP calls of the demo workload to the API, answered or not (as an SDK client sees them)."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass


NO_ANSWER = 599  # the status `send` reports when no HTTP answer came back; retried like a 5xx


def send(method: str, url: str, body: dict[str, Any], token: str) -> tuple[int, dict[str, Any]]:
    """The answer's status and JSON body. As an SDK client sees it, no answer at all (connection refused or reset,
    timed out, cut off mid-answer) is NO_ANSWER, which callers retry as they retry a 5xx: with the same jobId, a
    request that did reach the API is answered as a repeat."""
    headers = {"content-type": "application/json", "authorization": f"Bearer {token}"}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, answer_body(response.read())
    except urllib.error.HTTPError as error:
        return error.code, answer_body(error.read())
    except (OSError, http.client.HTTPException) as error:  # URLError, resets, timeouts, RemoteDisconnected
        return NO_ANSWER, {"error": f"no answer: {error!r}"}


def answer_body(raw: bytes) -> dict[str, Any]:
    try:
        answer = json.loads(raw or b"{}")
    except ValueError:
        return {"body": raw[:500].decode(errors="replace")}
    return answer if isinstance(answer, dict) else {"body": answer}


def post(url: str, body: dict[str, Any], token: str) -> tuple[int, dict[str, Any]]:
    return send("POST", url, body, token)
