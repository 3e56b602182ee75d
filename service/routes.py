"""Routes, declared once per protocol: what the ingress dispatches on and the OpenAPI document
is written from.

Each protocol adapter (service/protocols/) lists its routes as `Route` values: method, path
template, handler, the scope a token needs, the request body it takes and the answers it
gives, the query parameters it reads and a check to run before the body is read. The ingress
(service/ingress.py) matches a request against a `RouteTable` of all of them; the OpenAPI
document (service/openapi.py) is written from the same table. Nothing here knows HTTP's
wire or any server.

Path templates use `{param}` (one segment, `[^/]+`) and `{param:name}` (a model name or a
label: TF Serving's `[^/:]+`, so `/v1/models/m:predict` never reads as a model named
`m:predict`). A route with `any_case` matches its fixed words in any letter case, as TF
Serving's RE2 patterns with `(?i)` do (tensorflow_serving/model_servers/
http_rest_api_util.cc): `/V1/MODELS/m:PREDICT` is `/v1/models/m:predict`; the parameters
keep their case.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol

from starlette.datastructures import Headers, QueryParams
from starlette.responses import Response

PARAM_PATTERNS = {"": "[^/]+", "name": "[^/:]+"}
_PARAM = re.compile(r"{(\w+)(?::(\w+))?}")


# The errors any route reading a model's state or running one can answer with, whatever the
# protocol (the ingress adds its own: 401, 403 and 400 for a host).
MODEL_READ = (400, 404, 500, 502, 503, 504)
MODEL_WRITE = (400, 404, 408, 413, 500, 502, 503, 504)


def _unbudgeted(count: int) -> None:
    """A Call made outside the ingress (tests): nothing to reserve from."""


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    """A request as its handler sees it: the body, read whole and within the limits by the
    ingress, the headers and the query. A client that leaves cancels the handler's task.

    `reserve(n)` counts n more bytes the handler makes of the body (a decompressed copy, the
    copies of a tf.Example context) in the process's budget of bodies in flight
    (MAX_BODY_BYTES_IN_FLIGHT), held until the request is answered; it raises BodiesInFlight
    (503) past it, PayloadTooLarge (413) past all of it. Safe from a worker thread.
    `sender` is who sent it, as the access rules found (service/security.py: its token's
    name, `anonymous` without tokens).
    """

    body: bytes
    headers: Headers
    query: QueryParams
    reserve: Callable[[int], None] = _unbudgeted
    sender: str = "anonymous"


Handler = Callable[..., Awaitable[Response]]


@dataclasses.dataclass(frozen=True)
class Body:
    """What a route takes as its body, for the OpenAPI document.

    Args:
        schema: the JSON body's schema (a JSON Schema dict; `model_json_schema()` of a
            pydantic model).
        example: an example body.
        more: other media types it takes (media type -> OpenAPI media type object).
    """

    schema: dict
    example: Any = None
    more: dict[str, dict] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Answers:
    """What a route answers, for the OpenAPI document: the success's media types and schema,
    and every error status it can give (each as `{"error": "..."}`).

    Args:
        media_types: the success's content types.
        schema: the success's JSON schema, when it is JSON.
        errors: the error statuses it can answer with (the ingress adds its own).
    """

    media_types: tuple[str, ...] = ("application/json",)
    schema: dict | None = None
    errors: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class Route:
    """One route of one protocol.

    Args:
        method: GET or POST (a GET route answers HEAD too).
        path: its template (`/v1/models/{name:name}:predict`).
        handler: `await handler(call, **path_params)` -> a Starlette Response; raises
            ServiceError for the client's answer.
        summary: one line for the OpenAPI document.
        scope: the token scope it needs (service/security.py: PREDICT, FEEDBACK, STATUS),
            or None: open to all (probes, the page's files, the docs).
        tags: the OpenAPI document's grouping.
        body: what it takes as a body (None: no body is read).
        answers: what it answers with.
        query: its query parameters, as OpenAPI parameter objects.
        before_body: `before_body(path_params, query)`, run before the body is read; raises
            to refuse (Overloaded for a full queue, Forbidden for feedback that is off...).
        any_case: match the fixed words of the path in any case (TF Serving's /v1 URLs).
        probe: a health probe, answered whatever Host it names (kubelets use addresses).
        documented: listed in the OpenAPI document.
        protocol: the per-model metrics' `protocol` label for a route that serves a model
            (service/metrics.py; `feedback` counts feedback); empty: not measured per model.
        tf_api: TF Serving's `API` label for a route of its REST API (`predict`, `classify`,
            `regress`; empty for status and metadata, as TF Serving has it); None: not in TF
            Serving's metrics.
    """

    method: str
    path: str
    handler: Handler
    summary: str
    scope: str | None
    tags: tuple[str, ...] = ()
    body: Body | None = None
    answers: Answers = Answers()
    query: tuple[dict, ...] = ()
    before_body: Callable[[dict[str, Any], QueryParams], None] | None = None
    any_case: bool = False
    probe: bool = False
    documented: bool = True
    protocol: str = ""
    tf_api: str | None = None

    @functools.cached_property
    def template(self) -> str:
        """The path with its parameters' kinds left out (`/v1/models/{name}:predict`): the
        OpenAPI document's path and the metrics' route label."""
        return _PARAM.sub(lambda m: "{" + m[1] + "}", self.path)

    @property
    def params(self) -> tuple[str, ...]:
        """The names of its path parameters, in order."""
        return tuple(m[1] for m in _PARAM.finditer(self.path))


def admit_always(check: Callable[[], None]) -> Callable[[dict, QueryParams], None]:
    """A before_body check that ignores the request: `check()` alone (the queue's)."""

    def before_body(params: dict, query: QueryParams) -> None:
        check()

    return before_body


def _pattern(route: Route) -> re.Pattern:
    parts, at = [], 0
    for match in _PARAM.finditer(route.path):
        parts.append(_literal(route.path[at : match.start()], route.any_case))
        kind = match[2] or ""
        if kind not in PARAM_PATTERNS:
            raise ValueError(f"{route.path}: unknown parameter kind {kind!r}")
        parts.append(f"(?P<{match[1]}>{PARAM_PATTERNS[kind]})")
        at = match.end()
    parts.append(_literal(route.path[at:], route.any_case))
    return re.compile("".join(parts) + r"\Z")


def _literal(text: str, any_case: bool) -> str:
    if not text:
        return ""
    return f"(?i:{re.escape(text)})" if any_case else re.escape(text)


class RouteSource(Protocol):
    """A protocol's adapter, as the app gathers them: the routes it answers."""

    def routes(self) -> list[Route]: ...


class NoSuchMethod(Exception):
    """The path is a route's, not for this method; `allowed` lists the methods it takes,
    `template` the route's template (the metrics' label)."""

    def __init__(self, allowed: Sequence[str], template: str):
        super().__init__(", ".join(allowed))
        self.allowed = tuple(allowed)
        self.template = template


@dataclasses.dataclass(frozen=True, slots=True)
class Match:
    """A request's route and its path parameters."""

    route: Route
    params: dict[str, str]


class RouteTable:
    """Every protocol's routes, matched by path, then method.

    Paths without parameters are found in a dictionary; the others are tried in the order
    declared, among those whose first segment could match (a route's first word, in any
    case when the route says so).

    Raises:
        ValueError: two routes of the same method and path, or an unknown parameter kind.
    """

    def __init__(self, routes: Iterable[Route]):
        self.routes: list[Route] = list(routes)
        self._exact: dict[str, dict[str, Route]] = {}
        self._by_head: dict[str, list[tuple[re.Pattern, Route]]] = {}
        seen: set[tuple[str, str]] = set()
        for route in self.routes:
            key = (route.method, route.template.lower() if route.any_case else route.template)
            if key in seen:
                raise ValueError(f"two routes for {route.method} {route.path}")
            seen.add(key)
            if not route.params and not route.any_case:
                self._exact.setdefault(route.path, {})[route.method] = route
                continue
            head = _head(route.path)
            if "{" in head:
                raise ValueError(f"{route.path}: its first segment must be fixed")
            self._by_head.setdefault(head.lower(), []).append((_pattern(route), route))

    def match(self, method: str, path: str) -> Match | None:
        """The route answering `method` on `path`, with its parameters; None when no route has
        the path.

        Raises:
            NoSuchMethod: routes have the path, but none takes the method.
        """
        method = "GET" if method == "HEAD" else method
        exact = self._exact.get(path)
        if exact is not None:
            route = exact.get(method)
            if route is None:
                raise NoSuchMethod(sorted(exact), path)
            return Match(route, {})
        allowed: list[Route] = []
        for pattern, route in self._by_head.get(_head(path).lower(), ()):
            found = pattern.match(path)
            if found is None:
                continue
            if route.method == method:
                return Match(route, found.groupdict())
            allowed.append(route)
        if allowed:
            raise NoSuchMethod(sorted({r.method for r in allowed}), allowed[0].template)
        return None


def _head(path: str) -> str:
    """A path's first segment: `/v1/models/m` -> `/v1`."""
    end = path.find("/", 1)
    return path if end < 0 else path[:end]
