"""The routes' typed parameters, validated by Powertools before a route runs: the ids in the path, a listing's page
limit and token, the state the halted list is of."""

from typing import Annotated, Any, Final, Literal
from urllib.parse import unquote

from aws_lambda_powertools.event_handler.openapi.params import Path, Query
from pydantic import BeforeValidator, Field

from agent_jobs.models import JobId, WorkspaceId

PAGE_LIMIT_MAX: Final = 100
TIMELINE_LIMIT_DEFAULT: Final = 25
HALTED_LIST_DEFAULT: Final = 50


def _percent_decoded(value: Any) -> Any:
    """A path segment as the client meant it: the HTTP API routes on the raw (percent-encoded) path."""
    return unquote(value) if isinstance(value, str) else value


def _whole_number(value: Any) -> Any:
    """Up to three ASCII digits: `int` would also read '0001', ' 12', Unicode digits and very long numbers."""
    if isinstance(value, str) and not (value.isascii() and value.isdigit() and len(value) <= 3):
        raise ValueError(f"limit is a whole number from 1 to {PAGE_LIMIT_MAX}")
    return value


def _page_limit(items: str, default: int) -> Any:
    return Annotated[
        int,
        Field(ge=1, le=PAGE_LIMIT_MAX),
        BeforeValidator(_whole_number),
        Query(description=f"{items} per page, 1 to {PAGE_LIMIT_MAX} (default {default})."),
    ]


JobIdInPath = Annotated[JobId, BeforeValidator(_percent_decoded), Path(alias="jobId", description="The job's jobId.")]
WorkspaceIdInPath = Annotated[
    WorkspaceId, BeforeValidator(_percent_decoded), Path(alias="workspaceId", description="The workspace's id.")
]
TimelineLimit = _page_limit("Jobs", TIMELINE_LIMIT_DEFAULT)
HaltedListLimit = _page_limit("Workspaces", HALTED_LIST_DEFAULT)
PageToken = Annotated[
    str | None,
    Query(
        alias="nextToken",
        description="The previous page's nextToken (opaque); leave it out for the first page.",
    ),
]
HaltedState = Annotated[
    Literal["HALTED"],
    Query(description="HALTED: the workspaces halted or resuming (the only state listed)."),
]
