"""Workspace registration: which git branch of which remote a workspace works on, and which tenant owns it.

A registration lives on the workspace item `ws#<workspaceId>`, next to the halt state the guard writes there (state,
haltingJobId, haltReason, haltedAt). Registering never changes the halt state (it only gives a new item the state
ACTIVE, which the guard's claim requires of an existing item), and the guard never touches the registration: each
writes only its own attributes, so neither needs to read the item first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from agent_jobs.core.records import registration_owner
from agent_jobs.keys import workspace_key
from agent_jobs.models import WorkspaceState
from agent_jobs.registration import RegisteredWorkspace, WorkspaceRegistration
from agent_jobs.store.codec import Clock, Item, cancellation, condition_failed, epoch_ms, reason_failed, to_item, wire

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

# Item attribute of each registration field; the optional ones are removed from the item when not given.
_REQUIRED_ATTRIBUTES = {
    "remoteUrl": "remote_url",
    "branch": "branch",
    "baseBranch": "base_branch",
    "testCommands": "test_commands",
}
_OPTIONAL_ATTRIBUTES = {
    "tokenParameter": "token_parameter",
    "githubRepository": "github_repository",
    "githubApiUrl": "github_api_url",
    # A list, stored even when empty: an empty binding admits the enqueue API's messages alone.
    "directProducers": "direct_producers",
}


class WorkspaceOwnedElsewhereError(Exception):
    """The workspace is registered to (or was halted for) another tenant; nothing was written."""

    def __init__(self, workspace_id: str) -> None:
        super().__init__(f"workspace '{workspace_id}' belongs to another tenant; choose another workspaceId")
        self.workspace_id = workspace_id


class WorkspaceQuotaError(Exception):
    """The tenant has made as many first registrations as it may; nothing was written."""

    def __init__(self, tenant_id: str, limit: int) -> None:
        super().__init__(
            f"tenant '{tenant_id}' has registered {limit} workspaces, the most this deployment allows "
            f"(MaxWorkspacesPerTenant = {limit}); update one of your workspaces instead, or ask the operator to raise "
            "the MaxWorkspacesPerTenant parameter"
        )
        self.tenant_id = tenant_id
        self.limit = limit


DEFAULT_MAX_WORKSPACES_PER_TENANT = 100


def tenant_key(tenant_id: str) -> str:
    """The item counting a tenant's registrations."""
    return f"tenant#{tenant_id}"


@dataclass(frozen=True)
class RegisterOutcome:
    """What `register` did: `created` is True for a first registration, False for an update of one."""

    workspace: RegisteredWorkspace
    created: bool


@dataclass(frozen=True)
class WorkspaceStatus:
    """A workspace item as its owner may see it: the registration (None if it only carries halt state) and the
    halt state the guard keeps (ACTIVE unless the item says HALTED or RESUMING)."""

    workspace_id: str
    tenant_id: str | None
    registered: RegisteredWorkspace | None
    state: WorkspaceState
    halting_job_id: str | None
    halt_reason: str | None
    # The operator's last resume decision (decision, haltingJobId, at, by); while RESUMING, the resume under way.
    last_resume: dict[str, Any] | None = None


class WorkspaceRegistry:
    """Registrations of workspaces in the job table (one item per workspace, keyed `ws#<workspaceId>`)."""

    def __init__(
        self,
        client: DynamoDBClient,
        table_name: str,
        clock: Clock = epoch_ms,
        *,
        max_workspaces_per_tenant: int = DEFAULT_MAX_WORKSPACES_PER_TENANT,
    ) -> None:
        self._client = client
        self._table = table_name
        self._clock = clock
        self._max_workspaces = max_workspaces_per_tenant

    def register(self, workspace_id: str, registration: WorkspaceRegistration, tenant_id: str) -> RegisterOutcome:
        """Register (or re-register) a workspace for `tenant_id`.

        A first registration is one transaction: the workspace item's update, conditional on the item having no
        registration and no other owner, and one more on the tenant's counter item (`tenant#<tenantId>`), conditional
        on the count being below MaxWorkspacesPerTenant, so two concurrent first registrations cannot both pass the
        limit (`WorkspaceQuotaError`). When the workspace is already the tenant's (the transaction's old item says
        so), the registration is updated with one conditional UpdateItem and counts nothing. Another tenant's
        workspace (registered, or halted for that tenant's job) raises `WorkspaceOwnedElsewhereError`. Halt state on
        the item is left as it is. `registeredAt` keeps the time of the first registration.
        """
        now = self._clock()
        values: dict[str, Any] = {
            "workspaceId": workspace_id,
            "tenantId": tenant_id,
            **{attribute: getattr(registration, name) for attribute, name in _REQUIRED_ATTRIBUTES.items()},
        }
        removed: list[str] = []
        for attribute, name in _OPTIONAL_ATTRIBUTES.items():
            value = getattr(registration, name)
            if value is None:
                removed.append(attribute)
            else:
                values[attribute] = value
        names = {f"#{attribute}": attribute for attribute in [*values, *removed, "registeredAt", "updatedAt", "state"]}
        expression = (
            "SET "
            + ", ".join(f"#{attribute} = :{attribute}" for attribute in values)
            + ", #registeredAt = if_not_exists(#registeredAt, :now), #updatedAt = :now"
            # The guard's claim treats a workspace item without state ACTIVE as halted: a new item starts ACTIVE,
            # and an existing state (HALTED, RESUMING) is left as it is.
            + ", #state = if_not_exists(#state, :active)"
        )
        if removed:
            expression += " REMOVE " + ", ".join(f"#{attribute}" for attribute in removed)
        names["#remoteUrl"] = "remoteUrl"
        wire_values = wire(
            {**{f":{k}": v for k, v in values.items()}, ":now": now, ":active": str(WorkspaceState.ACTIVE)}
        )
        key = wire({"pk": workspace_key(workspace_id)})
        try:
            self._client.transact_write_items(
                TransactItems=[
                    {
                        "Update": {
                            "TableName": self._table,
                            "Key": key,
                            "UpdateExpression": expression,
                            "ConditionExpression": (
                                "attribute_not_exists(#remoteUrl) AND "
                                "(attribute_not_exists(#tenantId) OR #tenantId = :tenantId)"
                            ),
                            "ExpressionAttributeNames": names,
                            "ExpressionAttributeValues": wire_values,
                            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                        }
                    },
                    {
                        "Update": {
                            "TableName": self._table,
                            "Key": wire({"pk": tenant_key(tenant_id)}),
                            "UpdateExpression": (
                                "SET tenantId = :tid, workspaceCount = if_not_exists(workspaceCount, :zero) + :one"
                            ),
                            "ConditionExpression": "attribute_not_exists(workspaceCount) OR workspaceCount < :limit",
                            "ExpressionAttributeValues": wire(
                                {":tid": tenant_id, ":zero": 0, ":one": 1, ":limit": self._max_workspaces}
                            ),
                        }
                    },
                ]
            )
        except ClientError as error:
            reasons = cancellation(error)
            if reasons is None or not any(reason_failed(reason) for reason in reasons):
                raise
            if not reason_failed(reasons[0]):
                raise WorkspaceQuotaError(tenant_id, self._max_workspaces) from None
            owner = to_item(reasons[0].get("Item", {})).get("tenantId")
            if owner != tenant_id:
                raise WorkspaceOwnedElsewhereError(workspace_id) from None
        else:
            workspace = RegisteredWorkspace(workspace_id, tenant_id, registration, now)
            return RegisterOutcome(workspace=workspace, created=True)
        # The tenant's own registration: an update, which the quota does not count.
        try:
            response = self._client.update_item(
                TableName=self._table,
                Key=key,
                UpdateExpression=expression,
                ConditionExpression="attribute_exists(#remoteUrl) AND #tenantId = :tenantId",
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=wire_values,
                ReturnValues="ALL_OLD",
            )
        except ClientError as error:
            if condition_failed(error):  # registrations are never removed: only another owner fails this
                raise WorkspaceOwnedElsewhereError(workspace_id) from None
            raise
        old = to_item(response.get("Attributes", {}))
        workspace = RegisteredWorkspace(workspace_id, tenant_id, registration, int(old.get("registeredAt", now)))
        return RegisterOutcome(workspace=workspace, created=False)

    def get(self, workspace_id: str) -> RegisteredWorkspace | None:
        """The registration of a workspace, or None if it has none (no item, or an item with only halt state)."""
        status = self.status(workspace_id)
        return status.registered if status else None

    def status(self, workspace_id: str) -> WorkspaceStatus | None:
        """The workspace item's registration and halt state (one consistent GetItem); None if there is no item."""
        response = self._client.get_item(
            TableName=self._table, Key=wire({"pk": workspace_key(workspace_id)}), ConsistentRead=True
        )
        raw = response.get("Item")
        if not raw:
            return None
        return workspace_status(workspace_id, to_item(raw))


def workspace_status(workspace_id: str, item: Item) -> WorkspaceStatus:
    """A workspace item read as registration plus halt state."""
    tenant_id = item.get("tenantId")
    registered = None
    if registration_owner(item) is not None:
        registration = WorkspaceRegistration.model_validate(
            {
                attribute: item[attribute]
                for attribute in [*_REQUIRED_ATTRIBUTES, *_OPTIONAL_ATTRIBUTES]
                if attribute in item
            }
        )
        registered = RegisteredWorkspace(workspace_id, str(tenant_id), registration, int(item.get("registeredAt", 0)))
    state = item.get("state")
    return WorkspaceStatus(
        workspace_id=workspace_id,
        tenant_id=str(tenant_id) if tenant_id else None,
        registered=registered,
        state=WorkspaceState(state) if state in set(WorkspaceState) else WorkspaceState.ACTIVE,
        halting_job_id=item.get("haltingJobId"),
        halt_reason=item.get("haltReason"),
        last_resume=_public_last_resume(item.get("lastResume")),
    )


def _public_last_resume(value: Any) -> dict[str, Any] | None:
    """What an owner may see of the last resume: the decision, the job it decided, when and by whom."""
    if not isinstance(value, dict) or not value.get("decision") or not value.get("haltingJobId"):
        return None
    return {
        "decision": str(value["decision"]),
        "haltingJobId": str(value["haltingJobId"]),
        "at": int(value["at"]) if value.get("at") is not None else None,
        "by": str(value["by"]) if value.get("by") else None,
    }
