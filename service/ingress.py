"""The ingress: the one ASGI app the server runs, and everything that happens to an HTTP
request between the server and its route's handler.

Every request passes the same steps, in this order:

1. **Metrics**: counted in flight and timed, then counted by route template and status; a
   route that serves a model (`Route.protocol`) also records that one measurement per model
   and in TF Serving's metrics (service/metrics.py), with the version and signature the data
   plane answered with (`SERVED`).
2. **Route**: matched in the one table of every protocol's routes (service/routes.py): a
   path no route has is 404, a method its routes do not take 405 (a protocol may answer its
   own prefix otherwise: TF Serving's 400 for a /v1 URL it cannot parse).
3. **Access** (service/security.py): a request for a host ALLOWED_HOSTS does not list gets
   400 (probes answer any); a cross-origin browser request is refused or given its CORS
   headers (a preflight is answered here); a request without a token of its route's scope
   gets 401 or 403.
4. **Admission**: the route's `before_body` check, before the body is read, so refusing costs
   next to nothing: predictions are refused with 503 while the batching queue is full,
   feedback while it is off.
5. **Body**: read whole within MAX_BODY_BYTES (413, checked against Content-Length first),
   within BODY_TIMEOUT_SECONDS (408), a client leaving mid-body is 499; and within the
   process's MAX_BODY_BYTES_IN_FLIGHT, summed over every request whose body is coming or held
   (service/budgets.py: 503 with Retry-After before a declared body is read, or as soon as a
   chunked one passes it), so memory is bounded across requests, not only per request.
6. **Handler**: called with a `Call` (body, headers, query, the sender the access rules found)
   and its path parameters, and cancelled if the client leaves before the answer is ready
   (which frees its place in the batch queue), or when it is not done within
   REQUEST_TIMEOUT_SECONDS (504, TF Serving's --rest_api_timeout_in_ms).
7. **Answer**: errors rendered by the one renderer (service/errors.py: error_response); every
   answer gets `X-Content-Type-Options: nosniff`, the request's `X-Request-ID` (the client's
   when it sent a good one, else a new one: artifact/logs.py) and, for allowed origins, CORS
   headers; the access line is written once it is sent. An
   answer says `connection: close` when the connection must not carry another request: the
   service is draining, or the request's body was refused unread and could not be set aside
   at once (so a client cannot hold the connection by sending it slowly).

It uses only the ASGI interface, so any ASGI server runs it (service/server.py says which
does, and why). gRPC (service/protocols/grpc_server.py) is the other ingress: it asks the same
access rule (security.bearer_problem, from the call's metadata), the same admission
(DataPlane.admit) and the same budgets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from starlette.datastructures import Headers, QueryParams
from starlette.responses import Response

from artifact.logs import RequestLog, current_request, request_id_of, trace_id_of
from service import tracing
from service.budgets import BodyBudget, Held
from service.errors import (
    ClientClosedRequest,
    NotFound,
    PayloadTooLarge,
    RequestTimeout,
    ServiceError,
    UpstreamTimeout,
    error_response,
    printable,
)
from service.metrics import SERVED, Metrics, Served
from service.metrics_tfserving import REST
from service.routes import Call, Match, NoSuchMethod, RouteTable
from service.security import NOSNIFF, Access, scope_of

log = logging.getLogger("service.ingress")
# One line per request at INFO (LOG_LEVEL info or debug): client, request line, status; as
# JSON, every field of the request's RequestLog (artifact/logs.py).
access_log = logging.getLogger("service.access")
T = TypeVar("T")

LEFT_MID_BODY = "the client disconnected while sending the body"
LEFT_BEFORE_ANSWER = "the client disconnected before the prediction was ready"
# A body refused unread is set aside (read and dropped, before the answer) when it is this
# small and comes this soon: its client reads the answer, and the connection can carry the
# next request. Otherwise the answer closes the connection, so a client cannot hold it by
# sending slowly; a client still sending then may lose the answer to a reset.
SET_ASIDE_BYTES = 1024 * 1024
SET_ASIDE_SECONDS = 1.0
# A request still unanswered after this long starts watching for its client to leave; most are
# answered sooner and never pay for the watcher (a task, and two turns of the loop to start
# and cancel it: about a tenth of the loop's CPU per one-image prediction, measured in-process).
WATCH_AFTER_SECONDS = 0.02
CLOSE = (b"connection", b"close")
_NO_QUERY = QueryParams()


class MethodNotAllowed(ServiceError):
    """The path is a route's, but not for this method (`allowed` lists those it takes)."""

    status = 405

    def __init__(self, message: str, allowed: tuple[str, ...]):
        super().__init__(message)
        self.allowed = allowed


Unmatched = Callable[[str, str], ServiceError | None]


class Ingress:
    """The ASGI app: the steps above for HTTP, and the lifespan for the server's start and
    stop.

    Args:
        table: every protocol's routes.
        metrics: the service's metrics.
        access: the host, origin and token rules.
        max_body_bytes, body_timeout: MAX_BODY_BYTES and BODY_TIMEOUT_SECONDS.
        request_timeout: REQUEST_TIMEOUT_SECONDS: the longest a handler may take; 0 = no limit.
        body_budget: the bytes of bodies held at once (MAX_BODY_BYTES_IN_FLIGHT), shared
            with gRPC.
        lifespan: entered when the server starts (the models load) and left when it stops.
        unmatched: a protocol's answer to a path under its prefix that no route has
            (prefix, lowercased -> (method, path) -> the error, or None for the usual 404/405).
    """

    def __init__(
        self,
        table: RouteTable,
        metrics: Metrics,
        access: Access,
        max_body_bytes: int,
        body_timeout: float,
        body_budget: BodyBudget | None = None,
        lifespan: Callable[[], contextlib.AbstractAsyncContextManager] | None = None,
        unmatched: dict[str, Unmatched] | None = None,
        request_timeout: float = 0.0,
    ):
        self.table = table
        self.request_timeout = request_timeout
        self.metrics = metrics
        self.access = access
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout
        self.body_budget = body_budget or BodyBudget(1 << 62)
        self.lifespan = lifespan
        self.unmatched = unmatched or {}
        # Set when the service starts draining: every answer from then on closes its
        # connection, so clients move to fresh ones before the listener closes.
        self.draining = False
        self._in_flight: set[asyncio.Task] = set()

    async def __call__(self, scope, receive, send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        else:  # a WebSocket: no route takes one
            await send({"type": "websocket.close", "code": 1008})

    def cancel_in_flight(self) -> None:
        """Cancel every request still being answered (the shutdown's time is up): each is
        counted as a request that ends without an answer."""
        for task in list(self._in_flight):
            task.cancel()

    # --- HTTP ----------------------------------------------------------------------------

    async def _http(self, scope, receive, send) -> None:
        metrics = self.metrics
        started = metrics.request_started()
        task = current_task()
        self._in_flight.add(task)
        method = scope["method"]
        request = request_log_of(scope)
        # Log records made while this request is answered carry its ids.
        token = current_request.set(request)
        status = 500  # what a request that ends without an answer (a shutdown) counts as
        template = "unmatched"
        read = False  # whether the body was read whole
        route = served = None
        traced = None
        if tracing.tracer is not None:
            traced = tracing.request_span(method, _trace_carrier(scope["headers"]),
                                          {"http.request.method": method,
                                           "url.path": scope["path"],
                                           "request.id": request.request_id})  # fmt: skip
            request.trace_id = tracing.trace_id(traced[0])
        try:
            found, template = self._match(method, scope["path"])
            if traced is not None:
                traced[0].update_name(f"{method} {template}")
            route = found.route if isinstance(found, Match) else None
            if route is not None and route.protocol:
                served = Served(route.protocol)
                SERVED.set(served)
            needed = scope_of(method) if route is None else route.scope
            decision = self.access.check(scope, needed, route is not None and route.probe)
            extra = [NOSNIFF, (b"x-request-id", request.request_id.encode()), *decision.headers]
            if decision.refusal is not None:
                response = decision.refusal
            elif not isinstance(found, Match):
                response = error_response(method, scope["path"], found)
                if isinstance(found, MethodNotAllowed):
                    response.headers["allow"] = ", ".join(found.allowed)
            else:
                route = found.route
                headers = Headers(scope=scope)
                query = QueryParams(scope["query_string"]) if scope["query_string"] else _NO_QUERY
                try:
                    if route.before_body is not None:
                        with tracing.span("admission"):
                            route.before_body(found.params, query)
                    with self.body_budget.hold() as held:
                        body = b""
                        if route.body is not None:
                            with tracing.span("read body"):
                                body = await read_body(receive, headers, self.max_body_bytes,
                                                       self.body_timeout, held)  # fmt: skip
                            read = True
                        call = Call(body, headers, query, held.reserve, decision.sender)
                        work = route.handler(call, **found.params)
                        response = await unless_disconnected(receive, work,
                                                             self.request_timeout)  # fmt: skip
                except Exception as err:  # noqa: BLE001 - rendered as every handler's error is
                    response = error_response(method, scope["path"], err)
            if (not read and not await self._set_aside(scope, receive)) or self.draining:
                extra.append(CLOSE)
            status = response.status_code
            await _answer(response, extra, scope, receive, send)
        finally:
            self._in_flight.discard(task)
            seconds = metrics.request_finished(template, method, status, started)
            if served is not None and isinstance(found, Match):
                route = found.route
                name = found.params.get("name") or served.model
                measured = metrics.route(id(route), route.protocol, route.tf_api, REST, name)
                measured.finished(status < 400, status, seconds, served)
            if access_log.isEnabledFor(logging.INFO):
                request.status = status
                request.duration_ms = round((time.perf_counter() - started) * 1000, 3)
                access_log.info('%s - "%s %s HTTP/%s" %d', request.client, printable(method),
                                printable(_path_with_query(scope)), scope["http_version"],
                                status, extra={"request": request})  # fmt: skip
            if traced is not None:
                tracing.end_request(*traced, {"http.route": template,
                                              "http.response.status_code": status,
                                              "model": request.model,
                                              "model.version": request.version,
                                              "model.signature": request.signature},
                                    error=status >= 500)  # fmt: skip
            current_request.reset(token)

    def _match(self, method: str, path: str) -> tuple[Match | ServiceError, str]:
        """The request's route, or the error that answers it (the protocol's own for a path
        under its prefix, else 404 or 405); and the route template it counts under."""
        template = "unmatched"
        found: Match | ServiceError | None
        try:
            found = self.table.match(method, path)
        except NoSuchMethod as err:
            # The path is a route's: counted as the route's.
            found, template = MethodNotAllowed("Method Not Allowed", err.allowed), err.template
        if isinstance(found, Match):
            return found, found.route.template
        end = path.find("/", 1)
        answer = self.unmatched.get((path if end < 0 else path[:end]).lower())
        error = answer(method, path) if answer is not None else None
        return error or found or NotFound("Not Found"), template

    async def _set_aside(self, scope, receive) -> bool:
        """Read and drop a body its request was answered without (a refusal, a route that
        takes none): True when there was none, or it was small and came at once, so the
        connection may carry the next request."""
        declared = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                declared = value
            elif name == b"transfer-encoding" or name == b"expect":
                return False  # chunked, or waiting for 100-continue: nothing to wait for
        if declared is None or declared == b"0":
            return True
        if not declared.isdigit() or len(declared) > 9 or int(declared) > SET_ASIDE_BYTES:
            return False
        try:
            async with asyncio.timeout(SET_ASIDE_SECONDS):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        return False
                    if not message.get("more_body", False):
                        return True
        except TimeoutError:
            return False

    # --- the lifespan --------------------------------------------------------------------

    async def _lifespan(self, receive, send) -> None:
        message = await receive()
        if message["type"] != "lifespan.startup":
            return
        started: contextlib.AbstractAsyncContextManager | None = None
        if self.lifespan is not None:
            started = self.lifespan()
            try:
                await started.__aenter__()
            except Exception as err:  # noqa: BLE001 - the server says so, and stops
                log.exception("The service failed to start")
                await send({"type": "lifespan.startup.failed", "message": str(err)})
                return
        await send({"type": "lifespan.startup.complete"})
        message = await receive()
        try:
            if started is not None:
                await started.__aexit__(None, None, None)
        except Exception as err:  # noqa: BLE001 - the server says so
            log.exception("The service failed to stop cleanly")
            await send({"type": "lifespan.shutdown.failed", "message": str(err)})
            return
        await send({"type": "lifespan.shutdown.complete"})


def request_log_of(scope) -> RequestLog:
    """A request's log record as it comes: its id (the client's X-Request-ID when it is a
    good one, else a new one), the trace id of its `traceparent`, method, path and client."""
    sent_id = traceparent = None
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            sent_id = value
        elif name == b"traceparent":
            traceparent = value
    client = scope.get("client")
    return RequestLog(
        request_id_of(sent_id),
        trace_id_of(traceparent),
        scope["method"],
        scope["path"],
        f"{client[0]}:{client[1]}" if client else "-",
    )


def _trace_carrier(headers) -> dict[str, str]:
    """A request's W3C Trace Context headers, for the propagator."""
    return {
        name.decode("latin-1"): value.decode("latin-1")
        for name, value in headers
        if name == b"traceparent" or name == b"tracestate"
    }


def _path_with_query(scope) -> str:
    query = scope.get("query_string")
    return scope["path"] + ("?" + query.decode("latin-1") if query else "")


async def _answer(response: Response, extra: list[tuple[bytes, bytes]], scope, receive, send):
    """Send a response with the ingress's headers (those it set itself not repeated)."""
    headers = response.raw_headers
    present = {name for name, _ in headers}
    headers = headers + [h for h in extra if h[0] not in present]
    body = getattr(response, "body", None)
    if body is not None and type(response).__call__ is Response.__call__:
        # A whole body: two messages, as Response.__call__ sends it.
        await send({"type": "http.response.start", "status": response.status_code,
                    "headers": headers})  # fmt: skip
        await send({"type": "http.response.body", "body": body})
        return
    response.raw_headers = headers  # a file or a stream: it sends itself
    await response(scope, receive, send)


async def read_body(
    receive, headers: Headers, limit: int, timeout: float = 30.0, held: Held | None = None
) -> bytes:
    """The whole body, refusing more than `limit` bytes (MAX_BODY_BYTES) before reading it all,
    each byte reserved first from the process's budget (`held`, from BodyBudget.hold).

    Raises:
        PayloadTooLarge: over the limit (413).
        BodiesInFlight: the process's budget has no room for it (503).
        RequestTimeout: the body took longer than `timeout` seconds (BODY_TIMEOUT_SECONDS).
        ClientClosedRequest: the client hung up before sending it all (499: not a 5xx).
    """
    declared = headers.get("content-length")
    # Past 18 digits it is over any limit (and int() refuses past 4,300).
    if declared and declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
        raise PayloadTooLarge(
            f"request body is {declared} bytes; the limit is {limit} bytes (MAX_BODY_BYTES)"
        )
    # A declared length is reserved whole, before anything is read; then only what passes it.
    reserved = int(declared) if declared and declared.isdigit() else 0
    if held is not None and reserved:
        held.reserve(reserved)
    chunks: list[bytes] = []
    size = 0
    # A plain timer rather than asyncio.timeout, whose bookkeeping cost a twentieth of the
    # loop's CPU per one-image prediction (in-process, with and without).
    task = current_task()
    cancelling = task.cancelling()
    late = False

    def too_late() -> None:
        nonlocal late
        late = True
        task.cancel()

    timer = asyncio.get_running_loop().call_later(timeout, too_late)
    try:
        while True:
            message = await receive()
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


def current_task() -> asyncio.Task:
    """The task running this code (an ASGI call always runs in one).

    Raises:
        RuntimeError: called outside a task.
    """
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("no task is running: ASGI calls run in tasks")
    return task


def body_too_slow(timeout: float, size: int) -> RequestTimeout:
    """The error of a body not whole within BODY_TIMEOUT_SECONDS, `size` bytes of it come."""
    return RequestTimeout(
        f"the request body did not arrive within {timeout:g} s (BODY_TIMEOUT_SECONDS); "
        f"{size} bytes came"
    )


async def _wait_for_disconnect(receive) -> None:
    # The body is fully read by now (or none is read), so what comes next can only be the
    # disconnect.
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(receive, work: Awaitable[T], timeout: float = 0.0) -> T:
    """Await `work`, cancelling it if the client disconnects first (frees its batch slot), or
    when it is not done within `timeout` seconds (0: no limit). The client is watched, and the
    time kept, from WATCH_AFTER_SECONDS on: most requests are done sooner and pay for neither.

    Raises:
        ClientClosedRequest: the client left before the work was done.
        UpstreamTimeout: the work took longer than `timeout` (504).
    """
    handler = current_task()
    disconnected = False
    expired = False
    watcher: asyncio.Task | None = None
    deadline: asyncio.TimerHandle | None = None
    loop = asyncio.get_running_loop()

    def on_disconnect(task: asyncio.Task) -> None:
        nonlocal disconnected
        if not task.cancelled() and task.exception() is None:
            disconnected = True
            handler.cancel()

    def expire() -> None:
        nonlocal expired
        if not disconnected:
            expired = True
            handler.cancel()

    def watch() -> None:
        nonlocal watcher, deadline
        watcher = asyncio.ensure_future(_wait_for_disconnect(receive))
        watcher.add_done_callback(on_disconnect)
        if timeout > WATCH_AFTER_SECONDS:
            deadline = loop.call_later(timeout - WATCH_AFTER_SECONDS, expire)

    timer = loop.call_later(WATCH_AFTER_SECONDS, watch)
    if 0 < timeout <= WATCH_AFTER_SECONDS:
        deadline = loop.call_later(timeout, expire)
    try:
        return await work
    except asyncio.CancelledError:
        # The cancellation was ours, and is answered as one of these errors.
        if disconnected:
            handler.uncancel()
            raise ClientClosedRequest(LEFT_BEFORE_ANSWER) from None
        if expired:
            handler.uncancel()
            raise UpstreamTimeout(
                f"the request was not answered within {timeout:g} s (REQUEST_TIMEOUT_SECONDS)"
            ) from None
        raise
    finally:
        timer.cancel()
        if deadline is not None:
            deadline.cancel()
        if watcher is not None:
            watcher.remove_done_callback(on_disconnect)
            watcher.cancel()
