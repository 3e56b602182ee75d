"""The direct lane: predictions answered by the HTTP server's protocol itself, past ASGI.

Under load, a one-image prediction spent more of the event loop on its way through ASGI than
on its JSON: uvicorn's request cycle and its task, four middleware layers, a Starlette
request and response, a task watching for the client to leave, and the answer sent as
messages through each layer's wrapper (about 100 us of the loop's CPU per request at 64
clients, README, Throughput). Here the protocol (service/server.py) reads a plain
prediction's body itself, calls the route's handler with a Call (the same handler the ASGI
routes call), and writes the answer's bytes straight to the socket; a client that leaves
cancels the handler's task from `connection_lost`.

Only plain requests take the lane: a POST to a prediction route with a Content-Length within
MAX_BODY_BYTES, and none of the headers some layer of the app must see (a browser's Origin,
Expect, a chunked or encoded body, a multipart form, a proxy's forwarding headers) nor a
token the app would refuse. Everything else goes the usual way, through the app, so every
answer is the app's: the same status, body and headers, the same metrics and access log.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from starlette.datastructures import Headers, QueryParams
from starlette.requests import Request
from starlette.responses import Response
from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from service.fastlane import Routes, match_route, url_path
from service.metrics import Metrics
from service.protocols.http import Call
from service.security import NOSNIFF, bearer_problem, scope_of

# Headers that some layer of the app must see: such requests go through it.
APP_HEADERS = frozenset(
    {
        b"origin",  # CORS (service/security.py)
        b"expect",  # 100-continue: uvicorn's cycle answers it
        b"transfer-encoding",  # no length known up front
        b"content-encoding",  # the V2 route refuses it, with its words
        b"x-forwarded-for",  # uvicorn's proxy headers rewrite the client
        b"x-forwarded-proto",
    }
)


@dataclasses.dataclass(slots=True)
class Taken:
    """A request the lane has taken: its route and handler, and what the handler needs."""

    template: str  # the route's template, for the metrics' labels
    handler: Callable[..., Any]
    params: dict[str, Any]
    path: str
    query: bytes
    headers: list[tuple[bytes, bytes]]
    started: float  # when it was counted in flight


class DirectLane:
    """Which requests the protocol answers itself, and how.

    Args:
        routes: (route, handler) pairs, as the fast lane takes them (service/fastlane.py).
        metrics: the app's metrics: each request is counted and timed as MetricsMiddleware
            would.
        tokens: token -> scopes (AUTH_TOKENS_FILE), or None: a request the app would refuse
            goes to the app, which answers it.
        error_response: renders an exception as the app does.
        max_body_bytes: a body declared longer goes to the app (which answers 413).
        body_timeout: how long the body may take (BODY_TIMEOUT_SECONDS).
        admit: raises Overloaded while the model's queue is full: checked once the body is
            in, before it is parsed, as the app checks before it reads one.
    """

    def __init__(
        self,
        routes: Routes,
        metrics: Metrics,
        tokens: dict[bytes, frozenset[str]] | None,
        error_response: Callable[[Request, Exception], Response],
        max_body_bytes: int,
        body_timeout: float,
        admit: Callable[[], None],
    ):
        self.routes = list(routes)
        self.metrics = metrics
        self.tokens = tokens
        self.error_response = error_response
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout
        self.admit = admit

    def take(self, method: bytes, url: bytes, headers: list[tuple[bytes, bytes]]) -> Taken | None:
        """The request, taken, when it is a plain prediction; None to leave it to the app.
        A taken request is counted in flight until `finish`."""
        if method != b"POST":
            return None
        length = None
        authorization = b""
        for name, value in headers:
            if name in APP_HEADERS:
                return None
            if name == b"content-length":
                length = value
            elif name == b"content-type" and value[:10].lower() == b"multipart/":
                return None
            elif name == b"authorization":
                authorization = value
        if (
            length is None
            or not length.isdigit()
            or len(length) > 18  # beyond any limit (and int() refuses past 4,300 digits)
            or int(length) > self.max_body_bytes
        ):
            return None
        path = url_path(url)
        found = match_route(self.routes, "POST", path)
        if found is None:
            return None
        if self.tokens is not None:
            needed = scope_of("POST", path)
            if needed is not None and bearer_problem(self.tokens, authorization, needed):
                return None
        route, handler, params = found
        query = url.partition(b"#")[0].partition(b"?")[2]
        started = self.metrics.request_started()
        return Taken(route.path_format, handler, params, path, query, headers, started)

    def refusal(self, taken: Taken) -> Response | None:
        """The app's 503 when the queue filled while the body came (nothing parsed yet);
        None when there is room."""
        try:
            self.admit()
        except Exception as err:  # noqa: BLE001 - Overloaded, rendered as the app renders it
            return self.render(taken, err)
        return None

    async def answer(self, taken: Taken, body: bytes) -> Response:
        """The handler's response, or the app's rendering of its error."""
        call = Call(body, Headers(raw=taken.headers), QueryParams(taken.query))
        try:
            return await taken.handler(call, **taken.params)
        except Exception as err:  # noqa: BLE001 - rendered exactly as the app's handlers do
            return self.render(taken, err)

    def render(self, taken: Taken, err: Exception) -> Response:
        """An error as the app answers (and logs) it for this request."""
        return self.error_response(self.request(taken), err)

    def request(self, taken: Taken) -> Request:
        """A Starlette request for error rendering and logs (only made for those)."""
        scope: dict[str, Any] = {
            "type": "http",
            "method": "POST",
            "path": taken.path,
            "raw_path": taken.path.encode("latin-1", "replace"),
            "query_string": taken.query,
            "headers": taken.headers,
            "scheme": "http",
            "server": None,
            "root_path": "",
        }
        return Request(scope)

    def finish(self, taken: Taken, status: int) -> None:
        """Count and time a taken request (as MetricsMiddleware does for the app's)."""
        self.metrics.request_finished(taken.template, "POST", status, taken.started)


def response_bytes(
    response: Response, default_headers: list[tuple[bytes, bytes]], keep_alive: bool
) -> bytes:
    """An answer as uvicorn writes it for the app's response (status line, the server's
    default headers, the response's, the nosniff the app adds, `connection: close` when the
    connection ends), followed by its body."""
    parts = [STATUS_LINE[response.status_code]]
    sniff = True
    for name, value in (*default_headers, *response.raw_headers):
        name = name.lower()
        if name == b"x-content-type-options":
            sniff = False
        parts += (name, b": ", value, b"\r\n")
    if sniff:
        parts += (NOSNIFF[0], b": ", NOSNIFF[1], b"\r\n")
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    parts += (b"\r\n", response.body)
    return b"".join(parts)
