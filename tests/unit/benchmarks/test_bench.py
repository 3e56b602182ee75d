"""The benchmark's own parts without a model: the probe clients and wrk's status counting
against a stand-in HTTP server, resident memory, and the targets read from a result."""

from __future__ import annotations

import http.server
import itertools
import os
import subprocess
import threading

import pytest
from support.helpers import require_tool

from benchmarks import bench, common
from benchmarks.probe import probe


class StandIn(http.server.BaseHTTPRequestHandler):
    """Every third POST a 503 (with Retry-After unless the server says not), else a 200."""

    protocol_version = "HTTP/1.1"
    counter = itertools.count()
    retry_after = True

    def do_POST(self):  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers["Content-Length"]))
        refused = next(self.counter) % 3 == 2
        body = b'{"error": "overloaded"}' if refused else b'{"predictions": []}'
        self.send_response(503 if refused else 200)
        if refused and self.server.retry_after:
            self.send_header("Retry-After", "1")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(params=[True, False], ids=["retry-after", "no-retry-after"])
def stand_in(request):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    server.retry_after = request.param
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_the_probes_time_answers_by_status(stand_in):
    result = probe(stand_in.server_address[1], "/predict", b"{}", seconds=0.5, clients=2)
    ok, refused = result["ok"]["count"], result["refused"]["count"]
    assert ok > 0 and refused > 0
    assert abs(ok - 2 * refused) <= 4  # one 503 for two 200s, two clients stopping anywhere
    assert result["ok"]["p50_ms"] <= result["ok"]["p99_ms"]
    missing = result["refused_without_retry_after"]
    assert missing == (0 if stand_in.retry_after else refused)
    assert result["other"] == 0


def test_wrk_counts_answers_by_status(stand_in, tmp_path):
    require_tool("wrk", "wrk")
    body = tmp_path / "body.json"
    body.write_text("{}")
    result = common.run_wrk(stand_in.server_address[1], body, 4, 1, "/predict", statuses=True)
    counts = result["statuses"]
    total = counts["ok"] + counts["refused"]
    assert total > 0 and counts["other"] == 0
    assert abs(counts["refused"] - total / 3) <= 4
    expected_missing = 0 if stand_in.retry_after else counts["refused"]
    assert counts["refused_without_retry_after"] == expected_missing
    # Non-2xx answers are errors to wrk's own summary, as before.
    assert result["errors"] == counts["refused"]


def test_rss_is_read_for_a_process():
    child = subprocess.Popen(["sleep", "5"])
    try:
        assert 0 < bench.rss_mb(child.pid) < bench.rss_mb(os.getpid())
    finally:
        child.kill()
        child.wait()


def load(rps: float, p99: float, p50: float | None = None) -> dict:
    return {"requests_per_s": rps, "images_per_s": rps, "p50_ms": p50 or p99 / 2,
            "p99_ms": p99, "errors": 0}  # fmt: skip


def result(**changes) -> dict:
    out = {
        "ceiling": {"images_per_s": 7000.0, "batch1_p50_ms": 1.2},
        "servers": {"batched": {"c1x1": load(500, 3, p50=1.6), "c64x1": load(3600, 40)}},
        "protocols": {
            "friendly_json": load(2900, 45),
            "v2_binary": load(4300, 30),
            "grpc": load(4300, 30),
        },
        "overload": {
            "concurrency": 512,
            "seconds": 10.0,
            "ok_per_s": 2900.0,
            "refused_per_s": 3000.0,
            "refused_without_retry_after": 0,
            "other_answers": 0,
            "socket_errors": 0,
            "probes": {
                "clients": 8,
                "ok": {"count": 300, "p50_ms": 90.0, "p99_ms": 150.0},
                "refused": {"count": 900, "p50_ms": 0.5, "p99_ms": 20.0},
            },
        },
        "memory": {
            "one_version_mb": 600.0,
            "two_versions_mb": 640.0,
            "second_version_mb": 40.0,
            "weights_mb": 12.8,
        },  # fmt: skip
    }
    for key, value in changes.items():
        section, _, field = key.partition("__")
        out[section] = {**out[section], field: value} if field else value
    return out


def met(rows: list[dict]) -> dict[str, bool]:
    return {row["what"]: row["met"] for row in rows}


def test_every_target_is_met_by_a_result_that_meets_them():
    rows = bench.targets(result())
    assert len(rows) == 10
    assert all(met(rows).values()), [row for row in rows if not row["met"]]


@pytest.mark.parametrize(
    "changes, failing",
    [
        ({"servers__batched": {"c1x1": load(500, 3, p50=1.8), "c64x1": load(3400, 40)}},
         [":predict c=64, JSON: share of the ceiling", "c=1: ms over the model's batch-1 p50"]),
        ({"protocols__friendly_json": load(2800, 45)},
         ["/predict JSON pixels c=64: share of :predict"]),
        ({"protocols__grpc": {**load(4300, 30), "errors": 3}}, ["gRPC Predict c=64: share of the ceiling"]),
        ({"protocols__v1_json": load(4000, 30)},
         ["/predict JSON pixels c=64: share of :predict"]),  # 2900 of the 4000 beside it
        ({"overload__ok_per_s": 2800.0}, ["c=512: good answers/s, share of c=64"]),
        ({"overload__refused_without_retry_after": 1},
         ["c=512: p99 ms of the 503s (probes), all with Retry-After, nothing else"]),
        ({"memory__second_version_mb": 320.0},
         ["memory: MB a second loaded version adds (MB of weights)"]),
    ],
)  # fmt: skip
def test_a_target_missed_is_reported_as_missed(changes, failing):
    rows = bench.targets(result(**changes))
    assert [what for what, ok in met(rows).items() if not ok] == failing


def test_workers_targets_are_their_own_rows_without_memory_or_peers():
    measured = result(
        servers__workers={"c1x1": load(500, 3, p50=1.6), "c64x1": load(3000, 40)},
        protocols_workers={"friendly_json": load(2900, 45)},
        overload_workers={**result()["overload"], "ok_per_s": 2000.0},
    )
    rows = bench.targets(measured, "workers")
    assert all(row["what"].startswith("WORKERS=2: ") for row in rows)
    assert not any("memory" in row["what"] or " vs " in row["what"] for row in rows)
    assert [what for what, ok in met(rows).items() if not ok] == [
        "WORKERS=2: :predict c=64, JSON: share of the ceiling",  # 3000 of 7000
        "WORKERS=2: c=512: good answers/s, share of c=64",  # 2000 of 3000
    ]
    text = bench.table(
        {**measured, "ratios": {}, "ceiling": {**measured["ceiling"], "best_batch": 256}}
    )
    assert "(5) service, WORKERS=2, by protocol, c=64" in text
    assert "(5) service, WORKERS=2, overloaded: wrk c=512" in text


def test_the_overload_and_memory_lines_in_the_table():
    text = bench.overload_table(result()["overload"], load(3600, 40))
    assert "| 2,900 | 0.81 | 3,000 | 0 | 0 | 90.0 / 150.0 | 0.5 / 20.0 |" in text
    table = bench.targets_table(bench.targets(result(overload__ok_per_s=2800.0)))
    assert "| c=512: good answers/s, share of c=64 | >= 0.8 | 0.78 | **no** |" in table


@pytest.mark.parametrize("fail_every", [0, 4], ids=["all-ok", "every-fourth-fails"])
def test_the_grpc_row_counts_calls_and_failures(tmp_path, monkeypatch, fail_every):
    """h2load against a real gRPC server: its rate and latencies read, and the calls that
    fail (HTTP 200 with a gRPC status in the trailers) counted from the server's codes."""
    require_tool("h2load", "nghttp2-client")
    import collections
    from concurrent import futures

    import grpc

    codes: collections.Counter = collections.Counter()
    calls = itertools.count(1)

    def predict(request: bytes, context) -> bytes:
        if fail_every and next(calls) % fail_every == 0:
            codes["INVALID_ARGUMENT"] += 1
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no")
        codes["OK"] += 1
        return b"\x08\x01"

    handler = grpc.method_handlers_generic_handler(
        "tensorflow.serving.PredictionService",
        {"Predict": grpc.unary_unary_rpc_method_handler(predict)},
    )
    server = grpc.server(futures.ThreadPoolExecutor(4), handlers=[handler])
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    monkeypatch.setattr(bench, "grpc_codes", lambda port: dict(codes))
    body = tmp_path / "body.bin"
    body.write_bytes(b"\x00\x00\x00\x00\x02\x08\x01")
    try:
        result = bench.run_grpc_h2load(0, grpc_port, body, concurrency=4, seconds=1)
    finally:
        server.stop(0)
    assert result["requests_per_s"] > 0 and 0 < result["p50_ms"] <= result["p99_ms"]
    if fail_every:
        assert result["errors"] > 0
    else:
        assert result["errors"] == 0


@pytest.mark.parametrize("missing, package", [("wrk", "wrk"), ("h2load", "nghttp2-client")])
def test_the_bench_stops_at_once_without_a_load_generator(monkeypatch, capsys, missing, package):
    monkeypatch.setattr(
        bench.shutil, "which", lambda tool: None if tool == missing else f"/usr/bin/{tool}"
    )
    assert bench.main(["--seconds", "1"]) == 2
    assert capsys.readouterr().out == (
        f"error: {missing} is not installed (apt-get install {package}; `make bench` does it)\n"
    )
