"""A/B: the service from two or more checkouts, started in turn on the same model, one image
per request at c=64; requests/s and the server process's CPU per request (from /proc).

    python -m benchmarks.ab BASE_CHECKOUT OTHER_CHECKOUT [MORE ...] [--rounds 4] [--seconds 8]
                            [--constant-model]

Each checkout's `service` runs with this venv's Python (`git worktree add /tmp/old <commit>`
makes one). Interleaved rounds, each in another order (rotated, and reversed every other
round), so a machine that slows down or speeds up during the run weighs on every side alike;
the medians are printed, and each checkout's ratios to the first. The model is the newest
export under models/fashion_mnist, or a small one trained first (common).

With --constant-model the SavedModel's call answers a constant of its shapes instead (in each
checkout's `artifact.saved_model.SavedModelPredictor.run`): what is left is the service's own
work per request, which TensorFlow's compute, several times larger and noisier on two cores,
hides when it changes by a tenth.
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


# The SavedModel's call as --constant-model replaces it: every class 0, at probability 0.1 each.
CONSTANT_RUN = """
import numpy as np

def run(self, inputs, signature_name="serving_default"):
    n = len(inputs) if isinstance(inputs, np.ndarray) else len(next(iter(inputs.values())))
    return {"classes": np.zeros(n, np.int64), "probabilities": np.full((n, 10), 0.1, np.float32)}
"""
CONSTANT_SERVICE = (
    CONSTANT_RUN
    + """
import runpy, sys
import artifact.saved_model
artifact.saved_model.SavedModelPredictor.run = run
sys.argv = ["service"]
runpy.run_module("service", run_name="__main__")
"""
)


def measure(
    checkout: Path, model_base: Path, body: Path, seconds: int, constant_model: bool = False
) -> tuple[float, float]:
    """(requests/s, server CPU µs per request) of one checkout's service, after a warm-up."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(checkout), "MODEL_BASE_PATH": str(model_base),
           "PORT": str(port), "GRPC_PORT": "0", "LOG_LEVEL": "warning"}  # fmt: skip
    command = ["-c", CONSTANT_SERVICE] if constant_model else ["-m", "service"]
    server = subprocess.Popen([sys.executable, *command], cwd=checkout, env=env,
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
    parser.add_argument("checkouts", type=Path, nargs="+", metavar="CHECKOUT")
    parser.add_argument("--rounds", "--pairs", type=int, default=4, dest="rounds")
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--constant-model", action="store_true")
    args = parser.parse_args(argv)
    checkouts = args.checkouts
    if len(checkouts) < 2:
        parser.error(
            "name at least two checkouts: the first is the base the others are read against"
        )
    with tempfile.TemporaryDirectory() as scratch:
        version = find_or_train_model(Path(scratch))
        body = request_bodies(Path(scratch))[1]
        results: dict[Path, list[tuple[float, float]]] = {c: [] for c in checkouts}
        for turn in range(args.rounds):
            order = checkouts[turn % len(checkouts) :] + checkouts[: turn % len(checkouts)]
            for checkout in order if turn % 2 == 0 else order[::-1]:
                rate, cpu = measure(
                    checkout, version.parent.parent, body, args.seconds, args.constant_model
                )
                results[checkout].append((rate, cpu))
                print(f"{checkout}: {rate:,.0f} req/s, {cpu:,.0f} µs CPU/request", flush=True)
    medians = {
        checkout: (statistics.median(r for r, _ in rows), statistics.median(c for _, c in rows))
        for checkout, rows in results.items()
    }
    base_rate, base_cpu = medians[checkouts[0]]
    for checkout, (rate, cpu) in medians.items():
        print(
            f"{checkout}: median {rate:,.0f} req/s, {cpu:,.0f} µs CPU/request; "
            f"{rate / base_rate:.2f}x and {cpu / base_cpu:.2f}x {checkouts[0]}'s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
