"""Head to head: this service and the peers, all up at once, loaded in turn at c=64.

    python -m benchmarks.peers versus [--tabular] [--rounds 3] [--seconds 8] [--save]
                                      [--no-tricks] [--checkout DIR ...]

`make bench-peers` measures each server once, minutes after the last, and on this machine the
same server's c=64 throughput moves by a third between loads minutes apart with no steal to
show for it (docs/benchmark-peers.md, "Head to head"): a ratio of two such rows carries both
readings' drift. Here every contender (this service as it ships, one process, and each row of
spec.ROWS or spec.TABULAR_ROWS) is started once and checked against the SavedModel's own
probabilities, then loaded by wrk in rounds, each in another order (rotated, and reversed
every other round, as benchmarks/ab.py does), so that a machine that slows down or speeds up
spreads over every contender rather than one. The medians are compared. Each reading says the
contender's CPU per request (its whole process tree), the hypervisor's steal meanwhile, and
the CPU each idle contender used during it: they should wait on their sockets, and the reading
shows how much they did not.

`--checkout DIR` adds another checkout's service (`git worktree add /tmp/before <commit>`),
run with this venv's Python as benchmarks/ab.py runs one: whether a change moved the ratios to
the peers, measured against the same peers in the same rounds. With `--save`, the run is
written to benchmarks/results/versus-<model>-<date>-<time>.json.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from benchmarks import common, generic
from benchmarks.peers import run, spec
from benchmarks.profile import commit_of

CONCURRENCY = 64
# The service's :predict answers in TF Serving's row format: each row's probabilities.
SERVICE = "this service"
RESULTS = common.ROOT / "benchmarks" / "results"
# Seconds between two loads.
SETTLE_S = 1.0


@dataclasses.dataclass
class Contender:
    """One server under test: where it answers and the body it is sent."""

    key: str
    title: str
    port: int
    path: str
    body: Path
    process: subprocess.Popen
    peer: bool = False  # a peer runs in a session of its own, with workers to end with it

    @property
    def pids(self) -> list[int]:
        return common.process_tree(self.process.pid)

    def stop(self) -> None:
        if self.peer:
            run.stop(self.process)
        else:
            common.stop_server(self.process)


def service_probabilities(answer: dict, classes: int) -> np.ndarray:
    """The probabilities [n, classes] in the service's :predict answer (row format).

    Raises:
        ValueError: no probabilities, or not of that shape.
    """
    rows = answer.get("predictions")
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise ValueError("expected 'predictions': a list of rows with named outputs")
    result = np.asarray([row.get("probabilities") for row in rows], np.float64)
    if result.ndim != 2 or result.shape[1] != classes:
        raise ValueError(f"expected probabilities [n, {classes}], got shape {list(result.shape)}")
    return result


def check_service(port: int, path: str, body: Path, expected: np.ndarray) -> float:
    """The service's answer to one body against the SavedModel's probabilities.

    Raises:
        RuntimeError: an error, or other probabilities than the model's.
    """
    response = httpx.post(f"http://127.0.0.1:{port}{path}", content=body.read_bytes(),
                          headers={"Content-Type": "application/json"}, timeout=60)  # fmt: skip
    if response.status_code != 200:
        raise RuntimeError(f"{SERVICE}: HTTP {response.status_code}: {response.text[:500]}")
    got = service_probabilities(response.json(), expected.shape[1])
    if got.shape != expected.shape:
        raise RuntimeError(f"{SERVICE}: probabilities of shape {got.shape}, not {expected.shape}")
    diff = float(np.max(np.abs(got - expected)))
    if diff > run.TOLERANCE:
        raise RuntimeError(f"{SERVICE}: probabilities differ from the model's by {diff:.2g}")
    return diff


def round_orders(keys: list[str], rounds: int) -> list[list[str]]:
    """Each round's order: rotated by one a round, and reversed every other round."""
    orders = []
    for turn in range(rounds):
        at = turn % len(keys)
        order = keys[at:] + keys[:at]
        orders.append(order if turn % 2 == 0 else order[::-1])
    return orders


def summarize(readings: dict[str, list[dict]]) -> dict[str, dict]:
    """Per contender the medians of its readings, and against this service's medians: its
    throughput (the service's over the contender's) and the p99 share (the service's p99 over
    the contender's), as the targets read them."""
    medians = {
        key: {
            "requests_per_s": statistics.median(r["requests_per_s"] for r in rows),
            "p50_ms": statistics.median(r["p50_ms"] for r in rows),
            "p99_ms": statistics.median(r["p99_ms"] for r in rows),
            "cpu_us_per_request": statistics.median(r["cpu_us_per_request"] for r in rows),
            "steal_max": max(r["steal"] for r in rows),
            "rounds": len(rows),
        }
        for key, rows in readings.items()
    }
    ours = medians[SERVICE]
    for key, median in medians.items():
        if key != SERVICE:
            median["service_throughput_x"] = ours["requests_per_s"] / median["requests_per_s"]
            median["service_p99_share"] = ours["p99_ms"] / median["p99_ms"]
    return medians


def table(result: dict) -> str:
    """The run as a Markdown table, medians over the rounds."""
    lines = [
        f"Head to head, {result['model']}, wrk c={CONCURRENCY} one instance a request, "
        f"{result['rounds']} interleaved rounds of {result['seconds']} s, medians "
        f"({result['date']}, {result['commit']}):",
        "",
        "| server | req/s | p50 ms | p99 ms | CPU µs/req | this service: throughput x, "
        "p99 share | steal, highest |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for key, median in result["medians"].items():
        versus = (
            f"{median['service_throughput_x']:.2f}x, {median['service_p99_share']:.2f}"
            if "service_throughput_x" in median
            else "-"
        )
        lines.append(
            f"| {result['titles'][key]} | {median['requests_per_s']:,.0f} | "
            f"{median['p50_ms']:.1f} | {median['p99_ms']:.1f} | "
            f"{median['cpu_us_per_request']:,.0f} | {versus} | {median['steal_max']:.0%} |"
        )
    idle: dict[str, float] = {}
    for rows in result["readings"].values():
        for row in rows:
            for key, seconds in row["others_cpu_s"].items():
                idle[key] = max(idle.get(key, 0.0), seconds)
    lines += ["", f"The most CPU each used while another was loaded ({result['seconds']} s "
                  "loads): " + "; ".join(f"{result['titles'][key]}: {seconds:.2f} s"
                                         for key, seconds in idle.items()) + "."]  # fmt: skip
    return "\n".join(lines)


def start_service(version: Path, workdir: Path, path: str, body: Path, key: str,
                  checkout: Path | None = None) -> Contender:  # fmt: skip
    """This checkout's service, one process, or (`checkout`) another checkout's, run with this
    venv's Python as benchmarks/ab.py runs one: the service before a change, against the same
    peers."""
    from benchmarks.bench import service_environment

    port = common.free_port()
    env = {**service_environment(), "MODEL_NAME": version.parent.name,
           "MODEL_BASE_PATH": str(version.parent.parent), "PORT": str(port)}  # fmt: skip
    env.pop("WORKERS", None)
    if checkout is not None:
        env["PYTHONPATH"] = str(checkout)
    process = common.start_server([sys.executable, "-m", "service"], env, port,
                                  workdir / f"service-{port}.log", ready_path="/readyz",
                                  cwd=checkout or common.ROOT)  # fmt: skip
    return Contender(key, key, port, path, body, process)


def start_peer(variant: spec.Variant, version: Path, workdir: Path, body: Path) -> Contender:
    rundir = workdir / f"peer-{variant.key}"
    rundir.mkdir(parents=True, exist_ok=True)
    port = common.free_port()
    cmd, env, cwd = run.server_command(variant, version, rundir, port)
    process = common.start_server(cmd, env, port, rundir / "server.log",
                                  ready_path=spec.ready_path(variant), cwd=cwd,
                                  new_session=True)  # fmt: skip
    return Contender(variant.key, variant.title, port, spec.infer_path(variant), body, process,
                     peer=True)  # fmt: skip


def service_keys(checkouts: tuple[Path, ...]) -> dict[str, Path | None]:
    """Each service's key: this checkout's, then each other one by its commit (and its path,
    when two share a commit)."""
    keys: dict[str, Path | None] = {SERVICE: None}
    for checkout in checkouts:
        key = f"{SERVICE} at {commit_of(checkout)}"
        keys[f"{key} ({checkout})" if key in keys else key] = checkout
    return keys


def reading(contender: Contender, others: list[Contender], seconds: int) -> dict:
    """One c=64 load of one contender, with the CPU seconds each other one used meanwhile."""
    # The last load's requests still in flight when its wrk stopped leave first.
    time.sleep(SETTLE_S)
    idle = {other.key: other.pids for other in others}
    before = {key: common.tree_cpu_seconds(pids) for key, pids in idle.items()}
    row = common.run_wrk(contender.port, contender.body, CONCURRENCY, seconds, contender.path,
                         server_pid=contender.process.pid)  # fmt: skip
    if row["errors"] or not row["requests_per_s"]:
        raise RuntimeError(f"{contender.title}: {row['errors']} errors under wrk, "
                           f"{row['requests_per_s']} requests/s")  # fmt: skip
    row["others_cpu_s"] = {
        key: common.cpu_used(before[key], common.tree_cpu_seconds(pids))
        for key, pids in idle.items()
    }
    return row


def head_to_head(
    model: str,
    rounds: int,
    seconds: int,
    tricks: bool = True,
    checkouts: tuple[Path, ...] = (),
    log=print,
) -> dict:
    """Every contender up at once, `rounds` interleaved c=64 loads each; the readings, their
    medians and the service's ratios. `checkouts`: other checkouts' services beside this one's
    (their rows read against this one's, the peers' against this one's too)."""
    from artifact.quiet import quiet_tensorflow

    quiet_tensorflow()
    variants = spec.ROWS if model == spec.MODEL_NAME else spec.TABULAR_ROWS
    variants = [v for v in variants if tricks or not v.tricks]
    versions = run.prepare(variants, log=log)
    started_at = commit_of(common.ROOT)  # the code measured, before anything can change it
    with tempfile.TemporaryDirectory(prefix="bench-versus-") as scratch:
        workdir = Path(scratch)
        served = generic.served_model("fashion_mnist" if model == spec.MODEL_NAME else "tabular",
                                     workdir)  # fmt: skip
        version, body = served.version, served.body
        log(f"Model {version}", flush=True)
        expected = run.reference_probabilities(
            version, spec.instances_of(body.read_text(), model), model
        )
        path = f"/v1/models/{version.parent.name}:predict"
        contenders: dict[str, Contender] = {}
        try:
            # Each is held before it is checked: one that answers wrongly is stopped too.
            for key, checkout in service_keys(checkouts).items():
                contenders[key] = start_service(version, workdir, path, body, key, checkout)
                check_service(contenders[key].port, path, body, expected)
            for variant in variants:
                log(f"== starting {variant.title}", flush=True)
                (peer_body,) = run.peer_bodies(variant.peer, {1: body}, workdir, model).values()
                contenders[variant.key] = start_peer(variant, version, workdir, peer_body)
                run.check_answer(variant, contenders[variant.key].port, peer_body.read_text(),
                                 expected)  # fmt: skip
            for contender in contenders.values():
                common.run_wrk(contender.port, contender.body, 16, run.WARMUP_S, contender.path)
            readings: dict[str, list[dict]] = {key: [] for key in contenders}
            for turn, order in enumerate(round_orders(list(contenders), rounds), 1):
                for key in order:
                    others = [c for k, c in contenders.items() if k != key]
                    row = reading(contenders[key], others, seconds)
                    readings[key].append(row)
                    idle = sum(row["others_cpu_s"].values())
                    log(f"round {turn} {contenders[key].title}: {row['requests_per_s']:,.0f} "
                        f"req/s, p99 {row['p99_ms']:.1f} ms, "
                        f"{row['cpu_us_per_request']:,.0f} µs CPU/request, steal "
                        f"{row['steal']:.0%}, the others {idle:.2f} s CPU", flush=True)  # fmt: skip
        finally:
            for contender in contenders.values():
                contender.stop()
    return {
        "model": model,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": started_at,
        "rounds": rounds,
        "seconds": seconds,
        "titles": {key: c.title for key, c in contenders.items()},
        "versions": versions,
        "readings": readings,
        "medians": summarize(readings),
    }


def save(result: dict, directory: Path = RESULTS) -> Path:
    """The run as JSON, named by its model and time: each run is kept."""
    stamp = result["date"].replace("-", "").replace(":", "").replace(" UTC", "").replace(" ", "-")
    path = directory / f"versus-{result['model']}-{stamp}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path


def main(
    model: str, rounds: int, seconds: int, tricks: bool, keep: bool, checkouts: tuple = ()
) -> int:
    result = head_to_head(model, rounds, seconds, tricks, tuple(checkouts))
    print()
    print(table(result))
    if keep:
        print(f"Wrote {save(result)}")
    return 0
