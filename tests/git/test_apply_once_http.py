"""GitWorkspace.apply_once against a real smart-HTTP git server on loopback (dulwich's own `dulwich.web`): the HTTP
requests an apply_patch job makes, counted at the server.

A push over smart HTTP is two requests (the ref advertisement, then the receive-pack request with the commands and
the pack); a fetch is the upload-pack advertisement and one upload-pack request per negotiation round.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest
from dulwich.repo import Repo
from dulwich.server import BackendRepo, DictBackend
from dulwich.web import make_wsgi_chain

from job_worker.jobs import apply_patch
from job_worker.jobs.context import JobContext
from job_worker.jobs.errors import PermanentJobError
from job_worker.jobs.git_workspace import GitRemote, GitWorkspaceStore
from tests.git.conftest import BASE_BRANCH, apply_patch_job
from tests.git.test_git_workspace import append_line, branch_job_ids


class Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class Requests:
    """The requests the server answered, as "GET info/refs?service=..." or "POST git-receive-pack"."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()

    def mark(self) -> Counter[str]:
        return Counter(self.seen)

    def since(self, before: Counter[str]) -> dict[str, int]:
        return {name: n for name, n in (self.seen - before).items() if n}


@pytest.fixture
def served(remote: Path) -> Iterator[tuple[str, Requests]]:
    """`remote` served over smart HTTP on 127.0.0.1 (fetch and push), and the requests counted."""
    requests = Requests()
    repositories: dict[str, BackendRepo] = {"/": cast(BackendRepo, Repo(str(remote)))}
    application = make_wsgi_chain(DictBackend(repositories))

    def counting(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        path = environ["PATH_INFO"].lstrip("/")
        query = environ.get("QUERY_STRING", "")
        requests.seen[f"{environ['REQUEST_METHOD']} {path}{'?' + query if query else ''}"] += 1
        return application(environ, start_response)

    server = make_server("127.0.0.1", 0, counting, server_class=WSGIServer, handler_class=Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/", requests
    finally:
        server.shutdown()
        server.server_close()


def store(tmp_path: Path, url: str, worker: str) -> GitWorkspaceStore:
    def resolve(workspace_id: str) -> GitRemote:
        return GitRemote(url=url, branch=f"agent/{workspace_id}", base_branch=BASE_BRANCH)

    return GitWorkspaceStore(tmp_path / "caches" / worker, resolve)


def run(store: GitWorkspaceStore, job_id: str, patch: str) -> dict[str, Any]:
    workspace = store.open("ws-1")
    return apply_patch.run(apply_patch_job(job_id, patch), JobContext(workspace=workspace, remaining_ms=lambda: 60_000))


PUSH = {"GET info/refs?service=git-receive-pack": 1, "POST git-receive-pack": 1}


def test_over_http_a_warm_cache_applies_a_patch_with_one_push(
    tmp_path: Path, remote: Path, served: tuple[str, Requests]
) -> None:
    url, requests = served
    worker = store(tmp_path, url, "worker-1")

    # A cold cache: the server's capabilities (can it deepen a shallow cache? dulwich's cannot), one fetch, the push
    cold = requests.mark()
    run(worker, "job-1", append_line(1))
    cold_requests = requests.since(cold)
    assert {k: v for k, v in cold_requests.items() if "receive-pack" in k} == PUSH
    assert cold_requests["GET info/refs?service=git-upload-pack"] == 2
    caches = list(worker.cache_root.glob("*.git"))
    assert caches
    assert not [cache for cache in caches if (cache / "shallow").exists()]  # fetched in full

    # A warm cache: the push alone, and a redelivery of the same job reaches the server not at all
    warm = requests.mark()
    run(worker, "job-2", append_line(2))
    assert requests.since(warm) == PUSH
    again = requests.mark()
    assert run(worker, "job-2", append_line(2))["alreadyApplied"] is True
    assert requests.since(again) == {}
    assert branch_job_ids(remote) == ["job-1", "job-2"]


def test_over_http_a_stale_cache_is_refused_without_sending_a_pack_then_fetches(
    tmp_path: Path, remote: Path, served: tuple[str, Requests]
) -> None:
    url, requests = served
    worker, other = store(tmp_path, url, "worker-1"), store(tmp_path, url, "worker-2")
    run(worker, "job-1", append_line(1))
    run(other, "job-2", append_line(2))

    before = requests.mark()
    result = run(worker, "job-3", apply_patch_own_file())

    seen = requests.since(before)
    # the refused push stopped at the advertisement (the branch was not at the cached head): one receive-pack POST
    assert seen["GET info/refs?service=git-receive-pack"] == 2
    assert seen["POST git-receive-pack"] == 1
    assert seen["GET info/refs?service=git-upload-pack"] == 1
    assert result["alreadyApplied"] is False
    assert branch_job_ids(remote) == ["job-1", "job-2", "job-3"]


def apply_patch_own_file() -> str:
    return "--- /dev/null\n+++ b/own.txt\n@@ -0,0 +1 @@\n+own\n"


def test_over_http_a_remote_the_server_does_not_have_fails_the_job_at_once(
    tmp_path: Path, served: tuple[str, Requests]
) -> None:
    # Given a workspace whose remote URL names a repository the server answers 404 for
    url, _ = served
    worker = store(tmp_path, f"{url}no-such-repository.git", "worker-1")

    # When its job runs, Then it fails permanently (no retry can find the repository), saying what to fix
    with pytest.raises(PermanentJobError) as failed:
        run(worker, "job-1", append_line(1))
    assert str(failed.value) == (
        f"the remote at {url}no-such-repository.git does not exist or is not a git repository; fix the registration "
        "with PUT /workspaces/ws-1 and resume the workspace"
    )
