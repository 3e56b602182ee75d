"""A/B: the service from two checkouts, started alternately on the same model, one image per
request at c=64; requests/s and the server process's CPU per request (from /proc).

    python -m benchmarks.ab OLD_CHECKOUT NEW_CHECKOUT [--pairs 4] [--seconds 8]

Each checkout's `service` runs with this venv's Python (`git worktree add /tmp/old <commit>`
makes one). Interleaved pairs, the order flipped every pair, so a machine that slows down or
speeds up during the run weighs on both sides alike; the medians are printed. The model is
the newest export under models/fashion_mnist, or a small one trained first (common).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.common import LUA, PATH, find_or_train_model, free_port, request_bodies


def process_cpu_seconds(pid: int) -> float:
    """User and system CPU of every thread of a process, in seconds."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        fields = Path(f"/proc/{pid}/task/{task}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def wrk(port: int, body: Path, seconds: int) -> str:
    env = {**os.environ, "BENCH_BODY": str(body), "BENCH_PATH": PATH}
    command = ["wrk", "-t1", "-c64", f"-d{seconds}s", "-s", str(LUA), f"http://127.0.0.1:{port}"]
    return subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout


def measure(checkout: Path, model_base: Path, body: Path, seconds: int) -> tuple[float, float]:
    """(requests/s, server CPU µs per request) of one checkout's service, after a warm-up."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(checkout), "MODEL_BASE_PATH": str(model_base),
           "PORT": str(port), "GRPC_PORT": "0", "LOG_LEVEL": "warning"}  # fmt: skip
    server = subprocess.Popen([sys.executable, "-m", "service"], cwd=checkout, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError(f"{checkout}: the service did not get ready")
            time.sleep(0.2)
        wrk(port, body, 2)
        before = process_cpu_seconds(server.pid)
        out = wrk(port, body, seconds)
        used = process_cpu_seconds(server.pid) - before
        requests = int(re.search(r"(\d+) requests in", out).group(1))
        if "Non-2xx" in out:
            raise RuntimeError(f"{checkout}: answers other than 200:\n{out}")
        return float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)), used / requests * 1e6
    finally:
        server.terminate()
        server.wait(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--seconds", type=int, default=8)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        version = find_or_train_model(Path(scratch))
        body = request_bodies(Path(scratch))[1]
        results: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
        for pair in range(args.pairs):
            order = ("old", "new") if pair % 2 == 0 else ("new", "old")
            for side in order:
                checkout = getattr(args, side)
                rate, cpu = measure(checkout, version.parent.parent, body, args.seconds)
                results[side].append((rate, cpu))
                print(f"{side} ({checkout}): {rate:,.0f} req/s, {cpu:,.0f} µs CPU/request")
    medians = {side: (statistics.median(r for r, _ in rows), statistics.median(c for _, c in rows))
               for side, rows in results.items()}  # fmt: skip
    for side, (rate, cpu) in medians.items():
        print(f"{side}: median {rate:,.0f} req/s, {cpu:,.0f} µs CPU/request")
    print(f"new/old: {medians['new'][0] / medians['old'][0]:.2f}x req/s, "
          f"{medians['new'][1] / medians['old'][1]:.2f}x CPU/request")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
