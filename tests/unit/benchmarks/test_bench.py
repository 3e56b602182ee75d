"""The benchmark's own parts without a model: the probe clients and wrk's status counting
against a stand-in HTTP server, resident memory, and the targets read from a result."""

from __future__ import annotations

import http.server
import itertools
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
from support.helpers import REPO_ROOT, require_tool

from benchmarks import bench, common, generic
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
    # At least 6 answers per client, however slow the machine: 12 or more answers hold at
    # least 3 refusals (one in three) and 6 good ones, whenever the clients stop.
    result = probe(
        stand_in.server_address[1], "/predict", b"{}", seconds=0.5, clients=2, at_least=6
    )
    ok, refused = result["ok"]["count"], result["refused"]["count"]
    assert ok + refused >= 12
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


# ---- the models of other contracts (benchmarks/generic.py) ---------------------------------------


def generic_entry(title: str, rps: float, ceiling: float) -> dict:
    return {
        "model": title.split()[0],
        "title": title,
        "version": "/models/x/1",
        "ceiling": {"images_per_s": ceiling, "best_batch": 128, "batch1_p50_ms": 0.9},
        "loads": {
            "c1x1": load(rps / 10, 3),
            "c64x1": load(rps, 40),
            "c16x8": {**load(rps / 8, 40), "images_per_s": rps},
        },
        "max_abs_diff": 0.0,
    }


def with_generic(**changes) -> dict:
    measured = result(**changes)
    return {
        **measured,
        "ratios": {},
        "ceiling": {**measured["ceiling"], "best_batch": 256},
        "generic": {
            "tabular": generic_entry("tabular classifier", 500, 5000),
            "image32": generic_entry("32x32x3 CNN", 1200, 2400),
        },
    }


def test_the_other_models_rows_stand_beside_fashion_mnists():
    measured = with_generic()
    text = bench.table({**measured, "targets": bench.targets(measured)})
    section = text[text.index("Other models: (4)") :]
    # Each model's throughput and its share of its own ceiling, Fashion-MNIST's first.
    assert (
        "| fashion_mnist (28x28, the fast paths) | c=64, 1/req | 3,600 | 3,600 | 20.0 | 40.0 "
        "| 0 | 0.51 |" in section
    )
    assert "| tabular classifier | c=64, 1/req | 500 | 500 | 20.0 | 40.0 | 0 | 0.10 |" in section
    assert "| 32x32x3 CNN | c=16, 8/req | 150 | 1,200 | 20.0 | 40.0 | 0 | 0.50 |" in section
    # A load Fashion-MNIST's result lacks is left out for it, not made up.
    assert "| fashion_mnist (28x28, the fast paths) | c=16, 8/req" not in section
    assert "tabular classifier: 5,000/s at batch 128, batch 1 p50 0.90 ms" in section
    # Before the targets, as the figures page's headings expect.
    assert text.index("Other models: (4)") < text.index("Targets (")


def test_a_run_without_the_other_models_has_no_such_section():
    measured = with_generic()
    del measured["generic"]
    assert "Other models" not in bench.table(measured)


def test_the_tabular_instances_are_named_and_typed_by_the_signature(tmp_path):
    path = tmp_path / "classification.csv"
    path.write_text("x1,rooms,color,label\n0.5,3,red,mid\n-1.25,1,blue,low\n2,5,green,high\n")
    types = {"x1": float, "rooms": int, "color": str}
    assert generic.csv_instances(path, types, 2) == [
        {"x1": 0.5, "rooms": 3, "color": "red"},
        {"x1": -1.25, "rooms": 1, "color": "blue"},
    ]


@pytest.mark.parametrize("channels", [3, 1])
def test_the_image_instances_are_the_models_size_in_0_1(tmp_path, channels):
    from PIL import Image

    for i, name in enumerate(("circle/a.png", "square/b.jpg", "notes.txt")):
        path = tmp_path / name
        path.parent.mkdir(exist_ok=True)
        if name.endswith(".txt"):
            path.write_text("not an image")
        else:
            Image.new("RGB", (40, 30), (255, 40 * i, 0)).save(path)
    instances = np.asarray(generic.image_instances(tmp_path, 32, 24, channels, 8))
    assert instances.shape == (2, 32, 24, channels)
    assert instances.min() >= 0.0 and instances.max() <= 1.0
    if channels == 3:
        assert instances[0, :, :, 0].min() == 1.0  # red, whole
    assert np.all(np.round(instances, 4) == instances)


def test_the_bodies_name_the_tabular_signature_and_not_the_images(tmp_path):
    tabular, image = generic.MODELS
    rows = [{"x1": float(i)} for i in range(8)]
    bodies = generic.write_bodies(tabular, rows, tmp_path, generic.GENERIC_LOADS)
    assert sorted(bodies) == [1, 8]
    assert json.loads(bodies[8].read_text()) == {"instances": rows, "signature_name": "predict"}
    assert json.loads(bodies[1].read_text())["instances"] == rows[:1]
    pixels = [[[[0.5]]]] * 8
    bodies = generic.write_bodies(image, pixels, tmp_path, generic.GENERIC_LOADS)
    assert json.loads(bodies[1].read_text()) == {"instances": pixels[:1]}


def test_the_model_config_serves_each_models_folder(tmp_path):
    from artifact.model_config import parse_config

    versions = {"tabular_classifier": tmp_path / "a" / "tabular_classifier" / "3",
                "shapes": tmp_path / "b" / "shapes" / "1"}  # fmt: skip
    config = generic.model_config(versions, tmp_path / "generic.config")
    entries = parse_config(config.read_text(), config)
    assert {entry.name: entry.base_path for entry in entries} == {
        name: version.parent for name, version in versions.items()
    }


def with_tensorflow_2_15() -> dict:
    out = result()
    out["tensorflow"] = "2.21.0"
    out["tensorflow_2_15"] = {
        "tensorflow": "2.15.1",
        "ceiling": {"images_per_s": 5000.0, "batch1_p50_ms": 1.5},
        "batched": {"c1x1": load(400, 4), "c64x1": load(3000, 45)},
    }
    return out


def test_the_service_on_both_tensorflows_is_compared_load_by_load():
    compared = bench.tensorflow_comparison(with_tensorflow_2_15())
    assert compared["c64x1"] == {
        "current": 3600.0, "current_vs_ceiling": 3600 / 7000, "tf215": 3000.0,
        "tf215_vs_ceiling": 3000 / 5000, "current_vs_tf215": 3600 / 3000,
    }  # fmt: skip
    assert compared["c1x1"]["current_vs_tf215"] == 500 / 400


def test_the_table_shows_both_tensorflows_and_their_ceilings():
    text = bench.tensorflow_table(with_tensorflow_2_15())
    assert "TensorFlow 2.21.0 (its own) and 2.15.1 (the trainer's)" in text
    assert "| c64x1 | 3,600 | 0.51 | 3,000 | 0.60 | 1.20x |" in text
    assert "| (1) ceiling | 7,000 | | 5,000 | | 1.40x |" in text


def test_a_missing_model_is_trained_by_the_training_side(tmp_path, monkeypatch):
    """What the bench does when models/ has no version of a generic row's model: the training
    side's command (TRAINING_PYTHON) trains it from sample-data's files into the work dir."""
    data = tmp_path / "work" / "data"
    data.mkdir(parents=True)
    (data / "classification.csv").write_text("x1,label\n1,a\n")
    monkeypatch.setenv("TRAINING_PYTHON", "/opt/trainer/bin/python")
    commands = []

    def run(command, **kwargs):
        commands.append(command)
        export = Path(command[command.index("--export-dir") + 1])
        (export / "1").mkdir(parents=True)
        (export / "1" / "saved_model.pb").write_bytes(b"")
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(generic.subprocess, "run", run)
    tabular = next(model for model in generic.MODELS if model.key == "tabular")
    version = generic.find_or_train(tabular, tmp_path / "work", tmp_path / "empty")
    assert version == tmp_path / "work" / "models" / "tabular_classifier" / "1"
    (command,) = commands
    assert command[:4] == ["/opt/trainer/bin/python", "-m", "training", "train"]
    assert command[command.index("--csv") + 1] == str(data / "classification.csv")
    assert command[command.index("--max-steps") + 1] == str(generic.TRAIN_STEPS)
    # Found the next time: nothing trained again.
    commands.clear()
    found = generic.find_or_train(tabular, tmp_path / "work", tmp_path / "work" / "models")
    assert found == version and commands == []


def exported(root: Path, version: int, kind: str | None) -> Path:
    """A version under root/models/fashion_mnist, with a report naming its kind (or none)."""
    path = root / "models" / "fashion_mnist" / str(version)
    (path / "assets.extra").mkdir(parents=True)
    (path / "saved_model.pb").write_bytes(b"")
    if kind is not None:
        report = {"accuracy": 0.9, "params": {"model": kind}}
        (path / "assets.extra" / "evaluation.json").write_text(json.dumps(report))
    return path


@pytest.mark.parametrize(
    "kinds, chosen",
    [
        pytest.param({1: "cnn", 2: "dnn"}, 1, id="the-shipped-dnn-passed-over"),
        pytest.param({1: "dnn", 2: "keras"}, 2, id="keras-is-the-cnn"),
        pytest.param({1: "cnn", 2: "dnn", 3: None}, 3, id="no-report-taken-as-before"),
    ],
)
def test_the_benchmark_measures_the_newest_cnn(tmp_path, monkeypatch, kinds, chosen):
    monkeypatch.setattr(common, "ROOT", tmp_path)
    paths = {version: exported(tmp_path, version, kind) for version, kind in kinds.items()}

    def run(command, **kwargs):
        raise AssertionError(f"nothing should be trained: {command}")

    monkeypatch.setattr(common.subprocess, "run", run)
    assert common.find_or_train_model(tmp_path / "work") == paths[chosen]


def test_with_only_the_shipped_dnn_a_cnn_is_trained(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "ROOT", tmp_path)
    version = exported(tmp_path, 1, None)
    shipped = REPO_ROOT / "models" / "shipped" / "fashion_mnist" / "1"
    shutil.copy(shipped / "assets.extra" / "evaluation.json", version / "assets.extra")
    commands = []

    def run(command, **kwargs):
        commands.append(command)
        export = Path(command[command.index("--export-dir") + 1])
        (export / "1").mkdir(parents=True)
        (export / "1" / "saved_model.pb").write_bytes(b"")
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(common.subprocess, "run", run)
    trained = common.find_or_train_model(tmp_path / "work")
    assert trained == tmp_path / "work" / "models" / "fashion_mnist" / "1"
    (command,) = commands
    assert "--model" not in command  # the defaults: the CNN


def test_steal_is_the_hypervisors_share_of_the_cores_time_between_two_readings():
    total, stolen = common.machine_cpu_ticks()
    assert total > 0 and 0 <= stolen <= total
    assert common.steal_share((1000, 10), (1400, 110)) == 0.25
    assert common.steal_share((1000, 10), (1000, 10)) == 0.0  # no tick between the two


def test_the_run_says_the_highest_steal_of_any_measured_load():
    run = result()
    run["servers"]["batched"]["c64x1"]["steal"] = 0.31
    run["protocols"]["grpc"]["steal"] = 0.02
    assert bench.highest_steal(run) == 0.31
    assert bench.highest_steal(result()) == 0.0  # a run from before steal was read
