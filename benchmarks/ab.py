"""A/B: the service from two or more checkouts, or on two or more HTTP servers, started in turn
on the same model, one image per request; at each concurrency the requests/s, the p50 latency
and the server process's CPU per request (from /proc).

    python -m benchmarks.ab SIDE SIDE [MORE ...] [--rounds 4] [--seconds 8]
                            [--concurrency 64] [--constant-model] [--model tabular]

A SIDE is a checkout (`git worktree add /tmp/old <commit>` makes one), run as it ships
(`python -m service`), or CHECKOUT@SERVER: that checkout's app on another server
(benchmarks/servers.py: uvicorn-httptools, uvicorn-h11, granian, hypercorn), to choose the
server by measurement; either followed by `,NAME=VALUE` settings of its own, to compare
settings of one checkout (`. .,LOG_FORMAT=json`: every side runs with LOG_LEVEL=warning and
its log thrown away unless it says otherwise). Each runs with this venv's Python.
Interleaved rounds, each in another order (rotated, and reversed every other round), so a
machine that slows down or speeds up during the run weighs on every side alike; the medians
are printed, and each side's ratios to the first. Each reading says the share of the cores'
time the hypervisor took meanwhile (steal, /proc/stat): on a virtual machine, a round taken
while another tenant held the host's cores measured a slower machine. The model is the newest
export under models/fashion_mnist, or a small one trained first (common); with `--model
tabular`, the tabular classifier `make bench` serves (benchmarks/generic.py), one row a request.

With --constant-model the SavedModel's call answers a constant of its shapes instead (in each
checkout's `artifact.saved_model.SavedModelPredictor.run`): what is left is the service's own
work per request, which TensorFlow's compute, several times larger and noisier on two cores,
hides when it changes by a tenth.
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import httpx

from benchmarks.common import (
    LUA,
    PATH,
    free_port,
    machine_cpu_ticks,
    process_cpu_seconds,
    steal_share,
)
from benchmarks.generic import Served, served_model
from benchmarks.servers import SERVERS, constant_run

SERVERS_SCRIPT = Path(__file__).resolve().parent / "servers.py"


def wrk(port: int, body: Path, seconds: int, concurrency: int = 64, path: str = PATH) -> str:
    # BENCH_STATUSES: wrk counts the answers by status (benchmarks/post.lua), so that an
    # answer other than 200 is told apart by its status.
    env = {**os.environ, "BENCH_BODY": str(body), "BENCH_PATH": path, "BENCH_STATUSES": "1"}
    command = ["wrk", "-t1", f"-c{concurrency}", f"-d{seconds}s", "-s", str(LUA), "--latency",
               f"http://127.0.0.1:{port}"]  # fmt: skip
    return subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout


def p50_ms(out: str) -> float:
    """wrk's --latency p50, in milliseconds."""
    value, unit = re.search(r"^\s+50%\s+([\d.]+)(us|ms|s)\s*$", out, re.MULTILINE).groups()
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


# A checkout's service with the SavedModel's call answering a constant (--constant-model).
CONSTANT_SERVICE = (
    "import runpy, sys\n"
    "import artifact.saved_model\n"
    + inspect.getsource(constant_run)
    + "artifact.saved_model.SavedModelPredictor.run = constant_run\n"
    + 'sys.argv = ["service"]\n'
    + 'runpy.run_module("service", run_name="__main__")\n'
)


class Side(NamedTuple):
    """A checkout, the server it runs on (None: as it ships), and settings of its own."""

    checkout: Path
    server: str | None
    settings: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, text: str) -> Side:
        where, *assignments = text.split(",")
        path, _, server = where.partition("@")
        if server and server not in SERVERS:
            raise argparse.ArgumentTypeError(
                f"{text}: unknown server {server!r}; one of {', '.join(SERVERS)}"
            )
        settings = []
        for assignment in assignments:
            name, equals, value = assignment.partition("=")
            if not equals or not re.fullmatch(r"[A-Z][A-Z0-9_]*", name):
                raise argparse.ArgumentTypeError(
                    f"{text}: expected NAME=VALUE settings after the checkout, got {assignment!r}"
                )
            settings.append((name, value))
        return cls(Path(path), server or None, tuple(settings))

    def __str__(self) -> str:
        text = f"{self.checkout}@{self.server}" if self.server else str(self.checkout)
        return ",".join([text, *(f"{name}={value}" for name, value in self.settings)])

    def command(self, constant_model: bool) -> list[str]:
        if self.server is not None:
            return [str(SERVERS_SCRIPT), self.server]
        return ["-c", CONSTANT_SERVICE] if constant_model else ["-m", "service"]


class Reading(NamedTuple):
    rate: float  # requests/s
    cpu: float  # the server's CPU µs per request
    p50: float  # ms
    steal: float = 0.0  # the share of the cores' time the hypervisor took meanwhile


def measure(
    side: Side,
    served: Served,
    seconds: int,
    concurrencies: list[int],
    constant_model: bool = False,
) -> dict[int, Reading]:
    """One side's readings at each concurrency, each after a warm-up."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(side.checkout), **served.environment,
           "PORT": str(port), "GRPC_PORT": "0", "LOG_LEVEL": "warning",
           **dict(side.settings)}  # fmt: skip
    if constant_model:
        env["BENCH_CONSTANT_MODEL"] = "1"
    command = [sys.executable, *side.command(constant_model)]
    server = subprocess.Popen(
        command, cwd=side.checkout, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError(f"{side}: the service did not get ready")
            time.sleep(0.2)
        readings = {}
        for concurrency in concurrencies:
            wrk(port, served.body, 2, concurrency, served.path)
            # The warm-up's last requests, their connections closed by wrk, may still be
            # queued: let them leave before the measured run fills the queue again.
            time.sleep(1)
            before = process_cpu_seconds(server.pid)
            ticks = machine_cpu_ticks()
            out = wrk(port, served.body, seconds, concurrency, served.path)
            steal = steal_share(ticks, machine_cpu_ticks())
            used = process_cpu_seconds(server.pid) - before
            requests = int(re.search(r"(\d+) requests in", out).group(1))
            if "Non-2xx" in out:
                statuses = re.search(r"^BENCH_STATUSES (.*)$", out, re.MULTILINE)
                raise RuntimeError(f"{side}: answers other than 200: {statuses and statuses[1]}")
            rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
            readings[concurrency] = Reading(rate, used / requests * 1e6, p50_ms(out), steal)
        return readings
    finally:
        server.terminate()
        server.wait(30)


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sides", type=Side.parse, nargs="+", metavar="SIDE")
    parser.add_argument("--rounds", "--pairs", type=int, default=4, dest="rounds")
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument(
        "--concurrency", default="64", help="comma-separated concurrencies (default 64)"
    )
    parser.add_argument("--constant-model", action="store_true")
    parser.add_argument("--model", choices=("fashion_mnist", "tabular"), default="fashion_mnist")
    args = parser.parse_args(argv)
    if args.constant_model and args.model != "fashion_mnist":
        # constant_run answers Fashion-MNIST's outputs: another model's would not fit them.
        parser.error("--constant-model answers Fashion-MNIST's outputs: only with that model")
    if len(args.sides) < 2:
        parser.error("name at least two sides: the first is the base the others are read against")
    try:
        args.concurrency = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        parser.error(f"--concurrency: expected numbers like 1,64, got {args.concurrency!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    sides = args.sides
    with tempfile.TemporaryDirectory() as scratch:
        served = served_model(args.model, Path(scratch))
        results: dict[tuple[Side, int], list[Reading]] = {
            (side, c): [] for side in sides for c in args.concurrency
        }
        for turn in range(args.rounds):
            order = sides[turn % len(sides) :] + sides[: turn % len(sides)]
            for side in order if turn % 2 == 0 else order[::-1]:
                readings = measure(side, served, args.seconds, args.concurrency,
                                   args.constant_model)  # fmt: skip
                for concurrency, reading in readings.items():
                    results[(side, concurrency)].append(reading)
                    print(f"{side} c={concurrency}: {reading.rate:,.0f} req/s, "
                          f"{reading.cpu:,.0f} µs CPU/request, p50 {reading.p50:.3f} ms, "
                          f"steal {reading.steal:.0%}", flush=True)  # fmt: skip
    for concurrency in args.concurrency:
        medians = {
            side: Reading(*(statistics.median(r[i] for r in results[(side, concurrency)])
                            for i in range(3)),
                          max(r.steal for r in results[(side, concurrency)]))
            for side in sides
        }  # fmt: skip
        base = medians[sides[0]]
        for side, median in medians.items():
            print(
                f"c={concurrency} {side}: median {median.rate:,.0f} req/s, {median.cpu:,.0f} µs "
                f"CPU/request, p50 {median.p50:.3f} ms; {median.rate / base.rate:.2f}x, "
                f"{median.cpu / base.cpu:.2f}x and {median.p50 / base.p50:.2f}x {sides[0]}'s "
                f"(steal up to {median.steal:.0%} in a round)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
