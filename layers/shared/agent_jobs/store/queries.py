"""Reads: a job, a workspace, a workspace's jobs and its last applied one, the halted workspaces, and the jobs
missing ahead of a job."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from agent_jobs.core.records import WorkspaceRecord
from agent_jobs.core.transitions import UNSETTLED
from agent_jobs.keys import job_key, parked_sequence, workspace_key
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
from agent_jobs.store.results import HaltedPage, JobPage


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

    def missing_predecessors(
        self, workspace_id: str, *, tenant_id: str, job_id: str, sequence_number: str | None
    ) -> list[Item]:
        """The jobs of `tenant_id` that the workspace accepted ahead of this one in queue order (a lower
        SequenceNumber) and that are still QUEUED, FAILED or IN_FLIGHT, or were PARKED by a halting park (a redrive
        from the DLQ) and not yet run: earliest first, at most MAX_MISSING_LISTED.

        The queue hands out a job only once every earlier message of its group is gone, and the worker deletes a
        message only once its job is settled; so such a job left the queue without the worker settling it (the queue
        dead-lettered it, for example after every delivery died before the handler ran). The job must not run: it
        would take effect before them. Empty for a job without a numeric SequenceNumber (nothing to order by). A job
        the redrive parks stays listed: if the redrive lands between this job's claim (the workspace still ACTIVE)
        and this check, it is the only trace left that something ahead never took effect.

        Cost: one Query of the sparse pending index (usually empty: half a read unit); entries it shows are checked
        with a strongly consistent read, because the index lags behind jobs that settled a moment ago.
        """
        if not sequence_number or not sequence_number.isdigit():
            return []
        response = self._client.query(
            TableName=self._table,
            IndexName=PENDING_INDEX,
            KeyConditionExpression="pendingWorkspace = :wid AND queueSeq < :qseq",
            ExpressionAttributeValues=wire({":wid": workspace_id, ":qseq": parked_sequence(sequence_number, 0)}),
            Limit=MAX_MISSING_LISTED,
        )
        keys = [
            {"pk": job_key(tenant_id, str(entry["jobId"]))}
            for entry in map(to_item, response.get("Items", []))
            if entry.get("jobId") and entry.get("jobId") != job_id and entry.get("tenantId") in (None, tenant_id)
        ]
        missing = [
            item
            for item in self._get_consistently(keys)
            if item.get("pendingWorkspace") == workspace_id
            and item.get("tenantId") == tenant_id
            and item.get("status") in UNSETTLED | {JobStatus.PARKED}
        ]
        return sorted(missing, key=lambda item: str(item.get("queueSeq", "")))

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
