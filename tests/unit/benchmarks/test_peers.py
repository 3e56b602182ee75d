"""The peers' setup for `make bench-peers`, without installing or serving anything: their
settings and generated files, their request bodies, how their answers and results are read,
their locks, and the peer rows in bench.py's table and chart."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import numpy as np
import pytest
from support.helpers import REPO_ROOT as ROOT

from benchmarks import bench
from benchmarks.peers import report, run, spec, venvs

PEERS_SRC = ROOT / "benchmarks" / "peers"


def tfserving_body(n: int, seed: int = 0) -> str:
    """A body as common.request_bodies writes it: n images rounded to 4 decimals."""
    pixels = np.round(np.random.default_rng(seed).random((n, 28, 28), dtype=np.float32), 4)
    return json.dumps({"instances": pixels.tolist()})


def classes_in(path: Path) -> set[str]:
    return {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef)}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


# ---- the rows and the settings tried ---------------------------------------------------


def test_each_peer_has_a_docs_row_and_a_row_with_the_tricks():
    assert [v.key for v in spec.ROWS] == [
        "mlserver",
        "mlserver_tricks",
        "bentoml",
        "bentoml_tricks",
    ]
    for plain, tricked in zip(spec.ROWS[::2], spec.ROWS[1::2], strict=True):
        assert (plain.peer, plain.settings, plain.tricks) == (tricked.peer, tricked.settings, False)
        assert tricked.tricks
        assert "gc.freeze + tf.function" in tricked.title and "gc.freeze" not in plain.title


def test_the_rows_use_settings_from_the_sweep():
    assert len({v.key for v in spec.SWEEP}) == len(spec.SWEEP)
    assert {v.peer for v in spec.SWEEP} == {"mlserver", "bentoml"}
    for variant in spec.BEST.values():
        assert any(v.peer == variant.peer and v.settings == variant.settings for v in spec.SWEEP)
    # The best BentoML setting: a batchable API with 2 workers.
    assert spec.BEST["bentoml"].settings["workers"] == 2


@pytest.mark.parametrize(
    "variant, words",
    [
        (
            spec.mlserver("m", 1, 64, 0.005),
            "MLServer 1.7.1, adaptive batching 64 / 5 ms, 1 parallel worker",
        ),
        (spec.mlserver("m", 0, 16, 0.002), "adaptive batching 16 / 2 ms, 0 parallel workers"),
        (
            spec.bentoml("b", 2, 100, 60000),
            "BentoML 1.4.40, batchable API 100 / 60000 ms, 2 workers",
        ),
    ],
)
def test_titles_say_the_settings(variant, words):
    assert words in variant.title


# ---- MLServer's files ------------------------------------------------------------------


@pytest.mark.parametrize(
    "variant", [v for v in spec.ROWS if v.peer == "mlserver"], ids=lambda v: v.key
)
def test_mlserver_repository(tmp_path, variant):
    version = tmp_path / "models" / "fashion_mnist" / "3"
    root = spec.write_mlserver_repository(variant, version, tmp_path / "repo", (8001, 8002, 8003))

    settings = json.loads((root / "settings.json").read_text())
    assert settings["http_port"] == 8001 and settings["grpc_port"] == 8002
    assert settings["metrics_port"] == 8003
    assert settings["host"] == "127.0.0.1" and settings["debug"] is False
    assert settings["parallel_workers"] == variant.settings["parallel_workers"]
    assert Path(settings["metrics_dir"]).is_dir()

    model_dir = root / "fashion_mnist"
    model_settings = json.loads((model_dir / "model-settings.json").read_text())
    assert model_settings["name"] == "fashion_mnist"
    assert model_settings["max_batch_size"] == variant.settings["max_batch_size"] > 1
    assert model_settings["max_batch_time"] == variant.settings["max_batch_time"] > 0
    assert model_settings["parameters"] == {"uri": str(version), "version": "3"}
    # MLServer imports the implementation from the model's folder.
    module, cls = model_settings["implementation"].split(".")
    runtime = model_dir / f"{module}.py"
    assert runtime.read_text() == spec.MLSERVER_RUNTIME.read_text()
    assert cls in classes_in(runtime)
    assert cls == ("TunedSavedModelRuntime" if variant.tricks else "SavedModelRuntime")


def test_mlserver_runtime_names_match_the_contract():
    from artifact import contract

    tree = ast.parse(spec.MLSERVER_RUNTIME.read_text())
    constants = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
    }
    assert constants["SIGNATURE_NAME"] == contract.SIGNATURE_NAME
    assert constants["INPUT_KEY"] == contract.INPUT_KEY == spec.INPUT_KEY
    assert set(constants["OUTPUT_KEYS"]) == set(contract.OUTPUT_KEYS)


@pytest.mark.parametrize(
    "path", [spec.MLSERVER_RUNTIME, spec.BENTOML_SERVICE], ids=lambda p: p.name
)
def test_the_peer_side_files_import_nothing_of_the_project(path):
    # They run in the peers' venvs, where only the peer and TensorFlow are installed.
    assert not imported_roots(path) & {"artifact", "service", "training", "benchmarks"}


# ---- BentoML's environment ------------------------------------------------------------


@pytest.mark.parametrize(
    "variant", [v for v in spec.ROWS if v.peer == "bentoml"], ids=lambda v: v.key
)
def test_bentoml_environment(tmp_path, variant):
    env = spec.bentoml_environment(variant, tmp_path / "1", tmp_path / "home")
    assert env["PEER_MODEL_PATH"] == str(tmp_path / "1")
    assert env["PEER_WORKERS"] == str(variant.settings["workers"])
    assert env["PEER_MAX_BATCH_SIZE"] == str(variant.settings["max_batch_size"])
    assert env["PEER_MAX_LATENCY_MS"] == str(variant.settings["max_latency_ms"])
    assert env["PEER_TRICKS"] == ("1" if variant.tricks else "0")
    assert env["BENTOML_HOME"] == str(tmp_path / "home")
    # Every variable the service reads is one this sets.
    read = set(
        re.findall(r"os\.environ(?:\.get\(|\[)\"(PEER_\w+)\"", spec.BENTOML_SERVICE.read_text())
    )
    assert read == {k for k in env if k.startswith("PEER_")}


def test_bentoml_service_is_batchable_and_takes_images():
    text = spec.BENTOML_SERVICE.read_text()
    assert "batchable=True" in text
    assert "def predict(self, images: Images)" in text
    assert "FashionMNIST" in classes_in(spec.BENTOML_SERVICE)
    assert list(spec.bentoml_body([[[0.0] * 28] * 28])) == ["images"]


# ---- the request bodies ----------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 8])
def test_mlserver_body_is_v2_json_with_the_same_pixels(n):
    body = tfserving_body(n)
    v2 = json.loads(spec.peer_body("mlserver", body))
    (tensor,) = v2["inputs"]
    assert tensor["name"] == "image" and tensor["datatype"] == "FP32"
    assert tensor["shape"] == [n, 28, 28]
    expected = np.asarray(json.loads(body)["instances"])
    np.testing.assert_array_equal(np.reshape(tensor["data"], tensor["shape"]), expected)


@pytest.mark.parametrize("n", [1, 8])
def test_bentoml_body_has_the_same_pixels(n):
    body = tfserving_body(n)
    ours = json.loads(spec.peer_body("bentoml", body))
    assert ours == {"images": json.loads(body)["instances"]}


@pytest.mark.parametrize("peer", ["mlserver", "bentoml"])
def test_every_body_carries_the_same_numbers_as_the_same_text(peer):
    # JSON numbers, not the digits of a name such as "FP32".
    number = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
    body = tfserving_body(2, seed=3)
    pixels = sorted(number.findall(body))
    # The peer's own numbers (shape) are the only extra ones.
    theirs = number.findall(spec.peer_body(peer, body))
    extra = [2, 28, 28] if peer == "mlserver" else []
    for value in extra:
        theirs.remove(str(value))
    assert sorted(theirs) == pixels


@pytest.mark.parametrize(
    "bad", [{"instances": [[0.5] * 28] * 28}, {"instances": [[[0.5] * 27] * 28]}]
)
def test_a_body_not_of_images_is_refused(bad):
    with pytest.raises(ValueError, match=r"\[n, 28, 28\]"):
        spec.instances_of(json.dumps(bad))


def test_peer_bodies_are_written_per_images_per_request(tmp_path):
    bodies = {}
    for n in (1, 8):
        bodies[n] = tmp_path / f"body-{n}.json"
        bodies[n].write_text(tfserving_body(n))
    written = run.peer_bodies("mlserver", bodies, tmp_path)
    assert sorted(written) == [1, 8]
    assert json.loads(written[8].read_text())["inputs"][0]["shape"] == [8, 28, 28]


# ---- the peers' answers ------------------------------------------------------------------


def test_probabilities_from_an_mlserver_answer():
    probs = np.full((2, 10), 0.1)
    answer = {
        "model_name": "fashion_mnist",
        "outputs": [
            {"name": "classes", "shape": [2], "datatype": "INT64", "data": [3, 4]},
            {
                "name": "probabilities",
                "shape": [2, 10],
                "datatype": "FP32",
                "data": probs.ravel().tolist(),
            },
        ],
    }
    np.testing.assert_array_equal(spec.probabilities("mlserver", answer), probs)


def test_probabilities_from_a_bentoml_answer():
    probs = np.eye(10)[:3]
    np.testing.assert_array_equal(spec.probabilities("bentoml", probs.tolist()), probs)


@pytest.mark.parametrize(
    "peer, answer, error",
    [
        (
            "mlserver",
            {"outputs": [{"name": "classes", "shape": [1], "data": [1]}]},
            "no 'probabilities'",
        ),
        (
            "mlserver",
            {"outputs": [{"name": "probabilities", "shape": [1, 5], "data": [0.2] * 5}]},
            r"\[n, 10\]",
        ),
        ("bentoml", [0.1] * 10, r"\[n, 10\]"),
    ],
)
def test_an_answer_without_probabilities_is_refused(peer, answer, error):
    with pytest.raises(ValueError, match=error):
        spec.probabilities(peer, answer)


@pytest.mark.parametrize(
    "variant, infer, ready",
    [
        (spec.BEST["mlserver"], "/v2/models/fashion_mnist/infer", "/v2/models/fashion_mnist/ready"),
        (spec.BEST["bentoml"], "/predict", "/readyz"),
        (spec.TABULAR_ROWS[0], "/v2/models/tabular_classifier/infer",
         "/v2/models/tabular_classifier/ready"),
        (spec.TABULAR_ROWS[2], "/predict", "/readyz"),
    ],
    ids=lambda value: getattr(value, "key", None),
)  # fmt: skip
def test_each_peer_answers_on_its_own_paths(variant, infer, ready):
    assert spec.infer_path(variant) == infer
    assert spec.ready_path(variant) == ready


# ---- starting a peer ---------------------------------------------------------------------


def test_a_peer_runs_without_this_projects_python_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    monkeypatch.setenv("VIRTUAL_ENV", "/work/.venv")
    env = run.peer_env({"X": "1"})
    assert "PYTHONPATH" not in env and "VIRTUAL_ENV" not in env and env["X"] == "1"


def test_mlserver_command(tmp_path):
    cmd, env, cwd = run.server_command(spec.BEST["mlserver"], tmp_path / "1", tmp_path, 8123)
    assert cmd[:2] == [str(venvs.command("mlserver")), "start"]
    settings = json.loads((Path(cmd[2]) / "settings.json").read_text())
    assert settings["http_port"] == 8123
    assert len({settings["http_port"], settings["grpc_port"], settings["metrics_port"]}) == 3
    assert cwd == tmp_path


def test_bentoml_command(tmp_path):
    variant = spec.BEST["bentoml"].with_tricks()
    cmd, env, cwd = run.server_command(variant, tmp_path / "1", tmp_path, 8124)
    assert cmd[:3] == [str(venvs.command("bentoml")), "serve", "bentoml_service:FashionMNIST"]
    assert cmd[cmd.index("--port") + 1] == "8124"
    assert (cwd / "bentoml_service.py").read_text() == spec.BENTOML_SERVICE.read_text()
    assert cmd[cmd.index("--working-dir") + 1] == str(cwd)
    assert env["PEER_TRICKS"] == "1"


# ---- the venvs and their locks -------------------------------------------------------------


def pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        name, sep, version = line.split("#")[0].strip().partition("==")
        if sep:
            out[name.lower().replace("_", "-").replace(".", "-")] = version.split()[0]
    return out


@pytest.mark.parametrize("peer", venvs.PEERS)
def test_a_peers_lock_agrees_with_the_projects_where_they_overlap(peer):
    theirs, ours = pins(venvs.lock_file(peer)), pins(venvs.RUNTIME_CONSTRAINTS)
    shared = set(theirs) & set(ours)
    assert {"tensorflow", "numpy", "protobuf"} <= shared
    assert {name: theirs[name] for name in shared} == {name: ours[name] for name in shared}
    # What the .in file asks for is what the lock pins.
    for name, version in pins(venvs.in_file(peer)).items():
        assert theirs[name] == version


def test_the_locks_pin_the_versions_that_run_with_the_services_tensorflow():
    mlserver, bentoml = pins(venvs.lock_file("mlserver")), pins(venvs.lock_file("bentoml"))
    assert mlserver["mlserver"] == spec.MLSERVER_VERSION == "1.7.1"
    assert mlserver["uvloop"] == "0.21.0"  # 0.22+: its parallel workers crash-looped
    assert bentoml["bentoml"] == spec.BENTOML_VERSION
    service = pins(venvs.PROJECT_LOCK)
    for lock in (mlserver, bentoml):
        assert lock["tensorflow"] == service["tensorflow"] == "2.21.0"
        assert int(lock["protobuf"].split(".")[0]) >= 5 and int(lock["numpy"].split(".")[0]) >= 2


def test_the_runtime_constraints_are_the_services_tensorflow_pins():
    """What every peer is held to: TensorFlow and the packages it pins, at the service's pins,
    and none of the service's web stack (a peer's own FastAPI may differ)."""
    runtime, service = pins(venvs.RUNTIME_CONSTRAINTS), pins(venvs.PROJECT_LOCK)
    assert {"tensorflow", "numpy", "protobuf", "grpcio", "keras"} <= set(runtime)
    assert runtime == {name: service[name] for name in runtime}
    assert not {"fastapi", "starlette", "uvicorn", "pydantic"} & set(runtime)


def test_install_command_holds_the_peer_to_the_projects_pins(tmp_path):
    cmd = venvs.install_command("mlserver", tmp_path / "python", venvs.lock_file("mlserver"))
    assert cmd[:4] == [str(tmp_path / "python"), "-m", "pip", "install"]
    assert cmd[cmd.index("-r") + 1] == str(venvs.lock_file("mlserver"))
    assert cmd[cmd.index("-c") + 1] == str(venvs.RUNTIME_CONSTRAINTS)
    assert "--require-hashes" in cmd


def test_the_service_on_tensorflow_215_is_installed_hash_checked_by_uv(tmp_path):
    cmd = venvs.service_on_tf215_install_command(tmp_path / "python", tmp_path / "req.txt")
    assert Path(cmd[0]).name == "uv" and cmd[1:3] == ["pip", "install"]
    assert cmd[cmd.index("--python") + 1] == str(tmp_path / "python")
    assert cmd[cmd.index("-r") + 1] == str(tmp_path / "req.txt") and "--require-hashes" in cmd


def test_the_service_on_tensorflow_215_asks_for_no_protobuf_past_the_trainers(tmp_path):
    """TensorFlow 2.15 holds protobuf below 5: no package of the service's lock that the venv
    gets may ask for 5 or more (the OTLP exporter's do, and made the install unsolvable), as
    the service's own venv's metadata of each says."""
    from importlib import metadata

    from packaging.requirements import Requirement

    requirements = tmp_path / "requirements.txt"
    requirements.write_text(venvs.service_on_tf215_requirements())
    wanted = pins(requirements)
    protobuf = wanted["protobuf"]
    assert int(protobuf.split(".")[0]) < 5
    training = set(pins(venvs.TRAINING_LOCK))
    refusing = []
    for name in set(wanted) - training:
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            requirement = Requirement(text)
            unconditional = requirement.marker is None
            if (
                requirement.name == "protobuf"
                and unconditional
                and not (requirement.specifier.contains(protobuf))
            ):
                refusing.append(f"{name}: {text}")
    assert refusing == []
    assert "opentelemetry-proto" not in wanted and "opentelemetry-sdk" in wanted


def test_relock_compiles_the_in_file_with_hashes_on_the_projects_pins():
    cmd = venvs.relock_command("bentoml")
    assert cmd[1:4] == ["pip", "compile", "benchmarks/peers/requirements-bentoml.in"]
    assert cmd[cmd.index("--output-file") + 1] == "benchmarks/peers/requirements-bentoml.lock"
    assert cmd[cmd.index("--constraint") + 1] == "benchmarks/peers/tensorflow-runtime.txt"
    assert "--generate-hashes" in cmd
    header = venvs.lock_file("bentoml").read_text().splitlines()[1]
    assert header == f"#    {venvs.RELOCK_COMMAND}"


def test_a_venv_counts_as_installed_only_from_the_current_locks(tmp_path, monkeypatch):
    lock = tmp_path / "requirements-mlserver.lock"
    lock.write_text("mlserver==1.6.1\n")
    monkeypatch.setattr(venvs, "lock_file", lambda peer: lock)
    assert not venvs.is_installed("mlserver", tmp_path)
    (tmp_path / "mlserver" / "bin").mkdir(parents=True)
    (tmp_path / "mlserver" / "bin" / "mlserver").write_text("")
    venvs.stamp("mlserver", tmp_path).write_text(venvs.fingerprint("mlserver") + "\n")
    assert venvs.is_installed("mlserver", tmp_path)
    lock.write_text("mlserver==1.6.1\nuvloop==0.21.0\n")
    assert not venvs.is_installed("mlserver", tmp_path)


def test_parse_freeze():
    text = "MLServer==1.6.1\ntensorflow==2.15.1\nuvloop==0.21.0\nzipp==4.1.2\n-e git+x#egg=y\n"
    assert venvs.parse_freeze(text, {"mlserver", "tensorflow", "uvloop"}) == {
        "mlserver": "1.6.1",
        "tensorflow": "2.15.1",
        "uvloop": "0.21.0",
    }


def test_the_venvs_live_in_a_git_ignored_folder():
    assert venvs.PEERS_DIR == ROOT / "benchmarks" / ".peers"
    assert "benchmarks/.peers/" in (ROOT / ".gitignore").read_text().splitlines()


def test_make_bench_peers_runs_the_bench_with_the_peers():
    makefile = (ROOT / "Makefile").read_text()
    target = re.search(r"^bench-peers:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert target, "no bench-peers target"
    assert "-m benchmarks.bench --peers" in target.group(1)
    assert re.search(r"^\.PHONY:.*\bbench-peers\b", makefile, re.M)


# ---- the results: rows in the same table and chart ------------------------------------------


def load_result(rps: float, p99: float, n: int = 1) -> dict:
    return {
        "requests_per_s": rps,
        "images_per_s": rps * n,
        "p50_ms": p99 / 2,
        "p99_ms": p99,
        "errors": 0,
    }


LOADS = {"c1x1": 1, "c64x1": 1, "c16x8": 8}


def peer_row(variant: spec.Variant, rps: float, p99: float) -> dict:
    return {
        **run.describe_row(variant),
        "startup_s": 12.3,
        "max_abs_diff": 3e-8,
        "versions": {variant.peer: "x", "tensorflow": "2.15.1"},
        "loads": {load: load_result(rps, p99, n) for load, n in LOADS.items()},
    }


def full_result(peers: dict) -> dict:
    servers = {
        name: {load: load_result(rps, 20.0, n) for load, n in LOADS.items()}
        for name, rps in (
            ("naive", 200.0), ("unbatched", 900.0), ("batched", 3000.0), ("workers", 3600.0)
        )
    }  # fmt: skip
    ratios = {
        load: {"unbatched_vs_ceiling": 0.1, "batched_vs_ceiling": 0.3, "batched_vs_naive": 15.0,
               "workers_vs_ceiling": 0.36}
        for load in LOADS
    }  # fmt: skip
    return {
        "date": "2025-01-01 00:00",
        "machine": {"cores": 2},
        "ceiling": {"best_batch": 256, "images_per_s": 10000.0, "batch1_p50_ms": 0.8},
        "servers": servers,
        "ratios": ratios,
        "protocols": {},
        "peers": peers,
    }


def sample_peers() -> dict:
    mlserver, mlserver_tricks, bentoml, bentoml_tricks = spec.ROWS
    peers = {
        "mlserver": peer_row(mlserver, 1000.0, 80.0),
        "mlserver_tricks": peer_row(mlserver_tricks, 1200.0, 60.0),
        "bentoml": peer_row(bentoml, 750.0, 200.0),
    }
    peers["bentoml_tricks"] = {
        **run.describe_row(bentoml_tricks),
        "error": "server exited: Traceback ...\nImportError: no module named tensorflow",
        "loads": {},
        "versions": {},
    }
    return peers


def test_the_peers_rows_join_each_load_of_the_main_table():
    text = bench.table(full_result(sample_peers()))
    lines = text.splitlines()
    for load, c_n in (
        ("c1x1", "c=1, 1 img/req"),
        ("c64x1", "c=64, 1 img/req"),
        ("c16x8", "c=16, 8 img/req"),
    ):
        block = [line for line in lines if line.startswith(f"| {c_n} |")]
        assert [line.split(" | ")[1] for line in block] == [
            "(2) naive FastAPI",
            "(3) service, batching off",
            "(4) service, batching on",
            "(5) service, WORKERS=2",
            f"(6) {spec.ROWS[0].title}",
            f"(7) {spec.ROWS[1].title}",
            f"(8) {spec.ROWS[2].title}",
        ], load
    assert "| c=16, 8 img/req | (8) BentoML 1.4.40" in text and "| 750 | 6,000 |" in text
    assert "| c64x1 | 0.10 | 0.30 | 0.36 | 15.0x |" in text


def test_the_table_compares_the_service_with_each_peer_at_c64():
    text = bench.table(full_result(sample_peers()))
    assert "(4) against the peers at c=64, 1 img/req" in text
    # 3000 req/s and p99 20 ms against 1000 req/s, 80 ms: 3.0x and a quarter.
    assert f"| (6) {spec.ROWS[0].title} | 1,000 | 3.0x | 0.25 |" in text
    assert f"| (8) {spec.ROWS[2].title} | 750 | 4.0x | 0.10 |" in text
    # The failed peer says why, in the settings list, and has no rows.
    assert "(9) BentoML" in text and "FAILED" in text and "ImportError" in text
    assert "| (9)" not in text


def test_settings_list_says_versions_startup_and_the_check():
    text = report.settings_table(sample_peers())
    assert "up in 12 s" in text and "within 3e-08 of tf.saved_model.load's" in text
    assert "tensorflow 2.15.1" in text and "'parallel_workers': 1" in text


def test_a_result_without_peers_reads_as_before():
    result = full_result({})
    del result["peers"]
    text = bench.table(result)
    assert "(6)" not in text and "against the peers" not in text


def test_the_chart_has_a_bar_per_peer(tmp_path):
    path = tmp_path / "chart.png"
    bench.chart(full_result(sample_peers()), path)
    assert path.stat().st_size > 10_000
    labels = report.short_labels(sample_peers())
    assert list(labels.values()) == [
        "(6) MLServer",
        "(7) MLServer + tricks",
        "(8) BentoML",
        "(9) BentoML + tricks",
    ]


def test_peers_table_alone():
    text = report.peers_table(sample_peers())
    assert text.count("| c=64, 1 img/req |") == 3


@pytest.mark.parametrize(
    "argv", [["sweep", "--only", "mlserver", "nope"], ["lock", "mlserver", "torchserve"]]
)
def test_the_command_line_refuses_unknown_names(argv, capsys):
    from benchmarks.peers.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert "unknown" in capsys.readouterr().err


# ---- the tabular classifier -----------------------------------------------------------------

TABULAR_ROWS_OF_A_CSV = [
    {"x1": 0.1257, "x2": 3.6729, "rooms": 3, "color": "green"},
    {"x1": -0.1321, "x2": 3.7732, "rooms": 1, "color": "blue"},
]


def tabular_body(rows: list[dict]) -> str:
    """A body as benchmarks/generic.py writes the tabular classifier's."""
    return json.dumps({"instances": rows, "signature_name": "predict"})


def test_the_tabular_rows_are_the_same_peers_and_settings_on_the_other_model():
    assert [v.key for v in spec.TABULAR_ROWS] == [f"{v.key}_tabular" for v in spec.ROWS]
    for tabular, fashion in zip(spec.TABULAR_ROWS, spec.ROWS, strict=True):
        assert tabular.model == spec.TABULAR and fashion.model == spec.MODEL_NAME
        assert (tabular.peer, tabular.settings, tabular.tricks, tabular.title) == (
            fashion.peer, fashion.settings, fashion.tricks, fashion.title
        )  # fmt: skip
        assert spec.BY_KEY[tabular.key] == tabular


@pytest.mark.parametrize(
    "variant", [v for v in spec.TABULAR_ROWS if v.peer == "mlserver"], ids=lambda v: v.key
)
def test_mlserver_repository_for_the_tabular_classifier(tmp_path, variant):
    version = tmp_path / "models" / "tabular_classifier" / "2"
    root = spec.write_mlserver_repository(variant, version, tmp_path / "repo", (8001, 8002, 8003))
    model_dir = root / "tabular_classifier"
    model_settings = json.loads((model_dir / "model-settings.json").read_text())
    assert model_settings["name"] == "tabular_classifier"
    assert model_settings["parameters"] == {
        "uri": str(version), "version": "2", "extra": {"signature": "predict"}
    }  # fmt: skip
    module, cls = model_settings["implementation"].split(".")
    assert cls in classes_in(model_dir / f"{module}.py")
    expected = "TunedTabularSavedModelRuntime" if variant.tricks else "TabularSavedModelRuntime"
    assert cls == expected
    # As MLServer's docs decode tabular requests: with PandasCodec, into a DataFrame.
    assert "default_codec=PandasCodec" in spec.MLSERVER_RUNTIME.read_text()


@pytest.mark.parametrize(
    "variant", [v for v in spec.TABULAR_ROWS if v.peer == "bentoml"], ids=lambda v: v.key
)
def test_bentoml_environment_and_command_for_the_tabular_classifier(tmp_path, variant):
    env = spec.bentoml_environment(variant, tmp_path / "1", tmp_path / "home")
    assert env["PEER_SIGNATURE"] == "predict"
    assert env["PEER_TRICKS"] == ("1" if variant.tricks else "0")
    read = set(
        re.findall(r"os\.environ(?:\.get\(|\[)\"(PEER_\w+)\"",
                   spec.BENTOML_TABULAR_SERVICE.read_text())
    )  # fmt: skip
    assert read == {k for k in env if k.startswith("PEER_")}
    cmd, env, cwd = run.server_command(variant, tmp_path / "1", tmp_path, 8125)
    assert cmd[2] == "bentoml_tabular_service:TabularClassifier"
    assert (cwd / "bentoml_tabular_service.py").read_text() == (
        spec.BENTOML_TABULAR_SERVICE.read_text()
    )
    # The Fashion-MNIST service reads no signature: its environment sets none.
    assert "PEER_SIGNATURE" not in spec.bentoml_environment(
        spec.BEST["bentoml"], tmp_path, tmp_path
    )


def test_the_bentoml_tabular_service_takes_a_batch_of_the_models_named_fields():
    text = spec.BENTOML_TABULAR_SERVICE.read_text()
    assert "batchable=True" in text and "def predict(self, rows: list[Row])" in text
    assert {"Row", "TabularClassifier"} <= classes_in(spec.BENTOML_TABULAR_SERVICE)
    tree = ast.parse(text)
    (row,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Row"]
    fields = {n.target.id: n.annotation.id for n in row.body if isinstance(n, ast.AnnAssign)}
    # The sample data's features (training/sample_data.py), at the types generic.py sends.
    assert fields == {"x1": "float", "x2": "float", "rooms": "int", "color": "str"}
    assert not imported_roots(spec.BENTOML_TABULAR_SERVICE) & {
        "artifact", "service", "training", "benchmarks"
    }  # fmt: skip


def test_mlserver_tabular_body_is_a_column_per_feature_as_pandas_codec_writes_it():
    body = json.loads(spec.peer_body("mlserver", tabular_body(TABULAR_ROWS_OF_A_CSV), spec.TABULAR))
    assert body["parameters"] == {"content_type": "pd"}
    columns = {column["name"]: column for column in body["inputs"]}
    assert list(columns) == ["x1", "x2", "rooms", "color"]
    assert columns["x1"] == {"name": "x1", "shape": [2, 1], "datatype": "FP32",
                             "data": [0.1257, -0.1321]}  # fmt: skip
    assert columns["rooms"]["datatype"] == "INT64" and columns["rooms"]["data"] == [3, 1]
    assert columns["color"]["datatype"] == "BYTES"
    assert columns["color"]["parameters"] == {"content_type": "str"}
    assert columns["color"]["data"] == ["green", "blue"]


def test_bentoml_tabular_body_is_the_rows_under_the_apis_argument():
    body = json.loads(spec.peer_body("bentoml", tabular_body(TABULAR_ROWS_OF_A_CSV), spec.TABULAR))
    assert body == {"rows": TABULAR_ROWS_OF_A_CSV}


@pytest.mark.parametrize("peer", ["mlserver", "bentoml"])
def test_every_tabular_body_carries_the_same_numbers_as_the_same_text(peer):
    number = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
    body = tabular_body(TABULAR_ROWS_OF_A_CSV)
    theirs = number.findall(spec.peer_body(peer, body, spec.TABULAR))
    for value in [2, 1] * 4 if peer == "mlserver" else []:  # each column's shape
        theirs.remove(str(value))
    assert sorted(theirs) == sorted(number.findall(json.dumps(TABULAR_ROWS_OF_A_CSV)))


def test_a_tabular_body_without_named_rows_is_refused():
    with pytest.raises(ValueError, match="named values"):
        spec.instances_of(json.dumps({"instances": [[0.5, 1.0]]}), spec.TABULAR)


def test_tabular_probabilities_are_read_at_the_models_classes():
    answer = {"outputs": [{"name": "probabilities", "shape": [1, 3], "data": [0.2, 0.3, 0.5]}]}
    np.testing.assert_array_equal(
        spec.probabilities("mlserver", answer, classes=3), [[0.2, 0.3, 0.5]]
    )
    with pytest.raises(ValueError, match=r"\[n, 10\]"):
        spec.probabilities("mlserver", answer)


def test_the_tabular_peers_rows_and_their_comparison_in_the_other_models_table():
    from benchmarks import generic

    peers = {
        "mlserver_tabular": peer_row(spec.TABULAR_ROWS[0], 400.0, 90.0),
        "bentoml_tabular": peer_row(spec.TABULAR_ROWS[2], 300.0, 120.0),
    }
    tabular = {
        "title": "tabular classifier", "version": "/m/1",
        "ceiling": {"images_per_s": 100000.0, "best_batch": 256, "batch1_p50_ms": 1.0},
        "loads": {load: load_result(1200.0, 30.0, n) for load, n in LOADS.items()},
        "peers": peers,
    }  # fmt: skip
    result = {**full_result({}), "generic": {"tabular": tabular},
              "floor": {"one_process": {"c64x1": load_result(2000.0, 10.0)}}}  # fmt: skip
    text = generic.generic_table(result)
    assert (
        f"| tabular classifier on (6) {spec.TABULAR_ROWS[0].title} | c=64, 1/req | 400 | 400 |"
        in text
    )
    assert "(4) against the peers on the tabular classifier at c=64, 1 row/req" in text
    assert f"| (6) {spec.TABULAR_ROWS[0].title} | 400 | 3.0x | 0.33 |" in text
    assert f"| (7) {spec.TABULAR_ROWS[2].title} | 300 | 4.0x | 0.25 |" in text
    assert "Peers on the tabular classifier (benchmarks/peers/):" in text
    # The ceiling is the model's, said once.
    assert text.count("tabular classifier: 100,000/s at batch 256") == 1
    rows = {row["what"]: row for row in bench.tabular_targets(result)}
    floor_row = rows["tabular classifier c=64, 1 row/req: share of the HTTP floor"]
    assert floor_row["measured"] == 0.6 and floor_row["met"]
    versus = rows[f"tabular classifier vs {spec.TABULAR_ROWS[0].title}: throughput x"]
    assert versus["measured"] == 3.0 and versus["met"]
    slower = {**result, "generic": {"tabular": {**tabular, "loads": {
        "c64x1": load_result(850.0, 30.0)}}}}  # fmt: skip
    assert not any(row["met"] for row in bench.tabular_targets(slower))
