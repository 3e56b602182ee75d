"""What benchmarks/bench.py and benchmarks/peers/ share: the model and the request bodies
every server is loaded with, the loads, starting and stopping a server, and wrk at each load.

bench.py imports peers/ (their rows join its table); both import this, and neither this
nor peers/ imports bench.py (tests/test_architecture.py checks there is no cycle).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
LUA = ROOT / "benchmarks" / "post.lua"
PATH = "/v1/models/fashion_mnist:predict"
# (concurrency, images per request)
LOADS = [(1, 1), (16, 1), (64, 1), (16, 8)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def training_python() -> str:
    """The interpreter `python -m training` runs in: TRAINING_PYTHON, the checkout's
    .venv-training when there is one, else this one (a venv with both sides)."""
    named = os.environ.get("TRAINING_PYTHON")
    if named:
        return named
    own = ROOT / ".venv-training" / "bin" / "python"
    return str(own) if own.exists() else sys.executable


def measure_ceiling(
    version_path: Path,
    make_inputs: Callable[[int], np.ndarray | dict] | None = None,
    signature: str | None = None,
    seconds_per_batch: float = 2.0,
) -> dict:
    """A SavedModel in this process: examples/s per batch size and batch-1 latency.

    Args:
        make_inputs: batch size -> the signature's inputs (default: random 28x28 images).
        signature: the signature to run (default: serving_default).
        seconds_per_batch: how long each batch size runs (at least five calls).
    """
    from artifact.saved_model import SavedModelPredictor
    from service.backends.device import configure_tensorflow

    configure_tensorflow("auto", 0, 1)
    model = SavedModelPredictor(version_path)
    rng = np.random.default_rng(0)
    make_inputs = make_inputs or (lambda batch: rng.random((batch, 28, 28), dtype=np.float32))
    signature = signature or "serving_default"
    by_batch = {}
    for batch in (1, 8, 32, 64, 128, 256):
        inputs = make_inputs(batch)
        model.run(inputs, signature)  # trace and warm
        times = []
        deadline = time.perf_counter() + seconds_per_batch
        while time.perf_counter() < deadline or len(times) < 5:
            start = time.perf_counter()
            model.run(inputs, signature)
            times.append(time.perf_counter() - start)
        by_batch[batch] = {
            "images_per_s": batch / float(np.median(times)),
            "p50_ms": 1000 * float(np.percentile(times, 50)),
            "p99_ms": 1000 * float(np.percentile(times, 99)),
        }
    best = max(by_batch, key=lambda b: by_batch[b]["images_per_s"])
    return {
        "by_batch": by_batch,
        "best_batch": best,
        "images_per_s": by_batch[best]["images_per_s"],
        "batch1_p50_ms": by_batch[1]["p50_ms"],
    }


# The network the benchmark's figures and targets are about: the reference CNN (as a custom
# Estimator, or the same layers through Keras).
BENCHMARKED_KINDS = ("cnn", "keras")


def find_or_train_model(workdir: Path) -> Path:
    """The newest CNN exported under models/fashion_mnist, or a quickly trained one.

    A version of another kind is passed over: the small DNN the repository ships, which
    `make serve` serves until `make train` runs (models/README.md), costs a fraction of the
    CNN's time per image, and would make the figures another model's.
    """
    from artifact.repository import list_versions as version_dirs
    from artifact.repository import read_report

    versions = [
        path
        for _, path in version_dirs(ROOT / "models" / "fashion_mnist")
        # A version without a report (or without a kind in it) is taken, as before.
        if ((read_report(path) or {}).get("params") or {}).get("model", "cnn") in BENCHMARKED_KINDS
    ]
    if versions:
        return versions[-1]
    print(
        "No exported CNN: training a small one for the benchmark (speed does not depend "
        "on accuracy).",
        flush=True,
    )
    export = workdir / "models" / "fashion_mnist"
    subprocess.run(
        [
            training_python(),
            "-m",
            "training",
            "train",
            "--max-steps",
            "300",
            "--model-dir",
            str(workdir / "run"),
            "--export-dir",
            str(export),
        ],
        check=True,
    )
    return version_dirs(export)[-1][1]


def request_bodies(workdir: Path) -> dict[int | str, Path]:
    """Real test images as TF Serving row-format JSON, one file per batch size, and one
    image as the friendly /predict's integer pixels ("friendly")."""
    from artifact.contract import normalize_pixels
    from artifact.idx import DEFAULT_DATA_DIR, load_split

    _, images, _ = load_split(DEFAULT_DATA_DIR, "test")
    bodies = {}
    for n in sorted({n for _, n in LOADS}):
        path = workdir / f"body-{n}.json"
        # As a client writes them: 0.0039, not float32's 0.003899999894201755.
        pixels = np.round(normalize_pixels(images[:n]).astype(np.float64), 4)
        path.write_text(json.dumps({"instances": pixels.tolist()}))
        bodies[n] = path
    # The friendly /predict with a person's pixels: integers 0-255.
    friendly = workdir / "body-friendly.json"
    friendly.write_text(json.dumps({"instances": images[:1].astype(int).tolist()}))
    bodies["friendly"] = friendly
    return bodies


def start_server(
    cmd: list[str],
    env: dict,
    port: int,
    log_path: Path,
    ready_path: str = "/docs",
    cwd: Path = ROOT,
    new_session: bool = False,
) -> subprocess.Popen:
    """Start a server with its output in log_path; return once `ready_path` answers 200.

    `new_session`: in a process group of its own (a peer's workers can be ended with it).
    """
    import httpx

    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=new_session,
        )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log_path.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}{ready_path}", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"server did not start within 120 s: {log_path.read_text()[-2000:]}")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def process_cpu_seconds(pid: int) -> float:
    """User and system CPU of every thread of a process, in seconds (/proc/<pid>/task/*/stat)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        fields = Path(f"/proc/{pid}/task/{task}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def machine_cpu_ticks() -> tuple[int, int]:
    """(all, stolen) clock ticks of every core since boot (/proc/stat's `cpu` line): stolen
    is the time a virtual machine's cores were ready to run but the hypervisor ran something
    else (another tenant), which no reading inside the machine otherwise shows."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    # user nice system idle iowait irq softirq steal [guest guest_nice, counted in user]
    return sum(fields[:8]), fields[7] if len(fields) > 7 else 0


def steal_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The share of the cores' time the hypervisor took between two machine_cpu_ticks
    readings (0 on bare metal): a run whose share is high measured a slower machine."""
    total, stolen = after[0] - before[0], after[1] - before[1]
    return stolen / total if total > 0 else 0.0


def process_tree(pid: int) -> list[int]:
    """The process and every descendant of it (a supervisor's workers, a peer's), by their
    parent ids in /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # gone meanwhile
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry))
    tree, pending = [], [pid]
    while pending:
        current = pending.pop()
        tree.append(current)
        pending += children.get(current, [])
    return tree


def tree_cpu_seconds(pids: list[int]) -> dict[int, float]:
    """pid -> its CPU seconds, for those of `pids` still running."""
    used = {}
    for pid in pids:
        try:
            used[pid] = process_cpu_seconds(pid)
        except (OSError, IndexError):
            continue  # ended meanwhile
    return used


def cpu_used(before: dict[int, float], after: dict[int, float]) -> float:
    """The CPU seconds the processes read both times used in between."""
    return sum(after[pid] - before[pid] for pid in before.keys() & after.keys())


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[unit]


def run_wrk(
    port: int,
    body: Path,
    concurrency: int,
    seconds: int,
    path: str = PATH,
    header_length: int | None = None,
    statuses: bool = False,
    server_pid: int | None = None,
) -> dict:
    """wrk against the server: req/s, p50/p99 ms, errors (with `statuses`, also the answers
    counted by status, from post.lua). With `server_pid`, also the CPU the server's processes
    (it and its descendants) used over wrk's run per request answered: cpu_us_per_request."""
    env = {**os.environ, "BENCH_BODY": str(body), "BENCH_PATH": path}
    if header_length is not None:
        env["BENCH_HEADER_LENGTH"] = str(header_length)
    if statuses:
        env["BENCH_STATUSES"] = "1"
    cmd = [
        "wrk",
        "-t1",
        f"-c{concurrency}",
        f"-d{seconds}s",
        "--latency",
        "--timeout",
        "10s",
        "-s",
        str(LUA),
        f"http://127.0.0.1:{port}",
    ]
    pids = process_tree(server_pid) if server_pid is not None else []
    before = tree_cpu_seconds(pids)
    ticks = machine_cpu_ticks()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    steal = steal_share(ticks, machine_cpu_ticks())
    cpu = cpu_used(before, tree_cpu_seconds(pids))
    latency = dict(re.findall(r"^\s+(50|99)%\s+(\S+)\s*$", out, re.M))
    if set(latency) != {"50", "99"}:
        raise RuntimeError(f"could not read wrk's latency distribution:\n{out}")
    errors = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    result = {
        "requests_per_s": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        "p50_ms": _ms(latency["50"]),
        "p99_ms": _ms(latency["99"]),
        "errors": errors + (int(non2xx.group(1)) if non2xx else 0),
        "steal": steal,
    }
    if statuses:
        result["statuses"] = json.loads(re.search(r"^BENCH_STATUSES (.*)$", out, re.M).group(1))
    if server_pid is not None:
        result.update(cpu_per_request(cpu, requests_done(out)))
    return result


def requests_done(wrk_output: str) -> int:
    """How many requests wrk completed ("12345 requests in 8.00s")."""
    return int(re.search(r"(\d+) requests in ", wrk_output).group(1))


def cpu_per_request(cpu_seconds: float, requests: int) -> dict:
    """The server's CPU over a run, per request: {"requests", "cpu_us_per_request"}."""
    per_request = cpu_seconds / requests * 1e6 if requests else None
    return {"requests": requests, "cpu_us_per_request": per_request}


def run_loads(
    port: int,
    bodies: dict,
    loads,
    seconds: int,
    path: str = PATH,
    log: Callable[..., None] = print,
    server_pid: int | None = None,
) -> dict:
    """wrk at each (concurrency, images per request) load in turn, each load's line logged
    as it ends: "c16x8" -> its run_wrk result with images_per_s (and, with `server_pid`, the
    server's CPU per request)."""
    results = {}
    for concurrency, n in loads:
        r = run_wrk(port, bodies[n], concurrency, seconds, path, server_pid=server_pid)
        r["images_per_s"] = r["requests_per_s"] * n
        results[f"c{concurrency}x{n}"] = r
        cpu = r.get("cpu_us_per_request")
        log(
            f"   c={concurrency:<3} {n} img/req  {r['requests_per_s']:8.1f} req/s  "
            f"p50 {r['p50_ms']:7.1f} ms  p99 {r['p99_ms']:7.1f} ms  errors {r['errors']}"
            + ("" if cpu is None else f"  CPU {cpu:6.0f} µs/req")
            + (f"  steal {r['steal']:.0%}" if r["steal"] >= 0.005 else ""),
            flush=True,
        )
    return results
