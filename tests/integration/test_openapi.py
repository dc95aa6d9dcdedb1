"""The OpenAPI document (`GET /openapi.json`): generated from the registered routes, public, and complete: every route
of the template's HTTP API with its methods, its request body and every status it answers."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openapi_spec_validator import validate
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from agent_jobs.models import ApplyPatchPayload, Author, OpenPrPayload, ResumeRequest, RunTestsJob, RunTestsPayload
from agent_jobs.registration import WorkspaceRegistration
from agent_jobs.workspaces import WorkspaceRegistry
from agent_jobs_local.api_server import http_api_routes
from agent_jobs_local.event_source import LambdaContextStub
from agent_jobs_local.template import TemplateModel, load_template
from enqueue_api import app
from enqueue_api.app.openapi import describe_request_defaults, document_text
from tests.conftest import REPO, Stack
from tests.documentation import doc_text
from tests.integration.test_enqueue_api import Api, job_body, load_event, post_event, use_environment

POWERTOOLS_DEFAULT_DESCRIPTION = "Successful Response"
DEFAULT_NOTE = re.compile(r"Optional: when left out, the API uses `(.*)`\.$")
# The request bodies' models, by their schema's name in the document.
REQUEST_MODELS: dict[str, type[BaseModel]] = {
    "ApplyPatchPayload": ApplyPatchPayload,
    "Author": Author,
    "OpenPrPayload": OpenPrPayload,
    "RunTestsJob": RunTestsJob,
    "RunTestsPayload": RunTestsPayload,
    "WorkspaceRegistration": WorkspaceRegistration,
    "ResumeRequest": ResumeRequest,
}


def openapi_event(claims: dict[str, str] | None = None) -> dict[str, Any]:
    event = load_event("http_get_job.json")
    event["requestContext"]["requestId"] = uuid.uuid4().hex
    event["routeKey"] = event["requestContext"]["routeKey"] = "GET /openapi.json"
    event["rawPath"] = event["requestContext"]["http"]["path"] = "/openapi.json"
    event.pop("pathParameters")
    if claims is not None:
        event["requestContext"]["authorizer"] = {"jwt": {"claims": claims, "scopes": None}}
    return event


def served_document(event: dict[str, Any]) -> tuple[int, Any]:
    response = app.lambda_handler(event, LambdaContextStub(timeout_seconds=10, function_name="EnqueueApiFunction"))
    return response["statusCode"], json.loads(response["body"])


@pytest.fixture
def document(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """The document as the API serves it to a caller without any token, open access switched off."""
    monkeypatch.setenv("TABLE_NAME", "unused")
    monkeypatch.setenv("QUEUE_URL", "unused")
    monkeypatch.setenv("OPEN_ACCESS_TENANT", "")
    monkeypatch.setattr(app.metrics, "namespace", "AgentJobsTest")
    app.reset_services()
    status, body = served_document(openapi_event())
    assert status == 200
    yield body
    app.reset_services()


def facts(schema: dict[str, Any]) -> dict[str, Any]:
    """What a parameter's schema says of its values (its title and description left out)."""
    return {key: value for key, value in schema.items() if key not in {"title", "description"}}


def operations(document: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method.upper(), path): operation
        for path, path_item in document["paths"].items()
        for method, operation in path_item.items()
    }


def test_openapi_lists_every_route_of_the_templates_api_with_its_methods(document: dict[str, Any]) -> None:
    model = TemplateModel(load_template())
    template_routes = {(route.method, route.path) for route in http_api_routes(model)}

    assert set(operations(document)) == template_routes


def test_openapi_documents_every_operations_answers(document: dict[str, Any]) -> None:
    # A route registered without `responses` gets Powertools' default "Successful Response" with an empty schema.
    for key, operation in operations(document).items():
        responses = operation["responses"]
        assert responses, key
        for status, response in responses.items():
            assert response["description"] != POWERTOOLS_DEFAULT_DESCRIPTION, (key, status)
            assert response["content"]["application/json"]["schema"], (key, status)
        if key != ("GET", "/openapi.json"):
            assert any(status.startswith("4") for status in responses), key


def test_openapi_status_codes_are_those_each_route_answers(document: dict[str, Any]) -> None:
    statuses = {key: set(operation["responses"]) for key, operation in operations(document).items()}

    assert statuses[("POST", "/jobs")] == {"202", "400", "401", "403", "404", "409", "413", "415", "422", "429", "503"}
    assert statuses[("POST", "/jobs:batch")] == {"200", "400", "401", "403", "413", "415", "422", "503"}
    assert statuses[("GET", "/jobs/{jobId}")] == {"200", "401", "403", "404", "422", "503"}
    assert statuses[("PUT", "/workspaces/{workspaceId}")] == {
        *("200", "201", "400", "401", "403", "413", "415", "422", "429", "503")
    }
    assert statuses[("GET", "/workspaces/{workspaceId}")] == {"200", "401", "403", "404", "422", "503"}
    assert statuses[("GET", "/workspaces/{workspaceId}/jobs")] == {"200", "400", "401", "403", "404", "422", "503"}
    assert statuses[("POST", "/workspaces/{workspaceId}/resume")] == {
        *("202", "400", "401", "403", "404", "409", "413", "415", "422", "503")
    }
    assert statuses[("GET", "/workspaces")] == {"200", "400", "401", "403", "422", "503"}
    # Powertools declares its validation's 422 on every route of a resolver that validates, this one included.
    assert statuses[("GET", "/openapi.json")] == {"200", "422"}


def test_openapi_is_a_valid_openapi_31_document(document: dict[str, Any]) -> None:
    validate(document)
    assert document["openapi"].startswith("3.1")


def test_openapi_is_public_and_everything_else_needs_a_bearer_jwt(document: dict[str, Any]) -> None:
    assert document["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "JWT",
        "description": document["components"]["securitySchemes"]["bearerAuth"]["description"],
    }
    assert document["security"] == [{"bearerAuth": []}]
    for key, operation in operations(document).items():
        assert ("security" in operation) == (key == ("GET", "/openapi.json")), key
    assert operations(document)[("GET", "/openapi.json")]["security"] == []


def test_openapi_is_served_the_same_with_or_without_a_token(document: dict[str, Any]) -> None:
    status, body = served_document(openapi_event(claims={"tenant_id": "tenant-a"}))

    assert status == 200
    assert body == document


def test_openapi_describes_the_job_request_union(document: dict[str, Any]) -> None:
    body = operations(document)[("POST", "/jobs")]["requestBody"]
    schema = body["content"]["application/json"]["schema"]
    components = document["components"]["schemas"]

    assert body["required"] is True
    assert schema["discriminator"]["propertyName"] == "type"
    assert schema["discriminator"]["mapping"] == {
        "apply_patch": "#/components/schemas/ApplyPatchJob",
        "run_tests": "#/components/schemas/RunTestsJob",
        "open_pr": "#/components/schemas/OpenPrJob",
    }
    assert [ref["$ref"] for ref in schema["oneOf"]] == [
        "#/components/schemas/ApplyPatchJob",
        "#/components/schemas/RunTestsJob",
        "#/components/schemas/OpenPrJob",
    ]
    apply_patch = components["ApplyPatchJob"]
    assert set(apply_patch["required"]) == {"jobId", "workspaceId", "type", "payload"}
    assert apply_patch["additionalProperties"] is False  # tenantId in a body is refused
    assert components["ApplyPatchPayload"]["properties"]["commitMessage"]["minLength"] == 1


def test_openapi_describes_the_workspace_registration_and_path_ids(document: dict[str, Any]) -> None:
    operation = operations(document)[("PUT", "/workspaces/{workspaceId}")]
    registration = document["components"]["schemas"]["WorkspaceRegistration"]

    assert operation["requestBody"]["content"]["application/json"]["schema"]["$ref"] == (
        "#/components/schemas/WorkspaceRegistration"
    )
    assert set(registration["required"]) == {"remoteUrl", "branch"}
    (parameter,) = operation["parameters"]
    assert (parameter["name"], parameter["in"], parameter["required"]) == ("workspaceId", "path", True)
    assert parameter["schema"]["pattern"] == "^[A-Za-z0-9][A-Za-z0-9._-]*$"
    assert parameter["schema"]["maxLength"] == 100


def test_openapi_describes_the_timeline_query(document: dict[str, Any]) -> None:
    operation = operations(document)[("GET", "/workspaces/{workspaceId}/jobs")]
    query = {parameter["name"]: parameter for parameter in operation["parameters"] if parameter["in"] == "query"}
    timeline = document["components"]["schemas"]["JobTimelineView"]

    assert facts(query["limit"]["schema"]) == {"type": "integer", "minimum": 1, "maximum": 100, "default": 25}
    assert {"type": "string"} in query["nextToken"]["schema"]["anyOf"]
    assert set(timeline["required"]) == {"jobs", "nextToken"}
    assert set(document["components"]["schemas"]["WorkspaceStatusView"]["properties"]) >= {"lastAppliedJobId"}


def test_openapi_describes_the_resume_decision_and_its_answers(document: dict[str, Any]) -> None:
    operation = operations(document)[("POST", "/workspaces/{workspaceId}/resume")]
    schemas = document["components"]["schemas"]
    resume = schemas["ResumeRequest"]

    assert operation["requestBody"]["required"] is True
    assert operation["requestBody"]["content"]["application/json"]["schema"]["$ref"] == (
        "#/components/schemas/ResumeRequest"
    )
    assert set(resume["required"]) == {"decision", "haltingJobId"}
    assert resume["additionalProperties"] is False
    assert schemas["ResumeDecision"]["enum"] == ["retry", "skip"]
    (parameter,) = operation["parameters"]
    assert (parameter["name"], parameter["in"], parameter["required"]) == ("workspaceId", "path", True)
    responses = operation["responses"]
    assert responses["202"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/WorkspaceStatusView"
    }
    assert responses["409"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ResumeConflictView"
    }
    assert set(schemas["ResumeConflictView"]["required"]) == {"message", "workspace"}
    assert schemas["ResumeConflictView"]["properties"]["workspace"] == {
        "$ref": "#/components/schemas/WorkspaceStatusView",
        "description": schemas["ResumeConflictView"]["properties"]["workspace"]["description"],
    }


def test_openapi_describes_the_halted_list_query(document: dict[str, Any]) -> None:
    operation = operations(document)[("GET", "/workspaces")]
    query = {parameter["name"]: parameter for parameter in operation["parameters"] if parameter["in"] == "query"}
    page = document["components"]["schemas"]["HaltedWorkspacesView"]

    assert set(query) == {"state", "limit", "nextToken"}
    assert query["state"]["required"] is True
    assert (query["state"]["schema"]["type"], query["state"]["schema"]["const"]) == ("string", "HALTED")
    assert query["limit"]["required"] is False
    assert facts(query["limit"]["schema"]) == {"type": "integer", "minimum": 1, "maximum": 100, "default": 50}
    assert {"type": "string"} in query["nextToken"]["schema"]["anyOf"]
    assert operation["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/HaltedWorkspacesView"
    }
    assert set(page["required"]) == {"workspaces", "nextToken"}
    assert page["properties"]["workspaces"]["items"] == {"$ref": "#/components/schemas/WorkspaceStatusView"}


def test_openapi_job_view_names_every_public_field(document: dict[str, Any]) -> None:
    job_view = document["components"]["schemas"]["JobView"]

    assert set(job_view["properties"]) == set(app.PUBLIC_JOB_FIELDS)
    assert set(job_view["required"]) == set(app.PUBLIC_JOB_FIELDS)


def test_openapi_leaves_the_apis_own_validation_answers_in_place(
    any_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the API as deployed (the document is generated from the same resolver)
    use_environment(monkeypatch, any_stack.env("EnqueueApiFunction"))
    monkeypatch.setattr(app.metrics, "namespace", "AgentJobsTest")
    api = Api(any_stack)
    app.openapi_document()

    # When a job with an invalid field and one with an unknown type arrive
    invalid = api.invoke(post_event({"jobId": "job-1", "workspaceId": "ws-a", "type": "open_pr", "payload": {}}))
    unknown = api.invoke(post_event({"jobId": "job-1", "workspaceId": "ws-a", "type": "rm_rf", "payload": {}}))

    # Then the answers are the API's own (message and errors by camelCase field), not Powertools' validation answers
    assert invalid.status == 422
    assert invalid.field_errors() == {"payload.title": "Field required"}
    assert "detail" not in invalid.body
    assert unknown.status == 422
    assert unknown.field_errors()["type"].startswith("unknown job type 'rm_rf'")


def test_openapi_documents_retry_after_where_waiting_clears_a_429(document: dict[str, Any]) -> None:
    # A job quota clears by itself (the next second, settled jobs); the workspace quota only when raised.
    assert "Retry-After" in operations(document)[("POST", "/jobs")]["responses"]["429"]["headers"]
    assert "headers" not in operations(document)[("PUT", "/workspaces/{workspaceId}")]["responses"]["429"]


def test_openapi_committed_document_is_the_one_the_code_serves(document: dict[str, Any]) -> None:
    # docs/openapi.json is what client generators and readers take without running the API: it must not drift.
    committed = REPO / "docs" / "openapi.json"

    assert committed.read_text() == document_text(document), (
        "docs/openapi.json differs from the document the API serves: run make openapi"
    )


def test_openapi_make_openapi_prints_the_served_document(document: dict[str, Any]) -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "enqueue_api.app"],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": f"{REPO / 'layers/shared'}:{REPO / 'functions/enqueue_api'}"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )

    assert json.loads(printed.stdout) == document
    assert printed.stdout == document_text(document)


def test_openapi_make_openapi_writes_the_document_whole(document: dict[str, Any], tmp_path: Path) -> None:
    target = tmp_path / "openapi.json"
    target.write_text("the previous document\n")
    command = [sys.executable, "-m", "enqueue_api.app", "--write", str(target)]
    paths = f"{REPO / 'layers/shared'}:{REPO / 'functions/enqueue_api'}"
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": paths, "POWERTOOLS_DEBUG": "1"}

    written = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=True)
    assert "[DEBUG]" in written.stdout
    assert target.read_text() == document_text(document)  # Powertools' debug lines never reach the file

    # A run that fails (here: the API's package cannot be imported) leaves the file as it was.
    target.write_text("the previous document\n")
    failed = subprocess.run(
        command, check=False, env={**env, "PYTHONPATH": ""}, capture_output=True, text=True, timeout=120
    )
    assert failed.returncode != 0
    assert target.read_text() == "the previous document\n"
    assert [path.name for path in tmp_path.iterdir()] == ["openapi.json"]


def test_openapi_names_each_operation_for_generated_clients(document: dict[str, Any]) -> None:
    # Clients generated from the document name their methods after operationIds: they are part of the contract, so
    # each is chosen, not derived from a Python function's name and path.
    assert {key: operation["operationId"] for key, operation in operations(document).items()} == {
        ("POST", "/jobs"): "submitJob",
        ("POST", "/jobs:batch"): "submitJobBatch",
        ("GET", "/jobs/{jobId}"): "readJob",
        ("PUT", "/workspaces/{workspaceId}"): "registerWorkspace",
        ("GET", "/workspaces/{workspaceId}"): "readWorkspace",
        ("GET", "/workspaces/{workspaceId}/jobs"): "listWorkspaceJobs",
        ("POST", "/workspaces/{workspaceId}/resume"): "resumeWorkspace",
        ("GET", "/workspaces"): "listHaltedWorkspaces",
        ("GET", "/openapi.json"): "readOpenApiDocument",
    }


def test_openapi_operation_ids_are_listed_in_the_api_docs(document: dict[str, Any]) -> None:
    rows = dict(re.findall(r"^\| `([A-Z]+ /[^`]*)` \| `([A-Za-z]+)` \|", doc_text("docs/api.md"), re.MULTILINE))
    listed = {route.split("?")[0]: operation_id for route, operation_id in rows.items()}
    served = {
        f"{method.upper()} {path}": operation["operationId"]
        for (method, path), operation in operations(document).items()
    }
    assert listed == served


def _schema_ref(name: str) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}}}


def test_openapi_request_defaults_leave_schemas_that_answers_use_as_they_are() -> None:
    """Only schemas that no answer uses lose their defaults: an answer's field with a default is always there."""
    document: dict[str, Any] = {
        "paths": {
            "/x": {
                "parameters": [],  # a path item's shared keys are not operations
                "summary": "x",
                "post": {
                    "requestBody": _schema_ref("Asked"),
                    "responses": {"200": _schema_ref("Shared")},
                },
                "put": {"requestBody": _schema_ref("Shared"), "responses": {}},
            }
        },
        "components": {
            "schemas": {
                "Asked": {
                    "properties": {
                        "n": {"type": "integer", "default": 1},
                        "inner": {"$ref": "#/components/schemas/Inner"},
                    }
                },
                "Inner": {"properties": {"m": {"type": "string", "default": "a"}}, "required": []},
                "Shared": {"properties": {"k": {"type": "integer", "default": 2}}},
            }
        },
    }
    describe_request_defaults(document)
    schemas = document["components"]["schemas"]
    assert schemas["Asked"]["properties"]["n"] == {
        "type": "integer",
        "description": "Optional: when left out, the API uses `1`.",
    }
    assert schemas["Inner"]["properties"]["m"] == {
        "type": "string",
        "description": 'Optional: when left out, the API uses `"a"`.',
    }
    assert schemas["Shared"]["properties"]["k"] == {"type": "integer", "default": 2}


def request_schemas(document: dict[str, Any]) -> set[str]:
    """The names of the component schemas a request body uses, directly or through others."""
    references = re.compile(r'"#/components/schemas/([^"]+)"')
    components = document["components"]["schemas"]
    bodies = [operation.get("requestBody", {}) for operation in operations(document).values()]
    found, pending = set(), set(references.findall(json.dumps(bodies)))
    while pending:
        name = pending.pop()
        found.add(name)
        pending |= set(references.findall(json.dumps(components[name]))) - found
    return found


def documented_defaults(document: dict[str, Any]) -> dict[tuple[str, str], Any]:
    """(schema, property) -> the value a description says the API uses for the property when it is left out."""
    found = {}
    for name, schema in document["components"]["schemas"].items():
        for field, definition in schema.get("properties", {}).items():
            if match := DEFAULT_NOTE.search(definition.get("description", "")):
                found[(name, field)] = json.loads(match.group(1))
    return found


def test_openapi_request_bodies_name_no_default_that_generators_would_require(document: dict[str, Any]) -> None:
    # openapi-typescript (default options) types a property with a `default` as required: a request that leaves the
    # field out, as the API allows, would not compile.
    components = document["components"]["schemas"]
    requests = request_schemas(document)
    assert {"ApplyPatchJob", "RunTestsJob", "OpenPrJob", "WorkspaceRegistration", "JobBatchRequest"} <= requests

    defaulted = [
        (name, field)
        for name in requests
        for field, definition in components[name].get("properties", {}).items()
        if "default" in definition and field not in components[name].get("required", [])
    ]

    assert defaulted == []
    # Responses and query parameters keep theirs (a generator reads those as always present, or optional).
    timeline = operations(document)[("GET", "/workspaces/{workspaceId}/jobs")]
    assert {parameter["name"]: parameter["schema"].get("default") for parameter in timeline["parameters"]}[
        "limit"
    ] == 25


def test_openapi_describes_each_request_default_as_the_model_fills_it_in(document: dict[str, Any]) -> None:
    expected = {
        (name, field.alias or field_name): to_jsonable_python(field.default, by_alias=True)
        for name, model in REQUEST_MODELS.items()
        for field_name, field in model.model_fields.items()
        if not field.is_required() and field.default is not None
    }

    assert documented_defaults(document) == expected
    assert set(expected) >= {("WorkspaceRegistration", "baseBranch"), ("RunTestsJob", "payload")}


JOBS_WITHOUT_A_FIELD: dict[tuple[str, str], tuple[dict[str, Any], str]] = {
    # (schema, property) -> a job that leaves the property out, and where the property goes
    ("ApplyPatchPayload", "patchEncoding"): (
        job_body("job-1", payload={"patch": "--- a/f\n+++ b/f\n@@ -0,0 +1 @@\n+line\n", "commitMessage": "m"}),
        "payload",
    ),
    ("OpenPrPayload", "body"): (job_body("job-1", type="open_pr", payload={"title": "agent changes"}), "payload"),
    ("RunTestsPayload", "suite"): (job_body("job-1", type="run_tests", payload={}), "payload"),
    ("RunTestsJob", "payload"): ({"jobId": "job-1", "workspaceId": "ws-a", "type": "run_tests"}, "job"),
}


def test_openapi_documents_a_default_for_each_optional_job_field_tested_here(document: dict[str, Any]) -> None:
    jobs = {
        "ApplyPatchJob",
        "ApplyPatchPayload",
        "Author",
        "RunTestsJob",
        "RunTestsPayload",
        "OpenPrJob",
        "OpenPrPayload",
    }
    assert {key for key in documented_defaults(document) if key[0] in jobs} == set(JOBS_WITHOUT_A_FIELD)


@pytest.mark.parametrize("field", list(JOBS_WITHOUT_A_FIELD), ids="{0[0]}.{0[1]}".format)
def test_openapi_a_job_sending_a_documented_default_is_the_job_that_leaves_it_out(
    document: dict[str, Any], stack: Stack, monkeypatch: pytest.MonkeyPatch, field: tuple[str, str]
) -> None:
    # Given a job without the optional field, and the same job sending the value the document says the API uses,
    # for a workspace whose registration has what the jobs need (the test suite run_tests names when it names none)
    use_environment(monkeypatch, stack.env("EnqueueApiFunction"))
    api = Api(stack)
    registration: dict[str, Any] = {"remoteUrl": "https://git.example.com/ws-a.git", "branch": "agent/ws-a"}
    registration |= {"testCommands": {"default": ["make", "test"]}, "githubRepository": "acme/ws-a"}
    WorkspaceRegistry(stack.services.dynamodb, stack.table_name).register(
        "ws-a", WorkspaceRegistration.model_validate(registration), "tenant-demo"
    )
    left_out, where = JOBS_WITHOUT_A_FIELD[field]
    sent = json.loads(json.dumps(left_out))
    (sent["payload"] if where == "payload" else sent)[field[1]] = documented_defaults(document)[field]

    # When both are submitted with one jobId
    first, again = api.post(left_out), api.post(sent)

    # Then the second is the first again (same canonical document and payload hash), not a conflicting job
    assert (first.status, again.status) == (202, 202), again.body
    assert (first.body["created"], again.body["created"]) == (True, False)
    assert stack.queue_depth() == 1
