"""The HTTP server around the app: a stock uvicorn, configured through its public options
(`uvicorn.Config`, `uvicorn.Server`) and nothing below them, and drained on SIGTERM.

What the server bounds, and where (docs/security.md, "Slow and oversized clients"):
- **Bodies**: the app (service/ingress.py): MAX_BODY_BYTES, BODY_TIMEOUT_SECONDS, the
  process's MAX_BODY_BYTES_IN_FLIGHT, a client leaving mid-body or before its answer.
- **Connections**: MAX_CONNECTIONS bounds connections and requests at once (uvicorn's
  `limit_concurrency`: 503 past it); idle kept-alive connections close after
  KEEPALIVE_TIMEOUT_SECONDS (`timeout_keep_alive`).
- **Headers**: uvicorn's h11 protocol bounds a request's header section
  (`h11_max_incomplete_event_size`: MAX_HEADER_BYTES, then 431... with h11); uvicorn bounds
  no header time. Both belong to the ingress in front of the service when it faces the
  internet (nginx's `client_header_timeout` and `large_client_header_buffers`, Envoy's
  `request_headers_timeout` and `max_request_headers_kb`).

Connections are accepted by asyncio's event loop (EVENT_LOOP), every waiting one when the
listener is readable, so a new client is not left in the listen queue under load.

**SIGTERM**: /readyz turns 503 at once (a load balancer stops sending), every answer from
then on says `connection: close` (so busy clients move to fresh connections), the listener
stays open and serves for DRAIN_SECONDS, then closes; in-flight requests get
SHUTDOWN_TIMEOUT_SECONDS to finish (uvicorn's `timeout_graceful_shutdown`), and the process
exits 0. A second SIGTERM, or Ctrl-C, skips the drain.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import Callable

import uvicorn

log = logging.getLogger("service.server")

# The event loop uvicorn runs: asyncio's own, not uvloop. libuv, under uvloop, accepts one
# connection per turn of the loop (since libuv 1.45), and under load a turn takes tens of
# milliseconds: in a flood of 512 connections the listener's queue drained at about 20 a
# second, and a new connection's first request (a Kubernetes probe's, say) waited 4-9 s.
# asyncio accepts every waiting connection, up to the backlog, when the listener is
# readable. At 64 clients it serves as many requests per second (docs/benchmarks.md).
EVENT_LOOP = "asyncio"
HTTP_PROTOCOL = "httptools"


class Drain:
    """SIGTERM's drain: the first begins it (`on_drain`, then the server stops after `seconds`);
    a second stops the server at once.

    Args:
        server: the uvicorn server to stop.
        seconds: DRAIN_SECONDS.
        on_drain: called at once on the first SIGTERM (readiness off, connections closed after
            their answers).
        on_stop: called when the listener is about to close (gRPC stops with HTTP).
    """

    def __init__(
        self,
        server: uvicorn.Server,
        seconds: float,
        on_drain: Callable[[], None],
        on_stop: Callable[[], None] | None = None,
    ):
        self.server = server
        self.seconds = seconds
        self.on_drain = on_drain
        self.on_stop = on_stop
        self.draining = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None

    def install(self) -> None:
        """Take SIGTERM from uvicorn's handler (it restores the one before it when it stops);
        Ctrl-C stays uvicorn's: at once."""
        self._loop = asyncio.get_running_loop()
        signal.signal(signal.SIGTERM, self._signalled)

    def _signalled(self, signum, frame) -> None:
        self._loop.call_soon_threadsafe(self.sigterm)

    def sigterm(self) -> None:
        """On the loop: the first SIGTERM drains, a second stops."""
        if self.draining:
            self.stop()
            return
        self.draining = True
        log.info("SIGTERM: draining for %gs, then shutting down", self.seconds)
        self.on_drain()
        self._timer = asyncio.get_running_loop().call_later(self.seconds, self.stop)

    def stop(self) -> None:
        """Close the listener now: in-flight requests get SHUTDOWN_TIMEOUT_SECONDS."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.on_stop is not None:
            self.on_stop()
            self.on_stop = None
        self.server.should_exit = True


def uvicorn_config(app, settings, log_level: str) -> uvicorn.Config:
    """The server's options from the settings."""
    return uvicorn.Config(
        app,
        loop=EVENT_LOOP,
        http=HTTP_PROTOCOL,
        lifespan="on",
        log_level=log_level,
        # The ingress counts and times every request; uvicorn's access line is off.
        access_log=False,
        timeout_keep_alive=settings.keepalive_timeout_seconds,
        limit_concurrency=settings.max_connections,
        h11_max_incomplete_event_size=settings.max_header_bytes,
        # After the drain, in-flight requests get this long before the models are closed.
        timeout_graceful_shutdown=settings.shutdown_timeout_seconds,
        ssl_certfile=settings.tls_cert_file,
        ssl_keyfile=settings.tls_key_file,
    )


def run(service, settings, sock: socket.socket) -> None:
    """Serve `service` (service/app.py's Service) on the bound socket until stopped: SIGTERM
    drains, a second SIGTERM or Ctrl-C stops at once."""
    server = uvicorn.Server(uvicorn_config(service, settings, settings.log_level))
    grpc_server = service.grpc_server
    drain = Drain(
        server,
        settings.drain_seconds,
        service.start_draining,
        on_stop=grpc_server.begin_stop if grpc_server is not None else None,
    )

    def stop_at_start(problem: str) -> None:
        server.should_exit = True

    service.on_startup_error = stop_at_start
    asyncio.run(_serve(server, drain, sock))


async def _serve(server: uvicorn.Server, drain: Drain, sock: socket.socket) -> None:
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    # uvicorn takes the signals when it starts serving; SIGTERM is the drain's from then on.
    while not server.started and not serving.done():
        await asyncio.sleep(0.05)
    if not serving.done():
        drain.install()
    await serving
