"""`make bench`: the model's ceiling, a naive FastAPI app and this service, in one run.

(1) the SavedModel called in-process at its best batch size: the ceiling;
(2) a naive FastAPI endpoint (benchmarks/naive_app.py): the baseline users would write;
(3) this service with batching off (BATCH_MAX_SIZE=1);
(4) this service with dynamic batching on (the defaults);
(5) the same with WORKERS=2: two processes sharing the ports, one per core;
and (4) and (5) again at c=64 over their other protocols: the Open Inference Protocol with
binary tensors (wrk) and TF Serving's gRPC Predict (h2load, nghttp2's HTTP/2 load generator,
posting a framed PredictRequest on one connection), and overloaded (c=512, with probe clients
timing answers by status); then (1) and (4) again with the service on TensorFlow 2.15, the
trainer's (its own venv under benchmarks/.peers/), beside its current TensorFlow.
With `--peers` (`make bench-peers`), (6) and on: MLServer and BentoML serving the same model
with their own batching, as their docs show and with this service's two tricks
(benchmarks/peers/, each in its own venv under benchmarks/.peers/), then the tabular
classifier of the other models' rows (below) through each peer's own runtime for named
inputs, at those rows' loads.
Load comes from wrk, a separate process, with the same request bodies for every server.
Results: benchmarks/results/latest.json and latest.png, and a Markdown table on stdout.
(4) also serves two models of other contracts, each against its own ceiling: the tabular
classifier through :predict with named instances and a 32x32x3 image CNN
(benchmarks/generic.py), so a generic path that is slow shows beside Fashion-MNIST's rows.
`--protocols-only` runs only the protocol rows, `--generic-only` only the other models' rows
(with the floor), `--floor-only` only the floor's, and they save nothing (quick checks).

Every row is read against two references measured in the same run: the model's in-process
ceiling (1), and the HTTP floor (F, benchmarks/floor.py): the service's own server and
process layout answering a trivial JSON endpoint with no model, at c=1 and c=64, one process
(F1), WORKERS=2 (F2), and one process with a hand-off to another thread per request (F3).
Each row gives its share of both and the CPU its server's processes used per request (user
and system time of all their threads, from /proc, over wrk's run).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import floor as http_floor
from benchmarks import generic
from benchmarks.common import (
    LOADS,
    PATH,
    ROOT,
    cpu_per_request,
    cpu_used,
    find_or_train_model,
    free_port,
    machine_cpu_ticks,
    measure_ceiling,
    process_tree,
    request_bodies,
    run_loads,
    run_wrk,
    start_server,
    steal_share,
    stop_server,
    tree_cpu_seconds,
)
from benchmarks.tables import (  # noqa: F401 - re-exported: bench.table, bench.targets, ...
    OVERLOAD_CONCURRENCY,
    PROTOCOL_CONCURRENCY,
    SERVER_NAMES,
    chart,
    extras,
    overload_table,
    protocols_table,
    table,
    tabular_targets,
    targets,
    targets_table,
    tensorflow_comparison,
    tensorflow_table,
)

RESULTS = ROOT / "benchmarks" / "results"
V2_PATH = "/v2/models/fashion_mnist/infer"
# The overload row: 8x the clients of the c=64 row, for at least this long.
OVERLOAD_MIN_SECONDS = 10


def protocol_bodies(workdir: Path) -> dict[str, Path | int]:
    """One real test image as a V2 binary request (and its JSON's length) and as a gRPC
    PredictRequest message (the 5-byte length prefix and the proto, as gRPC frames it)."""
    from artifact.contract import normalize_pixels
    from artifact.idx import DEFAULT_DATA_DIR, load_split

    _, images, _ = load_split(DEFAULT_DATA_DIR, "test")
    image = normalize_pixels(images[:1])
    blob = image.astype("<f4").tobytes()
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "image",
                    "datatype": "FP32",
                    "shape": list(image.shape),
                    "parameters": {"binary_data_size": len(blob)},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    v2 = workdir / "body-v2-binary.bin"
    v2.write_bytes(header + blob)
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "fashion_mnist"
    request.inputs["image"].CopyFrom(tf.make_tensor_proto(image))
    message = request.SerializeToString()
    grpc_body = workdir / "body-grpc.bin"
    grpc_body.write_bytes(b"\x00" + len(message).to_bytes(4, "big") + message)
    return {"v2_binary": v2, "v2_header_length": len(header), "grpc": grpc_body}


def grpc_codes(port: int) -> dict[str, float]:
    """The service's own count of Predict calls by gRPC status code (/metrics)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    codes: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "grpc_requests_total" and sample.labels["method"] == "Predict":
                codes[sample.labels["code"]] = sample.value
    return codes


def run_grpc_h2load(
    port: int,
    grpc_port: int,
    body: Path,
    concurrency: int,
    seconds: int,
    server_pid: int | None = None,
) -> dict:
    """h2load posting a framed PredictRequest on one HTTP/2 connection with `concurrency`
    streams (as one TF Serving client channel does): req/s, p50/p99 ms from its per-request
    log, errors. gRPC answers a failed call with HTTP 200 and a status in the trailers, which
    h2load does not read, so failures are counted from the service's own metrics: every code
    but OK and CANCELLED (the calls h2load drops when its time is up). With `server_pid`,
    also the server's CPU per call answered, as run_wrk reads it."""
    url = f"http://127.0.0.1:{grpc_port}/tensorflow.serving.PredictionService/Predict"
    headers = ["-H", "content-type: application/grpc", "-H", "te: trailers"]

    def h2load(duration: int, log: Path | None = None) -> str:
        cmd = ["h2load", "-D", str(duration), "-c", "1", "-m", str(concurrency), "-d", str(body)]
        cmd += [*headers, *([f"--log-file={log}"] if log else []), url]
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout

    h2load(1)  # warm up
    before = grpc_codes(port)
    pids = process_tree(server_pid) if server_pid is not None else []
    cpu_before = tree_cpu_seconds(pids)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "requests.log"
        out = h2load(seconds, log)
        cpu = cpu_used(cpu_before, tree_cpu_seconds(pids))
        # Per request: start (µs since the epoch), HTTP status, elapsed µs.
        rows = [line.split() for line in log.read_text().splitlines() if line.strip()]
    after = grpc_codes(port)
    elapsed_ms = np.array([int(row[2]) / 1000 for row in rows if row[1] == "200"])
    counts = re.search(
        r"requests: .* (\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout", out
    )
    failed = sum(int(n) for n in counts.groups()[1:]) if counts else 0
    non2xx = sum(1 for row in rows if row[1] != "200")
    grpc_errors = sum(
        after.get(code, 0) - before.get(code, 0)
        for code in after
        if code not in ("OK", "CANCELLED")
    )
    result = {
        "requests_per_s": float(re.search(r"finished in [\d.]+s, ([\d.]+) req/s", out).group(1)),
        "p50_ms": float(np.percentile(elapsed_ms, 50)) if len(elapsed_ms) else float("nan"),
        "p99_ms": float(np.percentile(elapsed_ms, 99)) if len(elapsed_ms) else float("nan"),
        "errors": failed + non2xx + int(grpc_errors),
    }
    if server_pid is not None:
        result.update(cpu_per_request(cpu, len(rows)))
    return result


def bench_protocols(
    port: int, grpc_port: int, bodies: dict, seconds: int, server_pid: int | None = None
) -> dict:
    """The service (4) at c=64, one image per request, over each of its protocols (with
    `server_pid`, each row with the server's CPU per request)."""
    c = PROTOCOL_CONCURRENCY
    pid = server_pid
    results = {
        "v1_json": run_wrk(port, bodies[1], c, seconds, server_pid=pid),
        "friendly_json": run_wrk(port, bodies["friendly"], c, seconds, "/predict", server_pid=pid),
        "v2_binary": run_wrk(
            port,
            bodies["v2_binary"],
            c,
            seconds,
            V2_PATH,
            bodies["v2_header_length"],
            server_pid=pid,
        ),
        "grpc": run_grpc_h2load(port, grpc_port, bodies["grpc"], c, seconds, server_pid=pid),
    }
    for key, r in results.items():
        print(
            f"   c={c:<3} 1 img/req {key:10s} {r['requests_per_s']:8.1f} req/s  "
            f"p50 {r['p50_ms']:7.1f} ms  p99 {r['p99_ms']:7.1f} ms  errors {r['errors']}",
            flush=True,
        )
    return results


def run_overload(port: int, body: Path, seconds: int) -> dict:
    """wrk at OVERLOAD_CONCURRENCY, its answers counted by status, while 8 probe clients in
    the same flood time the 200s and the 503s apart (benchmarks/probe.py)."""
    import threading

    from benchmarks.probe import probe

    seconds = max(seconds, OVERLOAD_MIN_SECONDS)
    flood: dict = {}

    def run() -> None:
        flood.update(run_wrk(port, body, OVERLOAD_CONCURRENCY, seconds, statuses=True))

    wrk = threading.Thread(target=run)
    wrk.start()
    time.sleep(1.0)  # the probes time the flood, not its first second
    probes = probe(port, PATH, body.read_bytes(), seconds - 2)
    wrk.join()
    counts = flood["statuses"]
    result = {
        "concurrency": OVERLOAD_CONCURRENCY,
        "seconds": counts["seconds"],
        "ok_per_s": counts["ok"] / counts["seconds"],
        "refused_per_s": counts["refused"] / counts["seconds"],
        "refused_without_retry_after": counts["refused_without_retry_after"]
        + probes["refused_without_retry_after"],
        "other_answers": counts["other"] + probes["other"],
        "socket_errors": counts["socket_errors"],
        "probes": probes,
    }
    print(
        f"   c={OVERLOAD_CONCURRENCY} 1 img/req  {result['ok_per_s']:8.1f} good/s  "
        f"{result['refused_per_s']:8.1f} 503/s  good p99 {probes['ok']['p99_ms'] or 0:.1f} ms  "
        f"503 p99 {probes['refused']['p99_ms'] or 0:.1f} ms",
        flush=True,
    )
    return result


def rss_mb(pid: int) -> float:
    """A process's resident memory in MB (VmRSS)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1)) / 1024


def measure_memory(version_path: Path, workdir: Path, base_env: dict, body: Path) -> dict:
    """Resident memory of the service serving one version, then two (the same model copied
    to versions 1 and 2), each version warmed by the same short load."""
    base = workdir / "memory" / "fashion_mnist"
    for version in (1, 2):
        shutil.copytree(version_path, base / str(version))
    weights = sum(
        f.stat().st_size for f in version_path.rglob("*") if f.is_file() and "variables" in f.parts
    )
    result: dict = {"weights_mb": weights / 2**20}
    for key, versions in (("one_version", [1]), ("two_versions", [1, 2])):
        config = workdir / f"memory-{key}.config"
        listed = " ".join(f"versions: {v}" for v in versions)
        config.write_text(
            f'model_config_list {{ config {{ name: "fashion_mnist" base_path: "{base}" '
            f'model_platform: "tensorflow" model_version_policy {{ specific {{ {listed} }} }} }} }}'
        )
        env = {k: v for k, v in base_env.items() if k not in ("MODEL_NAME", "MODEL_BASE_PATH")}
        env.update({"MODEL_CONFIG_FILE": str(config), "PORT": str(port := free_port())})
        proc = start_server([sys.executable, "-m", "service"], env, port, workdir / f"{key}.log")
        try:
            for version in versions:
                path = f"/v1/models/fashion_mnist/versions/{version}:predict"
                run_wrk(port, body, 16, 3, path)
            result[key + "_mb"] = rss_mb(proc.pid)
        finally:
            stop_server(proc)
    result["second_version_mb"] = result["two_versions_mb"] - result["one_version_mb"]
    print(
        f"== memory: one version {result['one_version_mb']:.0f} MB, two "
        f"{result['two_versions_mb']:.0f} MB (+{result['second_version_mb']:.0f} MB; "
        f"weights {result['weights_mb']:.1f} MB)",
        flush=True,
    )
    return result


def bench_server(
    name, cmd, env, port, bodies, seconds, log_path: Path, loads=LOADS, extra=None
) -> dict:
    """wrk at each load against a server, each row with the server's CPU per request;
    `extra(port, pid)` runs too while the server is up."""
    print(f"== {name}", flush=True)
    proc = start_server(cmd, env, port, log_path)
    try:
        run_wrk(port, bodies[1], 16, 2)  # warm up
        results = run_loads(port, bodies, loads, seconds, server_pid=proc.pid)
        if extra is not None:
            extra(port, proc.pid)
        return results
    finally:
        stop_server(proc)


@dataclasses.dataclass(frozen=True)
class Setup:
    """What every measurement of one run shares."""

    version_path: Path
    bodies: dict
    # The service's environment without its ports: each server gets its own.
    base_env: dict
    workdir: Path
    seconds: int


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=8, help="wrk duration per load")
    parser.add_argument(
        "--protocols-only",
        action="store_true",
        help="only (4)'s rows per protocol at c=64; print them, save nothing",
    )
    parser.add_argument(
        "--generic-only",
        action="store_true",
        help="only the rows of the models of other contracts (tabular, 32x32x3 images); print "
        "them, save nothing",
    )
    parser.add_argument(
        "--floor-only",
        action="store_true",
        help="only the HTTP floor's rows (one process and WORKERS=2); print them, save nothing",
    )
    parser.add_argument(
        "--peers",
        action="store_true",
        help="add MLServer and BentoML (installed into benchmarks/.peers/ on first use)",
    )
    return parser.parse_args(argv)


def missing_load_tool() -> str | None:
    """The error line for the first load generator not installed, or None."""
    for tool, package in (("wrk", "wrk"), ("h2load", "nghttp2-client")):
        if shutil.which(tool) is None:
            return (
                f"error: {tool} is not installed (apt-get install {package}; `make bench` does it)"
            )
    return None


def prepare_run(workdir: Path, seconds: int) -> Setup:
    """The model (trained now when none is exported) and every request body, in workdir."""
    version_path = find_or_train_model(workdir)
    bodies = {**request_bodies(workdir), **protocol_bodies(workdir)}
    base_env = {
        **service_environment(),
        "MODEL_NAME": "fashion_mnist",
        "MODEL_BASE_PATH": str(version_path.parent.parent),
    }
    return Setup(version_path, bodies, base_env, workdir, seconds)


def service_environment() -> dict:
    """What every server of the run shares: quiet logs, no polling, no gRPC unless asked."""
    return {
        **os.environ,
        "MODEL_POLL_SECONDS": "0",
        "LOG_LEVEL": "warning",
        "MAX_IMAGES": "1024",
        "GRPC_PORT": "0",
    }


def measure_protocols_only(setup: Setup) -> dict:
    """`--protocols-only`: (4)'s rows by protocol, without its rows by load."""
    port, grpc_port = free_port(), free_port()
    env = {**setup.base_env, "PORT": str(port), "GRPC_PORT": str(grpc_port)}
    protocols: dict = {}
    bench_server(
        "(4) this service, batching on, by protocol",
        [sys.executable, "-m", "service"],
        env,
        port,
        setup.bodies,
        setup.seconds,
        setup.workdir / "protocols.log",
        loads=[],
        extra=lambda port, pid: protocols.update(
            bench_protocols(port, grpc_port, setup.bodies, setup.seconds, pid)
        ),
    )
    return protocols


def measure_servers(setup: Setup) -> tuple[dict, dict, dict]:
    """(2) to (5) in turn at every load; (4) and (5) also by protocol and overloaded.

    Returns the rows by server key, then (4)'s and (5)'s by protocol and their overload rows
    (keyed "batched" and "workers")."""
    naive = [sys.executable, "-m", "uvicorn", "benchmarks.naive_app:app"]
    service = [sys.executable, "-m", "service"]
    runs = [  # key, title, command, extra environment
        ("naive", "(2) naive FastAPI", naive, {"NAIVE_MODEL_PATH": str(setup.version_path)}),
        ("unbatched", "(3) this service, batching off", service, {"BATCH_MAX_SIZE": "1"}),
        ("batched", "(4) this service, batching on", service, {}),
        ("workers", "(5) this service, WORKERS=2", service, {"WORKERS": "2"}),
    ]
    servers: dict = {}
    protocols: dict = {"batched": {}, "workers": {}}
    overload: dict = {"batched": {}, "workers": {}}

    def measure_protocols_and_overload(port: int, pid: int, grpc_port: int, key: str) -> None:
        protocols[key].update(bench_protocols(port, grpc_port, setup.bodies, setup.seconds, pid))
        overload[key].update(run_overload(port, setup.bodies[1], setup.seconds))

    for key, title, command, extra_env in runs:
        port = free_port()
        # PORT for the service's settings, UVICORN_* for the naive app's uvicorn command.
        env = {
            **setup.base_env,
            **extra_env,
            "PORT": str(port),
            "UVICORN_PORT": str(port),
            "UVICORN_LOG_LEVEL": "warning",
        }
        extra = None
        if key in protocols:
            env["GRPC_PORT"] = str(grpc_port := free_port())
            extra = functools.partial(measure_protocols_and_overload, grpc_port=grpc_port, key=key)
        servers[key] = bench_server(
            title, command, env, port, setup.bodies, setup.seconds, setup.workdir / f"{key}.log",
            extra=extra,
        )  # fmt: skip
    return servers, protocols, overload


# The in-process ceiling measured by another interpreter (the service on TensorFlow 2.15).
CEILING_PROGRAM = """
import json, sys
from pathlib import Path
from artifact.quiet import quiet_tensorflow
quiet_tensorflow()
import tensorflow as tf
from benchmarks.common import measure_ceiling
print(json.dumps({"tensorflow": tf.__version__, **measure_ceiling(Path(sys.argv[1]))}))
"""


def measure_on_tensorflow_215(setup: Setup) -> dict:
    """(1) and (4) again with the service on TensorFlow 2.15, the trainer's (its own packages
    in a venv of their own: benchmarks/peers/venvs.py): the same model, bodies and loads, so
    the service's speed on its current TensorFlow is reported beside 2.15's."""
    from benchmarks.peers import venvs

    python = str(venvs.ensure_service_on_tf215())
    print("== the ceiling (1) on TensorFlow 2.15", flush=True)
    measured = subprocess.run(
        [python, "-c", CEILING_PROGRAM, str(setup.version_path)],
        cwd=ROOT,
        env=setup.base_env,
        capture_output=True,
        text=True,
    )
    if measured.returncode != 0:
        raise RuntimeError(f"the ceiling on TensorFlow 2.15 failed:\n{measured.stderr[-3000:]}")
    ceiling = json.loads(measured.stdout.splitlines()[-1])
    port = free_port()
    batched = bench_server(
        "(4) this service, batching on, on TensorFlow 2.15", [python, "-m", "service"],
        {**setup.base_env, "PORT": str(port)}, port, setup.bodies, setup.seconds,
        setup.workdir / "tf215.log",
    )  # fmt: skip
    return {"tensorflow": ceiling.pop("tensorflow"), "ceiling": ceiling, "batched": batched}


def measure_everything(setup: Setup, with_peers: bool) -> dict:
    """The ceiling, (2) to (5), memory and, `with_peers`, the peers: result's measured parts."""
    if with_peers:
        from benchmarks.peers import run as peers_run

        # Installs (minutes, the first time) before anything is timed.
        peer_versions = peers_run.prepare()
    print(f"Model {setup.version_path}; measuring the in-process ceiling...", flush=True)
    ceiling = measure_ceiling(setup.version_path)
    floor = http_floor.measure_floor(setup.base_env, setup.workdir, setup.seconds)
    servers, protocols, overload = measure_servers(setup)
    memory = measure_memory(setup.version_path, setup.workdir, setup.base_env, setup.bodies[1])
    tensorflow_2_15 = measure_on_tensorflow_215(setup)
    generic_rows = generic.bench_generic(setup.base_env, setup.workdir, setup.seconds)
    peers = {}
    if with_peers:
        tf_bodies = {n: setup.bodies[n] for n in sorted({n for _, n in LOADS})}
        peers = peers_run.bench_peers(
            setup.version_path, tf_bodies, setup.workdir, setup.seconds, LOADS,
            versions=peer_versions,
        )  # fmt: skip
        if "tabular" in generic_rows:
            generic_rows["tabular"]["peers"] = measure_tabular_peers(
                generic_rows["tabular"], setup, peer_versions
            )
    return {
        "ceiling": ceiling,
        "floor": floor,
        "servers": servers,
        "protocols": protocols,
        "overload": overload,
        "memory": memory,
        "tensorflow_2_15": tensorflow_2_15,
        "generic": generic_rows,
        "peers": peers,
    }


def measure_tabular_peers(tabular: dict, setup: Setup, versions: dict) -> dict:
    """The peers serving the tabular classifier the service's generic rows served, with the
    same bodies and loads (spec.TABULAR_ROWS: each peer's own runtime for named inputs)."""
    from benchmarks.peers import run as peers_run
    from benchmarks.peers import spec as peers_spec

    version = Path(tabular["version"])
    bodies = generic.model_bodies("tabular", version, setup.workdir)
    return peers_run.bench_peers(
        version, bodies, setup.workdir, setup.seconds, generic.GENERIC_LOADS,
        peers_spec.TABULAR_ROWS, versions=versions,
    )  # fmt: skip


def ratios_to_ceiling(servers: dict, ceiling: dict) -> dict:
    """Per load: (3), (4) and (5) against the ceiling, and (4) against the naive app (2)."""
    ratios = {}
    for load in servers["batched"]:
        ratios[load] = {
            "unbatched_vs_ceiling": servers["unbatched"][load]["images_per_s"]
            / ceiling["images_per_s"],
            "batched_vs_ceiling": servers["batched"][load]["images_per_s"]
            / ceiling["images_per_s"],
            "batched_vs_naive": servers["batched"][load]["images_per_s"]
            / servers["naive"][load]["images_per_s"],
            "workers_vs_ceiling": servers["workers"][load]["images_per_s"]
            / ceiling["images_per_s"],
        }
    return ratios


def build_result(
    version_path: Path,
    *,
    ceiling: dict,
    servers: dict,
    protocols: dict,
    overload: dict,
    memory: dict,
    peers: dict,
    tensorflow_2_15: dict | None = None,
    generic: dict | None = None,
    floor: dict | None = None,
) -> dict:
    """The run's result as latest.json holds it, its targets included."""
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": {
            "cores": os.cpu_count(),
            "cpu": platform.processor() or platform.machine(),
            "python": platform.python_version(),
            "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "unset"),
        },
        "model": str(version_path),
        "ceiling": ceiling,
        "floor": floor or {},
        "servers": servers,
        "ratios": ratios_to_ceiling(servers, ceiling),
        "protocols": protocols["batched"],
        "overload": overload["batched"],
        "protocols_workers": protocols["workers"],
        "overload_workers": overload["workers"],
        "memory": memory,
    }
    result["tensorflow"] = importlib.metadata.version("tensorflow")
    if tensorflow_2_15:
        result["tensorflow_2_15"] = tensorflow_2_15
        result["tensorflow_comparison"] = tensorflow_comparison(result)
    if generic:
        result["generic"] = generic
    if peers:
        result["peers"] = peers
    result["targets"] = targets(result) + targets(result, "workers")
    return result


def highest_steal(result: dict) -> float:
    """The highest share of the cores' time the hypervisor took during one measured load of
    the run (every row's `steal`, as run_wrk reads it)."""
    return max(_steals(result), default=0.0)


def _steals(value):
    """Every row's `steal` under `value`, however deep."""
    if isinstance(value, dict):
        if isinstance(value.get("steal"), float):
            yield value["steal"]
        for item in value.values():
            yield from _steals(item)
    elif isinstance(value, list):
        for item in value:
            yield from _steals(item)


def save_and_print(result: dict) -> None:
    """latest.json, latest.png and latest.md under benchmarks/results; the table on stdout."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "latest.json").write_text(json.dumps(result, indent=2) + "\n")
    chart(result, RESULTS / "latest.png")
    (RESULTS / "latest.md").write_text(table(result) + "\n")
    print()
    print(table(result))
    print(f"\nSaved {RESULTS / 'latest.json'}, latest.md and latest.png")


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    missing = missing_load_tool()
    if missing:
        print(missing)
        return 2
    from artifact.quiet import quiet_tensorflow

    quiet_tensorflow()
    workdir = Path(tempfile.mkdtemp(prefix="bench-"))
    try:
        if args.floor_only:
            floor = http_floor.measure_floor(service_environment(), workdir, args.seconds)
            print()
            print(http_floor.floor_table(floor))
            return 0
        if args.generic_only:
            # With the one-process floor, for the rows' share of it.
            floor = http_floor.measure_floor(
                service_environment(), workdir, args.seconds, layouts=("one_process",)
            )
            rows = generic.bench_generic(service_environment(), workdir, args.seconds)
            print()
            print(generic.generic_table({"generic": rows, "floor": floor}))
            return 0
        setup = prepare_run(workdir, args.seconds)
        if args.protocols_only:
            protocols = measure_protocols_only(setup)
            print()
            print(protocols_table(protocols))
            return 0
        ticks = machine_cpu_ticks()
        measured = measure_everything(setup, args.peers)
        steal = steal_share(ticks, machine_cpu_ticks())
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result = build_result(setup.version_path, **measured)
    result["steal"] = {"run": steal, "highest_load": highest_steal(result)}
    save_and_print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
