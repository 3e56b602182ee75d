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

import inspect
import logging
import re
import signal
import time
from collections.abc import Callable

import orjson
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

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


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header size limit, a header timeout, coalesced
    writes, and keep-alive turned off by a drain.

    The limits are class attributes: `guarded_protocol()` makes a subclass with the
    settings' values (uvicorn builds one protocol object per connection from the class).
    """

    max_header_bytes = 32 * 1024
    header_timeout = 10.0
    drain = Drain()

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
        if self._header_timer is None:
            # The next request on a kept-alive connection: its headers get the same time.
            self._header_timer = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def on_message_complete(self) -> None:
        self._message_open = False
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
        super().connection_lost(exc)


def guarded_protocol(
    max_header_bytes: int, header_timeout: float, drain: Drain
) -> type[HttpToolsProtocol]:
    """The protocol class uvicorn should use, with these limits and this drain's flag.

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
         "drain": drain},
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
# per-connection state, connection_made) assigns it.
UVICORN_INTERNALS: dict[type, dict[str, tuple[str, ...]]] = {
    HttpToolsProtocol: {
        "methods": (
            "connection_made", "data_received", "on_message_begin", "on_message_complete",
            "on_headers_complete", "on_response_complete", "shutdown", "connection_lost",
            "timeout_keep_alive_handler",
        ),
        "attributes": (
            "loop", "transport", "client", "cycle", "server_state", "pipeline",
            "timeout_keep_alive_task", "timeout_keep_alive",
        ),
    },
    RequestResponseCycle: {"methods": (), "attributes": ("keep_alive", "response_complete")},
    uvicorn.Server: {
        "methods": ("handle_exit", "shutdown", "on_tick"),
        "attributes": ("should_exit", "server_state"),
    },
    ServerState: {"methods": (), "attributes": ("connections",)},
}  # fmt: skip


def _assigned(cls: type, name: str) -> bool:
    """Whether `self.<name> = ...` appears in the class's __init__ or connection_made."""
    pattern = re.compile(rf"\bself\.{re.escape(name)}\s*(?::[^=\n]+)?=[^=]")
    for method in ("__init__", "connection_made"):
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
