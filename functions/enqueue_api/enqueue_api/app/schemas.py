"""The models of the API's answers, as the OpenAPI document describes them."""

from __future__ import annotations

from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from agent_jobs.models import JobRequest, ResumeDecision
from agent_jobs.producer import MAX_BATCH_JOBS

# A 422 lists at most this many field errors and counts the rest (`moreErrors`): the answer to a body with a great
# many bad fields stays small.
MAX_FIELD_ERRORS: Final = 20


class _View(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class FieldErrorView(_View):
    field: str = Field(description="The field's camelCase path in the body (`payload.patch`), or a parameter name.")
    message: str


class ErrorView(_View):
    message: str = Field(description="What went wrong and what to do about it.")
    errors: list[FieldErrorView] | None = Field(
        default=None, description=f"One entry per invalid field (422), the first {MAX_FIELD_ERRORS} of them."
    )
    more_errors: int | None = Field(
        default=None, description="How many more invalid fields there are than `errors` lists; absent when none."
    )


class ConflictView(_View):
    message: str
    job_id: str


class JobAcceptedView(_View):
    job_id: str
    status: str
    message_id: str | None
    sequence_number: str | None
    created: bool = Field(description="False when this repeated a job already accepted with the same payload.")


class JobBatchRequest(BaseModel):
    """A batch of jobs, each as `POST /jobs` takes it; a jobId at most once."""

    model_config = ConfigDict(extra="forbid")

    jobs: list[JobRequest] = Field(min_length=1, max_length=MAX_BATCH_JOBS)


class BatchItemView(_View):
    job_id: str
    status_code: int = Field(
        description="What POST /jobs would answer for this job alone: 202 accepted (`created` false: a repeat of a job "
        "already accepted with the same payload), 409 the jobId is taken by another job of the tenant, 404 a "
        "workspace the tenant has not registered (another tenant's is answered the same), 413 too large, 429 a "
        "quota refused it (send it again after the answer's Retry-After), 503 the queue did not take it (send the "
        "same job again)."
    )
    status: str | None
    message_id: str | None
    sequence_number: str | None = Field(description="The queue's SequenceNumber: the order jobs take effect in.")
    created: bool
    message: str | None = Field(description="Why the job was not accepted, and what to do; null when accepted.")


class JobBatchView(_View):
    results: list[BatchItemView] = Field(description="One per job, in the order of the request.")


class JobView(_View):
    """A job as its tenant sees it. Every field is present; a field not recorded yet is null."""

    job_id: str | None = Field(description="Null only for a rejected message that named no usable jobId.")
    workspace_id: str | None
    tenant_id: str | None
    type: str | None
    status: str | None = Field(description="QUEUED, IN_FLIGHT, SUCCEEDED, FAILED, DEAD, REJECTED, PARKED or SKIPPED.")
    attempt: int | None = Field(
        description="Claims of the job by a worker over its whole life, an operator's retry included: a claim whose "
        "invocation never came back counts, one taken back because the workspace was halted does not."
    )
    failures: int | None = Field(
        description="Failed attempts recorded since the job was accepted or last retried by an operator: MaxAttempts "
        "of them make the job DEAD."
    )
    accepted_at: int | None = Field(description="Epoch milliseconds.")
    updated_at: int | None
    finished_at: int | None
    message_id: str | None
    sequence_number: str | None = Field(description="The queue's SequenceNumber: the order jobs take effect in.")
    result: dict[str, Any] | None
    error: str | None = Field(
        description="Why the job's last attempt failed, or why it was rejected; null while it runs again and once it "
        "SUCCEEDED (its history keeps each failed attempt's error)."
    )
    history: list[dict[str, Any]] | None


class JobTimelineView(_View):
    jobs: list[JobView] = Field(description="Oldest accepted first.")
    next_token: str | None = Field(description="Pass as nextToken for the next page; null on the last page.")


DIRECT_PRODUCERS = (
    "The SQS senders (SenderId: AIDA... users, AROA... roles, AROA...:<session> sessions) whose messages sent straight "
    "to the queue are this workspace's jobs; null binds none (any sender allowed to send to the queue acts as the "
    "owner), an empty list admits jobs submitted through this API alone."
)


class WorkspaceView(_View):
    workspace_id: str
    tenant_id: str
    remote_url: str
    branch: str
    base_branch: str
    test_commands: dict[str, list[str]]
    token_parameter: str | None
    github_repository: str | None
    github_api_url: str | None
    direct_producers: list[str] | None = Field(description=DIRECT_PRODUCERS)
    registered_at: int


class LastResumeView(_View):
    """An operator's resume decision. While the workspace is RESUMING it is the resume under way: sending the same
    decision and haltingJobId to the resume route again sends its drain marker again."""

    decision: ResumeDecision
    halting_job_id: str = Field(description="The job the decision was for.")
    at: int | None = Field(description="Epoch milliseconds.")
    by: str | None = Field(description="Who decided (the operator token's subject).")


class WorkspaceStatusView(_View):
    """The registration (null fields when the workspace only carries halt state) and the workspace's state."""

    workspace_id: str
    tenant_id: str | None
    remote_url: str | None
    branch: str | None
    base_branch: str | None
    test_commands: dict[str, list[str]] | None
    token_parameter: str | None
    github_repository: str | None
    github_api_url: str | None
    direct_producers: list[str] | None = Field(description=DIRECT_PRODUCERS)
    registered_at: int | None
    state: str = Field(description="ACTIVE, HALTED or RESUMING.")
    halting_job_id: str | None
    halt_reason: str | None
    last_applied_job_id: str | None = Field(description="The newest job that SUCCEEDED on the workspace.")
    last_resume: LastResumeView | None = Field(
        description="The last resume decision; while RESUMING, the resume under way (repeat it to resend its marker)."
    )


class ResumeConflictView(_View):
    """A resume refused because the workspace is not as the operator saw it: read `workspace` and decide again."""

    message: str = Field(
        description="Why: the workspace is not HALTED, is halted by another job, or its halting job cannot be retried."
    )
    workspace: WorkspaceStatusView = Field(description="The workspace as it is now.")


class HaltedWorkspacesView(_View):
    workspaces: list[WorkspaceStatusView] = Field(description="HALTED and RESUMING workspaces, by workspaceId.")
    next_token: str | None = Field(description="Pass as nextToken for the next page; null on the last page.")
