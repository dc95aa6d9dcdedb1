"""The worker's telemetry: metrics with their own dimensions, per-job log keys and trace subsegments, and the
cause of a record's unplanned failure."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.metrics.base import SingleMetric
from botocore.exceptions import BotoCoreError, ClientError

from agent_jobs.keys import workspace_id_from_group
from agent_jobs.models import ID_PATTERN, JobType
from job_worker.worker.core import WorkerCore

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

    from agent_jobs.models import JobMessage

# Job-level metrics carry the job's type in this dimension; a rejected message whose type cannot be read counts as
# UNKNOWN_JOB_TYPE (never a value taken from a bad message, which would make a new metric per message).
JOB_TYPE_DIMENSION = "JobType"
UNKNOWN_JOB_TYPE = "unknown"
# One per halt the worker causes (DEAD, REJECTED, parked or halted on a last delivery). Its only dimension is
# Powertools' `service`: template.yaml's WorkspacesHaltedAlarm names exactly that, so keep both sides in step.
WORKSPACES_HALTED = "WorkspacesHalted"
# One per message refused as not its workspace owner's (`worker.records`): recorded for the operator, nothing halted.
# Its only dimension is `service`, as template.yaml's MessagesRefusedAlarm names it.
MESSAGES_REFUSED = "MessagesRefused"


class Telemetry(WorkerCore):
    """Logging, tracing and metrics of the jobs of a batch, safe to use from the threads of its groups."""

    @contextmanager
    def _log_keys(self, **keys: Any) -> Iterator[None]:
        """`keys` on this thread's log lines while the block runs, then the keys it had before. Powertools' thread-safe
        keys live in a context variable, so jobs of groups running at once each log their own jobId (the formatter's
        shared keys, `append_context_keys`, would hand one job's keys to every thread)."""
        before = self.logger.thread_safe_get_current_keys()
        self.logger.thread_safe_append_keys(**keys)
        try:
            yield
        finally:
            self.logger.thread_safe_clear_keys()
            self.logger.thread_safe_append_keys(**before)

    @contextmanager
    def _traced(self, message: JobMessage) -> Iterator[None]:
        """One X-Ray subsegment per job, annotated so traces can be searched by job and workspace (a batch holds
        several jobs, so annotations on the handler's segment would keep only one)."""
        with self.tracer.provider.in_subsegment(f"## {message.type}"):
            self.tracer.put_annotation("jobId", message.job_id)
            self.tracer.put_annotation("workspaceId", message.workspace_id)
            yield

    def _trace_entity(self) -> Any:
        """The X-Ray entity open in this thread (the handler's subsegment), for the group threads to attach their
        job subsegments to (X-Ray keeps the current entity per thread); None when tracing is off or there is none."""
        get_entity = getattr(self.tracer.provider, "get_trace_entity", None)
        if self.tracer.disabled or get_entity is None:
            return None
        try:
            return get_entity()
        except Exception:  # no segment to attach to (not in Lambda): the jobs' subsegments are dropped as before
            return None

    def _report_failed_record(self, record: SQSRecord, error: Exception) -> None:
        """An unplanned failure of a record (DynamoDB or SQS unreachable, throttled, a bug): the processor reports
        it failed and the queue brings it back, so it is logged here, with its job and cause, and counted by cause
        (`RecordsFailed<Cause>`); its group stops behind it."""
        cause = failure_cause(error)
        self.logger.error(
            "record failed: it comes back after its visibility timeout",
            extra={
                "jobId": job_id_if_any(record.body),
                "workspaceId": workspace_id_from_group(record.attributes.message_group_id or ""),
                "messageId": record.message_id,
                "cause": cause,
                "error": f"{type(error).__name__}: {error}"[:1000],
            },
            exc_info=error,
        )
        self._count(f"RecordsFailed{cause}")

    def _count(self, name: str, job_type: str | None = None) -> None:
        """One of `name`; job-level metrics pass their job's type and get the JobType dimension."""
        self._emit(name, MetricUnit.Count, 1, job_type=job_type)

    def _count_halt(self) -> None:
        """This worker's action halted a workspace. Only the `service` dimension, which the alarm names exactly."""
        self._emit(WORKSPACES_HALTED, MetricUnit.Count, 1, dimensions={})

    def _count_refused(self) -> None:
        """A message was refused as not its workspace owner's. Only the `service` dimension, which the alarm names."""
        self._emit(MESSAGES_REFUSED, MetricUnit.Count, 1, dimensions={})

    def _emit(
        self,
        name: str,
        unit: MetricUnit,
        value: float,
        *,
        job_type: str | None = None,
        dimensions: dict[str, str] | None = None,
    ) -> None:
        """A metric with its own dimensions, written at once as its own EMF document (as Powertools' `single_metric`).

        Powertools' Metrics gives one dimension set to everything it flushes together, and one batch mixes job types
        and halts; so a metric whose dimensions matter (JobType, or the exact set an alarm names) is not added to it.
        Without either argument the metric joins the invocation's shared set (service dimension only).
        Groups of a batch emit from their own threads: one lock keeps the shared set and stdout whole.
        """
        with self._emit_lock:
            if job_type is None and dimensions is None:
                self.metrics.add_metric(name=name, unit=unit, value=value)
                return
            own = dict(dimensions or {})
            if job_type is not None:
                own[JOB_TYPE_DIMENSION] = job_type
            # What `single_metric` does, but written in one call: its print writes the document and its newline
            # separately, and a job of another group logging in between would break both lines.
            metric = SingleMetric(namespace=self.metrics.namespace)
            metric.add_metric(name=name, unit=unit, value=value)
            for dimension, dimension_value in {**self.metrics.default_dimensions, **own}.items():
                metric.add_dimension(name=dimension, value=dimension_value)
            if self.metrics.service:  # a SingleMetric drops the Metrics' service dimension unless it is set again
                metric.add_dimension(name="service", value=str(self.metrics.service))
            sys.stdout.write(json.dumps(metric.serialize_metric_set(), separators=(",", ":")) + "\n")


def job_type_if_any(record: SQSRecord) -> str:
    """A rejected message's job type for its metric: the body's `type`, else the producer's `type` attribute, when it
    names a known job type; otherwise UNKNOWN_JOB_TYPE."""
    try:
        candidates: list[Any] = [json.loads(record.body).get("type")]
    except Exception:  # not JSON, not an object, or nested too deep (RecursionError)
        candidates = []
    attribute = record.message_attributes["type"] if "type" in record.message_attributes else None  # noqa: SIM401
    if attribute is not None:
        candidates.append(attribute.string_value)
    known = {str(job_type) for job_type in JobType}
    return next((str(c) for c in candidates if isinstance(c, str) and c in known), UNKNOWN_JOB_TYPE)


# AWS error codes by what they mean for a record that failed on them.
_THROTTLED_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "ThrottlingException",
        "Throttling",
        "TooManyRequestsException",
    }
)
_CONFLICT_CODES = frozenset(
    {"TransactionConflictException", "TransactionCanceledException", "TransactionInProgressException"}
)
_UNAVAILABLE_CODES = frozenset({"InternalServerError", "ServiceUnavailable", "InternalFailure", "RequestTimeout"})


def failure_cause(error: BaseException) -> str:
    """What kind of failure a record met: Throttled, Conflict (a transaction that lost to another writer),
    Unavailable (the service could not be reached or answered 5xx), Aws (another AWS error), or Other."""
    if isinstance(error, ClientError):
        code = str(error.response.get("Error", {}).get("Code", ""))
        status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if code in _THROTTLED_CODES:
            return "Throttled"
        if code in _CONFLICT_CODES:
            return "Conflict"
        if code in _UNAVAILABLE_CODES or status >= 500:
            return "Unavailable"
        return "Aws"
    if isinstance(error, BotoCoreError):  # no answer at all: connection refused, timed out, closed
        return "Unavailable"
    return "Other"


def tenant_if_any(body: str) -> str | None:
    """The tenant a body names when it is a JSON object with a string `tenantId` (the body need not be a valid job)."""
    try:
        tenant_id = json.loads(body).get("tenantId")
    except Exception:  # not JSON, not an object, or nested too deep (RecursionError)
        return None
    return tenant_id[:128] if isinstance(tenant_id, str) and tenant_id else None


def job_id_if_any(body: str) -> str | None:
    try:
        job_id = json.loads(body).get("jobId")
    except Exception:  # not JSON, not an object, or nested too deep (RecursionError)
        return None
    if isinstance(job_id, str) and len(job_id) <= 64 and re.fullmatch(ID_PATTERN, job_id):
        return job_id
    return None
