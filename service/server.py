"""The HTTP server around the app: uvicorn, hardened against slow and oversized clients, its
writes coalesced, and drained on SIGTERM.

- **Headers**: a request's header section may hold at most MAX_HEADER_BYTES (431 otherwise,
  before httptools buffers any more of it) and must arrive within HEADER_TIMEOUT_SECONDS of
  its first byte, or of the connection when nothing comes (408). uvicorn itself has neither
  limit with httptools.
- **Bodies** are bounded by the app (MAX_BODY_BYTES, BODY_TIMEOUT_SECONDS:
  service/protocols/http.py); idle keep-alive connections close after
  KEEPALIVE_TIMEOUT_SECONDS; MAX_CONNECTIONS bounds connections and requests at once (uvicorn's
  limit_concurrency: 503 past it).
- **SIGTERM**: /readyz turns 503 at once (a load balancer stops sending), the listener stays
  open and serves for DRAIN_SECONDS, then closes; in-flight requests get
  SHUTDOWN_TIMEOUT_SECONDS to finish, and the process exits 0. A second SIGTERM, or Ctrl-C,
  skips the drain. From the SIGTERM on, every answer carries `connection: close` (as Go's
  server does when shutting down), so a busy client is on a fresh connection by the time the
  listener closes, not on a kept-alive one the server may close under its next request. A
  connection accepted but with no request yet when the listener closes gets a moment
  (FRESH_CONNECTION_GRACE) for it: the client connected to send one.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
import types
from collections.abc import Callable, Sequence

import orjson
import uvicorn
from starlette.responses import Response
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from service.directlane import DirectLane, Taken, response_bytes
from service.errors import ClientClosedRequest
from service.fastlane import url_path
from service.protocols.http import body_too_slow

log = logging.getLogger("service.server")


def _status_response(status: int, reason: str, message: str) -> bytes:
    body = orjson.dumps({"error": message})
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode("ascii") + body


class CoalescingTransport:
    """A transport whose writes in one turn of the event loop go out as one.

    uvicorn writes a response's status line and headers, then its body: two write() calls,
    two TCP segments, two wake-ups of the client, for a 300-byte answer. Here both land in one
    buffer and go out together at the end of the turn (loop.call_soon): one segment, and about
    5% less server CPU per one-image prediction at 64 clients (A/B with wrk, 8 alternating
    5-second runs). Everything else is the real transport's.
    """

    def __init__(self, transport, loop):
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def write_now(self, data: bytes) -> None:
        """Write at once, after anything pending: for an answer already in one piece."""
        if self._pending:
            self._pending.append(data)
            self.flush()
        elif not self._transport.is_closing():
            self._transport.write(data)

    def flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name):
        return getattr(self._transport, name)


class EarlyRefusal:
    """Refuses a prediction from its request line, before the app sees it, while the model's
    queue is full: a 503 with Retry-After and the app's own error body, written by the
    protocol itself. Under overload most requests are refusals; through the whole ASGI stack
    each cost about 55 us of the event loop, which delayed every good answer behind them.

    Args:
        full: whether a new prediction would be refused (the batching queue is full).
        routes: the routes to refuse (POST): the predictions'.
        message: the error the body carries.
        on_refused: called with the refused route's template (metrics, the rate-limited log).
    """

    def __init__(
        self,
        full: Callable[[], bool],
        routes: Sequence,
        message: str,
        on_refused: Callable[[str], None],
    ):
        self.full = full
        self.routes = list(routes)
        self.message = message
        self.on_refused = on_refused
        body = orjson.dumps({"error": message})
        self.head = (
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nretry-after: 1\r\nx-content-type-options: nosniff\r\n"
            % len(body)
        )
        self.body = body

    def __call__(self, method: bytes, url: bytes, headers: list) -> bool:
        if method != b"POST" or not self.full():
            return False
        # A browser's cross-origin call gets the app's answer, with its CORS headers.
        if any(name == b"origin" for name, _ in headers):
            return False
        path = url_path(url)
        for route in self.routes:
            if route.path_regex.match(path):
                self.on_refused(route.path_format)
                return True
        return False


class _NoWaiter:
    """The message event of a request no app reads: uvicorn sets it when the connection goes."""

    def set(self) -> None:
        pass


# The cycle of a request the protocol answered itself: finished, so uvicorn drops the rest of
# its body as it comes and treats the connection as idle.
_ANSWERED = types.SimpleNamespace(
    response_complete=True, keep_alive=True, disconnected=False, message_event=_NoWaiter()
)


class _DirectCycle:
    """A request the direct lane answers, as uvicorn and the drain see it: not complete until
    its answer is written; `keep_alive` turned off by a drain or a shutdown."""

    __slots__ = ("taken", "keep_alive", "http_version", "response_complete", "disconnected",
                 "task", "timer", "message_event")  # fmt: skip

    def __init__(self, taken: Taken, keep_alive: bool, http_version: str):
        self.taken = taken
        self.keep_alive = keep_alive
        self.http_version = http_version
        self.response_complete = False
        self.disconnected = False
        self.task: asyncio.Task | None = None  # once its body is in
        self.timer: asyncio.TimerHandle | None = None  # the body's deadline
        self.message_event = _NoWaiter()


# How long a connection with no request yet stays open once the server shuts down.
FRESH_CONNECTION_GRACE = 1.0


def _draining(server_state) -> bool:
    return getattr(server_state, "draining", False)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header size limit and a header timeout.

    The limits are class attributes: `guarded_protocol()` makes a subclass with the
    settings' values (uvicorn builds one protocol object per connection from the class).
    """

    max_header_bytes = 32 * 1024
    header_timeout = 10.0
    refusal: EarlyRefusal | None = None
    direct: DirectLane | None = None
    _direct: _DirectCycle | None = None  # the request the direct lane answers now
    _direct_body: list[bytes] | None = None  # its body, while it comes

    def connection_made(self, transport) -> None:
        super().connection_made(CoalescingTransport(transport, self.loop))
        self._header_bytes = 0
        self._in_headers = True
        self._message_open = False
        self._header_timer = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self._in_headers and not self.transport.is_closing():
            log.info("Closing a connection from %s: headers not complete in %gs", self.client,
                     self.header_timeout)  # fmt: skip
            message = f"request headers not complete within {self.header_timeout:g} s"
            self.transport.write(_status_response(408, "Request Timeout", message))
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._in_headers:
            end = data.find(b"\r\n\r\n")
            counted = len(data) if end < 0 else end + 4
            self._header_bytes += counted
            if self._header_bytes > self.max_header_bytes:
                self._cancel_header_timer()
                message = f"request headers exceed {self.max_header_bytes} bytes (MAX_HEADER_BYTES)"
                self.transport.write(
                    _status_response(431, "Request Header Fields Too Large", message)
                )
                self.transport.close()
                return
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._message_open = True
        if not self._in_headers:
            # A request that began in the same read as the previous one's end (pipelined):
            # its headers are counted from the next read on, not left uncounted.
            self._in_headers = True
            self._header_bytes = 0
        # A request is under way: an answer written while this read was parsed (a refusal)
        # armed the keep-alive timer, which must not close the connection under this one.
        self._unset_keepalive_if_required()
        if self._header_timer is None:
            # The next request on a kept-alive connection: its headers get the same time.
            self._header_timer = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def on_body(self, body: bytes) -> None:
        if self._direct_body is not None:
            self._direct_body.append(body)  # at most MAX_BODY_BYTES: its length was checked
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._message_open = False
        if self._direct_body is not None:
            self._start_direct()
            return
        answered = self.cycle is not None and self.cycle.response_complete
        if answered:
            # Answered before its body was all read (a refusal): the next request's headers
            # are counted from their first byte.
            self._in_headers = True
            self._header_bytes = 0
        super().on_message_complete()
        if (
            answered
            and not self.pipeline
            and self.timeout_keep_alive_task is None
            and not self.transport.is_closing()
        ):
            # The body's reads cancelled the keep-alive timer the answer had armed: the
            # connection is idle again, and must not stay open forever.
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self._message_open:
            # The next request's headers are counted from their first byte (unless it is
            # already being read: a pipelined one).
            self._in_headers = True
            self._header_bytes = 0

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._cancel_header_timer()
        if self.transport.is_closing():
            return  # a request pipelined behind one whose answer closed the connection
        refusal = self.refusal
        # Never ahead of a pipelined request still being answered: answers keep their order.
        idle = self.cycle is None or self.cycle.response_complete
        if (
            refusal is not None
            and idle
            and refusal(self.parser.get_method(), self.url, self.headers)
        ):
            self._answer_refusal(refusal)
            return
        if self.direct is not None and idle and self._take_direct(self.direct):
            return
        super().on_headers_complete()
        cycle = self.cycle
        if _draining(self.server_state) and cycle is not None and cycle is not _ANSWERED:
            cycle.keep_alive = False

    def _answer_refusal(self, refusal: EarlyRefusal) -> None:
        keep_alive = (
            self.parser.get_http_version() == "1.1"
            and self.parser.should_keep_alive()
            and not _draining(self.server_state)
            # A client waiting for 100 Continue may or may not send its body now: closing
            # is the one way its next request is not read as this one's body.
            and not self.expect_100_continue
        )
        defaults = b"".join(name + b": " + value + b"\r\n"
                            for name, value in self.server_state.default_headers)  # fmt: skip
        connection = b"" if keep_alive else b"connection: close\r\n"
        self.cycle = _ANSWERED
        self.transport.write(refusal.head + defaults + connection + b"\r\n" + refusal.body)
        if not keep_alive:
            self.transport.close()
            return
        self.on_response_complete()

    # --- the direct lane (service/directlane.py) ---------------------------------------------
    def _take_direct(self, lane: DirectLane) -> bool:
        if self.flow.write_paused:
            return False  # the client is not reading: the app's path waits for it to
        limit = self.limit_concurrency
        if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
            return False  # uvicorn answers 503
        if self.parser.should_upgrade():
            return False
        taken = lane.take(self.parser.get_method(), self.url, self.headers)
        if taken is None:
            return False
        version = self.parser.get_http_version()
        keep_alive = (
            version != "1.0"
            and self.parser.should_keep_alive()
            and not _draining(self.server_state)
        )
        cycle = _DirectCycle(taken, keep_alive, version)
        cycle.timer = self.loop.call_later(lane.body_timeout, self._direct_body_too_slow, cycle)
        self.cycle = self._direct = cycle
        self._direct_body = []
        return True

    def _start_direct(self) -> None:
        cycle = self._direct
        body = b"".join(self._direct_body)
        self._direct_body = None
        cycle.timer.cancel()
        cycle.timer = None
        lane = self.direct
        refused = lane.refusal(cycle.taken)
        if refused is not None:
            # Under overload most requests end here: no task, no parse.
            self._write_direct(cycle, refused)
            lane.finish(cycle.taken, refused.status_code)
            return
        cycle.task = task = self.loop.create_task(self._answer_direct(cycle, body))
        # Among uvicorn's tasks: a shutdown waits for it as for the app's.
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _answer_direct(self, cycle: _DirectCycle, body: bytes) -> None:
        lane = self.direct
        status = 500  # as MetricsMiddleware counts a request cancelled by a shutdown
        try:
            response = await lane.answer(cycle.taken, body)
            status = response.status_code
            self._write_direct(cycle, response)
        except asyncio.CancelledError:
            if not cycle.disconnected:
                # Cancelled by a shutdown past its grace: answered as uvicorn answers the
                # app's unfinished requests then, and closed.
                cycle.keep_alive = False
                self._write_direct(cycle, Response(b"Internal Server Error", 500,
                                                   media_type="text/plain"))  # fmt: skip
                raise
            # As the app answers (and logs) a client that left before its answer.
            leaving = ClientClosedRequest("the client disconnected before the prediction was ready")
            status = lane.render(cycle.taken, leaving).status_code
        finally:
            lane.finish(cycle.taken, status)

    def _write_direct(self, cycle: _DirectCycle, response) -> None:
        if cycle.disconnected or self.transport.is_closing():
            return
        taken = cycle.taken
        if self.access_log and self.access_logger.isEnabledFor(logging.INFO):
            scope = {"client": self.client, "path": taken.path, "query_string": taken.query}
            self.access_logger.info(
                '%s - "%s %s HTTP/%s" %d', get_client_addr(scope), "POST",
                get_path_with_query_string(scope), cycle.http_version, response.status_code,
            )  # fmt: skip
        # A drain that began while it ran (pipelined requests hide it from the drain's pass).
        keep_alive = cycle.keep_alive and not _draining(self.server_state)
        # One piece already: written now, not at the end of the loop's turn.
        self.transport.write_now(
            response_bytes(response, self.server_state.default_headers, keep_alive)
        )
        cycle.response_complete = True
        self._direct = None
        if not keep_alive:
            self.transport.close()
        self.on_response_complete()

    def _direct_body_too_slow(self, cycle: _DirectCycle) -> None:
        cycle.timer = None
        if self._direct is not cycle or cycle.task is not None:
            return
        lane = self.direct
        size = sum(map(len, self._direct_body))
        self._direct_body = None
        response = lane.render(cycle.taken, body_too_slow(lane.body_timeout, size))
        # The rest of the body would be read as the next request: the connection ends.
        cycle.keep_alive = False
        self._write_direct(cycle, response)
        lane.finish(cycle.taken, response.status_code)

    def _direct_connection_lost(self) -> None:
        cycle = self._direct
        if cycle is None or cycle.response_complete:
            return
        cycle.disconnected = True
        if cycle.task is not None:
            cycle.task.cancel()  # _answer_direct counts it
            return
        # Gone while sending the body: as the app answers (and logs) it.
        if cycle.timer is not None:
            cycle.timer.cancel()
        self._direct_body = None
        lane = self.direct
        leaving = ClientClosedRequest("the client disconnected while sending the body")
        status = lane.render(cycle.taken, leaving).status_code
        lane.finish(cycle.taken, status)

    def shutdown(self) -> None:
        if self._direct is not None:
            self._direct.keep_alive = False  # answered, then closed
        if self.cycle is None and not self.transport.is_closing():
            # Accepted with no request yet: its request may be on the wire. It is served (with
            # connection: close) if it comes soon; the header timeout bounds a slow one.
            self.loop.call_later(FRESH_CONNECTION_GRACE, self._close_if_no_request)
            return
        super().shutdown()

    def _close_if_no_request(self) -> None:
        if self.cycle is None and self._header_bytes == 0 and not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc) -> None:
        self._cancel_header_timer()
        self._direct_connection_lost()
        super().connection_lost(exc)


def guarded_protocol(
    max_header_bytes: int,
    header_timeout: float,
    refusal: EarlyRefusal | None = None,
    direct: DirectLane | None = None,
) -> type[HttpToolsProtocol]:
    """The protocol class uvicorn should use, with these limits (and early refusals, and the
    direct lane's predictions)."""
    return type(
        "GuardedHttpToolsProtocol",
        (GuardedHttpToolsProtocol,),
        {"max_header_bytes": max_header_bytes, "header_timeout": header_timeout,
         "refusal": refusal, "direct": direct},
    )  # fmt: skip


class DrainingServer(uvicorn.Server):
    """uvicorn's server, draining on the first SIGTERM before it shuts down.

    Args:
        config: uvicorn's configuration.
        drain_seconds: how long the listener stays open after SIGTERM.
        on_drain: called at once on SIGTERM (the app turns /readyz 503).
        on_shutdown: called when the listener closes, after the drain (gRPC stops with HTTP).
    """

    def __init__(
        self,
        config: uvicorn.Config,
        drain_seconds: float,
        on_drain: Callable[[], None],
        on_shutdown: Callable[[], None] | None = None,
    ):
        super().__init__(config)
        self.drain_seconds = drain_seconds
        self.on_drain = on_drain
        self.on_shutdown = on_shutdown
        self._drain_until: float | None = None

    def handle_exit(self, sig, frame) -> None:
        if sig == signal.SIGTERM and self._drain_until is None and not self.should_exit:
            # Not recorded as a captured signal: uvicorn would raise it again at the end,
            # and the process would die of it (exit code 143) instead of exiting 0.
            self._drain_until = time.monotonic() + self.drain_seconds
            self._stop_keeping_alive()
            self.on_drain()
            log.info("SIGTERM: draining for %gs, then shutting down", self.drain_seconds)
            return
        if sig == signal.SIGTERM:
            self.should_exit = True  # a second SIGTERM: stop draining, still exit 0
            return
        super().handle_exit(sig, frame)

    def _stop_keeping_alive(self) -> None:
        # Answers from now on close their connection; idle kept-alive ones close after their
        # next answer, or when the server shuts down.
        self.server_state.draining = True
        for connection in self.server_state.connections:
            cycle = getattr(connection, "cycle", None)
            if cycle is not None and cycle is not _ANSWERED and not cycle.response_complete:
                cycle.keep_alive = False

    async def shutdown(self, sockets=None) -> None:
        # Also when the drain was skipped (Ctrl-C, a second SIGTERM): no answer from now on
        # keeps its connection alive.
        self._stop_keeping_alive()
        if self.on_shutdown is not None:
            self.on_shutdown()
        await super().shutdown(sockets)

    async def on_tick(self, counter: int) -> bool:
        if self._drain_until is not None and time.monotonic() >= self._drain_until:
            self.should_exit = True
        return await super().on_tick(counter)
