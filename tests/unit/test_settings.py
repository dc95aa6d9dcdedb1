from __future__ import annotations

import pytest
from pydantic import ValidationError

from agent_jobs.settings import Settings


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TABLE_NAME", "jobs")
    monkeypatch.setenv("QUEUE_URL", "https://sqs/q.fifo")
    monkeypatch.setenv("MAX_ATTEMPTS", "4")
    settings = Settings()
    assert (settings.table_name, settings.queue_url, settings.max_attempts) == ("jobs", "https://sqs/q.fifo", 4)


def test_settings_refuse_attempts_that_reach_the_queue_backstop():
    with pytest.raises(ValidationError, match="MAX_ATTEMPTS \\(10\\) must be below MAX_RECEIVE_COUNT \\(10\\)"):
        Settings(table_name="t", queue_url="q", max_attempts=10, max_receive_count=10)


def test_settings_name_a_missing_variable(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("TABLE_NAME", raising=False)
    monkeypatch.delenv("QUEUE_URL", raising=False)
    with pytest.raises(ValidationError, match="table_name"):
        Settings()
