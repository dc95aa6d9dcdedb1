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

from agent_jobs.guard import Clock, Item, _condition_failed, _wire, epoch_ms, to_item
from agent_jobs.keys import workspace_key
from agent_jobs.models import RegisteredWorkspace, WorkspaceRegistration, WorkspaceState

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
}


class WorkspaceOwnedElsewhereError(Exception):
    """The workspace is registered to (or was halted for) another tenant; nothing was written."""

    def __init__(self, workspace_id: str) -> None:
        super().__init__(f"workspace '{workspace_id}' belongs to another tenant; choose another workspaceId")
        self.workspace_id = workspace_id


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

    def __init__(self, client: DynamoDBClient, table_name: str, clock: Clock = epoch_ms) -> None:
        self._client = client
        self._table = table_name
        self._clock = clock

    def register(self, workspace_id: str, registration: WorkspaceRegistration, tenant_id: str) -> RegisterOutcome:
        """Register (or re-register) a workspace for `tenant_id` with one conditional UpdateItem.

        The condition lets a tenant register a workspace nobody owns yet (including one the guard halted before it
        was registered, for this tenant's job) or update its own; another tenant's raises
        `WorkspaceOwnedElsewhereError`. Halt state on the item is left as it is. `registeredAt` keeps the time of
        the first registration.
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
        try:
            response = self._client.update_item(
                TableName=self._table,
                Key=_wire({"pk": workspace_key(workspace_id)}),
                UpdateExpression=expression,
                ConditionExpression="attribute_not_exists(#tenantId) OR #tenantId = :tenantId",
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=_wire(
                    {**{f":{k}": v for k, v in values.items()}, ":now": now, ":active": str(WorkspaceState.ACTIVE)}
                ),
                ReturnValues="ALL_OLD",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as error:
            if _condition_failed(error):
                raise WorkspaceOwnedElsewhereError(workspace_id) from None
            raise
        old = to_item(response.get("Attributes", {}))
        registered_at = int(old.get("registeredAt", now)) if "remoteUrl" in old else now
        workspace = RegisteredWorkspace(workspace_id, tenant_id, registration, registered_at)
        return RegisterOutcome(workspace=workspace, created="remoteUrl" not in old)

    def get(self, workspace_id: str) -> RegisteredWorkspace | None:
        """The registration of a workspace, or None if it has none (no item, or an item with only halt state)."""
        status = self.status(workspace_id)
        return status.registered if status else None

    def status(self, workspace_id: str) -> WorkspaceStatus | None:
        """The workspace item's registration and halt state (one consistent GetItem); None if there is no item."""
        response = self._client.get_item(
            TableName=self._table, Key=_wire({"pk": workspace_key(workspace_id)}), ConsistentRead=True
        )
        raw = response.get("Item")
        if not raw:
            return None
        return workspace_status(workspace_id, to_item(raw))


def workspace_status(workspace_id: str, item: Item) -> WorkspaceStatus:
    """A workspace item read as registration plus halt state."""
    tenant_id = item.get("tenantId")
    registered = None
    if "remoteUrl" in item and tenant_id:
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
