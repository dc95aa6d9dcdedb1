"""Settings, read from the environment once per process by whoever needs them (never at import time)."""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from agent_jobs.patch_limits import (
    DEFAULT_PATCH_MAX_BYTES,
    DEFAULT_PATCH_MAX_HUNKS,
    DEFAULT_PATCH_SEARCH_WINDOW_LINES,
)

# The last deliveries of a message before the queue's redrive: the worker parks a failing record on one of them, and a
# claim on one of them does not take over a lease whose worker never came back (a crash there could let the queue
# dead-letter the job and hand out the next job of its workspace). More than one, so that an invocation that crashes
# on one of them still leaves another.
LAST_DELIVERIES: Final = 3
# A deferral over a tenant's share waits BACKOFF_BASE_SECONDS x DEFERRAL_GROWTH^(receives - 1), at most
# BACKOFF_MAX_SECONDS: growing faster than a retry's backoff (x2 a receive), because a deferral may spend only the few
# receives a job's attempts and a crash do not need (`Settings.deferrable`), and each must hold the record back longer
# for the share to hold through a longer backlog. Not faster still: a deferred record waits out its backoff even when
# a slot of its tenant's share frees sooner, so a tenant's burst larger than its share leaves its own slots idle
# (x4 held 120 jobs of 20 s twice as long again as x3, for no fewer records run over the share).
DEFERRAL_GROWTH: Final = 3
# The longest a Lambda function can run (its Timeout's maximum), hence the longest a test sandbox invocation can take.
LAMBDA_MAX_TIMEOUT_SECONDS: Final = 900
# A sandbox invocation keeps this much of its own Timeout for unpacking the checkout, killing the tests and cleaning
# up: the tests themselves get at most its Timeout minus this.
SANDBOX_HEADROOM_SECONDS: Final = 10
MIB: Final = 1024 * 1024
# What one job of a git workspace may bring into the worker (MAX_BLOB_BYTES, MAX_FETCH_BYTES, MAX_CHECKOUT_BYTES):
# inflating an object takes memory of its size, so the largest object bounds the worker's memory, and the fetch and
# the checkout bound what a job writes to the worker's ephemeral storage (/tmp).
DEFAULT_MAX_BLOB_BYTES: Final = 50 * MIB
DEFAULT_MAX_FETCH_BYTES: Final = 100 * MIB
DEFAULT_MAX_CHECKOUT_BYTES: Final = 100 * MIB
# The worker's ephemeral storage (/tmp, the template's WorkerEphemeralStorage) when EPHEMERAL_STORAGE_MB is unset.
DEFAULT_EPHEMERAL_STORAGE_MB: Final = 512
# What the warm caches leave free of the ephemeral storage beyond one fetch and one checkout (the runtime's own files).
EPHEMERAL_HEADROOM_BYTES: Final = 64 * MIB


def deferrals_allowed(*, max_receive_count: int, max_attempts: int) -> int:
    """How many times a record may be deferred over its tenant's share: every receive its job's attempts and a crash
    (LAST_DELIVERIES) do not need before the queue's redrive."""
    return max(0, max_receive_count - max_attempts - LAST_DELIVERIES)


def deferral_backoff_bound(receive_count: int, *, base_seconds: float, max_seconds: float) -> float:
    """The longest a record deferred on its `receive_count`-th receive waits (it waits between half this and this)."""
    return min(max_seconds, base_seconds * float(DEFERRAL_GROWTH) ** max(0, receive_count - 1))


def share_hold_seconds(
    *, max_receive_count: int, max_attempts: int, base_seconds: float, max_seconds: float
) -> tuple[float, float]:
    """How long a tenant's share holds one of its records back, at least and at most: the backoff of every deferral it
    is allowed (each jittered between half its bound and its bound). A backlog the share has not run by then runs over
    it (`RecordsOverShare`)."""
    count = deferrals_allowed(max_receive_count=max_receive_count, max_attempts=max_attempts)
    bounds = [
        deferral_backoff_bound(receives, base_seconds=base_seconds, max_seconds=max_seconds)
        for receives in range(1, count + 1)
    ]
    return sum(bound / 2 for bound in bounds), float(sum(bounds))


class Settings(BaseSettings):
    """Every knob of the functions. Names are the environment variables set by template.yaml."""

    model_config = SettingsConfigDict(frozen=True, extra="ignore")

    table_name: str = Field(description="DynamoDB table for job and workspace state.")
    queue_url: str = Field(description="The FIFO jobs queue.")
    max_attempts: Annotated[int, Field(ge=1, le=10)] = 3
    # The queue's redrive maxReceiveCount: on the last delivery the worker parks instead of letting SQS dead-letter.
    max_receive_count: Annotated[int, Field(ge=2)] = 10
    # The S3 bucket for payloads too large for a queue message (the claim check); without it such jobs are refused.
    payload_bucket: str | None = None
    # A message body above this goes to PAYLOAD_BUCKET and the message carries a pointer. Well below SQS's 1 MiB and
    # the 300,000 characters the guard keeps of a parked or rejected message's body.
    inline_message_limit_bytes: Annotated[int, Field(ge=1024, le=262_144)] = 131_072
    # The API's own request limit: a synchronous Lambda invocation carries at most 6 MB (the event, with the body
    # JSON-escaped inside it), below API Gateway HTTP API's 10 MB, so 5.5 MiB leaves room for the envelope.
    max_request_bytes: Annotated[int, Field(ge=1024, le=6_000_000)] = 5_767_168
    # An apply_patch job's patch: at most PATCH_MAX_BYTES (UTF-8) and PATCH_MAX_HUNKS hunks (and file sections); the
    # API refuses a larger one (413, 422) and the worker ends one DEAD. A hunk whose lines are not at its stated line
    # is looked for at most PATCH_SEARCH_WINDOW_LINES lines above and below it. Together they bound a patch's CPU time.
    patch_max_bytes: Annotated[int, Field(ge=1024)] = DEFAULT_PATCH_MAX_BYTES
    patch_max_hunks: Annotated[int, Field(ge=1)] = DEFAULT_PATCH_MAX_HUNKS
    patch_search_window_lines: Annotated[int, Field(ge=0, le=100_000)] = DEFAULT_PATCH_SEARCH_WINDOW_LINES
    job_ttl_days: Annotated[int, Field(ge=1)] = 30
    time_safety_margin_ms: Annotated[int, Field(ge=0)] = 10_000
    backoff_base_seconds: Annotated[int, Field(ge=0)] = 2
    backoff_max_seconds: Annotated[int, Field(ge=0, le=43_200)] = 300
    # How long a claimed job waits for a job its workspace accepted before it whose send is not confirmed yet (its
    # producer may still be confirming it) before the workspace is halted naming that job (`jobs_ahead`); the waiting
    # job's claim is given back each time, uncounted.
    unplaced_grace_seconds: Annotated[int, Field(ge=0, le=900)] = 30
    # A resume's drain runs at most this many parked jobs per drain marker before it sends the next marker.
    drain_jobs_per_marker: Annotated[int, Field(ge=1, le=1000)] = 10
    # How long a drain marker waits when the parked index lags behind the workspace's parkedCount.
    drain_lag_retry_seconds: Annotated[int, Field(ge=0, le=300)] = 1
    workspaces_root: str = "/tmp/agent-jobs/workspaces"
    # Workspace tokens live under this prefix, a folder per tenant: SSM `/<prefix>/<tenantId>/...`, Secrets Manager
    # `<prefix>/<tenantId>/...` (the template's WorkspaceTokenPrefix).
    workspace_token_prefix: Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.-]+$")] = (
        "agent-jobs"
    )
    # File-system remotes lie under `<root>/<tenantId>/` (e.g. an EFS mount); None refuses file-system remotes.
    workspaces_remote_root: str | None = None
    # host or host:port entries a registration may name although they resolve to a private or loopback address (the
    # local runtime's fake GitHub); never set by the template. Comma-separated in the environment.
    allowed_private_hosts: str = ""
    # Set by SAM CLI (`sam local invoke`, `sam local start-api`) to "true", never by Lambda itself.
    aws_sam_local: str | None = None
    # The local development key's public half (PEM), from the `sam local` env file only (the template declares it only
    # when EndpointUrl is set): under `sam local`, the producer verifies bearer tokens against it itself, since SAM
    # skips the HTTP API's JWT authorizer (`local_token_public_key`).
    local_jwt_public_key: str | None = None
    # The `sam local` git server of the sample workspaces (host:port, e.g. host.docker.internal:8443) and the PEM of the
    # local CA that signed its certificate, from the `sam local` env file only (the template declares them only when
    # EndpointUrl is set): see `local_git_server_settings`.
    local_git_server: str | None = None
    local_git_ca: str | None = None
    # First registrations a tenant may make (updates of a registration do not count).
    max_workspaces_per_tenant: Annotated[int, Field(ge=1)] = 100
    # New jobs a tenant may have accepted in one second (a batch counts each job; repeats count nothing).
    max_jobs_per_second_per_tenant: Annotated[int, Field(ge=1)] = 25
    # Jobs of a workspace accepted and not yet settled; a count of the pending index up to it precedes each accept.
    max_queued_jobs_per_workspace: Annotated[int, Field(ge=1, le=10_000)] = 200
    # How many message groups (workspaces) of one batch the worker runs at once, each group's records in order on its
    # own thread. A batch holds at most 10 records; 1 runs the batch as one sequential loop.
    group_concurrency: Annotated[int, Field(ge=1, le=10)] = 10
    # How many of the worker's invocations may run one tenant's jobs at once (agent_jobs.tenant_shares; a tenant's own
    # `concurrencyShare` overrides it): a record of a tenant at its share is deferred, its group waiting in order,
    # while other tenants' records run. 0: no share.
    tenant_share: Annotated[int, Field(ge=0, le=1000)] = 0
    # The SenderId of the enqueue API's own messages: its role's unique id (template.yaml's
    # `!GetAtt EnqueueApiFunctionRole.RoleId`; a Lambda function's messages carry `<role id>:<function name>`). The
    # worker runs them on a workspace whose owner bound its direct producers (`agent_jobs.direct_producers`); unset,
    # such a workspace runs the messages of its bound senders alone.
    api_sender_id: Annotated[str, Field(max_length=128)] | None = None
    # The function that runs a workspace's test command (template.yaml's TestSandboxFunction): run_tests never runs
    # tests inside the worker, so without it run_tests jobs of git workspaces end DEAD saying to set it.
    test_sandbox_function: str | None = None
    # The sandbox function's Timeout (SandboxTimeout): bounds a test run and the worker's wait for its answer.
    test_sandbox_timeout_seconds: int = 90

    # The largest git object (file, folder listing, commit) a fetch may bring, read from the pack's headers before it is
    # inflated; a larger one ends the job DEAD.
    max_blob_bytes: Annotated[int, Field(ge=1024)] = DEFAULT_MAX_BLOB_BYTES
    # The pack bytes one fetch may bring, counted as they arrive: the download stops there and the job ends DEAD.
    max_fetch_bytes: Annotated[int, Field(ge=1024)] = DEFAULT_MAX_FETCH_BYTES
    # The bytes a checkout (run_tests' copy of the head for the sandbox) may write.
    max_checkout_bytes: Annotated[int, Field(ge=1024)] = DEFAULT_MAX_CHECKOUT_BYTES
    # The worker's ephemeral storage in MB (WorkerEphemeralStorage): sizes the default WORKSPACE_CACHE_BYTES.
    ephemeral_storage_mb: Annotated[int, Field(ge=512, le=10_240)] = DEFAULT_EPHEMERAL_STORAGE_MB
    # The warm git caches of one worker in all; least recently used caches are removed beyond it. None: the ephemeral
    # storage less one fetch (twice: the received pack, then its copy into the cache), one checkout and
    # EPHEMERAL_HEADROOM_BYTES (`cache_budget_bytes`).
    workspace_cache_bytes: Annotated[int, Field(ge=0)] | None = None

    # The payload bucket's lifecycle expiration (PayloadRetentionDays); None when not set (no check).
    payload_retention_days: Annotated[int, Field(ge=1)] | None = None

    @property
    def private_hosts(self) -> frozenset[str]:
        """ALLOWED_PRIVATE_HOSTS as a set of lower-case host or host:port entries."""
        return frozenset(entry.strip().lower() for entry in self.allowed_private_hosts.split(",") if entry.strip())

    @property
    def local_token_public_key(self) -> str | None:
        """LOCAL_JWT_PUBLIC_KEY when running under `sam local` (AWS_SAM_LOCAL is "true"), else None: in AWS the HTTP
        API's JWT authorizer verifies tokens, and nothing else may."""
        if self.aws_sam_local != "true" or not (self.local_jwt_public_key or "").strip():
            return None
        return self.local_jwt_public_key

    @property
    def local_git_server_settings(self) -> tuple[str, str] | None:
        """(host:port, CA PEM) of the `sam local` git server when running under `sam local` (AWS_SAM_LOCAL is "true")
        and both are set, else None: in AWS neither ever admits a private host or adds a trusted CA."""
        server = (self.local_git_server or "").strip().lower()
        ca = (self.local_git_ca or "").strip()
        if self.aws_sam_local != "true" or not server or "BEGIN CERTIFICATE" not in ca:
            return None
        return server, ca

    @property
    def max_claims(self) -> int:
        """Claims of one job in all, counting those of invocations that crashed or timed out (which take every job
        they had in flight with them): every delivery before the last ones. Recorded failures are bounded by
        max_attempts alone."""
        return max(self.max_attempts, self.max_receive_count - LAST_DELIVERIES)

    @property
    def cache_budget_bytes(self) -> int:
        """WORKSPACE_CACHE_BYTES, or what the ephemeral storage leaves beside one fetch and one checkout. A fetch
        takes twice its bytes while it lands: the pack as received, and its copy into the cache as it is indexed."""
        if self.workspace_cache_bytes is not None:
            return self.workspace_cache_bytes
        room = self.ephemeral_storage_mb * MIB - 2 * self.max_fetch_bytes - self.max_checkout_bytes
        return max(0, room - EPHEMERAL_HEADROOM_BYTES)

    def deferrable(self, receive_count: int) -> bool:
        """A record may still be deferred over its tenant's share (`tenant_share`) without costing its job a retry:
        after this delivery it keeps max_attempts deliveries for its attempts and LAST_DELIVERIES for a crash, before
        the queue's redrive. A deferral writes nothing, but each one is a delivery."""
        return receive_count <= deferrals_allowed(
            max_receive_count=self.max_receive_count, max_attempts=self.max_attempts
        )

    def deferral_backoff_bound(self, receive_count: int) -> float:
        """The longest a record deferred over its tenant's share on its `receive_count`-th receive is handed back for
        (`DEFERRAL_GROWTH`)."""
        return deferral_backoff_bound(
            receive_count, base_seconds=self.backoff_base_seconds, max_seconds=self.backoff_max_seconds
        )

    def near_delivery_limit(self, receive_count: int) -> bool:
        """The message is on one of its LAST_DELIVERIES before the queue's redrive."""
        return receive_count > self.max_receive_count - LAST_DELIVERIES

    @field_validator("test_sandbox_timeout_seconds")
    @classmethod
    def _sandbox_timeout_within_lambda(cls, value: int) -> int:
        if value > LAMBDA_MAX_TIMEOUT_SECONDS:
            raise ValueError(
                f"TEST_SANDBOX_TIMEOUT_SECONDS ({value}) is above {LAMBDA_MAX_TIMEOUT_SECONDS} s, the longest a Lambda"
                " function can run; lower SandboxTimeout, or point TEST_SANDBOX_FUNCTION at a function that starts a"
                " longer-running job (CodeBuild, ECS) and answers with its result"
            )
        if value <= SANDBOX_HEADROOM_SECONDS:
            raise ValueError(
                f"TEST_SANDBOX_TIMEOUT_SECONDS ({value}) leaves no time for the tests: the sandbox keeps"
                f" {SANDBOX_HEADROOM_SECONDS} s for unpacking and cleaning up; raise SandboxTimeout"
            )
        return value

    @field_validator("workspaces_remote_root", mode="before")
    @classmethod
    def _empty_root_is_none(cls, value: object) -> object:
        # The template passes an empty WorkspacesRemoteRoot as an empty string: no file-system remotes.
        return None if value == "" else value

    @model_validator(mode="after")
    def _payloads_outlive_their_jobs(self) -> Settings:
        # A queue keeps a message up to 14 days; a payload must outlive that on top of its job record's TTL.
        if self.payload_retention_days is not None and self.payload_retention_days < self.job_ttl_days + 14:
            raise ValueError(
                f"PAYLOAD_RETENTION_DAYS ({self.payload_retention_days}) must be at least JOB_TTL_DAYS "
                f"({self.job_ttl_days}) + 14, the longest a queue keeps a message; raise PayloadRetentionDays"
            )
        return self

    @model_validator(mode="after")
    def _queue_backstop_above_attempts(self) -> Settings:
        if self.max_attempts >= self.max_receive_count:
            raise ValueError(
                f"MAX_ATTEMPTS ({self.max_attempts}) must be below MAX_RECEIVE_COUNT ({self.max_receive_count}): the"
                " queue's redrive is a backstop, the worker decides DEAD; raise MaxReceiveCount or lower MaxAttempts"
            )
        return self
