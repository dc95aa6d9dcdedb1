"""Reads: a job, a workspace, a workspace's jobs and its last applied one, the halted workspaces, and the jobs
missing ahead of a job."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from agent_jobs.core.records import WorkspaceRecord
from agent_jobs.core.transitions import UNSETTLED
from agent_jobs.keys import is_unplaced, job_key, parked_sequence, unplaced_since, workspace_key
from agent_jobs.models import JobStatus
from agent_jobs.store.base import StoreBase
from agent_jobs.store.codec import Item, to_item, wire
from agent_jobs.store.conditions import (
    HALTED_INDEX,
    MAX_MISSING_LISTED,
    PENDING_INDEX,
    RUNNING_INDEX,
    WORKSPACE_INDEX,
)
from agent_jobs.store.results import HaltedPage, JobPage, JobsAhead

# How far apart two producers' clocks may be: a job recorded more than this after another job's send was confirmed (by
# their own clocks) was sent after it. Lambda's clocks are kept within a millisecond or so of each other.
PRODUCER_CLOCK_MARGIN_MS = 1_000


class QueryStore(StoreBase):
    """Reads of job and workspace records."""

    def get_job(self, tenant_id: str, job_id: str) -> Item | None:
        """The record of `tenant_id`'s job `job_id`, read consistently; None if that tenant has no such job."""
        key = wire({"pk": job_key(tenant_id, job_id)})
        response = self._client.get_item(TableName=self._table, Key=key, ConsistentRead=True)
        raw = response.get("Item")
        return to_item(raw) if raw else None

    def get_workspace(self, workspace_id: str) -> Item | None:
        response = self._client.get_item(
            TableName=self._table, Key=wire({"pk": workspace_key(workspace_id)}), ConsistentRead=True
        )
        raw = response.get("Item")
        return to_item(raw) if raw else None

    def workspace_jobs(
        self,
        workspace_id: str,
        tenant_id: str,
        *,
        limit: int,
        start_key: Mapping[str, Any] | None = None,
        attributes: Sequence[str] | None = None,
        max_queries: int = 10,
    ) -> JobPage:
        """A page of the workspace's job records of `tenant_id`, oldest accepted first (the GSI `byWorkspace`).

        At most `limit` items; `next_key` (the index's LastEvaluatedKey, plain values: pk, workspaceId, acceptedAt)
        continues after the last item read, None at the end. Records of other tenants that name this workspace are
        read and left out, so a page can hold fewer than `limit` items while `next_key` is not None; the read stops
        after `max_queries` Query calls to keep one page's cost bounded. `attributes` limits the attributes returned.
        Reads of a GSI are eventually consistent: a job accepted a moment ago can be missing for a moment.
        """
        items: list[Item] = []
        key: Mapping[str, Any] | None = start_key
        for _ in range(max_queries):
            page = self._query_workspace(
                workspace_id,
                tenant_id,
                limit=limit - len(items),
                start_key=key,
                attributes=attributes,
                newest_first=False,
            )
            items.extend(page.items)
            key = page.next_key
            if key is None or len(items) >= limit:
                break
        return JobPage(items=items, next_key=dict(key) if key is not None else None)

    def last_succeeded_job(self, workspace_id: str, tenant_id: str, *, max_items: int = 300) -> Item | None:
        """The workspace's most recently applied job of `tenant_id`: the SUCCEEDED job with the highest SequenceNumber
        among the newest accepted records, or None if none of the newest `max_items` records SUCCEEDED.

        Derived at read time so that the worker's happy path writes nothing more than the job's own item. Cost: a
        Query of the GSI `byWorkspace`, newest first, filtered on SUCCEEDED, in pages of 100 records until a page
        holds a SUCCEEDED job: usually one call reading the newest records of the workspace, at most
        ceil(max_items / 100) calls (each reads up to 100 records or 1 MB, billed by their size, eventually
        consistent). Jobs of one workspace take effect in SequenceNumber order, so within the page that holds
        SUCCEEDED jobs the highest SequenceNumber is the last applied even when acceptedAt ties or two producers'
        clocks disagree.
        """
        key: Mapping[str, Any] | None = None
        evaluated = 0
        while evaluated < max_items:
            page_size = min(100, max_items - evaluated)
            page = self._query_workspace(
                workspace_id,
                tenant_id,
                limit=page_size,
                start_key=key,
                attributes=("jobId", "sequenceNumber", "finishedAt", "status"),
                newest_first=True,
                status=str(JobStatus.SUCCEEDED),
            )
            if page.items:
                return max(page.items, key=self._applied_order)
            evaluated += page_size
            key = page.next_key
            if key is None:
                break
        return None

    @staticmethod
    def _applied_order(item: Mapping[str, Any]) -> tuple[int, int]:
        """Jobs of one workspace take effect in SequenceNumber order (a decimal string); finishedAt breaks the rest."""
        sequence = str(item.get("sequenceNumber") or "")
        return (int(sequence) if sequence.isdigit() else -1, int(item.get("finishedAt") or 0))

    def _query_workspace(
        self,
        workspace_id: str,
        tenant_id: str,
        *,
        limit: int,
        start_key: Mapping[str, Any] | None,
        attributes: Sequence[str] | None,
        newest_first: bool,
        status: str | None = None,
    ) -> JobPage:
        names = {"#tenant": "tenantId"}
        values: dict[str, Any] = {":wid": workspace_id, ":tid": tenant_id}
        condition = "#tenant = :tid"
        if status is not None:
            names["#status"] = "status"
            values[":status"] = status
            condition += " AND #status = :status"
        request: dict[str, Any] = {
            "TableName": self._table,
            "IndexName": WORKSPACE_INDEX,
            "KeyConditionExpression": "workspaceId = :wid",
            "FilterExpression": condition,
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": wire(values),
            "ScanIndexForward": not newest_first,
            "Limit": max(1, limit),
        }
        if attributes:
            # Every name through a placeholder: status, type, result and error are DynamoDB reserved words.
            projected = {f"#a{index}": name for index, name in enumerate(attributes)}
            names.update(projected)
            request["ProjectionExpression"] = ", ".join(projected)
        if start_key is not None:
            request["ExclusiveStartKey"] = wire(start_key)
        response = self._client.query(**request)
        last = response.get("LastEvaluatedKey")
        return JobPage(
            items=[to_item(raw) for raw in response.get("Items", [])], next_key=to_item(last) if last else None
        )

    def list_halted(self, tenant_id: str, *, limit: int = 50, start_key: Mapping[str, Any] | None = None) -> HaltedPage:
        """A page of the tenant's HALTED and RESUMING workspaces (the halted index, ordered by workspaceId)."""
        kwargs: dict[str, Any] = {
            "TableName": self._table,
            "IndexName": HALTED_INDEX,
            "KeyConditionExpression": "haltedTenant = :tid",
            "ExpressionAttributeValues": wire({":tid": tenant_id}),
            "Limit": limit,
        }
        if start_key:
            kwargs["ExclusiveStartKey"] = wire(start_key)
        response = self._client.query(**kwargs)
        items = [to_item(raw) for raw in response.get("Items", [])]
        # The index may lag a resume that just finished: show only what it says is still halted or resuming.
        shown = [item for item in items if WorkspaceRecord.from_item(item).halted]
        last = response.get("LastEvaluatedKey")
        return HaltedPage(shown, to_item(last) if last else None)

    def jobs_ahead(
        self,
        workspace_id: str,
        *,
        tenant_id: str,
        job_id: str,
        sequence_number: str | None,
        sent_at: int | None,
        unplaced_grace_ms: int = 0,
    ) -> JobsAhead:
        """The jobs of `tenant_id` the workspace accepted ahead of this one (placed at `sequence_number`) that are
        still QUEUED, FAILED or IN_FLIGHT, or were PARKED by a halting park (a redrive from the DLQ) and not yet run.

        `missing`, earliest first, at most MAX_MISSING_LISTED: placed ahead of it in queue order (a lower
        SequenceNumber). The queue hands out a job only once every earlier message of its group is gone, and the
        worker deletes a message only once its job is settled; so such a job left the queue without the worker
        settling it (the queue dead-lettered it, for example after every delivery died before the handler ran). The
        job must not run: it would take effect before them. A job the redrive parks stays listed: if the redrive
        lands between this job's claim (the workspace still ACTIVE) and this check, it is the only trace left that
        something ahead never took effect.

        Unplaced jobs (recorded, their send never confirmed, no copy of them seen by a worker) may have a message
        ahead of this one that the queue let go, or none yet, or one behind. One recorded after this job's own send
        was confirmed (`sent_at`, with PRODUCER_CLOCK_MARGIN_MS for the producers' clocks) was sent after it, so it
        is behind and not listed. Any other is `unplaced` while it was accepted less than `unplaced_grace_ms` ago (its
        producer may still be confirming it: wait for it), else `missing`: nothing can tell where its message was.

        Empty for a job without a numeric SequenceNumber (nothing to order by). Cost: one Query of the sparse pending
        index (usually empty: half a read unit); the entries it shows are read again with strongly consistent reads,
        because the index lags behind jobs that settled or were placed a moment ago.
        """
        if not sequence_number or not sequence_number.isdigit():
            return JobsAhead([], [])
        own_place = parked_sequence(sequence_number, 0)
        keys = [
            {"pk": job_key(tenant_id, str(entry["jobId"]))}
            for entry in self._pending_before(workspace_id, own_place)
            if entry.get("jobId")
            and entry.get("jobId") != job_id
            and entry.get("tenantId") in (None, tenant_id)
            and not _sent_after(entry.get("queueSeq"), sent_at)
        ]
        now = self._clock()
        missing: list[Item] = []
        unplaced: list[Item] = []
        for item in self._get_consistently(keys):
            queue_seq = item.get("queueSeq")
            if (
                item.get("pendingWorkspace") != workspace_id
                or item.get("tenantId") != tenant_id
                or item.get("status") not in UNSETTLED | {JobStatus.PARKED}
            ):
                continue
            if not is_unplaced(queue_seq):
                if str(queue_seq or "") < own_place:  # placed meanwhile, maybe behind this one
                    missing.append(item)
            elif not _sent_after(queue_seq, sent_at):
                young = now - unplaced_since(str(queue_seq)) < unplaced_grace_ms
                (unplaced if young else missing).append(item)
        by_place = lambda item: str(item.get("queueSeq", ""))  # noqa: E731
        return JobsAhead(sorted(missing, key=by_place), sorted(unplaced, key=by_place))

    def _pending_before(self, workspace_id: str, own_place: str) -> list[Item]:
        """The pending index's entries of the workspace before `own_place` (unplaced ones first), at most
        MAX_MISSING_LISTED and a few pages."""
        entries: list[Item] = []
        query: dict[str, Any] = {
            "TableName": self._table,
            "IndexName": PENDING_INDEX,
            "KeyConditionExpression": "pendingWorkspace = :wid AND queueSeq < :qseq",
            "ExpressionAttributeValues": wire({":wid": workspace_id, ":qseq": own_place}),
            "Limit": MAX_MISSING_LISTED,
        }
        for _ in range(4):
            response = self._client.query(**query)
            entries.extend(to_item(raw) for raw in response.get("Items", []))
            if "LastEvaluatedKey" not in response or len(entries) >= MAX_MISSING_LISTED:
                break
            query["ExclusiveStartKey"] = response["LastEvaluatedKey"]
        return entries

    def running_invocations(self, tenant_id: str, *, limit: int) -> set[str]:
        """The invocations that run jobs of `tenant_id` now (their request ids), as the sparse running index shows
        them: jobs claimed from the queue whose lease has not expired and that nothing settled or released yet. At
        most `limit` (the caller's share: it needs to know only whether the tenant reached it).

        Eventually consistent, so a claim of a moment ago may be missing (a tenant can go over its share by the
        claims that land at once) and a job settled a moment ago may still count. A crashed invocation's jobs drop out
        when their leases expire. Cost: one Query of a few small entries, usually half a read unit; no write.
        """
        found: set[str] = set()
        query: dict[str, Any] = {
            "TableName": self._table,
            "IndexName": RUNNING_INDEX,
            "KeyConditionExpression": "runningTenant = :tid AND leaseExpiresAt > :now",
            "ProjectionExpression": "runningInvocation",
            "ExpressionAttributeValues": wire({":tid": tenant_id, ":now": self._clock()}),
        }
        while len(found) < limit:
            response = self._client.query(**query)
            items = map(to_item, response.get("Items", []))
            found.update(str(item["runningInvocation"]) for item in items if item.get("runningInvocation"))
            if "LastEvaluatedKey" not in response:
                break
            query["ExclusiveStartKey"] = response["LastEvaluatedKey"]
        return found

    def _get_consistently(self, keys: list[Item]) -> list[Item]:
        """The items of `keys` that exist, read with strongly consistent reads (BatchGetItem, 100 keys a call, its
        unprocessed keys read again)."""
        items: list[Item] = []
        for start in range(0, len(keys), 100):
            request: dict[str, Any] = {
                self._table: {"Keys": [wire(key) for key in keys[start : start + 100]], "ConsistentRead": True}
            }
            for _ in range(10):
                response = self._client.batch_get_item(RequestItems=request)
                items.extend(to_item(raw) for raw in response.get("Responses", {}).get(self._table, []))
                request = dict(response.get("UnprocessedKeys") or {})
                if not request:
                    break
                time.sleep(0.05)
            else:
                raise RuntimeError("keys left unprocessed after 10 BatchGetItem calls")
        return items


def _sent_after(queue_seq: object, sent_at: int | None) -> bool:
    """Whether an unplaced pending entry was recorded after a send confirmed at `sent_at`: its own send came later."""
    if sent_at is None or not is_unplaced(queue_seq):
        return False
    return unplaced_since(str(queue_seq)) > sent_at + PRODUCER_CLOCK_MARGIN_MS
