"""The OpenAPI document, written from the routes' declarations (service/routes.py): every
operation with its path and query parameters, its body, and every status and content type it
can answer with (its own errors, and those of the ingress in front of every route).

The ingress dispatches on the same `RouteTable`, so a route exists in the document exactly
when it exists on the wire; tests/live/service/test_openapi.py runs schemathesis against the
service with it, so a status or content type the document does not list fails the tests.
"""

from __future__ import annotations

import re

from service.routes import PARAM_PATTERNS, Route, RouteTable

ERROR_SCHEMA = {
    "type": "object",
    "properties": {"error": {"type": "string"}},
    "required": ["error"],
}
REASONS = {
    400: "Bad input: the message says which field, what was expected and what came",
    401: "A bearer token is required, or the one given is not valid (AUTH_TOKENS_FILE)",
    403: "The token lacks the scope, a cross-origin request is not allowed, or the feature is off",
    404: "Unknown model, version, label or file",
    408: "The request body did not arrive within BODY_TIMEOUT_SECONDS",
    413: "Over a limit: MAX_BODY_BYTES, MAX_IMAGES, MAX_REQUEST_PIXELS or MAX_BODY_BYTES_IN_FLIGHT",
    429: "The sender is past its rate (then with Retry-After)",
    500: "The service failed (the log has the details), or a report it reads is damaged",
    502: "The backend (TF Serving) failed",
    503: "Not ready, shutting down, or overloaded (then with Retry-After)",
    504: "The backend (TF Serving) did not answer in time",
    507: "The feedback store has no room or cannot be written",
}
# What the ingress itself answers in front of routes: a body's limits, time and budget.
BODY_ERRORS = (408, 413, 503)
_PARAM = re.compile(r"{(\w+)(?::(\w+))?}")


def openapi_document(table: RouteTable, title: str, version: str, description: str) -> dict:
    """The OpenAPI 3.1 document of every documented route in `table`."""
    paths: dict[str, dict] = {}
    for route in table.routes:
        if route.documented:
            paths.setdefault(route.template, {})[route.method.lower()] = operation(route)
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version, "description": description},
        "paths": paths,
    }


def operation(route: Route) -> dict:
    """One route as an OpenAPI operation."""
    parameters = [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": {"type": "string", "pattern": f"^{PARAM_PATTERNS[kind or '']}$"},
        }
        for name, kind in _PARAM.findall(route.path)
    ]
    result: dict = {
        "tags": list(route.tags),
        "summary": route.summary,
        "operationId": re.sub(r"\W+", "_", f"{route.method}_{route.template}").strip("_").lower(),
        "parameters": [*parameters, *route.query],
        "responses": responses(route),
    }
    if route.body is not None:
        json = {"schema": route.body.schema}
        if route.body.example is not None:
            json["example"] = route.body.example
        result["requestBody"] = {
            "required": True,
            "content": {"application/json": json, **route.body.more},
        }
    return result


def responses(route: Route) -> dict:
    """A route's answers: its success's content types, and every error status it or the
    ingress in front of it can give."""
    answers = route.answers
    success = {
        media_type: (
            {"schema": answers.schema}
            if media_type == "application/json" and answers.schema is not None
            else {}
        )
        for media_type in answers.media_types
    }
    result = {"200": {"description": "Successful Response", "content": success}}
    codes = set(answers.errors) | {403}  # a cross-origin browser request, anywhere
    if route.scope is not None:
        codes |= {401, 403}
    if not route.probe:
        codes.add(400)  # a Host that ALLOWED_HOSTS does not list
    if route.body is not None:
        codes.update(BODY_ERRORS)
    for code in sorted(codes):
        result[str(code)] = {
            "description": REASONS[code],
            "content": {"application/json": {"schema": ERROR_SCHEMA}},
        }
    return result
