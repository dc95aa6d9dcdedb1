"""Ids a sender controls are checked as whole strings: an id pattern's `$` also matches before a trailing newline, so
`re.match` would let `"abc\\n"` through into a record key, a cache path or an API URL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from job_worker.jobs.errors import PermanentJobError
from job_worker.jobs.git_workspace import GitRemote, GitWorkspaceStore
from job_worker.jobs.github import _repository
from job_worker.worker.telemetry import job_id_if_any


@pytest.mark.parametrize("job_id", ["abc\n", "abc\r\n", "-abc", "a" * 65, "a/b"])
def test_a_rejected_messages_job_id_is_kept_only_when_it_is_a_whole_id(job_id: str) -> None:
    assert job_id_if_any(json.dumps({"jobId": job_id})) is None
    assert job_id_if_any(json.dumps({"jobId": "abc"})) == "abc"


def test_a_workspace_id_with_a_trailing_newline_opens_no_cache(tmp_path: Path) -> None:
    store = GitWorkspaceStore(tmp_path)

    with pytest.raises(ValueError, match="not a workspace id"):
        store.open_remote("ws-a\n", GitRemote(url=str(tmp_path / "remote.git"), branch="agent/a"))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("owner", "repo"), [("acme\n", "repo"), ("acme", "repo\n")])
def test_a_github_name_with_a_trailing_newline_names_no_repository(owner: str, repo: str) -> None:
    with pytest.raises(PermanentJobError, match="is not a GitHub"):
        _repository(owner, repo)
