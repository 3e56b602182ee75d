"""The HTTP floor: the service's own server and process layout, with its settings, answering a
trivial JSON endpoint, with no model behind it.

    python -m benchmarks.floor      # settings from the environment, as `python -m service`

What a request costs the server and the event loop alone, so that `make bench` can say of
each row how much of the floor's requests/s it keeps (its "share of the floor"), beside how
much of the model's in-process ceiling. Every request, any method and path, has its body
read whole; a body that is there is parsed with orjson (the bench sends the tabular
classifier's one-row request, `FLOOR_BODY`) and answered with a small JSON object. The app
speaks plain ASGI and is run by `service.server.run`, the runner `python -m service` calls,
so the floor moves with whichever server service/server.py ships. It is started as the
service starts: the port bound and let go first (`service.__main__.listening_socket`), and
with WORKERS > 1 the service's own supervisor (service/workers.py) starts that many floor
processes on the port with SO_REUSEPORT, as it starts the service's workers.

With FLOOR_HOPS=n each request also waits, n times, for a function that does nothing to run
on another thread (`run_in_executor`, one worker thread): the price of the hand-off every
prediction makes to the batcher's thread and back, which a trivial endpoint never pays
(row F3, one hop; docs/benchmarks.md, "Where c=1's time goes").

The rest of this module is what the tables need and no server: the floor's loads and the
columns every row gets ("share of ceiling", "share of floor", "CPU µs/req").
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# The loads the floor is measured at: (concurrency, instances per request).
FLOOR_LOADS = [(1, 1), (64, 1)]
# What the bench posts to the floor: the tabular classifier's one-row request.
FLOOR_BODY = {
    "instances": [{"x1": 0.5, "x2": 4.2, "rooms": 3, "color": "red"}],
    "signature_name": "predict",
}
FLOOR_PATH = "/v1/models/floor:predict"
JSON_HEADERS = [(b"content-type", b"application/json")]
CLOSE = (b"connection", b"close")


class FloorApp:
    """The ASGI app: read the body, parse it, answer `{"instances": n}` (n: how many instances
    the body held); 400 for a body that is not JSON. The lifespan is answered at once.

    Args:
        hops: how many times each request waits for a no-op on another thread first.
    """

    def __init__(self, hops: int = 0) -> None:
        # As the service's ingress: once draining, every answer closes its connection.
        self.draining = False
        self.hops = hops
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="hop") if hops else None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(receive, send)

    async def _http(self, receive, send) -> None:
        import orjson

        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        for _ in range(self.hops):
            await asyncio.get_running_loop().run_in_executor(self._thread, _nothing)
        status = 200
        try:
            parsed = orjson.loads(body) if body else {}
            count = len(parsed.get("instances", ())) if isinstance(parsed, dict) else 0
            answer = orjson.dumps({"instances": count})
        except orjson.JSONDecodeError as err:
            status, answer = 400, orjson.dumps({"error": f"the body is not JSON: {err}"})
        headers = [*JSON_HEADERS, (b"content-length", str(len(answer)).encode())]
        if self.draining:
            headers.append(CLOSE)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": answer})

    def cancel_in_flight(self) -> None:
        """Nothing to cancel: no request waits on anything but its own client."""


def _nothing() -> None:
    """What a hop runs on the other thread."""


async def _lifespan(receive, send) -> None:
    message = await receive()
    if message["type"] == "lifespan.startup":
        await send({"type": "lifespan.startup.complete"})
        await receive()
        await send({"type": "lifespan.shutdown.complete"})


class FloorService:
    """The floor as service/server.py's runner takes the service (service.app.Service): an ASGI
    app with `ingress`, `grpc_server`, `on_startup_error`, `startup_error` and
    `start_draining`, so SIGTERM drains it as it drains the service."""

    def __init__(self, hops: int = 0) -> None:
        self.ingress = FloorApp(hops)
        self.grpc_server = None
        self.on_startup_error = None
        self.startup_error = None

    async def __call__(self, scope, receive, send) -> None:
        await self.ingress(scope, receive, send)

    def start_draining(self) -> None:
        self.ingress.draining = True


def hops_setting() -> int:
    """FLOOR_HOPS: a whole number of hops, 0 when unset.

    Raises:
        SystemExit: not a whole number from 0 to 16.
    """
    text = os.environ.get("FLOOR_HOPS", "0")
    if not text.isdigit() or int(text) > 16:
        raise SystemExit(f"FLOOR_HOPS: expected a whole number from 0 to 16, got {text!r}")
    return int(text)


def main() -> int:
    """Serve the floor with the service's settings, server and process layout; the exit code."""
    from service import server
    from service.__main__ import listening_socket
    from service.settings import Settings
    from service.workers import Supervisor, die_with_supervisor, worker_index

    settings = Settings()
    worker = worker_index()
    if worker is not None:
        die_with_supervisor()
    sock = listening_socket(settings.host, settings.port, share=worker is not None)
    logging.basicConfig(level=settings.log_level.upper())
    if settings.workers > 1 and worker is None:
        sock.close()  # the workers bind their own, beside each other
        stop_seconds = settings.drain_seconds + settings.shutdown_timeout_seconds + 10
        command = [sys.executable, "-m", "benchmarks.floor"]
        return Supervisor(settings.workers, stop_seconds, command=command).run()
    sock.close()  # the server binds the port itself, as `python -m service` lets it
    server.run(FloorService(hops_setting()), settings)
    # Granian's threads may still be winding down when its serve() returns, and an interpreter
    # finalizing under them aborts (SIGABRT: a Rust panic that cannot unwind, in about half of
    # the quick stops tried here). The floor has nothing to flush or close: it leaves without
    # finalizing.
    logging.shutdown()
    os._exit(0)


# ---- measuring it ---------------------------------------------------------------------------

# The floor's rows: one process, and the layout of the service's WORKERS=2 row.
FLOOR_NAMES = {
    "one_process": "(F1) HTTP floor, no model",
    "workers": "(F2) HTTP floor, no model, WORKERS=2",
    "one_hop": "(F3) HTTP floor, no model, one thread hop a request",
}
FLOOR_WORKERS = {"one_process": 1, "workers": 2, "one_hop": 1}
FLOOR_HOPS = {"one_process": 0, "workers": 0, "one_hop": 1}


def measure_floor(
    base_env: dict,
    workdir: Path,
    seconds: int,
    layouts: tuple[str, ...] = tuple(FLOOR_NAMES),
    log: Callable[..., None] = print,
) -> dict:
    """The floor under wrk at FLOOR_LOADS, in each layout (FLOOR_NAMES' keys), with the
    service's environment `base_env`.

    Returns:
        {"server": the floor's `server` header (which server ran it), "body", "path", and per
        layout: {"c64x1": run_wrk's row with images_per_s and cpu_us_per_request}}.
    """
    import httpx

    from benchmarks.common import ROOT, free_port, run_loads, run_wrk, start_server, stop_server

    body = workdir / "body-floor.json"
    body.write_text(json.dumps(FLOOR_BODY))
    out: dict = {"body": FLOOR_BODY, "path": FLOOR_PATH}
    for layout in layouts:
        port = free_port()
        env = {**base_env, "PORT": str(port), "GRPC_PORT": "0",
               "WORKERS": str(FLOOR_WORKERS[layout]),
               "FLOOR_HOPS": str(FLOOR_HOPS[layout])}  # fmt: skip
        log(f"== {FLOOR_NAMES[layout]}", flush=True)
        command = [sys.executable, "-m", "benchmarks.floor"]
        log_path = workdir / f"floor-{layout}.log"
        proc = start_server(command, env, port, log_path, ready_path="/readyz", cwd=ROOT)
        try:
            out["server"] = httpx.get(f"http://127.0.0.1:{port}/readyz").headers.get("server")
            run_wrk(port, body, 16, 2, FLOOR_PATH)  # warm up
            out[layout] = run_loads(port, {1: body}, FLOOR_LOADS, seconds, FLOOR_PATH, log=log,
                                    server_pid=proc.pid)  # fmt: skip
        finally:
            stop_server(proc)
    return out


def floor_rows(result: dict, server: str = "batched") -> dict | None:
    """The floor a row of the results is held against: WORKERS=2's for the service's WORKERS=2
    row ("workers"), the one process's for every other."""
    floor = result.get("floor") or {}
    return floor.get("workers" if server == "workers" else "one_process")


def floor_table(floor: dict) -> str:
    """The floor's rows alone (`make bench --floor-only`)."""
    server = floor.get("server") or "the service's server"
    lines = [
        f"HTTP floor: {server} (service/server.py), a trivial JSON endpoint, no model:",
        "",
        "| load | server | req/s | p50 ms | p99 ms | errors | CPU µs/req |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for layout, name in FLOOR_NAMES.items():
        for load, r in (floor.get(layout) or {}).items():
            cpu = r.get("cpu_us_per_request")
            lines.append(
                f"| c={concurrency_of(load)} | {name} | {r['requests_per_s']:,.0f} | "
                f"{r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['errors']} | "
                f"{'-' if cpu is None else f'{cpu:,.0f}'} |"
            )
    return "\n".join(lines)


# ---- the columns every row of the tables gets ----------------------------------------------


def concurrency_of(load: str) -> int:
    """The concurrency of a load's key: "c64x1" -> 64."""
    return int(load[1:].split("x")[0])


def floor_at(floor_rows: dict | None, load: str) -> dict | None:
    """The floor's row at the load's concurrency (the floor sends one instance a request),
    or None when the floor was not measured there."""
    if not floor_rows:
        return None
    return floor_rows.get(f"c{concurrency_of(load)}x1")


def share_of_floor(row: dict, floor_rows: dict | None, load: str) -> float | None:
    """A row's requests/s over the floor's at the same concurrency; None without a floor."""
    floor = floor_at(floor_rows, load)
    if floor is None or not floor["requests_per_s"]:
        return None
    return row["requests_per_s"] / floor["requests_per_s"]


def share_of_ceiling(row: dict, ceiling: dict | None) -> float | None:
    """A row's images (instances) per second over its model's in-process ceiling."""
    if not ceiling or not ceiling.get("images_per_s"):
        return None
    return row["images_per_s"] / ceiling["images_per_s"]


SHARE_HEADER = " share of ceiling | share of floor | CPU µs/req |"
SHARE_ALIGN = "---:|---:|---:|"


def share_cells(row: dict, ceiling: dict | None, floor_rows: dict | None, load: str) -> str:
    """The three cells every row ends with: share of its model's ceiling, share of the floor
    at its concurrency, and the server's CPU per request ("-" where not measured)."""
    cells = [share_of_ceiling(row, ceiling), share_of_floor(row, floor_rows, load)]
    text = ["-" if value is None else f"{value:.2f}" for value in cells]
    cpu = row.get("cpu_us_per_request")
    text.append("-" if cpu is None else f"{cpu:,.0f}")
    return " " + " | ".join(text) + " |"


if __name__ == "__main__":
    sys.exit(main())
