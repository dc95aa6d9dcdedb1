"""Per-tenant quotas on jobs, so that one tenant's load cannot crowd out another's.

Two limits, each a template parameter:

* MaxJobsPerSecondPerTenant: new jobs a tenant may have accepted in one second (a batch counts each of its jobs). A
  counter item per tenant and second (`rate#<tenantId>#<epochSecond>`, TTL'd) takes them before the guard records
  them: one UpdateItem `ADD jobCount :n` on the condition that the count stays within the limit (a plain write, not
  part of the guard's transaction, so a tenant's concurrent requests never cancel each other's transactions on this
  one item). A job it refuses is looked up: a repeat of an accepted job goes on to be answered from its record, so
  retries are never refused by this quota; a new one is refused before anything is written. What was taken for jobs
  that were then not recorded (repeats, refusals, failures) is given back. The window is a fixed second, so a tenant
  may have up to twice the limit accepted across the boundary of two seconds.
* MaxQueuedJobsPerWorkspace: jobs of a workspace accepted and not yet settled. Counted, before the accept, with a
  bounded COUNT query of the sparse pending index (`pendingByWorkspace`: the jobs the guard has not settled, entered
  when their message is sent), filtered on the caller's tenant: it reads at most the limit's index entries (keys,
  jobId, tenantId: about 200 bytes each) and no write path of the guard changes. The index is eventually consistent
  and a job enters it once sent, so concurrent requests may take a workspace a few jobs past the limit: a soft bound on
  the backlog, not an exact count. A refused job is checked against the table first: a job already accepted (a
  repeat) is never refused by it.

Both refusals are 429 with Retry-After: they clear by themselves (the next second, or once the worker settles jobs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from botocore.exceptions import ClientError

from agent_jobs.keys import rate_key
from agent_jobs.store.codec import Clock, condition_failed, epoch_ms, to_item, wire
from agent_jobs.store.conditions import PENDING_INDEX

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

DEFAULT_MAX_JOBS_PER_SECOND_PER_TENANT: Final = 25
DEFAULT_MAX_QUEUED_JOBS_PER_WORKSPACE: Final = 200
# A second's counter is garbage once the second is over; TTL removes it (DynamoDB deletes expired items within days).
RATE_COUNTER_TTL_SECONDS: Final = 120
# Seconds a caller waits before sending again: the next second's window for the rate, a few settled jobs for a queue.
RATE_RETRY_AFTER_SECONDS: Final = 1
QUEUE_RETRY_AFTER_SECONDS: Final = 10


class QuotaExceededError(Exception):
    """A job refused by a quota (429): nothing was recorded or queued. `retry_after` is in seconds."""

    def __init__(self, message: str, *, limit: int, parameter: str, retry_after: int) -> None:
        super().__init__(message)
        self.limit = limit
        self.parameter = parameter
        self.retry_after = retry_after


class TenantRateLimitError(QuotaExceededError):
    """The tenant had as many new jobs accepted this second as it may."""

    def __init__(self, tenant_id: str, limit: int) -> None:
        super().__init__(
            f"tenant '{tenant_id}' has had {limit} new jobs accepted this second, the most this deployment accepts "
            f"(MaxJobsPerSecondPerTenant = {limit}); send the job again after {RATE_RETRY_AFTER_SECONDS} s (the same "
            "jobId is safe to repeat), or ask the operator to raise the MaxJobsPerSecondPerTenant parameter",
            limit=limit,
            parameter="MaxJobsPerSecondPerTenant",
            retry_after=RATE_RETRY_AFTER_SECONDS,
        )
        self.tenant_id = tenant_id


class WorkspaceQueueFullError(QuotaExceededError):
    """The workspace has as many jobs accepted and not yet settled as it may."""

    def __init__(self, workspace_id: str, limit: int) -> None:
        super().__init__(
            f"workspace '{workspace_id}' has {limit} jobs accepted and not yet finished, the most this deployment "
            f"queues per workspace (MaxQueuedJobsPerWorkspace = {limit}); send the job again once some have finished "
            f"(after {QUEUE_RETRY_AFTER_SECONDS} s or more), or ask the operator to raise the "
            "MaxQueuedJobsPerWorkspace parameter",
            limit=limit,
            parameter="MaxQueuedJobsPerWorkspace",
            retry_after=QUEUE_RETRY_AFTER_SECONDS,
        )
        self.workspace_id = workspace_id


@dataclass(frozen=True)
class JobQuotas:
    """The quotas of one deployment, checked in the job table. `clock` (epoch ms) picks the rate counter's second;
    None reads this module's `epoch_ms` at each call."""

    client: DynamoDBClient
    table_name: str
    jobs_per_second_per_tenant: int = DEFAULT_MAX_JOBS_PER_SECOND_PER_TENANT
    queued_jobs_per_workspace: int = DEFAULT_MAX_QUEUED_JOBS_PER_WORKSPACE
    clock: Clock | None = None

    # ---- admission -----------------------------------------------------------------------------------------------

    def admit(self, jobs: Sequence[tuple[str, str]], tenant_id: str, known: Callable[[str], bool]) -> Admission:
        """Which of `jobs` ((jobId, workspaceId) each, in request order) the quotas refuse, and the count taken for
        the others. `known(jobId)` says whether a job is recorded already; it is asked only when a quota has no room
        for every job, so that a repeat of an accepted job is never refused. The later new jobs are refused first:
        those beyond their workspace's room, then those beyond the tenant's room this second."""
        lookups: dict[str, bool] = {}

        def is_known(job_id: str) -> bool:
            if job_id not in lookups:
                lookups[job_id] = known(job_id)
            return lookups[job_id]

        refused: dict[int, QuotaExceededError] = {}
        by_workspace: dict[str, list[int]] = {}
        for index, (_, workspace_id) in enumerate(jobs):
            by_workspace.setdefault(workspace_id, []).append(index)
        for workspace_id, indexes in by_workspace.items():
            room = self.queue_room(workspace_id, tenant_id)
            if room < len(indexes):
                new = [index for index in indexes if not is_known(jobs[index][0])]
                refused.update((index, self.queue_full(workspace_id)) for index in new[room:])
        remaining = [index for index in range(len(jobs)) if index not in refused]
        permit = self.take(tenant_id, len(remaining))
        if permit.taken < len(remaining):
            new = [index for index in remaining if not is_known(jobs[index][0])]
            refused.update((index, self.rate_limited(tenant_id)) for index in new[permit.taken :])
        return Admission(refused=refused, permit=permit)

    # ---- jobs per second per tenant ------------------------------------------------------------------------------

    def take(self, tenant_id: str, jobs: int) -> Permit:
        """Count as many of `jobs` new jobs of the tenant in this second as fit (none when the second is full): one
        conditional UpdateItem, again with fewer jobs when the count had less room."""
        second = (self.clock or epoch_ms)() // 1000
        wanted = min(jobs, self.jobs_per_second_per_tenant)
        while wanted > 0:
            try:
                self.client.update_item(
                    TableName=self.table_name,
                    Key=wire({"pk": rate_key(tenant_id, second)}),
                    UpdateExpression="SET tenantId = :tid, #ttl = :ttl ADD jobCount :n",
                    ConditionExpression="attribute_not_exists(jobCount) OR jobCount <= :room",
                    ExpressionAttributeNames={"#ttl": "ttl"},
                    ExpressionAttributeValues=wire(
                        {
                            ":tid": tenant_id,
                            ":ttl": second + RATE_COUNTER_TTL_SECONDS,
                            ":n": wanted,
                            ":room": self.jobs_per_second_per_tenant - wanted,
                        }
                    ),
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
            except ClientError as error:
                if not condition_failed(error):
                    raise
                # The count as it was says how many still fit; without it, try one job fewer.
                count = to_item(error.response.get("Item", {})).get("jobCount")  # type: ignore[arg-type]
                room = wanted - 1 if count is None else self.jobs_per_second_per_tenant - int(count)
                wanted = max(0, min(wanted - 1, room))
                continue
            return Permit(tenant_id, second, wanted)
        return Permit(tenant_id, second, 0)

    def give_back(self, permit: Permit, jobs: int) -> None:
        """Uncount `jobs` of a permit's jobs that were not recorded (repeats, refusals, a failed write). Best effort:
        if this fails, the tenant's count is too high for the rest of that second only."""
        jobs = min(jobs, permit.taken)
        if jobs <= 0:
            return
        try:
            self.client.update_item(
                TableName=self.table_name,
                Key=wire({"pk": rate_key(permit.tenant_id, permit.second)}),
                UpdateExpression="ADD jobCount :minus",
                ConditionExpression="attribute_exists(jobCount)",
                ExpressionAttributeValues=wire({":minus": -jobs}),
            )
        except ClientError:
            return

    def rate_limited(self, tenant_id: str) -> TenantRateLimitError:
        return TenantRateLimitError(tenant_id, self.jobs_per_second_per_tenant)

    # ---- jobs queued per workspace -------------------------------------------------------------------------------

    def queue_room(self, workspace_id: str, tenant_id: str) -> int:
        """How many more jobs of `tenant_id` the workspace may queue: the limit less its pending jobs of that tenant,
        counted up to the limit (a bounded COUNT query of the pending index; eventually consistent).

        The query reads at most `limit` index entries, whoever's they are: a tenant sending to another tenant's busy
        workspace (answered 404 after) makes it read no more than the owner's own request would."""
        limit = self.queued_jobs_per_workspace
        counted = scanned = 0
        start_key: dict[str, Any] | None = None
        while scanned < limit:
            arguments: dict[str, Any] = {
                "TableName": self.table_name,
                "IndexName": PENDING_INDEX,
                "KeyConditionExpression": "pendingWorkspace = :wid",
                "FilterExpression": "tenantId = :tid",
                "ExpressionAttributeValues": wire({":wid": workspace_id, ":tid": tenant_id}),
                "Select": "COUNT",
                "Limit": limit - scanned,
            }
            if start_key is not None:
                arguments["ExclusiveStartKey"] = start_key
            response = self.client.query(**arguments)
            counted += int(response.get("Count", 0))
            scanned += int(response.get("ScannedCount", 0))
            start_key = response.get("LastEvaluatedKey")
            if not start_key:
                break
        return max(0, limit - counted)

    def queue_full(self, workspace_id: str) -> WorkspaceQueueFullError:
        return WorkspaceQueueFullError(workspace_id, self.queued_jobs_per_workspace)


@dataclass(frozen=True)
class Permit:
    """Jobs counted against a tenant's second (`JobQuotas.take`)."""

    tenant_id: str
    second: int
    taken: int


@dataclass(frozen=True)
class Admission:
    """What `JobQuotas.admit` decided: the refused jobs by index, with the quota that refused each, and the count
    taken for the others (give back what is not recorded with `JobQuotas.give_back`)."""

    refused: dict[int, QuotaExceededError] = field(default_factory=dict)
    permit: Permit = field(default_factory=lambda: Permit("", 0, 0))
