"""The HTTP API routes of the template as API Gateway serves them: a function's `HttpApi` events as routes, how a
request path matches one (the most specific first), and the authorizer and scopes that guard each, with the claims
an authorizer passes on."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from agent_jobs_local.template import TemplateModel

DEFAULT_ROUTE: Final = "$default"
# A route's `Auth: {Authorizer: NONE}` opts it out of the API's default authorizer.
NO_AUTHORIZER: Final = "NONE"
_PATH_VARIABLE: Final = re.compile(r"^\{([A-Za-z0-9._-]+)(\+?)\}$")


class ApiRouteError(ValueError):
    """The template's HTTP API routes cannot be served as asked; the message says what to change."""


@dataclass(frozen=True)
class HttpRoute:
    """One `HttpApi` event of a function: `method` (upper case, or ANY) and `path` (`/jobs/{jobId}`), or the
    `$default` route. `authorizer` names the authorizer that guards it (None: open); `authorization_scopes`, when
    any, are the scopes of which the caller's token must hold one."""

    function_id: str
    event_name: str
    method: str
    path: str
    authorizer: str | None = None
    authorization_scopes: tuple[str, ...] = ()

    @property
    def route_key(self) -> str:
        return DEFAULT_ROUTE if self.path == DEFAULT_ROUTE else f"{self.method} {self.path}"

    @property
    def _segments(self) -> list[str]:
        return [segment for segment in self.path.split("/") if segment]

    def match(self, method: str, raw_path: str) -> dict[str, str] | None:
        """The path parameters when this route takes the request, else None."""
        if self.path == DEFAULT_ROUTE:
            return {}
        if self.method not in ("ANY", method):
            return None
        parts = [part for part in raw_path.split("/") if part]
        parameters: dict[str, str] = {}
        for index, segment in enumerate(self._segments):
            variable = _PATH_VARIABLE.match(segment)
            if variable and variable.group(2):  # {name+}: the rest of the path, at least one segment
                if index >= len(parts):
                    return None
                parameters[variable.group(1)] = "/".join(parts[index:])
                return parameters
            if index >= len(parts):
                return None
            if variable:
                parameters[variable.group(1)] = parts[index]
            elif segment != parts[index]:
                return None
        return parameters if len(parts) == len(self._segments) else None

    def specificity(self) -> tuple[int, int, int, int]:
        """API Gateway prefers exact paths, then path variables, then greedy variables, then $default."""
        if self.path == DEFAULT_ROUTE:
            return (0, 0, 0, 0)
        segments = self._segments
        greedy = any(s.endswith("+}") for s in segments)
        literal = sum(1 for s in segments if not _PATH_VARIABLE.match(s))
        return (1, 0 if greedy else 1, literal, 0 if self.method == "ANY" else 1)


def http_api_routes(model: TemplateModel, function_id: str | None = None) -> list[HttpRoute]:
    """The `HttpApi` events of `function_id` (default: the one function that has any) as routes."""
    routes: list[HttpRoute] = []
    for candidate in model.resources_of_type("AWS::Serverless::Function"):
        if function_id is not None and candidate != function_id:
            continue
        events: Mapping[str, Any] = model.function_properties(candidate).get("Events") or {}
        for event_name, event in events.items():
            if event.get("Type") != "HttpApi":
                continue
            properties = event.get("Properties") or {}
            # Path, Method and Auth: ApiId only names the API whose Auth applies (it is not provisioned locally).
            path, method = model.resolve(properties.get("Path")), model.resolve(properties.get("Method"))
            authorizer, scopes = route_authorization(model, properties)
            if path is None and method is None:
                routes.append(HttpRoute(candidate, event_name, "ANY", DEFAULT_ROUTE, authorizer, scopes))
                continue
            method = str(method or "ANY").upper()
            routes.append(
                HttpRoute(
                    candidate,
                    event_name,
                    "ANY" if method in ("ANY", "X-AMAZON-APIGATEWAY-ANY-METHOD") else method,
                    str(path or "/"),
                    authorizer,
                    scopes,
                )
            )
    functions = sorted({route.function_id for route in routes})
    if not routes:
        raise ApiRouteError(f"no HttpApi events in the template{f' for {function_id}' if function_id else ''}")
    if len(functions) > 1:
        raise ApiRouteError(f"HttpApi events belong to several functions {functions}: name one as function_id")
    return routes


def _api_auth(model: TemplateModel, event_properties: Mapping[str, Any]) -> Mapping[str, Any]:
    """The `Auth` of the HttpApi an event belongs to: its ApiId's resource, else SAM's implicit API (Globals)."""
    api_id = event_properties.get("ApiId")
    if isinstance(api_id, Mapping) and isinstance(api_id.get("Ref"), str):
        auth = model.properties(api_id["Ref"]).get("Auth")
    else:
        auth = ((model.template.get("Globals") or {}).get("HttpApi") or {}).get("Auth")
    return auth if isinstance(auth, Mapping) else {}


def route_authorization(
    model: TemplateModel, event_properties: Mapping[str, Any]
) -> tuple[str | None, tuple[str, ...]]:
    """The authorizer that guards an HttpApi event's route (None: open) and the scopes it requires, as SAM wires
    them: the event's `Auth.Authorizer` (NONE opts out), else the API's `DefaultAuthorizer`; the event's
    `Auth.AuthorizationScopes`, else the authorizer's own."""
    api_auth = _api_auth(model, event_properties)
    route_auth = event_properties.get("Auth") or {}
    authorizer = model.resolve(route_auth.get("Authorizer")) or model.resolve(api_auth.get("DefaultAuthorizer"))
    if authorizer is None or authorizer == NO_AUTHORIZER:
        return None, ()
    authorizers = api_auth.get("Authorizers") or {}
    if authorizer not in authorizers:
        raise ApiRouteError(f"the route's authorizer '{authorizer}' is not among the API's Authorizers")
    scopes = route_auth.get("AuthorizationScopes")
    if scopes is None:
        scopes = (authorizers[authorizer] or {}).get("AuthorizationScopes")
    return str(authorizer), tuple(str(scope) for scope in model.resolve(scopes) or ())


def token_scopes(claims: Mapping[str, Any]) -> list[str]:
    """The scopes a token grants, as an HTTP API JWT authorizer reads them: `scope` (space-separated) or `scp`."""
    raw = claims.get("scope", claims.get("scp"))
    if isinstance(raw, str):
        return raw.split()
    if isinstance(raw, list):
        return [str(scope) for scope in raw]
    return []


def api_gateway_claims(claims: Mapping[str, Any]) -> dict[str, str]:
    """Claims as an HTTP API passes them to the function: every value a string, a list as `[a b]`."""

    def text(value: Any) -> str:
        if isinstance(value, str):
            return value
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, list):
            return "[" + " ".join(text(item) for item in value) + "]"
        if isinstance(value, int | float):
            return str(int(value)) if float(value).is_integer() else str(value)
        return json.dumps(value, separators=(",", ":"))

    return {str(name): text(value) for name, value in claims.items()}
