"""CPU a 503 costs the server: the protocol's early refusal against the app's own.

    python -m benchmarks.refusal_cost            # both, twice each

One uvicorn server in this process over the tests' fake backend, made to say its queue is
full, so every request is refused; wrk (c=64, the bench's 1-image :predict body) for 8 s
after a 2 s warm-up; the process's own CPU time (not wrk's) per request. docs/architecture.md
quotes the result.
"""

from __future__ import annotations

import os
import re
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import orjson
import uvicorn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "service"))

from fakes import FakeBackend  # noqa: E402

from service.app import create_app  # noqa: E402
from service.server import guarded_protocol  # noqa: E402
from service.settings import Settings  # noqa: E402


class AlwaysFull(FakeBackend):
    def overloaded(self) -> bool:
        return True


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(early: bool, body: Path, seconds: int = 8) -> dict:
    app = create_app(Settings(log_level="warning"), AlwaysFull())
    protocol = guarded_protocol(32 * 1024, 10.0, app.state.refusal if early else None)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, loop="uvloop", log_level="warning", http=protocol)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    env = {**os.environ, "BENCH_BODY": str(body), "BENCH_PATH": "/v1/models/fashion_mnist:predict"}
    lua = str(ROOT / "benchmarks" / "post.lua")

    def wrk(duration: int) -> str:
        cmd = ["wrk", "-t1", "-c64", f"-d{duration}s", "-s", lua, f"http://127.0.0.1:{port}"]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout

    try:
        wrk(2)
        before = cpu_seconds()
        out = wrk(seconds)
        cpu = cpu_seconds() - before
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {
        "requests": requests,
        "refused": int(non2xx.group(1)) if non2xx else 0,
        "cpu_us_per_request": cpu / requests * 1e6,
    }


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        body = Path(tmp) / "body.json"
        pixels = np.round(np.random.default_rng(0).random((1, 28, 28)), 4)
        body.write_bytes(orjson.dumps({"instances": pixels.tolist()}))
        for _ in range(2):
            for early in (True, False):
                r = measure(early, body)
                who = "protocol (early refusal)" if early else "app"
                print(f"{who:>25}: {r['requests']:,} requests, {r['refused']:,} refused, "
                      f"{r['cpu_us_per_request']:.1f} µs of CPU each")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
