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
(F1) and WORKERS=2 (F2). Each row gives its share of both and the CPU its server's processes
used per request (user and system time of all their threads, from /proc, over wrk's run).
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
    measure_ceiling,
    process_tree,
    request_bodies,
    run_loads,
    run_wrk,
    start_server,
    stop_server,
    tree_cpu_seconds,
)

RESULTS = ROOT / "benchmarks" / "results"
V2_PATH = "/v2/models/fashion_mnist/infer"
PROTOCOL_CONCURRENCY = 64
# The overload row: 8x the clients of the c=64 row, for at least this long.
OVERLOAD_CONCURRENCY = 512
OVERLOAD_MIN_SECONDS = 10
# Each server's row label; (5) is (4) as two processes, one per core (service/workers.py).
SERVER_NAMES = {
    "naive": "(2) naive FastAPI",
    "unbatched": "(3) service, batching off",
    "batched": "(4) service, batching on",
    "workers": "(5) service, WORKERS=2",
}


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


def table(result: dict) -> str:
    from benchmarks.peers import report as peer_report

    ceiling = result["ceiling"]
    peers = result.get("peers") or {}
    floor = result.get("floor") or {}
    one_process = http_floor.floor_rows(result)
    rows = [
        f"Ceiling (1): SavedModel in-process, best batch {ceiling['best_batch']}: "
        f"{ceiling['images_per_s']:,.0f} images/s; batch 1: p50 {ceiling['batch1_p50_ms']:.2f} ms",
    ]
    if floor:
        rows.append(
            f"HTTP floor (F): the service's server ({floor.get('server') or '?'}) and process "
            "layout answering a trivial JSON endpoint, no model (benchmarks/floor.py); share of "
            "floor: req/s over the floor's at the same concurrency ((5) against (F2)); CPU: "
            "the server's processes, per request"
        )
    rows += [
        "",
        "| load | server | req/s | images/s | p50 ms | p99 ms | errors |" + http_floor.SHARE_HEADER,
        "|---|---|---:|---:|---:|---:|---:|" + http_floor.SHARE_ALIGN,
    ]
    for load in result["servers"]["batched"]:
        c, n = load[1:].split("x")
        for layout, label in http_floor.FLOOR_NAMES.items():
            r = (floor.get(layout) or {}).get(load)
            if r is not None:
                rows.append(
                    f"| c={c}, {n} img/req | {label} | {r['requests_per_s']:,.0f} | - | "
                    f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['errors']} |"
                    + http_floor.share_cells({**r, "images_per_s": None}, None, None, load)
                )
        for key, label in SERVER_NAMES.items():
            if key not in result["servers"]:
                continue
            r = result["servers"][key][load]
            rows.append(
                f"| c={c}, {n} img/req | {label} | {r['requests_per_s']:,.0f} | "
                f"{r['images_per_s']:,.0f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
                f"{r['errors']} |"
                + http_floor.share_cells(r, ceiling, http_floor.floor_rows(result, key), load)
            )
        rows += peer_report.rows_for_load(peers, load, ceiling, one_process)
    rows += ["", "| load | (3)/(1) | (4)/(1) | (5)/(1) | (4)/(2) |", "|---|---:|---:|---:|---:|"]
    for load, ratio in result["ratios"].items():
        workers = ratio.get("workers_vs_ceiling")
        rows.append(
            f"| {load} | {ratio['unbatched_vs_ceiling']:.2f} | "
            f"{ratio['batched_vs_ceiling']:.2f} | "
            f"{'-' if workers is None else f'{workers:.2f}'} | {ratio['batched_vs_naive']:.1f}x |"
        )
    c1 = result["servers"]["batched"]["c1x1"]["p50_ms"]
    rows.append("")
    base = ceiling["batch1_p50_ms"]
    rows.append(
        f"At c=1, (4) p50 {c1:.2f} ms vs (1) batch-1 p50 {base:.2f} ms: +{c1 - base:.2f} ms"
    )
    for server in ("batched", "workers"):
        protocols, overload = extras(result, server)
        if protocols:
            rows += ["", protocols_table(protocols, SERVER_NAMES[server], ceiling,
                                         http_floor.floor_rows(result, server))]  # fmt: skip
        if overload:
            c64 = result["servers"][server]["c64x1"]
            rows += ["", overload_table(overload, c64, SERVER_NAMES[server])]
    memory = result.get("memory")
    if memory:
        rows += [
            "",
            f"Memory (VmRSS after the same short load): one version "
            f"{memory['one_version_mb']:,.0f} MB, two versions {memory['two_versions_mb']:,.0f} "
            f"MB: the second adds {memory['second_version_mb']:,.0f} MB (its weights: "
            f"{memory['weights_mb']:.1f} MB on disk).",
        ]
    if peers:
        rows += ["", peer_report.versus_table(result["servers"]["batched"], peers)]
        rows += ["", peer_report.settings_table(peers)]
    if result.get("tensorflow_2_15"):
        rows += ["", tensorflow_table(result)]
    if result.get("generic"):
        rows += ["", generic.generic_table(result)]
    if result.get("targets"):
        rows += ["", targets_table(result["targets"])]
    return "\n".join(rows)


def extras(result: dict, server: str) -> tuple[dict, dict]:
    """A server's rows by protocol and its overload row ((4)'s keep their original keys)."""
    if server == "batched":
        return result.get("protocols") or {}, result.get("overload") or {}
    return (result.get(f"protocols_{server}") or {}), (result.get(f"overload_{server}") or {})


def targets(result: dict, server: str = "batched") -> list[dict]:
    """The throughput, overload and memory targets, each as measured in this run by `server`
    ((4), the defaults, is the one compared with the peers and measured for memory)."""
    ceiling = result["ceiling"]["images_per_s"]
    c64 = result["servers"][server]["c64x1"]
    c1 = result["servers"][server]["c1x1"]["p50_ms"] - result["ceiling"]["batch1_p50_ms"]
    protocols, overload = extras(result, server)
    out = [
        {"what": ":predict c=64, JSON: share of the ceiling", "target": ">= 0.5",
         "measured": c64["images_per_s"] / ceiling,
         "met": c64["images_per_s"] / ceiling >= 0.5 and c64["errors"] == 0},
        {"what": ":predict c=64: p99 ms", "target": "< 50",
         "measured": c64["p99_ms"], "met": c64["p99_ms"] < 50 and c64["errors"] == 0},
        {"what": "c=1: ms over the model's batch-1 p50", "target": "<= 0.5",
         "measured": c1, "met": c1 <= 0.5},
    ]  # fmt: skip
    if "friendly_json" in protocols:
        # Against :predict measured right beside it, when it was.
        beside = protocols.get("v1_json", c64)
        friendly = protocols["friendly_json"]
        share = friendly["requests_per_s"] / beside["requests_per_s"]
        out.append(
            {"what": "/predict JSON pixels c=64: share of :predict", "target": ">= 0.8",
             "measured": share, "met": share >= 0.8 and friendly["errors"] == 0}
        )  # fmt: skip
    for key, name in (("v2_binary", "V2 binary"), ("grpc", "gRPC Predict")):
        if key in protocols:
            share = protocols[key]["requests_per_s"] / ceiling
            out.append(
                {"what": f"{name} c=64: share of the ceiling", "target": ">= 0.6",
                 "measured": share, "met": share >= 0.6 and protocols[key]["errors"] == 0}
            )  # fmt: skip
    if overload:
        share = overload["ok_per_s"] / c64["requests_per_s"]
        good_p99 = overload["probes"]["ok"]["p99_ms"]
        refused_p99 = overload["probes"]["refused"]["p99_ms"]
        clean = (
            overload["refused_without_retry_after"] == 0
            and overload["other_answers"] == 0
            and overload["socket_errors"] == 0
        )
        out += [
            {"what": f"c={overload['concurrency']}: good answers/s, share of c=64",
             "target": ">= 0.8", "measured": share, "met": share >= 0.8},
            {"what": f"c={overload['concurrency']}: p99 ms of the good answers (probes)",
             "target": "< 200", "measured": good_p99,
             "met": good_p99 is not None and good_p99 < 200},
            {"what": f"c={overload['concurrency']}: p99 ms of the 503s (probes), all with "
             "Retry-After, nothing else", "target": "fast", "measured": refused_p99,
             "met": clean and (refused_p99 is None or refused_p99 < good_p99)},
        ]  # fmt: skip
    if server != "batched":
        prefix = SERVER_NAMES[server].split(",")[-1].strip()
        return [{**row, "what": f"{prefix}: {row['what']}"} for row in out]
    memory = result.get("memory")
    if memory:
        out.append(
            {"what": "memory: MB a second loaded version adds (MB of weights)",
             "target": "<< one version's RSS", "measured": memory["second_version_mb"],
             "met": memory["second_version_mb"] < memory["one_version_mb"] / 2}
        )  # fmt: skip
    for peer in (result.get("peers") or {}).values():
        theirs = peer.get("loads", {}).get("c64x1")
        if not theirs:
            continue
        speedup = c64["requests_per_s"] / max(theirs["requests_per_s"], 1e-9)
        p99 = c64["p99_ms"] / max(theirs["p99_ms"], 1e-9)
        out.append(
            {"what": f"vs {peer['title']}: throughput x, p99 share", "target": ">= 3x, <= 0.25",
             "measured": [speedup, p99], "met": speedup >= 3 and p99 <= 0.25}
        )  # fmt: skip
    return out + tabular_targets(result)


def tabular_targets(result: dict) -> list[dict]:
    """The tabular classifier at c=64, one row a request (benchmarks/generic.py): its share of
    the one-process HTTP floor, and its throughput against each peer on the same model."""
    tabular = (result.get("generic") or {}).get("tabular") or {}
    ours = (tabular.get("loads") or {}).get("c64x1")
    if ours is None:
        return []
    out = []
    floor = (http_floor.floor_rows(result) or {}).get("c64x1")
    if floor is not None:
        share = ours["requests_per_s"] / floor["requests_per_s"]
        out.append(
            {"what": "tabular classifier c=64, 1 row/req: share of the HTTP floor",
             "target": ">= 0.5", "measured": share, "met": share >= 0.5 and ours["errors"] == 0}
        )  # fmt: skip
    for peer in (tabular.get("peers") or {}).values():
        theirs = (peer.get("loads") or {}).get("c64x1")
        if not theirs:
            continue
        speedup = ours["requests_per_s"] / max(theirs["requests_per_s"], 1e-9)
        out.append(
            {"what": f"tabular classifier vs {peer['title']}: throughput x", "target": ">= 3x",
             "measured": speedup, "met": speedup >= 3 and ours["errors"] == 0}
        )  # fmt: skip
    return out


def targets_table(rows: list[dict]) -> str:
    def shown(value) -> str:
        if value is None:
            return "-"
        if isinstance(value, list):
            return ", ".join(shown(v) for v in value)
        return f"{value:.2f}" if abs(value) < 10 else f"{value:,.0f}"

    out = ["Targets (throughput, overload, memory, peers), as measured in this run:", "",
           "| what | target | measured | met |", "|---|---|---:|---|"]  # fmt: skip
    for row in rows:
        met = "yes" if row["met"] else "**no**"
        out.append(f"| {row['what']} | {row['target']} | {shown(row['measured'])} | {met} |")
    return "\n".join(out)


def overload_table(overload: dict, c64: dict, server: str = "(4) service, batching on") -> str:
    probes = overload["probes"]

    def ms(value) -> str:
        return "-" if value is None else f"{value:.1f}"

    return "\n".join(
        [
            f"{server}, overloaded: wrk c={overload['concurrency']} on :predict for "
            f"{overload['seconds']:.0f} s, 1 img/req; latency by status from "
            f"{probes['clients']} probe clients in the same flood:",
            "",
            "| good/s | share of c=64 | 503/s | 503 without Retry-After | other answers | "
            "good p50 / p99 ms | 503 p50 / p99 ms |",
            "|---:|---:|---:|---:|---:|---:|---:|",
            f"| {overload['ok_per_s']:,.0f} | {overload['ok_per_s'] / c64['requests_per_s']:.2f} "
            f"| {overload['refused_per_s']:,.0f} | {overload['refused_without_retry_after']} | "
            f"{overload['other_answers'] + overload['socket_errors']} | "
            f"{ms(probes['ok']['p50_ms'])} / {ms(probes['ok']['p99_ms'])} | "
            f"{ms(probes['refused']['p50_ms'])} / {ms(probes['refused']['p99_ms'])} |",
        ]
    )


def protocols_table(
    protocols: dict,
    server: str = "(4) service, batching on",
    ceiling: dict | None = None,
    floor: dict | None = None,
) -> str:
    names = {
        "v1_json": "TF Serving REST, JSON (wrk)",
        "friendly_json": "friendly /predict, JSON integer pixels (wrk)",
        "v2_binary": "Open Inference Protocol, binary tensors (wrk)",
        "grpc": "TF Serving gRPC Predict (h2load, one connection)",
    }
    rows = [
        f"{server}, by protocol, c={PROTOCOL_CONCURRENCY}, 1 img/req:",
        "",
        "| protocol | req/s | p50 ms | p99 ms | errors |" + http_floor.SHARE_HEADER,
        "|---|---:|---:|---:|---:|" + http_floor.SHARE_ALIGN,
    ]
    load = f"c{PROTOCOL_CONCURRENCY}x1"
    for key, r in protocols.items():
        one_image = {**r, "images_per_s": r["requests_per_s"]}
        rows.append(
            f"| {names[key]} | {r['requests_per_s']:,.0f} | {r['p50_ms']:.1f} | "
            f"{r['p99_ms']:.1f} | {r['errors']} |"
            + http_floor.share_cells(one_image, ceiling, floor, load)
        )
    return "\n".join(rows)


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.peers import report as peer_report

    loads = list(result["servers"]["batched"])
    bars = {SERVER_NAMES[key]: result["servers"][key] for key in SERVER_NAMES
            if key in result["servers"]}  # fmt: skip
    peers = result.get("peers") or {}
    labels = peer_report.short_labels(peers)
    bars.update({labels[key]: peer["loads"] for key, peer in peers.items()})
    x = np.arange(len(loads))
    width = 0.8 / len(bars)
    fig, ax = plt.subplots(figsize=(8 + len(peers), 4.5))
    for i, (name, by_load) in enumerate(bars.items()):
        ax.bar(
            x + (i - (len(bars) - 1) / 2) * width,
            [by_load[load]["images_per_s"] if load in by_load else 0 for load in loads],
            width,
            label=name,
        )
    ax.axhline(result["ceiling"]["images_per_s"], color="k", ls="--", label="in-process ceiling")
    ax.set_xticks(x, [load.replace("x", " x") + " img" for load in loads])
    ax.set_ylabel("images/s")
    ax.set_title(f"Throughput on {result['machine']['cores']} cores ({result['date']})")
    ax.legend(fontsize="small" if peers else None)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


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


def tensorflow_comparison(result: dict) -> dict:
    """Per load, (4)'s images/s and its share of its own ceiling on each TensorFlow."""
    old = result["tensorflow_2_15"]
    return {
        load: {
            "current": row["images_per_s"],
            "current_vs_ceiling": row["images_per_s"] / result["ceiling"]["images_per_s"],
            "tf215": old["batched"][load]["images_per_s"],
            "tf215_vs_ceiling": old["batched"][load]["images_per_s"]
            / old["ceiling"]["images_per_s"],
            "current_vs_tf215": row["images_per_s"] / old["batched"][load]["images_per_s"],
        }
        for load, row in result["servers"]["batched"].items()
    }


def tensorflow_table(result: dict) -> str:
    """The service on both TensorFlows: (1), (4) and (4)/(1) side by side."""
    old = result["tensorflow_2_15"]
    current = result["tensorflow"]
    rows = [
        f"The service on TensorFlow {current} (its own) and {old['tensorflow']} (the trainer's), "
        "the same model, bodies and loads:",
        "",
        f"| load | (4) on {current}, images/s | (4)/(1) | (4) on {old['tensorflow']}, "
        "images/s | (4)/(1) | current / 2.15 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for load, row in tensorflow_comparison(result).items():
        rows.append(
            f"| {load} | {row['current']:,.0f} | {row['current_vs_ceiling']:.2f} | "
            f"{row['tf215']:,.0f} | {row['tf215_vs_ceiling']:.2f} | "
            f"{row['current_vs_tf215']:.2f}x |"
        )
    rows.append(
        f"| (1) ceiling | {result['ceiling']['images_per_s']:,.0f} | | "
        f"{old['ceiling']['images_per_s']:,.0f} | | "
        f"{result['ceiling']['images_per_s'] / old['ceiling']['images_per_s']:.2f}x |"
    )
    return "\n".join(rows)


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
        measured = measure_everything(setup, args.peers)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    save_and_print(build_result(setup.version_path, **measured))
    return 0


if __name__ == "__main__":
    sys.exit(main())
