"""benchmarks/floor.py: the HTTP floor's app, its process run by the service's own runner (one
process and WORKERS=2), the CPU a server's processes use read from /proc, and the columns every
row of the tables gets. No TensorFlow, no timing asserted."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from support.helpers import REPO_ROOT
from support.servers import free_port

from benchmarks import bench, common, floor, generic
from benchmarks.peers import report

# ---- the app -------------------------------------------------------------------------------


def call(app, body: bytes, chunks: int = 1) -> tuple[int, dict, bytes]:
    """One HTTP request through the ASGI app, its body in `chunks` messages."""
    step = max(1, -(-len(body) // chunks))
    parts = [body[i : i + step] for i in range(0, len(body), step)] or [b""]
    messages = [
        {"type": "http.request", "body": part, "more_body": i < len(parts) - 1}
        for i, part in enumerate(parts)
    ]
    sent = []

    async def receive():
        return messages.pop(0)

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": floor.FLOOR_PATH, "headers": []}
    asyncio.run(app(scope, receive, send))
    start, answer = sent
    return start["status"], dict(start["headers"]), answer["body"]


@pytest.mark.parametrize("chunks", [1, 3])
def test_the_floor_parses_the_body_and_answers_a_small_one(chunks):
    body = json.dumps({"instances": [floor.FLOOR_BODY["instances"][0]] * 2}).encode()
    status, headers, answer = call(floor.FloorService(), body, chunks)
    assert status == 200
    assert json.loads(answer) == {"instances": 2}
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"content-length"] == str(len(answer)).encode()
    assert b"connection" not in headers


def test_with_hops_each_request_waits_for_another_thread_that_many_times(monkeypatch):
    ran = []
    monkeypatch.setattr(floor, "_nothing", lambda: ran.append(threading.current_thread().name))
    status, _, answer = call(floor.FloorService(hops=2), json.dumps(floor.FLOOR_BODY).encode())
    assert status == 200 and json.loads(answer) == {"instances": 1}
    assert len(ran) == 2 and all(name.startswith("hop") for name in ran)
    call(floor.FloorService(), json.dumps(floor.FLOOR_BODY).encode())
    assert len(ran) == 2  # none without


@pytest.mark.parametrize(("text", "hops"), [(None, 0), ("0", 0), ("1", 1), ("16", 16)])
def test_floor_hops_is_read_from_the_environment(monkeypatch, text, hops):
    if text is None:
        monkeypatch.delenv("FLOOR_HOPS", raising=False)
    else:
        monkeypatch.setenv("FLOOR_HOPS", text)
    assert floor.hops_setting() == hops


@pytest.mark.parametrize("text", ["-1", "one", "17", ""])
def test_a_floor_hops_that_is_not_a_small_whole_number_is_refused_by_name(monkeypatch, text):
    monkeypatch.setenv("FLOOR_HOPS", text)
    with pytest.raises(
        SystemExit, match=f"FLOOR_HOPS: expected a whole number from 0 to 16, got {text!r}"
    ):
        floor.hops_setting()


def test_a_body_that_is_not_json_is_a_400_that_says_so():
    status, _, answer = call(floor.FloorService(), b'{"instances": [')
    assert status == 400
    assert "the body is not JSON" in json.loads(answer)["error"]


def test_once_draining_every_answer_closes_its_connection():
    service = floor.FloorService()
    service.start_draining()
    _, headers, _ = call(service, json.dumps(floor.FLOOR_BODY).encode())
    assert headers[b"connection"] == b"close"


def test_the_lifespan_is_answered():
    messages = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent = []

    async def receive():
        return messages.pop(0)

    async def send(message):
        sent.append(message["type"])

    asyncio.run(floor.FloorService()({"type": "lifespan"}, receive, send))
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


def test_the_floor_offers_the_runner_what_the_service_offers_it():
    """service/server.py's runner takes service.app.Service: the floor has each of its parts."""
    service = floor.FloorService()
    for attribute in ("ingress", "grpc_server", "on_startup_error", "startup_error"):
        assert hasattr(service, attribute)
    assert callable(service.start_draining) and callable(service.ingress.cancel_in_flight)


# ---- the process, as the service's runner and supervisor run it ---------------------------


def wait_ready(port: int, proc: subprocess.Popen) -> httpx.Response:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        try:
            return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1)
        except httpx.HTTPError:
            time.sleep(0.1)
    raise AssertionError("the floor did not answer within 60 s")


def listening(pid: int, port: int) -> bool:
    """Whether the process holds a socket listening on the loopback port (from /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    try:
        links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:
        return False
    return any(link == f"socket:[{inode}]" for link in links for inode in inodes)


@pytest.mark.parametrize("workers", [1, 2])
def test_the_floor_runs_on_the_services_runner_in_its_layout(workers):
    port = free_port()
    env = {**os.environ, "PORT": str(port), "WORKERS": str(workers), "DRAIN_SECONDS": "0",
           "LOG_LEVEL": "warning", "PYTHONPATH": str(REPO_ROOT)}  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.floor"], cwd=REPO_ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        ready = wait_ready(port, proc)
        assert ready.status_code == 200 and ready.headers.get("server")
        answer = httpx.post(f"http://127.0.0.1:{port}{floor.FLOOR_PATH}", json=floor.FLOOR_BODY)
        assert answer.json() == {"instances": 1}
        # WORKERS=2: the supervisor and its two floor processes, all read for the CPU, each
        # on the port (waited for: a worker told to stop while it starts dies of the signal).
        tree = common.process_tree(proc.pid)
        assert len(tree) == (1 if workers == 1 else 3)
        deadline = time.monotonic() + 60
        while not all(listening(pid, port) for pid in tree[1:]):
            assert time.monotonic() < deadline, "a worker never listened on the port"
            time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(30)
    assert proc.returncode == 0


# ---- the CPU a server used, from /proc ------------------------------------------------------


def test_the_cpu_of_a_process_tree_counts_its_children():
    spin = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"
    parent = subprocess.Popen(
        [sys.executable, "-c",
         f"import subprocess, sys; subprocess.run([sys.executable, '-c', {spin!r}])"],
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while len(common.process_tree(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        pids = common.process_tree(parent.pid)
        assert pids[0] == parent.pid and len(pids) == 2
        before = common.tree_cpu_seconds(pids)
        parent.wait(30)
        # Both ended: nothing read twice, nothing counted.
        assert common.cpu_used(before, common.tree_cpu_seconds(pids)) == 0
    finally:
        parent.kill()
    assert common.cpu_used({1: 1.0, 2: 2.0}, {1: 1.5, 3: 9.0}) == 0.5


def test_the_cpu_per_request_from_wrks_count():
    out = "Running 2s test @ http://127.0.0.1:1\n  24137 requests in 2.00s, 3.1MB read\n"
    assert common.requests_done(out) == 24137
    assert common.cpu_per_request(0.5, 1000) == {"requests": 1000, "cpu_us_per_request": 500.0}
    assert common.cpu_per_request(0.5, 0) == {"requests": 0, "cpu_us_per_request": None}


# ---- the columns -----------------------------------------------------------------------------


def row(rps: float, cpu: float | None = 250.0, images: float | None = None) -> dict:
    out = {"requests_per_s": rps, "images_per_s": images or rps, "p50_ms": 2.0, "p99_ms": 9.0,
           "errors": 0}  # fmt: skip
    if cpu is not None:
        out["cpu_us_per_request"] = cpu
    return out


FLOOR = {"c1x1": row(4000, 120), "c64x1": row(10000, 60)}


@pytest.mark.parametrize(
    "load, rps, share",
    [("c64x1", 5000, 0.5), ("c1x1", 500, 0.125), ("c16x1", 500, None), ("c64x8", 2500, 0.25)],
)
def test_a_rows_share_of_the_floor_is_at_its_concurrency(load, rps, share):
    assert floor.share_of_floor(row(rps), FLOOR, load) == share
    assert floor.share_of_floor(row(rps), None, load) is None


def test_the_cells_each_row_ends_with():
    ceiling = {"images_per_s": 8000.0}
    assert floor.share_cells(row(4000, 1234.4), ceiling, FLOOR, "c64x1") == " 0.50 | 0.40 | 1,234 |"
    assert floor.share_cells(row(4000, None), None, None, "c16x1") == " - | - | - |"


def measured() -> dict:
    """A result with the floor, (2)-(5) and one peer, at c=1 and c=64 and c=16 with eight."""
    loads = {"c1x1": row(200, 3000), "c64x1": row(1200, 1500), "c16x8": row(280, 4000, 2240)}
    servers = {key: loads for key in bench.SERVER_NAMES}
    servers["workers"] = {**loads, "c64x1": row(1300, 1700)}
    return {
        "ceiling": {"images_per_s": 3000.0, "best_batch": 128, "batch1_p50_ms": 3.0},
        "floor": {
            "server": "granian",
            "one_process": FLOOR,
            "workers": {"c1x1": row(2000, 400), "c64x1": row(13000, 110)},
        },
        "servers": servers,
        "ratios": {},
        "peers": {
            "mlserver": {
                "title": "MLServer 1.7.1, x",
                "settings": {},
                "startup_s": 9.0,
                "max_abs_diff": 0.0,
                "loads": {"c64x1": row(400)},
            },
        },
    }


def test_the_main_table_has_the_floors_rows_and_every_rows_shares():
    text = bench.table(measured())
    assert "HTTP floor (F): the service's server (granian)" in text
    assert (
        "| load | server | req/s | images/s | p50 ms | p99 ms | errors | share of ceiling " in text
    )
    assert "| c=64, 1 img/req | (F1) HTTP floor, no model | 10,000 | - | 2.0 | 9.0 | 0 | - | - | 60 |" in text  # fmt: skip
    assert "| c=1, 1 img/req | (F2) HTTP floor, no model, WORKERS=2 | 2,000 |" in text
    # (4) against the one process's floor, (5) against WORKERS=2's.
    assert "| (4) service, batching on | 1,200 | 1,200 | 2.0 | 9.0 | 0 | 0.40 | 0.12 | 1,500 |" in text  # fmt: skip
    assert "| (5) service, WORKERS=2 | 1,300 | 1,300 | 2.0 | 9.0 | 0 | 0.43 | 0.10 | 1,700 |" in text  # fmt: skip
    # No floor at c=16: the share is left out, not made up.
    assert "| c=16, 8 img/req | (4) service, batching on | 280 | 2,240 | 2.0 | 9.0 | 0 | 0.75 | - | 4,000 |" in text  # fmt: skip
    assert "| c=16, 8 img/req | (F1)" not in text
    # The peer's row too.
    assert "| (6) MLServer 1.7.1, x | 400 | 400 | 2.0 | 9.0 | 0 | 0.13 | 0.04 | 250 |" in text


def test_a_result_without_a_floor_still_renders():
    result = measured()
    del result["floor"]
    text = bench.table(result)
    assert "HTTP floor" not in text
    assert "| (4) service, batching on | 1,200 | 1,200 | 2.0 | 9.0 | 0 | 0.40 | - | 1,500 |" in text


def test_the_protocol_rows_get_the_shares_too():
    protocols = {"v1_json": row(1500, 900), "grpc": row(900, None)}
    text = bench.protocols_table(protocols, "(4) x", {"images_per_s": 3000.0}, FLOOR)
    assert "| TF Serving REST, JSON (wrk) | 1,500 | 2.0 | 9.0 | 0 | 0.50 | 0.15 | 900 |" in text
    assert "| TF Serving gRPC Predict (h2load, one connection) | 900 | 2.0 | 9.0 | 0 | 0.30 | 0.09 | - |" in text  # fmt: skip


def test_the_other_models_rows_get_their_share_of_the_floor():
    entry = {"title": "tabular", "ceiling": {"images_per_s": 100000.0, "best_batch": 256,
             "batch1_p50_ms": 1.0}, "loads": {"c64x1": row(6000, 300)}}  # fmt: skip
    text = generic.generic_table({"generic": {"tabular": entry}, "floor": measured()["floor"]})
    assert "| tabular | c=64, 1/req | 6,000 | 6,000 | 2.0 | 9.0 | 0 | 0.06 | 0.60 | 300 |" in text


def test_the_floor_alone_as_floor_only_prints_it():
    text = floor.floor_table(measured()["floor"])
    assert "HTTP floor: granian (service/server.py)" in text
    assert (
        "| c=64 | (F2) HTTP floor, no model, WORKERS=2 | 13,000 | 2.00 | 9.00 | 0 | 110 |" in text
    )


def test_the_peers_table_alone_has_the_same_columns():
    text = report.peers_table(measured()["peers"])
    assert text.splitlines()[0].endswith(floor.SHARE_HEADER)
    assert "| c=64, 1 img/req | (6) MLServer 1.7.1, x | 400 | 400 | 2.0 | 9.0 | 0 | - | - | 250 |" in text  # fmt: skip


def test_floor_only_is_an_option():
    assert bench.parse_arguments(["--floor-only"]).floor_only
