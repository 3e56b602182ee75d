"""A fast lane for the routes under load, past FastAPI's per-request machinery.

FastAPI's middleware stack, route matching and dependency solving cost as much as the rest
of a one-image prediction: about a quarter of the throughput at 64 concurrent clients
(README, Throughput). This ASGI middleware matches a request against the routes' own
compiled path patterns and calls their handler directly, with the same error bodies and the
same metrics labels; every other request goes through FastAPI as usual. The FastAPI routes
stay, for the OpenAPI docs and for anything the lane does not take.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

Handler = Callable[..., Awaitable[Response]]


class FastLane:
    """ASGI middleware answering some routes without FastAPI's routing.

    Args:
        app: the rest of the application.
        routes: (route, handler) pairs: a request matching a route's method and path is
            answered by `handler(request, **path_params)`; scope["route"] is set so metrics
            label it by the route's template.
        error_response: turns an exception into the response the app's handlers would give.
    """

    def __init__(
        self,
        app,
        routes: Sequence[tuple[APIRoute, Handler]],
        error_response: Callable[[Request, Exception], Response],
    ):
        self.app = app
        self.routes = list(routes)
        self.error_response = error_response

    def _match(self, scope) -> tuple[APIRoute, Handler, dict] | None:
        for route, handler in self.routes:
            if scope["method"] not in route.methods:
                continue
            match = route.path_regex.match(scope["path"])
            if match:
                params = {
                    key: route.param_convertors[key].convert(value)
                    for key, value in match.groupdict().items()
                }
                return route, handler, params
        return None

    async def __call__(self, scope, receive, send):
        found = self._match(scope) if scope["type"] == "http" else None
        if found is None:
            await self.app(scope, receive, send)
            return
        route, handler, params = found
        scope["route"] = route
        scope["path_params"] = params
        request = Request(scope, receive, send)
        try:
            response = await handler(request, **params)
        except Exception as err:  # noqa: BLE001 - rendered exactly as the app's handlers do
            response = self.error_response(request, err)
        await response(scope, receive, send)
