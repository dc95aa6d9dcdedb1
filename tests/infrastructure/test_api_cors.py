"""The HTTP API's CORS as CloudFormation gets it: SAM's own transform of template.yaml with the parameter values a
deploy passes, then the intrinsic functions of the result evaluated. Off unless `CorsOrigins` names origins; never
with credentials; an origin that would open the API wider than its operator meant is refused before deploying."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from samtranslator.translator.transform import transform  # type: ignore[import-untyped]

from agent_jobs_local.template.intrinsics import IntrinsicResolver
from agent_jobs_local.template.loading import TemplateError

Template = dict[str, Any]

API = "JobsHttpApi"
ORIGINS = "CorsOrigins"


class NoManagedPolicies:
    """SAM asks IAM for the ARNs of managed policies named by name; the template names none (a test fails if it
    does: the transform raises without them), so nothing is asked of AWS."""

    def load(self) -> dict[str, str]:
        return {}


def sam_transform(template: Template, parameters: dict[str, str]) -> Template:
    """The CloudFormation template SAM makes of `template` for `parameters`, as `sam deploy` would have it made.
    The code locations are S3 URIs by then (`sam package`)."""
    source = copy.deepcopy(template)
    for resource in source["Resources"].values():
        for location in ("CodeUri", "ContentUri"):
            if location in resource.get("Properties", {}):
                resource["Properties"][location] = "s3://artifacts/agent-jobs.zip"
    translated: Template = transform(source, dict(parameters), NoManagedPolicies())
    return translated


def deployed_cors(template: Template, monkeypatch: pytest.MonkeyPatch, **parameters: str) -> Any:
    """The CORS configuration API Gateway receives for the HTTP API (None: no CORS)."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")  # SAM needs a region for its ARNs
    translated = sam_transform(template, parameters)
    api = translated["Resources"][API]
    assert api["Type"] == "AWS::ApiGatewayV2::Api"
    resolver = IntrinsicResolver(translated, parameter_overrides=parameters)
    return resolver.resolve(api["Properties"]["Body"].get("x-amazon-apigateway-cors"))


def test_cors_is_off_by_default(template: Template, monkeypatch: pytest.MonkeyPatch) -> None:
    assert template["Parameters"][ORIGINS]["Default"] == ""
    assert deployed_cors(template, monkeypatch) is None


def test_cors_allows_the_named_origins_a_bearer_token_and_never_credentials(
    template: Template, monkeypatch: pytest.MonkeyPatch
) -> None:
    cors = deployed_cors(template, monkeypatch, CorsOrigins="https://app.example.com,http://localhost:5173")

    assert cors == {
        "allowOrigins": ["https://app.example.com", "http://localhost:5173"],
        "allowMethods": ["GET", "POST", "PUT"],
        "allowHeaders": ["authorization", "content-type"],
        # What a browser client reads of an answer beyond the safelisted headers: where a job is, when to retry.
        "exposeHeaders": ["location", "retry-after"],
        "allowCredentials": False,
        "maxAge": 600,
    }


def test_cors_any_origin_is_allowed_only_alone_and_without_credentials(
    template: Template, monkeypatch: pytest.MonkeyPatch
) -> None:
    cors = deployed_cors(template, monkeypatch, CorsOrigins="*")

    assert (cors["allowOrigins"], cors["allowCredentials"]) == (["*"], False)


@pytest.mark.parametrize(
    "origins",
    [
        "null",  # sandboxed frames and file:// pages: any page can make its origin null
        "http://app.example.com",  # plain http off this machine: a network attacker could inject script there
        "https://app.example.com/",  # an origin has no path: a browser never sends this one, so it never matches
        "https://app.example.com/ui",
        "https://*.example.com",
        "*.example.com",
        "*,https://app.example.com",  # * alone or not at all
        "https://app.example.com, http://localhost:5173",  # a space would become part of the second origin
        "https://App.Example.com",  # browsers send lower case: this would never match
        "https://user@app.example.com",
        "file:///tmp/page.html",
        "https://app.example.com,",
        "*,*",
        "https://a.com,*",
        "HTTPS://app.example.com",
        "http://localhost.evil.com",  # a public name that starts like this machine's
        "http://localhost:80@evil.com",
        "https://\uff41pp.example.com",  # a full-width letter
        "https://app.example.com\n",
    ],
)
def test_cors_origins_refuses_what_is_not_a_web_origin_or_opens_the_api_wider(template: Template, origins: str) -> None:
    # CloudFormation checks the AllowedPattern before anything is deployed, as the local resolver does here.
    with pytest.raises(TemplateError, match="AllowedPattern"):
        IntrinsicResolver(template, parameter_overrides={ORIGINS: origins})


@pytest.mark.parametrize(
    "origins", ["https://app.example.com:8443", "http://127.0.0.1:5173,http://localhost", "https://a-b.example.co.uk"]
)
def test_cors_origins_takes_https_origins_and_this_machines_http_ones(template: Template, origins: str) -> None:
    assert IntrinsicResolver(template, parameter_overrides={ORIGINS: origins}).parameters[ORIGINS] == origins
