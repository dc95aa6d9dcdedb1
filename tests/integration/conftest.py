"""Fixtures of the worker's Lambda handler as deployed, with the test sandbox behind a Lambda Invoke endpoint."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from enqueue_api import app
from tests.conftest import GitWorkspaces, Stack
from tests.integration.lambda_invoke import LambdaInvokeServer, presigned_get
from tests.integration.test_enqueue_api import Api, api_on


@pytest.fixture
def api(any_stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    """The enqueue function as template.yaml configures it, on both stacks (a module's own `api` replaces it)."""
    yield api_on(any_stack, monkeypatch)
    app.reset_services()


@pytest.fixture
def sandbox_endpoint(any_stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LambdaInvokeServer]:
    """The test sandbox function behind a Lambda Invoke endpoint (its handler in this process)."""
    (tmp_path / "sandbox").mkdir()
    monkeypatch.setenv("SANDBOX_WORK_ROOT", str(tmp_path / "sandbox"))
    with LambdaInvokeServer(any_stack.env()["TEST_SANDBOX_FUNCTION"], fetch=presigned_get(any_stack)) as server:
        yield server


@pytest.fixture
def worker_app(
    any_stack: Stack,
    sandbox_endpoint: LambdaInvokeServer,
    git_workspaces: GitWorkspaces,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Any:
    """The worker's `app` module with the environment template.yaml gives it, a cold start for each test."""
    from job_worker import app  # the worker function folder is on the path as in Lambda (/var/task)

    for name, value in {**any_stack.env(), **git_workspaces.env()}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WORKSPACES_ROOT", str(tmp_path / "ws"))
    monkeypatch.setenv("AWS_ENDPOINT_URL_LAMBDA", sandbox_endpoint.url)
    app.worker.cache_clear()  # a cold start: the next invocation builds the worker from this environment
    return app
