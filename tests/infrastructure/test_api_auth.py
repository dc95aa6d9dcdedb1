"""The HTTP API's authorization in template.yaml: a JWT authorizer is the API's default, its issuer and audience come
from parameters, and every route runs it unless the route is public on purpose."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agent_jobs_local.api_server import http_api_routes
from agent_jobs_local.template import TemplateModel

Template = dict[str, Any]

API = "JobsHttpApi"
AUTHORIZER = "TenantJwt"
# Paths anyone may call without a token. Nothing else may opt out of the authorizer.
PUBLIC_PATHS = frozenset({"/openapi.json"})


def _api_auth(template: Template) -> dict[str, Any]:
    auth: dict[str, Any] = template["Resources"][API]["Properties"].get("Auth") or {}
    return auth


def _http_api_events(template: Template) -> list[tuple[str, str, dict[str, Any]]]:
    """(function, event name, event properties) of every HttpApi event in the template."""
    events = []
    for function_id, resource in template["Resources"].items():
        if resource["Type"] != "AWS::Serverless::Function":
            continue
        for name, event in (resource["Properties"].get("Events") or {}).items():
            if event["Type"] == "HttpApi":
                events.append((function_id, name, event.get("Properties") or {}))
    return events


def authorization_violations(template: Template) -> list[str]:
    """Every route that could be called without the API's JWT authorizer, except the public paths."""
    violations = []
    default = _api_auth(template).get("DefaultAuthorizer")
    for function_id, name, properties in _http_api_events(template):
        route = f"{function_id}.{name} {properties.get('Method')} {properties.get('Path')}"
        if properties.get("ApiId") != {"Ref": API}:
            violations.append(f"{route} is not on {API} (SAM's implicit API has no authorizer)")
            continue
        authorizer = (properties.get("Auth") or {}).get("Authorizer", default)
        if authorizer == "NONE":
            if properties.get("Path") not in PUBLIC_PATHS:
                violations.append(f"{route} opts out of the authorizer but is not a public path {sorted(PUBLIC_PATHS)}")
        elif authorizer != AUTHORIZER:
            violations.append(f"{route} runs authorizer {authorizer!r}, not {AUTHORIZER}")
    return violations


def test_api_has_the_jwt_authorizer_as_default(template: Template) -> None:
    auth = _api_auth(template)
    assert auth["DefaultAuthorizer"] == AUTHORIZER
    authorizer = auth["Authorizers"][AUTHORIZER]
    # API Gateway reads the token from the Authorization header, with or without "Bearer ".
    assert authorizer["IdentitySource"] == "$request.header.Authorization"
    assert authorizer["JwtConfiguration"] == {"issuer": {"Ref": "JwtIssuer"}, "audience": [{"Ref": "JwtAudience"}]}
    assert list(auth["Authorizers"]) == [AUTHORIZER]


def test_jwt_issuer_and_audience_are_described_parameters(template: Template) -> None:
    for name in ("JwtIssuer", "JwtAudience"):
        parameter = template["Parameters"][name]
        assert parameter["Type"] == "String"
        assert parameter["MinLength"] == 1
    assert "Cognito" in template["Parameters"]["JwtIssuer"]["Description"]
    assert "OIDC issuer" in template["Parameters"]["JwtIssuer"]["Description"]
    assert "app client id" in template["Parameters"]["JwtAudience"]["Description"]


def test_every_route_runs_the_authorizer_or_is_a_listed_public_path(template: Template) -> None:
    assert _http_api_events(template)  # not vacuous
    assert authorization_violations(template) == []


def test_the_local_api_reads_the_same_authorization_from_the_template(model: TemplateModel) -> None:
    routes = http_api_routes(model)
    for route in routes:
        expected = None if route.path in PUBLIC_PATHS else AUTHORIZER
        assert route.authorizer == expected, route


def _event(path: str, method: str = "GET", **properties: Any) -> dict[str, Any]:
    return {"Type": "HttpApi", "Properties": {"ApiId": {"Ref": API}, "Path": path, "Method": method, **properties}}


def _add_route(name: str, event: dict[str, Any]) -> Callable[[Template], None]:
    def mutate(template: Template) -> None:
        template["Resources"]["EnqueueApiFunction"]["Properties"]["Events"][name] = event

    return mutate


def _no_default_authorizer(template: Template) -> None:
    del _api_auth(template)["DefaultAuthorizer"]


def _no_auth(template: Template) -> None:
    del template["Resources"][API]["Properties"]["Auth"]


OPEN_ROUTES = [
    ("no-default-authorizer", _no_default_authorizer, "runs authorizer None"),
    ("no-auth-at-all", _no_auth, "runs authorizer None"),
    ("private-route-opts-out", _add_route("Peek", _event("/jobs/{jobId}/peek", Auth={"Authorizer": "NONE"})), "Peek"),
    ("route-on-implicit-api", _add_route("Side", {"Type": "HttpApi", "Properties": {"Path": "/x"}}), "implicit API"),
    ("another-authorizer", _add_route("Other", _event("/other", Auth={"Authorizer": "Lax"})), "'Lax'"),
]


@pytest.mark.parametrize(("mutate", "expected"), [r[1:] for r in OPEN_ROUTES], ids=[r[0] for r in OPEN_ROUTES])
def test_authorization_violations_report_a_route_without_the_authorizer(
    template: Template, mutate: Callable[[Template], None], expected: str
) -> None:
    mutate(template)
    violations = authorization_violations(template)
    assert any(expected in violation for violation in violations), violations


def test_authorization_violations_allow_the_listed_public_path(template: Template) -> None:
    # Given the OpenAPI document served without a token, as its route says
    _add_route("OpenApi", _event("/openapi.json", Auth={"Authorizer": "NONE"}))(template)

    assert authorization_violations(template) == []
    routes = {route.path: route for route in http_api_routes(TemplateModel(template, stack_name="agent-jobs-test"))}
    assert routes["/openapi.json"].authorizer is None
    assert routes["/jobs"].authorizer == AUTHORIZER
