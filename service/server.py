"""The HTTP server around the app: a stock Granian (a Rust HTTP server, hyper under it), run
embedded on the service's own event loop through its public API (`granian.server.embed.Server`:
serve, stop), and drained on SIGTERM.

Granian was chosen by measurement over uvicorn (httptools and h11) and Hypercorn, the same app
on each in one interleaved `python -m benchmarks.ab` run (docs/benchmarks.md): its HTTP work
runs on a thread of its own, beside the event loop, and it bounds what a slow or oversized
client can hold by itself.

What the server bounds, and where (docs/security.md, "Slow and oversized clients"):
- **Headers**: a request's header section must arrive within HEADER_TIMEOUT_SECONDS, or the
  connection is closed; an idle kept-alive connection is closed after the same time (the
  server is then waiting for the next request's headers). A header section larger than
  MAX_HEADER_BYTES gets 431 (Granian's `header_read_timeout` and `max_buffer_size`).
- **Connections**: at most MAX_CONNECTIONS are served at once; more wait in the listen queue
  until one closes (Granian's `backpressure`).
- **Bodies**: the app (service/ingress.py): MAX_BODY_BYTES, BODY_TIMEOUT_SECONDS, the
  process's MAX_BODY_BYTES_IN_FLIGHT, a client leaving mid-body or before its answer.

**SIGTERM**: /readyz turns 503 at once (a load balancer stops sending), every answer from
then on says `connection: close` (so busy clients move to fresh connections), the listener
stays open and serves for DRAIN_SECONDS, then closes; in-flight requests get
SHUTDOWN_TIMEOUT_SECONDS to finish, and the process exits 0. A second SIGTERM, or Ctrl-C,
skips the drain.

**PORT=0** (TF Serving's --rest_api_port=0): no HTTP server; the service's lifespan (models,
gRPC) runs on its own until SIGTERM, which stops gRPC the same way.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from pathlib import Path

import uvloop
from granian.constants import HTTPModes, Interfaces, SSLProtocols
from granian.http import HTTP1Settings
from granian.server.embed import Server

log = logging.getLogger("service.server")

# hyper's smallest read buffer: a header section always gets at least this much.
MIN_HEADER_BUFFER = 8192
# The listen queue: connections past MAX_CONNECTIONS wait here.
BACKLOG = 2048


def granian_server(app, settings) -> Server:
    """The server for `app`, with the settings' limits, address and certificate."""
    tls = bool(settings.tls_cert_file)
    return Server(
        app,
        address=settings.host,
        port=settings.port,
        interface=Interfaces.ASGI,
        http=HTTPModes.http1,
        websockets=False,
        backlog=BACKLOG,
        backpressure=settings.max_connections,
        runtime_threads=settings.http_threads,
        http1_settings=HTTP1Settings(
            header_read_timeout=round(settings.header_timeout_seconds * 1000),
            keep_alive=True,
            max_buffer_size=max(settings.max_header_bytes, MIN_HEADER_BUFFER),
        ),
        # The service logs what a request did (service/ingress.py); the server only fails.
        log_enabled=False,
        ssl_cert=Path(settings.tls_cert_file) if tls else None,
        ssl_key=Path(settings.tls_key_file) if tls else None,
        # Granian's default minimum is TLS 1.3; the service takes 1.2 too.
        ssl_protocol_min=SSLProtocols.tls12,
    )


class Drain:
    """SIGTERM's drain: the first begins it (`on_drain`, then `stop` after `seconds`); a second,
    or Ctrl-C, stops at once.

    Args:
        stop_server: stops the server (its listener closes; in-flight requests finish).
        seconds: DRAIN_SECONDS.
        on_drain: called at once on the first SIGTERM (readiness off, connections closed after
            their answers).
        on_stop: called when the listener is about to close (gRPC stops with HTTP).
    """

    def __init__(
        self,
        stop_server: Callable[[], None],
        seconds: float,
        on_drain: Callable[[], None],
        on_stop: Callable[[], None] | None = None,
    ):
        self.stop_server = stop_server
        self.seconds = seconds
        self.on_drain = on_drain
        self.on_stop = on_stop
        self.draining = False
        self.stopped = False
        self._timer: asyncio.TimerHandle | None = None

    def install(self) -> None:
        """Handle SIGTERM and SIGINT on the running loop."""
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.sigterm)
        loop.add_signal_handler(signal.SIGINT, self.stop)

    def sigterm(self) -> None:
        """The first SIGTERM drains, a second stops."""
        if self.draining:
            self.stop()
            return
        self.draining = True
        log.info("SIGTERM: draining for %gs, then shutting down", self.seconds)
        self.on_drain()
        self._timer = asyncio.get_running_loop().call_later(self.seconds, self.stop)

    def stop(self) -> None:
        """Close the listener now (once)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.stopped:
            return
        self.stopped = True
        if self.on_stop is not None:
            self.on_stop()
        self.stop_server()


def run(service, settings) -> None:
    """Serve `service` (service/app.py's Service) until stopped: SIGTERM drains, a second
    SIGTERM or Ctrl-C stops at once; in-flight requests then get SHUTDOWN_TIMEOUT_SECONDS.

    On uvloop's event loop: the server accepts and reads connections on its own threads, so
    the loop runs only the app's work (and gRPC's), which uvloop runs faster than asyncio's
    own loop (docs/benchmarks.md, "The HTTP server")."""
    uvloop.run(serve(service, settings))


async def serve(service, settings) -> None:
    """`run`, on the running loop."""
    if not settings.port:
        await serve_without_http(service, settings)
        return
    server = granian_server(service, settings)
    loop = asyncio.get_running_loop()
    grpc_server = service.grpc_server

    def stop_server() -> None:
        server.stop()
        # The requests still in flight when their time is up are cancelled, so the server can
        # finish and the service close its models and stores.
        loop.call_later(settings.shutdown_timeout_seconds, service.ingress.cancel_in_flight)

    drain = Drain(
        stop_server,
        settings.drain_seconds,
        service.start_draining,
        on_stop=grpc_server.begin_stop if grpc_server is not None else None,
    )
    service.on_startup_error = lambda problem: drain.stop()
    drain.install()
    await server.serve()
    log.info("Stopped serving on %s:%s", settings.host, settings.port)


async def serve_without_http(service, settings) -> None:
    """PORT=0: the service's lifespan alone (the models and gRPC), until SIGTERM (which drains
    as with HTTP) or Ctrl-C."""
    stopped = asyncio.Event()
    grpc_server = service.grpc_server
    drain = Drain(
        stopped.set,
        settings.drain_seconds,
        service.start_draining,
        on_stop=grpc_server.begin_stop if grpc_server is not None else None,
    )
    service.on_startup_error = lambda problem: drain.stop()
    drain.install()
    async with service.ingress.lifespan():
        await stopped.wait()
    log.info("Stopped serving (no HTTP: PORT=0)")
