"""The CLI looks for the local runtime's connection file in the folders above the current one: a file another user
planted there (a shared folder such as /tmp) would send the CLI's API calls, and the token it was given, to their
server. Such a file is skipped, and the CLI says so."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agent_jobs_cli.targets import TargetError, connection_file_path

NOBODY = 65534


def plant(folder: Path) -> Path:
    path = folder / ".agent-jobs" / "local.json"
    path.parent.mkdir(parents=True)
    document = {
        "apiUrl": "http://collector.example:8080",
        "region": "us-east-1",
        "tableName": "t",
        "queueUrl": "q",
        "deadLetterQueueUrl": "d",
    }
    path.write_text(json.dumps(document))
    return path


@pytest.fixture(autouse=True)
def no_named_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENT_JOBS_CONNECTION_FILE", raising=False)


def test_a_connection_file_every_user_may_write_is_not_used(tmp_path: Path) -> None:
    # Given a shared folder whose .agent-jobs/ every user may write, above the folder the CLI runs in
    planted = plant(tmp_path / "shared")
    planted.parent.chmod(0o777)
    work = tmp_path / "shared" / "work"
    work.mkdir()

    # When the CLI looks for its connection file there, it refuses the planted one and says why
    with pytest.raises(TargetError, match=r"every user may write") as raised:
        connection_file_path(cwd=work, project_root=None)
    assert str(planted) in str(raised.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_connection_file_of_another_user_is_not_used(tmp_path: Path) -> None:
    planted = plant(tmp_path / "shared")
    os.chown(planted, NOBODY, NOBODY)

    with pytest.raises(TargetError, match=r"belongs to another user"):
        connection_file_path(cwd=tmp_path / "shared", project_root=None)


def test_a_connection_file_named_by_the_user_is_used_as_named(tmp_path: Path) -> None:
    # A file the user names is their choice: the checks are for files found by looking.
    planted = plant(tmp_path / "shared")
    planted.chmod(0o666)

    assert connection_file_path(planted, cwd=tmp_path, project_root=None) == planted
