"""The one door: everything that happens to an HTTP request before its handler, in one place.

Every request the service answers passes here first, in this order:

1. **Metrics**: counted in flight and timed, then counted by route template and status.
2. **Access** (service/security.py): a request for a host ALLOWED_HOSTS does not list gets
   400; a cross-origin browser request is refused or given its CORS headers (a preflight is
   answered here); a request needing a token without a valid one gets 401 or 403.
3. **Route**: a `/v1` path's fixed words are matched in any case, as TF Serving's URL
   patterns are (`canonical_v1_path`); the routes whose handlers take a `Call`
   (predictions, inference, feedback) are matched here, by their own compiled patterns;
   every other request (status, metadata, the page, the docs, /metrics) goes on to
   FastAPI's router, still inside the door.
4. **Admission**: a route's `before_body` check runs before the body is read, so refusing
   costs next to nothing: predictions are refused with 503 while the batching queue is full,
   feedback while it is off.
5. **Body**: read whole within MAX_BODY_BYTES (413, checked against Content-Length before
   reading), within BODY_TIMEOUT_SECONDS (408), a client leaving mid-body is 499; and within
   the process's MAX_BODY_BYTES_IN_FLIGHT, summed over every request whose body is coming or
   held (503 with Retry-After, before a declared body is read, or as soon as a chunked one
   passes it), so memory is bounded across requests, not only per request.
6. **Handler**: called with a `Call` (body, headers, query, the sender the access rules
   found) and its path parameters, and cancelled if the client leaves before the answer is
   ready (which frees its place in the batch queue).
7. **Answer**: errors rendered by the one renderer (service/errors.py: error_response);
   every answer gets `X-Content-Type-Options: nosniff` and, for allowed origins, CORS headers.

Two HTTP transports feed it: the ASGI app (`Door.__call__`, through uvicorn's request cycle)
and the server's direct transport (service/server.py), which reads a Call route's body and
writes its answer itself: `Door.take` runs steps 1-5 at the request's headers, except for
reading the body, and returns None for anything it would refuse (the ASGI app then answers
it); `answer_taken` runs steps 6 and 7 on the whole body; `refuse_taken` answers a body
that came too slowly or not at all. Both share `_admit` and `_serve`; tests/unit/service/
test_door.py sends every kind of request through each transport and compares the bytes.

gRPC (service/protocols/grpc_server.py) is the other transport: it asks the same access
rule (security.bearer_problem, from the call's metadata) and the same admission
(DataPlane.admit), and counts its own metrics.

The routes here are not FastAPI routes: they are documented in the OpenAPI schema from their
`CallRoute` (service/openapi.py), so each request's query and body are read by one parser,
its handler's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from functools import partial
from typing import Any, NamedTuple, TypeVar

from starlette.datastructures import QueryParams
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.budgets import BodyBudget, Held
from service.errors import (
    ClientClosedRequest,
    PayloadTooLarge,
    RequestTimeout,
    ServiceError,
    error_response,
)
from service.metrics import Metrics
from service.protocols.http import Call, CallRoute
from service.security import NOSNIFF, Access

T = TypeVar("T")

# The fixed words of /v1 paths, by their place in `/v1/models/{name}/{word}/{value}/{word}`,
# and the verbs after a name or a value (`:predict`). TF Serving's patterns are RE2 with
# `(?i)` (tensorflow_serving/model_servers/http_rest_api_util.cc): `/V1/MODELS/m:PREDICT`
# is `/v1/models/m:predict`; the names (model, label) keep their case.
_V1_WORDS = {
    1: {"v1"},
    2: {"models"},
    4: {"versions", "labels", "metadata", "rollout", "feedback"},
    6: {"metadata"},
}
_V1_VERB = re.compile(r":(predict|classify|regress)$", re.IGNORECASE)


def canonical_v1_path(path: str) -> str:
    """A /v1 path with its fixed words in lower case, the names as they came; any other path
    unchanged."""
    if path[:4].lower() != "/v1/" or path[:4] == "/v1/" and path.islower():
        return path
    parts = path.split("/")
    for i, part in enumerate(parts):
        if part.lower() in _V1_WORDS.get(i, ()):
            parts[i] = part.lower()
        elif i in (3, 5):
            parts[i] = _V1_VERB.sub(lambda m: m[0].lower(), part)
    return "/".join(parts)


@dataclasses.dataclass(frozen=True)
class _Compiled:
    route: CallRoute
    pattern: Any
    template: str  # the path without convertors: the metrics' label
    convertors: dict


class Door:
    """The ASGI app the server runs: the prelude above, then a Call route or FastAPI.

    Args:
        app: the FastAPI app answering every other route (and the lifespan).
        routes: the Call routes.
        metrics: the service's metrics.
        access: the origin and token rules.
        max_body_bytes, body_timeout: MAX_BODY_BYTES and BODY_TIMEOUT_SECONDS.
        body_budget: the bytes of bodies held at once (MAX_BODY_BYTES_IN_FLIGHT).
    """

    def __init__(
        self,
        app: ASGIApp,
        routes: Sequence[CallRoute],
        metrics: Metrics,
        access: Access,
        max_body_bytes: int,
        body_timeout: float,
        body_budget: BodyBudget | None = None,
    ):
        self.app = app
        self.body_budget = body_budget or BodyBudget(1 << 62)
        self.routes = list(routes)
        self.metrics = metrics
        self.access = access
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout
        self._compiled = []
        for route in self.routes:
            pattern, template, convertors = compile_path(route.path)
            self._compiled.append(_Compiled(route, pattern, template, convertors))

    def match(self, path: str) -> tuple[_Compiled, dict[str, Any]] | None:
        """The Call route whose pattern matches the (decoded) path, with its converted path
        parameters; None when none does."""
        for compiled in self._compiled:
            found = compiled.pattern.match(path)
            if found:
                params = {
                    key: compiled.convertors[key].convert(value)
                    for key, value in found.groupdict().items()
                }
                return compiled, params
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)  # the lifespan
            return
        metrics = self.metrics
        started = metrics.request_started()
        status = 500  # what a request that ends without an answer (a shutdown) counts as
        template = "unmatched"
        # The access rules see the path the request is routed by: `/V1/MODELS/m/FEEDBACK`
        # is feedback's route, and needs feedback's scope.
        path = canonical_v1_path(scope["path"])
        if path != scope["path"]:
            scope = {**scope, "path": path}  # FastAPI's routes are matched on it too
        decision = self.access.check(scope)
        # Every answer: nosniff, and CORS's headers for an allowed origin.
        extra_headers = [NOSNIFF, *decision.headers]

        async def answer(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = with_headers(message.get("headers", ()), extra_headers)
            await send(message)

        try:
            if decision.refusal is not None:
                await decision.refusal(scope, receive, answer)
                return
            found = self.match(path)
            if found is None:
                try:
                    await self.app(scope, receive, answer)
                finally:
                    route = scope.get("route")
                    template = getattr(route, "path_format", None) or "unmatched"
                return
            compiled, params = found
            template = compiled.template
            request = Request(scope, receive, send)
            route = compiled.route
            try:
                query = self._admit(request, route, params)
                watch = partial(unless_disconnected, request)
                with self.body_budget.hold() as held:
                    response = await self._serve(
                        request, route, params, query, decision.sender, held, None, watch
                    )
            except Exception as err:  # noqa: BLE001 - rendered as every handler's error is
                response = error_response(request, err)
            await response(scope, receive, answer)
        finally:
            metrics.request_finished(template, scope["method"], status, started)

    @staticmethod
    def _admit(request: Request, route: CallRoute, params: dict[str, Any]) -> QueryParams:
        # Before the body: the method, then the route's own check (a full queue...).
        if request.method != route.method:
            raise StarletteHTTPException(405, headers={"Allow": route.method})
        # Most requests have no query: one shared empty one, not a parse each.
        query = request.query_params if request.scope["query_string"] else _NO_QUERY
        if route.before_body is not None:
            route.before_body(params, query)
        return query

    async def _serve(
        self,
        request: Request,
        route: CallRoute,
        params: dict[str, Any],
        query: QueryParams,
        sender: str,
        held: Held,
        body: bytes | None,
        watch: Callable[[Awaitable[Response]], Awaitable[Response]],
    ) -> Response:
        # The body and the handler, for both transports: `body` is None when it is still to
        # be read (ASGI); `watch` cancels the handler when the client leaves.
        if body is None:
            body = await read_body(request, self.max_body_bytes, self.body_timeout, held)
        call = Call(body, request.headers, query, held.reserve, sender)
        return await watch(route.handler(call, **params))

    # --- the direct transport's half (service/server.py reads the body and writes bytes) ----

    def take(self, scope: Scope, declared: int) -> Taken | None:
        """The direct transport's request (service/server.py), at its headers: taken when it
        is a Call route's that the access rules, the method and the route's before_body check
        let through, and whose declared body (`declared` bytes, the whole body: the server
        frames it by its Content-Length) is within MAX_BODY_BYTES and the process's budget,
        which it is reserved from now. Counted in flight from now. None leaves the request to
        the ASGI app, which meets the same checks in the same order and answers it.
        """
        path = canonical_v1_path(scope["path"])
        if path != scope["path"]:
            scope = {**scope, "path": path}  # the server's scope keeps the path as sent
        decision = self.access.check(scope)  # on the path it is routed by, as in __call__
        if decision.refusal is not None or declared > self.max_body_bytes:
            return None
        found = self.match(path)
        if found is None:
            return None
        compiled, params = found
        request = Request(scope)
        held = self.body_budget.hold()
        try:
            query = self._admit(request, compiled.route, params)
            held.reserve(declared)
        except Exception:  # noqa: BLE001 - a refusal: the ASGI app meets it again, and answers
            return None
        started = self.metrics.request_started()
        return Taken(request, compiled, params, query, decision, held, started)

    async def answer_taken(self, taken: Taken, body: bytes) -> Answer:
        """A taken request's answer, from its whole body: the handler's response or its
        error's, with the door's headers; counted and timed. A client that leaves meanwhile
        (`Taken.client_left`) cancels the handler (answered 499, to nobody)."""
        status = 500  # cancelled for another reason: the server is stopping
        taken.finished = True
        try:
            try:
                with taken.held:
                    response = await self._serve(taken.request, taken.compiled.route,
                                                 taken.params, taken.query, taken.decision.sender,
                                                 taken.held, body, taken.unless_left)  # fmt: skip
            except Exception as err:  # noqa: BLE001 - rendered as every handler's error is
                response = error_response(taken.request, err)
            status = response.status_code
        finally:
            self.metrics.request_finished(taken.compiled.template, "POST", status, taken.started)
        return self._answer(taken, response)

    def refuse_taken(self, taken: Taken, err: ServiceError) -> Answer:
        """A taken request that ends before its body is whole (a body too slow, a client gone
        mid-body): the error's answer, with the door's headers; counted and timed."""
        taken.finished = True
        taken.held.__exit__(None, None, None)
        response = error_response(taken.request, err)
        self.metrics.request_finished(taken.compiled.template, "POST", response.status_code,
                                      taken.started)  # fmt: skip
        return self._answer(taken, response)

    def abandon_taken(self, taken: Taken) -> None:
        """A taken request whose answer never began (its task cancelled at shutdown before it
        ran): counted as the ASGI app counts a request that ends without an answer (500),
        its bytes given back. Nothing when it was answered or refused already."""
        if not taken.finished:
            taken.finished = True
            taken.held.__exit__(None, None, None)
            self.metrics.request_finished(taken.compiled.template, "POST", 500, taken.started)

    @staticmethod
    def _answer(taken: Taken, response: Response) -> Answer:
        headers = with_headers(response.raw_headers, [NOSNIFF, *taken.decision.headers])
        return Answer(response.status_code, headers, response.body)


class Answer(NamedTuple):
    """What the direct transport writes: a Response's status, headers and body, the door's
    headers among them."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


def with_headers(headers, extra: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """An answer's headers and the door's own (nosniff, CORS's), those it set not repeated."""
    headers = list(headers)
    present = {name.lower() for name, _ in headers}
    return headers + [h for h in extra if h[0] not in present]


class Taken:
    """A request the direct transport took (Door.take): its route and what the access rules
    found, its share of the body budget; `client_left()` when its connection closes."""

    __slots__ = (
        "request", "compiled", "params", "query", "decision", "held", "started", "left", "task",
        "finished",
    )  # fmt: skip

    def __init__(self, request, compiled, params, query, decision, held, started):
        self.request = request
        self.compiled = compiled
        self.params = params
        self.query = query
        self.decision = decision
        self.held = held
        self.started = started
        self.left = False
        self.task: asyncio.Task | None = None
        self.finished = False  # counted in the metrics as answered (or abandoned)

    def client_left(self) -> None:
        """The client closed the connection: its handler, if running, is cancelled."""
        self.left = True
        if self.task is not None:
            self.task.cancel()

    async def unless_left(self, work: Coroutine[Any, Any, T]) -> T:
        """Await the handler's `work`, cancelled if the client leaves (ClientClosedRequest)."""
        if self.left:  # it left between its body and its handler's start
            work.close()
            raise ClientClosedRequest(LEFT_BEFORE_ANSWER)
        self.task = asyncio.current_task()
        try:
            return await work
        except asyncio.CancelledError:
            if self.left:
                self.task.uncancel()  # the cancellation was ours, and is answered as this error
                raise ClientClosedRequest(LEFT_BEFORE_ANSWER) from None
            raise
        finally:
            self.task = None


_NO_QUERY = QueryParams()


LEFT_MID_BODY = "the client disconnected while sending the body"
LEFT_BEFORE_ANSWER = "the client disconnected before the prediction was ready"


def body_too_slow(timeout: float, size: int) -> RequestTimeout:
    """The error of a body not whole within BODY_TIMEOUT_SECONDS, `size` bytes of it come."""
    return RequestTimeout(
        f"the request body did not arrive within {timeout:g} s (BODY_TIMEOUT_SECONDS); "
        f"{size} bytes came"
    )


async def read_body(
    request: Request, limit: int, timeout: float = 30.0, held: Held | None = None
) -> bytes:
    """The whole body, refusing more than `limit` bytes (MAX_BODY_BYTES) before reading it all,
    each byte reserved first from the process's budget (`held`, from BodyBudget.hold).

    Raises:
        PayloadTooLarge: over the limit (413).
        BodiesInFlight: the process's budget has no room for it (503).
        RequestTimeout: the body took longer than `timeout` seconds (BODY_TIMEOUT_SECONDS).
        ClientClosedRequest: the client hung up before sending it all (499: not a 5xx).
    """
    declared = request.headers.get("content-length")
    # Past 18 digits it is over any limit (and int() refuses past 4,300).
    if declared and declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
        raise PayloadTooLarge(
            f"request body is {declared} bytes; the limit is {limit} bytes (MAX_BODY_BYTES)"
        )
    # A declared length is reserved whole, before anything is read; then only what passes it.
    reserved = int(declared) if declared and declared.isdigit() else 0
    if held is not None and reserved:
        held.reserve(reserved)
    chunks, size = [], 0
    # A plain timer rather than asyncio.timeout, whose bookkeeping cost a twentieth of the
    # loop's CPU per one-image prediction (in-process, with and without).
    task = asyncio.current_task()
    cancelling = task.cancelling()
    late = False

    def too_late() -> None:
        nonlocal late
        late = True
        task.cancel()

    timer = asyncio.get_running_loop().call_later(timeout, too_late)
    try:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                raise ClientClosedRequest(LEFT_MID_BODY)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(
                    f"request body exceeds the limit of {limit} bytes (MAX_BODY_BYTES)"
                )
            if held is not None and size > reserved:
                held.reserve(size - reserved)
                reserved = size
            if not message.get("more_body", False):
                # Mostly the whole body came in one message: no join, no copy.
                return b"".join((*chunks, chunk)) if chunks else chunk
            chunks.append(chunk)
    except asyncio.CancelledError:
        # Ours only when nothing else cancelled the task meanwhile (asyncio.timeout's rule).
        if late:
            late = False
            if task.uncancel() <= cancelling:
                raise body_too_slow(timeout, size) from None
        raise
    finally:
        timer.cancel()
        if late:  # it fired, but its cancellation never came through: take it back
            task.uncancel()


async def _wait_for_disconnect(request: Request) -> None:
    # The body is fully read by now, so the next message can only be the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


# A request still unanswered after this long starts watching for its client to leave; most are
# answered sooner and never pay for the watcher (a task, and two turns of the loop to start
# and cancel it: about a tenth of the loop's CPU per one-image prediction, measured in-process).
WATCH_AFTER_SECONDS = 0.02


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it if the client disconnects first (frees its batch slot).
    The client is watched from WATCH_AFTER_SECONDS on.

    Raises:
        ClientClosedRequest: the client left before the work was done.
    """
    handler = asyncio.current_task()
    disconnected = False
    watcher: asyncio.Task | None = None

    def on_disconnect(task: asyncio.Task) -> None:
        nonlocal disconnected
        if not task.cancelled() and task.exception() is None:
            disconnected = True
            handler.cancel()

    def watch() -> None:
        nonlocal watcher
        watcher = asyncio.ensure_future(_wait_for_disconnect(request))
        watcher.add_done_callback(on_disconnect)

    timer = asyncio.get_running_loop().call_later(WATCH_AFTER_SECONDS, watch)
    try:
        return await work
    except asyncio.CancelledError:
        if disconnected:
            handler.uncancel()  # the cancellation was ours, and is answered as this error
            raise ClientClosedRequest(LEFT_BEFORE_ANSWER) from None
        raise
    finally:
        timer.cancel()
        if watcher is not None:
            watcher.remove_done_callback(on_disconnect)
            watcher.cancel()
