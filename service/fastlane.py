"""A fast lane for the routes under load, past FastAPI's per-request machinery.

FastAPI's middleware stack, route matching and dependency solving cost as much as the rest
of a one-image prediction: about a quarter of the throughput at 64 concurrent clients
(README, Throughput). This ASGI middleware matches a request against the routes' own
compiled path patterns and calls their handler directly, with the same error bodies and the
same metrics labels; every other request goes through FastAPI as usual. The FastAPI routes
stay, for the OpenAPI docs and for anything the lane does not take. The server's protocol
answers most of these requests before they even become ASGI (service/directlane.py); this
lane takes the rest (a browser's, a chunked body, ...).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from service.protocols.http import CallHandler, serve_call

Routes = Sequence[tuple[APIRoute, CallHandler]]


def match_route(
    routes: Routes, method: str, path: str
) -> tuple[APIRoute, CallHandler, dict[str, Any]] | None:
    """The first route taking this method and (decoded) path, its handler and its converted
    path parameters; None when no route does."""
    for route, handler in routes:
        if method not in route.methods:
            continue
        found = route.path_regex.match(path)
        if found:
            params = {
                key: route.param_convertors[key].convert(value)
                for key, value in found.groupdict().items()
            }
            return route, handler, params
    return None


def url_path(raw: bytes) -> str:
    """A request target's path, percent-decoded as uvicorn decodes it for ASGI's scope (a
    fragment, which no client should send, dropped as uvicorn drops it)."""
    path = raw.partition(b"#")[0].partition(b"?")[0].decode("latin-1")
    return urllib.parse.unquote(path) if "%" in path else path


class FastLane:
    """ASGI middleware answering some routes without FastAPI's routing.

    Args:
        app: the rest of the application.
        routes: (route, handler) pairs: a request matching a route's method and path is
            answered by `serve_call(request, handler, path_params, ...)`
            (service/protocols/http.py); scope["route"] is set so metrics label it by the
            route's template.
        error_response: turns an exception into the response the app's handlers would give.
        max_body_bytes, body_timeout: the bounds on reading a body (MAX_BODY_BYTES,
            BODY_TIMEOUT_SECONDS).
        admit: raises Overloaded while the model's queue is full.
    """

    def __init__(
        self,
        app,
        routes: Routes,
        error_response: Callable[[Request, Exception], Response],
        max_body_bytes: int,
        body_timeout: float,
        admit: Callable[[], None],
    ):
        self.app = app
        self.routes = list(routes)
        self.error_response = error_response
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout
        self.admit = admit

    async def __call__(self, scope, receive, send):
        found = (
            match_route(self.routes, scope["method"], scope["path"])
            if scope["type"] == "http"
            else None
        )
        if found is None:
            await self.app(scope, receive, send)
            return
        route, handler, params = found
        scope["route"] = route
        scope["path_params"] = params
        request = Request(scope, receive, send)
        try:
            response = await serve_call(
                request, handler, params, self.max_body_bytes, self.body_timeout, self.admit
            )
        except Exception as err:  # noqa: BLE001 - rendered exactly as the app's handlers do
            response = self.error_response(request, err)
        await response(scope, receive, send)
