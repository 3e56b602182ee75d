"""The HTTP server around the app: uvicorn, hardened against slow and oversized clients, its
writes coalesced, and drained on SIGTERM. The one module that touches uvicorn's internals:
`UVICORN_INTERNALS` names each one, `missing_uvicorn_internals()` checks them (the server
refuses to start without them; tests/.../test_server.py checks the pinned uvicorn).

- **Headers**: a request's header section may hold at most MAX_HEADER_BYTES (431 otherwise,
  before httptools buffers any more of it) and must arrive within HEADER_TIMEOUT_SECONDS of
  its first byte, or of the connection when nothing comes (408). uvicorn itself has neither
  limit with httptools.
- **Bodies** are bounded by the door (MAX_BODY_BYTES, BODY_TIMEOUT_SECONDS: service/door.py);
  idle keep-alive connections close after KEEPALIVE_TIMEOUT_SECONDS; MAX_CONNECTIONS bounds
  connections and requests at once (uvicorn's limit_concurrency: 503 past it).
- **The direct transport**: a POST with a Content-Length (and none of ASGI_ONLY_HEADERS) is
  offered to the door at its headers (service/door.py: `Door.take`, which asks the same
  access rules, route, method, admission and body budget as for any request). A request the
  door takes has its body gathered here, within BODY_TIMEOUT_SECONDS, and its answer written
  as bytes, exactly as uvicorn's cycle would write it; a client that leaves cancels its
  handler. It skips uvicorn's ASGI cycle (the scope's copy, an event, the `send` messages and
  their checks), about a fifth of the server's CPU per one-image prediction
  (docs/benchmarks.md). Everything else, a refusal included, goes through uvicorn's cycle to
  the ASGI app, and so through the same door.
- **Connections** are accepted by asyncio's event loop (EVENT_LOOP), every waiting one when
  the listener is readable, so a new client is not left in the listen queue under load.
- **Keep-alive** follows one rule, uvicorn's (HTTP/1.1 unless the client says close; HTTP/1.0
  only when it asks), which a drain turns off.
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
import inspect
import logging
import re
import signal
import time
import urllib.parse
from collections.abc import Callable
from functools import partial

import httptools
import orjson
import uvicorn
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string
from uvicorn.server import ServerState

from service.door import LEFT_MID_BODY, Answer, Door, Taken, body_too_slow
from service.errors import ClientClosedRequest

log = logging.getLogger("service.server")

# The event loop uvicorn runs: asyncio's own, not uvloop. libuv, under uvloop, accepts one
# connection per turn of the loop (since libuv 1.45), and under load a turn takes tens of
# milliseconds: in a flood of 512 connections the listener's queue drained at about 20 a
# second, and a new connection's first request (a Kubernetes probe's, say) waited 4-9 s.
# asyncio accepts every waiting connection, up to the backlog, when the listener is
# readable. At 64 clients it serves as many requests per second (docs/benchmarks.md).
EVENT_LOOP = "asyncio"


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
        """Write a whole answer at once (after anything pending): no turn to wait for."""
        self.flush()
        if not self._transport.is_closing():
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


# How long a connection with no request yet stays open once the server shuts down.
FRESH_CONNECTION_GRACE = 1.0


class Drain:
    """Whether the server is draining: shared by the server and its connections' protocol
    (a flag of ours, not an attribute added to uvicorn's ServerState)."""

    def __init__(self) -> None:
        self.on = False


# Headers that some part of the ASGI path must see: requests with one are not taken direct.
ASGI_ONLY_HEADERS = frozenset({
    b"expect",  # 100-continue: uvicorn's cycle answers it when the body is first read
    b"transfer-encoding",  # no length known up front: read by the door's read_body
    b"upgrade",  # a WebSocket's (refused by uvicorn)
    b"x-forwarded-for",  # uvicorn's proxy headers rewrite the client and scheme
    b"x-forwarded-proto",
})  # fmt: skip


class _DirectCycle:
    """A request the direct transport answers, as uvicorn's protocol and the drain see it (the
    protocol's `cycle`): not complete until answered; keep-alive turned off by a drain.
    `chunks` holds its body while it comes, and is None once it is whole."""

    __slots__ = ("taken", "scope", "keep_alive", "response_complete", "chunks", "timer")

    def __init__(self, taken: Taken, scope: dict, keep_alive: bool):
        self.taken = taken
        self.scope = scope  # as uvicorn made it: the path as sent, for the access line
        self.keep_alive = keep_alive
        self.response_complete = False
        self.chunks: list[bytes] | None = []
        self.timer: asyncio.TimerHandle | None = None


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header size limit, a header timeout, coalesced
    writes, and keep-alive turned off by a drain.

    The limits are class attributes: `guarded_protocol()` makes a subclass with the
    settings' values (uvicorn builds one protocol object per connection from the class).
    """

    max_header_bytes = 32 * 1024
    header_timeout = 10.0
    drain = Drain()
    door: Door | None = None  # None: every request goes to the ASGI app

    def connection_made(self, transport) -> None:
        super().connection_made(CoalescingTransport(transport, self.loop))
        self._direct: _DirectCycle | None = None
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
        direct = self._direct
        if direct is not None and direct.chunks is not None and direct.timer is None:
            # Its body is still coming: it has BODY_TIMEOUT_SECONDS from now, as in the door.
            direct.timer = self.loop.call_later(self.door.body_timeout, self._body_too_slow)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._message_open = True
        if not self._in_headers:
            # A request that began in the same read as the previous one's end (pipelined):
            # its headers are counted from the next read on, not left uncounted.
            self._in_headers = True
            self._header_bytes = 0
        if self._header_timer is None:
            # The next request on a kept-alive connection: its headers get the same time.
            self._header_timer = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def on_body(self, body: bytes) -> None:
        direct = self._direct
        if direct is not None and direct.chunks is not None:
            direct.chunks.append(body)
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._message_open = False
        direct = self._direct
        if direct is not None and direct.chunks is not None:
            self._start_direct(direct)
            return
        # Answered before its body was all read (refused at the door, before the body).
        answered = self.cycle is not None and self.cycle.response_complete
        if answered:
            # The next request's headers are counted from their first byte.
            self._in_headers = True
            self._header_bytes = 0
        super().on_message_complete()
        if (
            answered
            and not self.pipeline
            and self.timeout_keep_alive_task is None
            and not self.transport.is_closing()
        ):
            # The body's reads cancelled the keep-alive timer the answer had armed (uvicorn
            # cancels it on every read): the connection is idle again, and must not stay
            # open forever.
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
        if self.door is not None and self._take_direct():
            return
        super().on_headers_complete()
        if self.drain.on and self.cycle is not None:
            self.cycle.keep_alive = False

    def shutdown(self) -> None:
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
        if isinstance(self.cycle, _DirectCycle):
            self.cycle = None  # uvicorn's connection_lost tells only a cycle of its own
        direct = self._direct
        if direct is not None:
            self._direct = None
            if direct.chunks is None:
                direct.taken.client_left()  # its handler is cancelled: 499, to nobody
            else:
                self._cancel_body_timer(direct)
                self.door.refuse_taken(direct.taken, ClientClosedRequest(LEFT_MID_BODY))
        super().connection_lost(exc)

    # --- the direct transport: a Call route's request, answered past uvicorn's ASGI cycle ---

    def _take_direct(self) -> bool:
        # At a request's headers: the door takes it (service/door.py: Door.take), or uvicorn's
        # cycle runs the ASGI app for it, as for every request the door does not take.
        if self.parser.get_method() != b"POST" or (
            self.cycle is not None and not self.cycle.response_complete
        ):
            return False  # pipelined behind one not yet answered: uvicorn queues it
        if self.flow.write_paused:
            return False  # a client not reading its answers: uvicorn's cycle waits for it
        limit = self.limit_concurrency
        if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
            return False  # uvicorn answers 503
        declared = None
        for name, value in self.headers:
            if name in ASGI_ONLY_HEADERS or (name == b"content-length" and declared is not None):
                return False
            if name == b"content-length":
                declared = value
        if declared is None or not declared.isdigit() or len(declared) > 18:
            return False
        scope = self.scope
        scope["method"] = "POST"
        http_version = self.parser.get_http_version()
        if http_version != "1.1":
            scope["http_version"] = http_version
        url = httptools.parse_url(self.url)
        path = url.path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        scope["path"] = self.root_path + path
        scope["raw_path"] = self.root_path.encode("ascii") + url.path
        scope["query_string"] = url.query or b""
        taken = self.door.take(scope, int(declared))
        if taken is None:
            return False
        keep_alive = http_version != "1.0" and self.parser.should_keep_alive()
        self._direct = self.cycle = _DirectCycle(taken, scope, keep_alive and not self.drain.on)
        return True

    def _start_direct(self, direct: _DirectCycle) -> None:
        self._cancel_body_timer(direct)
        body = b"".join(direct.chunks) if len(direct.chunks) != 1 else direct.chunks[0]
        direct.chunks = None
        task = self.loop.create_task(self._answer_direct(direct, body))
        task.add_done_callback(partial(self._direct_done, direct))
        self.tasks.add(task)

    async def _answer_direct(self, direct: _DirectCycle, body: bytes) -> None:
        answer = await self.door.answer_taken(direct.taken, body)
        if self._direct is direct:
            self._write_direct(direct, answer)

    def _direct_done(self, direct: _DirectCycle, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is None:
            return
        # Cancelled (the server's shutdown timeout, even before it started) or failed: as
        # uvicorn's cycle does, the connection is closed rather than left waiting for an
        # answer, and the request is counted and its bytes given back if it was not yet.
        if not task.cancelled():
            log.error("The direct transport failed", exc_info=task.exception())
        self.door.abandon_taken(direct.taken)
        if self._direct is direct:
            self._direct = None
            direct.response_complete = True
        self.transport.close()

    def _body_too_slow(self) -> None:
        direct = self._direct
        direct.timer = None
        size = sum(len(chunk) for chunk in direct.chunks)
        direct.chunks = None
        error = body_too_slow(self.door.body_timeout, size)
        try:
            self._write_direct(direct, self.door.refuse_taken(direct.taken, error))
        except Exception:
            log.exception("The direct transport failed")
            self.transport.close()

    @staticmethod
    def _cancel_body_timer(direct: _DirectCycle) -> None:
        if direct.timer is not None:
            direct.timer.cancel()
            direct.timer = None

    def _write_direct(self, direct: _DirectCycle, answer: Answer) -> None:
        # As uvicorn's cycle writes an app's answer (`send`): the status line, the server's
        # default headers, the answer's, `connection: close` when the connection ends.
        self._direct = None
        direct.response_complete = True
        if self.transport.is_closing():
            return
        keep_alive = direct.keep_alive and not self.drain.on
        if self.access_log:
            scope = direct.scope
            self.access_logger.info('%s - "%s %s HTTP/%s" %d', get_client_addr(scope), "POST",
                                    get_path_with_query_string(scope), scope["http_version"],
                                    answer.status)  # fmt: skip
        parts = [STATUS_LINE[answer.status]]
        says_close = False
        for name, value in (*self.server_state.default_headers, *answer.headers):
            name = name.lower()
            if name == b"connection" and b"close" in [t.strip().lower() for t in value.split(b",")]:
                keep_alive = False
                says_close = True
            parts += (name, b": ", value, b"\r\n")
        if not keep_alive and not says_close:
            parts.append(b"connection: close\r\n")
        parts += (b"\r\n", answer.body)
        self.transport.write_now(b"".join(parts))
        if not keep_alive:
            self.transport.close()
        self.on_response_complete()


def guarded_protocol(
    max_header_bytes: int, header_timeout: float, drain: Drain, door: Door | None = None
) -> type[HttpToolsProtocol]:
    """The protocol class uvicorn should use, with these limits and this drain's flag; with
    the service's `door`, the direct transport answers the requests the door takes.

    Raises:
        RuntimeError: the installed uvicorn lacks something this module uses (the message
            names each, and the pinned version).
    """
    missing = missing_uvicorn_internals()
    if missing:
        raise RuntimeError(
            f"uvicorn {uvicorn.__version__} lacks what service/server.py uses: "
            f"{', '.join(missing)}; install the version pyproject.toml pins"
        )
    return type(
        "GuardedHttpToolsProtocol",
        (GuardedHttpToolsProtocol,),
        {"max_header_bytes": max_header_bytes, "header_timeout": header_timeout,
         "drain": drain, "door": door},
    )  # fmt: skip


class DrainingServer(uvicorn.Server):
    """uvicorn's server, draining on the first SIGTERM before it shuts down.

    Args:
        config: uvicorn's configuration (its `http` protocol made by guarded_protocol with
            this `drain`).
        drain: the flag the connections read.
        drain_seconds: how long the listener stays open after SIGTERM.
        on_drain: called at once on SIGTERM (the app turns /readyz 503).
        on_shutdown: called when the listener closes, after the drain (gRPC stops with HTTP).
    """

    def __init__(
        self,
        config: uvicorn.Config,
        drain: Drain,
        drain_seconds: float,
        on_drain: Callable[[], None],
        on_shutdown: Callable[[], None] | None = None,
    ):
        super().__init__(config)
        self.drain = drain
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
        self.drain.on = True
        for connection in self.server_state.connections:
            cycle = getattr(connection, "cycle", None)
            if cycle is not None and not cycle.response_complete:
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


# What this module uses of uvicorn beyond its documented API (uvicorn.Config, Server.run):
# methods it overrides or calls, and attributes it reads or writes, by the class that has
# them. An instance attribute is found where the class's __init__ (or, for the protocol's
# per-connection and per-request state, connection_made or on_message_begin) assigns it.
# Module-level names (STATUS_LINE, get_client_addr, get_path_with_query_string) are
# imported above: a uvicorn without one fails at the import, naming it.
UVICORN_INTERNALS: dict[type, dict[str, tuple[str, ...]]] = {
    HttpToolsProtocol: {
        "methods": (
            "connection_made", "data_received", "on_message_begin", "on_body",
            "on_message_complete", "on_headers_complete", "on_response_complete", "shutdown",
            "connection_lost", "timeout_keep_alive_handler",
        ),
        "attributes": (
            "loop", "transport", "client", "cycle", "server_state", "pipeline",
            "timeout_keep_alive_task", "timeout_keep_alive", "parser", "url", "headers",
            "scope", "root_path", "limit_concurrency", "connections", "tasks", "access_log",
            "access_logger", "flow",
        ),
    },
    RequestResponseCycle: {"methods": (), "attributes": ("keep_alive", "response_complete")},
    FlowControl: {"methods": (), "attributes": ("write_paused",)},
    uvicorn.Server: {
        "methods": ("handle_exit", "shutdown", "on_tick"),
        "attributes": ("should_exit", "server_state"),
    },
    ServerState: {"methods": (), "attributes": ("connections", "default_headers")},
}  # fmt: skip


def _assigned(cls: type, name: str) -> bool:
    """Whether `self.<name> = ...` appears in the class's __init__, connection_made or
    on_message_begin (where each request's state starts)."""
    pattern = re.compile(rf"\bself\.{re.escape(name)}\s*(?::[^=\n]+)?=[^=]")
    for method in ("__init__", "connection_made", "on_message_begin"):
        function = cls.__dict__.get(method)
        if function is not None and pattern.search(inspect.getsource(function)):
            return True
    return False


def missing_uvicorn_internals(internals=UVICORN_INTERNALS) -> list[str]:
    """Each internal this module uses that the installed uvicorn lacks, as `Class.name`."""
    missing = []
    for cls, names in internals.items():
        for method in names["methods"]:
            if not callable(getattr(cls, method, None)):
                missing.append(f"{cls.__name__}.{method}()")
        for attribute in names["attributes"]:
            if not _assigned(cls, attribute):
                missing.append(f"{cls.__name__}.{attribute}")
    return missing
