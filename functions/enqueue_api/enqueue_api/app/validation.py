"""Powertools' validation errors as the API's 422: `{"message", "errors": [{"field", "message"}], "moreErrors"?}`,
each field named by its camelCase path in the body (`jobs.3.payload.patch`) or by the parameter's name, and the
message worded for the operation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any, Final

from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEventV2
from pydantic import TypeAdapter, ValidationError

from agent_jobs.models import JobId, JobType, WorkspaceId
from agent_jobs.producer import MAX_BATCH_JOBS

from .bodies import JOB_SHAPE, RESUME_SHAPE, json_kind
from .errors import RequestRefused
from .operations import Operation, operation_of
from .params import PAGE_LIMIT_MAX
from .schemas import MAX_FIELD_ERRORS

_JOB_TYPES: Final = frozenset(job_type.value for job_type in JobType)
_ALLOWED_TYPES: Final = ", ".join(job_type.value for job_type in JobType)
_ID_RULE: Final = "letters, digits, '.', '_' and '-', starting with a letter or digit"
ID_FIELDS: Final[dict[str, TypeAdapter[str]]] = {"jobId": TypeAdapter(JobId), "workspaceId": TypeAdapter(WorkspaceId)}
_FIX: Final = "fix the fields listed in 'errors' and send it again"
_BODY_MESSAGES: Final = {
    Operation.SUBMIT_JOB: "the job is invalid ({count}); " + _FIX,
    Operation.SUBMIT_BATCH: "the batch is invalid ({count}); nothing was accepted: fix the fields listed in 'errors' "
    "and send the batch again",
    Operation.REGISTER_WORKSPACE: "the workspace registration is invalid ({count}); " + _FIX,
    Operation.RESUME_WORKSPACE: f"the resume request is invalid; send {RESUME_SHAPE}",
}


def counted(count: int) -> str:
    return f"{count} {'error' if count == 1 else 'errors'}"


def validation_refusal(details: Sequence[Mapping[str, Any]], event: APIGatewayProxyEventV2) -> RequestRefused:
    """The 422 for Powertools' validation `details` of `event`: the path's ids first, then the query, then the body."""
    places: dict[str, list[Mapping[str, Any]]] = {"path": [], "query": [], "body": []}
    for detail in details:
        places.setdefault(str(detail["loc"][0]), []).append(detail)
    if places["path"]:
        errors = [id_error(str(detail["loc"][1]), detail) for detail in places["path"]]
        return RequestRefused(
            HTTPStatus.UNPROCESSABLE_ENTITY, f"the {errors[0]['field']} in the path is invalid", errors
        )
    if places["query"]:
        return _query_refusal(places["query"], event)
    # Only the errors the answer lists are put into words: a body of 200,000 bad fields costs no more than counting.
    document = event.json_body
    described = places["body"][:MAX_FIELD_ERRORS]
    errors = [error for detail in described for error in _body_errors(detail, document)]
    return body_refusal(operation_of(event), errors, len(places["body"]) - len(described))


def body_refusal(operation: Operation, errors: list[dict[str, str]], uncounted: int = 0) -> RequestRefused:
    """The 422 for the field `errors` of the body of `operation` (and `uncounted` more)."""
    message = _BODY_MESSAGES.get(operation, "the request body is invalid ({count}); " + _FIX)
    count = counted(len(errors) + uncounted)
    return RequestRefused(HTTPStatus.UNPROCESSABLE_ENTITY, message.replace("{count}", count), errors, uncounted)


def id_error(field: str, detail: Mapping[str, Any]) -> dict[str, str]:
    """A jobId or workspaceId refused, with the rule it breaks."""
    schema = ID_FIELDS[field].json_schema()
    rule = f"{schema['minLength']} to {schema['maxLength']} characters: {_ID_RULE}"
    return {"field": field, "message": f"{detail['msg']}; a {field} is {rule}"}


def _query_refusal(details: Sequence[Mapping[str, Any]], event: APIGatewayProxyEventV2) -> RequestRefused:
    query = event.query_string_parameters or {}
    errors = []
    for detail in details:
        name = str(detail["loc"][1])
        if name == "state":
            errors.append({"field": name, "message": "only HALTED is supported"})
        elif name == "limit":
            got = str(query.get("limit", ""))[:20]
            errors.append(
                {"field": name, "message": f"limit is a whole number from 1 to {PAGE_LIMIT_MAX}; got '{got}'"}
            )
        else:
            errors.append({"field": name, "message": str(detail["msg"])})
    if errors[0]["field"] == "state":
        message = "list workspaces with GET /workspaces?state=HALTED (halted and resuming workspaces)"
    else:
        message = f"the {errors[0]['field']} query parameter is invalid"
    return RequestRefused(HTTPStatus.UNPROCESSABLE_ENTITY, message, errors)


def _body_errors(detail: Mapping[str, Any], document: Any) -> list[dict[str, str]]:
    """The field errors of one validation detail of the body, a job's type tag left out of the path."""
    loc = _without_type_tags(detail["loc"][1:])
    if detail["type"] in {"union_tag_invalid", "union_tag_not_found"}:
        return _type_errors(detail, loc, document)
    field = ".".join(str(part) for part in loc) or "(body)"
    return [{"field": field, "message": _field_message(field, loc, detail, document)}]


def _type_errors(detail: Mapping[str, Any], loc: Sequence[Any], document: Any) -> list[dict[str, str]]:
    """A job without a known type: validation stops there, so the job's ids are reported in the same answer."""
    prefix = "".join(f"{part}." for part in loc)
    if detail["type"] == "union_tag_not_found":
        message = f"Field required; use one of: {_ALLOWED_TYPES}"
    else:
        message = f"unknown job type '{(detail.get('ctx') or {}).get('tag')}'; use one of: {_ALLOWED_TYPES}"
    type_error = {"field": f"{prefix}type", "message": message}
    return [type_error] + [{**error, "field": prefix + error["field"]} for error in _id_errors(_at(document, loc))]


def _field_message(field: str, loc: Sequence[Any], detail: Mapping[str, Any], document: Any) -> str:
    kind = str(detail["type"])
    if kind == "extra_forbidden":
        if loc[-1] == "tenantId":  # of a job, or of a job of a batch
            return "unknown field; the tenant comes from your credentials, never from the body"
        return "unknown field; remove it"
    if field == "jobs" and kind in {"missing", "list_type", "too_short", "too_long"}:
        return f"send an array of 1 to {MAX_BATCH_JOBS} jobs (got {_batch_got(document)})"
    if len(loc) == 2 and loc[0] == "jobs" and kind == "model_attributes_type":
        return f"a job is a JSON object: {JOB_SHAPE}"
    if loc and loc[-1] in ID_FIELDS and kind.startswith("string_"):
        return id_error(str(loc[-1]), detail)["message"]
    return str(detail["msg"])


def _without_type_tags(loc: Sequence[Any]) -> list[Any]:
    """The discriminated union puts a job's type in the error's path (`apply_patch.payload`), at the top of a job or
    after its place in a batch; the API's field path does not have it."""
    kept: list[Any] = []
    for part in loc:
        if part in _JOB_TYPES and (not kept or isinstance(kept[-1], int)):
            continue
        kept.append(part)
    return kept


def _at(document: Any, loc: Sequence[Any]) -> Any:
    for part in loc:
        try:
            document = document[part]
        except (KeyError, IndexError, TypeError):
            return None
    return document


def _id_errors(job: Any) -> list[dict[str, str]]:
    if not isinstance(job, dict):
        return []
    errors = []
    for field, adapter in ID_FIELDS.items():
        try:
            adapter.validate_python(job.get(field))
        except ValidationError as error:
            detail = error.errors(include_input=False, include_url=False)[0]
            errors.append(id_error(field, {"msg": "Field required" if field not in job else detail["msg"]}))
    return errors


def _batch_got(document: Any) -> str:
    if not isinstance(document, dict) or "jobs" not in document:
        return "missing"
    items = document["jobs"]
    return f"an array of {len(items)} jobs" if isinstance(items, list) else f"a JSON {json_kind(items)}"
