"""The OpenAPI schema says every status code and content type each route can answer with.

FastAPI documents a route's 200 (as JSON) and a 422 it never sends here (validation errors
are 400 in TF Serving's `{"error": "..."}` form). This module rewrites each operation's
responses from one table: the errors the service's layers can raise for that kind of route,
the content types of its answers, and the codes the security middleware can send in front of
any route. `tests/live/service/test_openapi.py` runs schemathesis against it, so a status or
content type the schema does not list fails the tests.
"""

from __future__ import annotations

import re

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from service.protocols.http import CallRoute
from service.security import scope_of

ERROR_SCHEMA = {
    "type": "object",
    "properties": {"error": {"type": "string"}},
    "required": ["error"],
}
REASONS = {
    400: "Bad input: the message says which field, what was expected and what came",
    401: "A bearer token is required, or the one given is not valid (AUTH_TOKENS_FILE)",
    403: "The token lacks the scope, or a cross-origin request is not allowed",
    404: "Unknown model, version, label or file",
    408: "The request body did not arrive within BODY_TIMEOUT_SECONDS",
    413: "Over a limit: MAX_BODY_BYTES, MAX_IMAGES or MAX_REQUEST_PIXELS",
    500: "The service failed (the log has the details), or a report it reads is damaged",
    502: "The backend (TF Serving) failed",
    503: "Not ready, shutting down, or overloaded (then with Retry-After)",
    504: "The backend (TF Serving) did not answer in time",
}
# Errors the model routes can answer with, whatever the protocol.
MODEL_READ = (400, 404, 500, 502, 503, 504)
MODEL_WRITE = (400, 404, 408, 413, 500, 502, 503, 504)
# (method, path pattern) -> (error codes, content types of a success), first match wins.
RULES: list[tuple[str, re.Pattern, tuple[int, ...], tuple[str, ...]]] = [
    ("GET", re.compile(r"/healthz$|/v2/health/live$|/v2$"), (), ("application/json",)),
    ("GET", re.compile(r"/readyz$|/v2/health/ready$"), (503,), ("application/json",)),
    ("GET", re.compile(r"/metrics$"), (), ("text/plain",)),
    ("GET", re.compile(r"/$"), (), ("text/html",)),
    (
        "GET",
        re.compile(r"/static/"),
        (404,),
        ("text/html", "text/javascript", "text/css", "image/svg+xml", "image/png"),
    ),  # fmt: skip
    ("GET", re.compile(r"/page/.*/plots/"), (400, 404, 500), ("image/png",)),
    ("GET", re.compile(r"/page/"), (400, 404, 500), ("application/json",)),
    (
        "POST",
        re.compile(r"/v2/.*/infer$"),
        MODEL_WRITE,
        ("application/json", "application/octet-stream"),
    ),  # fmt: skip
    ("POST", re.compile(r"/"), MODEL_WRITE, ("application/json",)),
    ("GET", re.compile(r"/"), MODEL_READ, ("application/json",)),
]


def _rule(method: str, path: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(error codes, success content types) of the first rule matching the operation."""
    for rule_method, pattern, codes, content_types in RULES:
        if rule_method == method and pattern.match(path):
            return codes, content_types
    return MODEL_READ, ("application/json",)


def _responses(method: str, path: str, success: dict) -> dict:
    codes, content_types = _rule(method, path)
    schema = success.get("content", {}).get("application/json", {}).get("schema", {})
    responses = {
        "200": {
            "description": success.get("description", "Successful Response"),
            "content": {
                t: {"schema": schema} if t == "application/json" else {} for t in content_types
            },  # fmt: skip
        }
    }
    # Any route: a cross-origin request is refused; a protected one wants a token.
    extra = {403} | ({401} if scope_of(method, path) is not None else set())
    for code in sorted(set(codes) | extra):
        responses[str(code)] = {
            "description": REASONS[code],
            "content": {"application/json": {"schema": ERROR_SCHEMA}},
        }
    return responses


def call_route_operation(route: CallRoute) -> tuple[str, dict]:
    """A Call route (service/door.py answers it; FastAPI does not know it) as an OpenAPI
    path and operation: its path and query parameters, its body, its summary and tags."""
    path = _CONVERTOR.sub(r"{\1}", route.path)
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in _PATH_PARAMETER.findall(path)
    ]
    operation = {
        "tags": list(route.tags),
        "summary": route.summary,
        "operationId": re.sub(r"\W+", "_", f"{route.method}_{path}").strip("_").lower(),
        "parameters": [*parameters, *route.query],
        "responses": {"200": {"description": "Successful Response"}},
        **(route.openapi_extra or {}),
    }
    return path, operation


_CONVERTOR = re.compile(r"{(\w+):\w+}")
_PATH_PARAMETER = re.compile(r"{(\w+)}")


def document_responses(app: FastAPI, call_routes: list[CallRoute] = ()) -> None:
    """Make `app.openapi()` list every operation (FastAPI's routes and the door's Call
    routes) with every status and content type it can answer with."""

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            for route in call_routes:
                path, operation = call_route_operation(route)
                schema["paths"].setdefault(path, {})[route.method.lower()] = operation
            for path, operations in schema["paths"].items():
                for method, operation in operations.items():
                    operation["responses"] = _responses(
                        method.upper(), path, operation["responses"].get("200", {})
                    )
            schema.get("components", {}).get("schemas", {}).pop("HTTPValidationError", None)
            schema.get("components", {}).get("schemas", {}).pop("ValidationError", None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
