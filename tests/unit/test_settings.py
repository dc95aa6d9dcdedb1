from __future__ import annotations

import pytest
from pydantic import ValidationError

from agent_jobs.patch_limits import PatchLimits
from agent_jobs.settings import Settings
from job_worker.jobs.limits import GitLimits


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


def test_settings_refuse_payloads_that_expire_before_their_jobs_can_be_delivered():
    with pytest.raises(
        ValidationError, match=r"PAYLOAD_RETENTION_DAYS \(43\) must be at least JOB_TTL_DAYS \(30\) \+ 14"
    ):
        Settings(table_name="t", queue_url="q", job_ttl_days=30, payload_retention_days=43)
    assert Settings(table_name="t", queue_url="q", job_ttl_days=30, payload_retention_days=44).payload_retention_days


def test_settings_keep_inline_messages_below_the_stored_body_limit():
    from agent_jobs.guard import MAX_STORED_BODY_CHARS

    default = Settings(table_name="t", queue_url="q").inline_message_limit_bytes
    assert default <= MAX_STORED_BODY_CHARS // 2
    with pytest.raises(ValidationError, match="inline_message_limit_bytes"):
        Settings(table_name="t", queue_url="q", inline_message_limit_bytes=MAX_STORED_BODY_CHARS)


def test_settings_allow_claims_lost_to_crashes_up_to_the_last_deliveries():
    settings = Settings(table_name="t", queue_url="q", max_attempts=3, max_receive_count=10)
    assert settings.max_claims == 7  # every delivery before the last three
    assert [n for n in range(1, 11) if settings.near_delivery_limit(n)] == [8, 9, 10]
    # a queue that redrives early leaves no claims beyond the failed attempts
    assert Settings(table_name="t", queue_url="q", max_attempts=3, max_receive_count=5).max_claims == 3


@pytest.mark.parametrize(
    ("environment", "limits"),
    [
        pytest.param(
            {"MAX_BLOB_BYTES": "2048", "MAX_FETCH_BYTES": "4096", "MAX_CHECKOUT_BYTES": "8192"},
            GitLimits(max_blob_bytes=2048, max_fetch_bytes=4096, max_checkout_bytes=8192),
            id="git",
        ),
        pytest.param(
            {"PATCH_MAX_BYTES": "2048", "PATCH_MAX_HUNKS": "7", "PATCH_SEARCH_WINDOW_LINES": "0"},
            PatchLimits(max_bytes=2048, max_hunks=7, search_window_lines=0),
            id="patch",
        ),
    ],
)
def test_settings_read_the_limits_of_a_job_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], limits: GitLimits | PatchLimits
):
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert type(limits).from_settings(Settings(table_name="t", queue_url="q")) == limits
    for name in environment:
        monkeypatch.delenv(name)
    assert type(limits).from_settings(Settings(table_name="t", queue_url="q")) == type(limits)()


def test_settings_size_the_cache_budget_from_the_ephemeral_storage(monkeypatch: pytest.MonkeyPatch):
    from agent_jobs.settings import EPHEMERAL_HEADROOM_BYTES, MIB

    default = Settings(table_name="t", queue_url="q")
    # a fetch lands twice: the pack as received, then its copy in the cache
    left = 512 * MIB - 2 * default.max_fetch_bytes - default.max_checkout_bytes - EPHEMERAL_HEADROOM_BYTES
    assert default.cache_budget_bytes == left == 148 * MIB
    monkeypatch.setenv("EPHEMERAL_STORAGE_MB", "1024")
    assert Settings(table_name="t", queue_url="q").cache_budget_bytes == left + 512 * MIB
    monkeypatch.setenv("WORKSPACE_CACHE_BYTES", "1000000")
    assert Settings(table_name="t", queue_url="q").cache_budget_bytes == 1_000_000
