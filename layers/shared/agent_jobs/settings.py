"""Settings, read from the environment once per process by whoever needs them (never at import time)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Every knob of the functions. Names are the environment variables set by template.yaml."""

    model_config = SettingsConfigDict(frozen=True, extra="ignore")

    table_name: str = Field(description="DynamoDB table for job and workspace state.")
    queue_url: str = Field(description="The FIFO jobs queue.")
    max_attempts: Annotated[int, Field(ge=1, le=10)] = 3
    # The queue's redrive maxReceiveCount: on the last delivery the worker parks instead of letting SQS dead-letter.
    max_receive_count: Annotated[int, Field(ge=2)] = 10
    max_payload_bytes: Annotated[int, Field(ge=1024)] = 256 * 1024
    job_ttl_days: Annotated[int, Field(ge=1)] = 30
    time_safety_margin_ms: Annotated[int, Field(ge=0)] = 10_000
    backoff_base_seconds: Annotated[int, Field(ge=0)] = 2
    backoff_max_seconds: Annotated[int, Field(ge=0, le=43_200)] = 300
    # A resume's drain runs at most this many parked jobs per drain marker before it sends the next marker.
    drain_jobs_per_marker: Annotated[int, Field(ge=1, le=1000)] = 10
    # How long a drain marker waits when the parked index lags behind the workspace's parkedCount.
    drain_lag_retry_seconds: Annotated[int, Field(ge=0, le=300)] = 1
    # Until the API has an authorizer, every caller is this tenant (enqueue_api.app.caller_tenant); "" refuses them.
    open_access_tenant: str = "default"
    workspaces_root: str = "/tmp/agent-jobs/workspaces"

    @model_validator(mode="after")
    def _queue_backstop_above_attempts(self) -> Settings:
        if self.max_attempts >= self.max_receive_count:
            raise ValueError(
                f"MAX_ATTEMPTS ({self.max_attempts}) must be below MAX_RECEIVE_COUNT ({self.max_receive_count}): the"
                " queue's redrive is a backstop, the worker decides DEAD; raise MaxReceiveCount or lower MaxAttempts"
            )
        return self
