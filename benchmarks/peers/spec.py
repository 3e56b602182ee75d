"""What each peer is given: its settings, its files, its request bodies, and how its answers
are read. Pure data and JSON, no TensorFlow and no peer package: the fast tests cover it all.

A `Variant` is one row of the benchmark: a peer (MLServer or BentoML), its own batching knobs,
whether it also gets this project's two tricks (gc.freeze() after loading, and the signature
called through a concrete tf.function), and the model it serves: Fashion-MNIST's image
classifier, or the tabular classifier (a pre-made Estimator on named features, through each
peer's own runtime for it). `ROWS` are the Fashion-MNIST rows `make bench-peers` adds,
`TABULAR_ROWS` the same peers and settings on the tabular classifier; `SWEEP` are the
settings tried to choose them (`python -m benchmarks.peers sweep`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from itertools import chain
from pathlib import Path

import numpy as np

MODEL_NAME = "fashion_mnist"
# The tabular classifier of benchmarks/generic.py: named inputs, its signature `predict`.
TABULAR = "tabular_classifier"
# The signature each model is served through.
SIGNATURES = {MODEL_NAME: "serving_default", TABULAR: "predict"}
INPUT_KEY = "image"
OUTPUT_KEYS = ("classes", "probabilities")
IMAGE_SHAPE = (28, 28)
# The versions the peers' locks pin (benchmarks/peers/requirements-*.lock).
MLSERVER_VERSION = "1.7.1"
BENTOML_VERSION = "1.4.40"

HERE = Path(__file__).resolve().parent
MLSERVER_RUNTIME = HERE / "mlserver_runtime.py"
BENTOML_SERVICE = HERE / "bentoml_service.py"
BENTOML_TABULAR_SERVICE = HERE / "bentoml_tabular_service.py"
# Per model: MLServer's runtime classes (as the docs write it, with the tricks) and BentoML's
# service file and class.
MLSERVER_RUNTIMES = {
    MODEL_NAME: ("SavedModelRuntime", "TunedSavedModelRuntime"),
    TABULAR: ("TabularSavedModelRuntime", "TunedTabularSavedModelRuntime"),
}
BENTOML_SERVICES = {
    MODEL_NAME: (BENTOML_SERVICE, "FashionMNIST"),
    TABULAR: (BENTOML_TABULAR_SERVICE, "TabularClassifier"),
}


@dataclass(frozen=True)
class Variant:
    """One peer with one group of settings: a row of the table."""

    key: str  # the row's key in the results' JSON
    peer: str  # "mlserver" | "bentoml"
    settings: dict = field(default_factory=dict)
    tricks: bool = False
    model: str = MODEL_NAME  # MODEL_NAME or TABULAR

    @property
    def title(self) -> str:
        return f"{PEER_NAMES[self.peer]}, {describe(self)}"

    def with_tricks(self) -> Variant:
        return replace(self, key=f"{self.key}_tricks", tricks=True)

    def serving(self, model: str) -> Variant:
        """The same peer and settings serving another model (its key says which)."""
        return replace(self, key=f"{self.key}_{model.split('_')[0]}", model=model)


PEER_NAMES = {
    "mlserver": f"MLServer {MLSERVER_VERSION}",
    "bentoml": f"BentoML {BENTOML_VERSION}",
}


def describe(variant: Variant) -> str:
    """The settings in words, for the table and the chart's legend."""
    s = variant.settings
    if variant.peer == "mlserver":
        text = (
            f"adaptive batching {s['max_batch_size']} / {s['max_batch_time'] * 1000:g} ms, "
            f"{s['parallel_workers']} parallel worker{'s' if s['parallel_workers'] != 1 else ''}"
        )
    else:
        text = (
            f"batchable API {s['max_batch_size']} / {s['max_latency_ms']:g} ms, "
            f"{s['workers']} worker{'s' if s['workers'] != 1 else ''}"
        )
    return text + (", + gc.freeze + tf.function" if variant.tricks else "")


def mlserver(key: str, parallel_workers: int, max_batch_size: int, max_batch_time: float):
    settings = {
        "parallel_workers": parallel_workers,
        "max_batch_size": max_batch_size,
        "max_batch_time": max_batch_time,
    }
    return Variant(key, "mlserver", settings)


def bentoml(key: str, workers: int, max_batch_size: int, max_latency_ms: int):
    settings = {"workers": workers, "max_batch_size": max_batch_size}
    settings["max_latency_ms"] = max_latency_ms
    return Variant(key, "bentoml", settings)


# The settings tried (`python -m benchmarks.peers sweep`); docs/benchmark-peers.md has the
# numbers. MLServer: its default of one parallel worker (inference in a separate process),
# none (inference on the HTTP process's event loop) and two; batch sizes and waits around
# this service's own (64 images, a few ms). BentoML: one and two workers; its defaults (100
# requests, 60 s), a smaller batch and a 1 s budget, and 64 (its dispatcher answers 503 to a
# request it expects to wait longer than max_latency_ms, so a small budget sheds load).
SWEEP = [
    mlserver("mlserver_w1_b64_t5", 1, 64, 0.005),
    mlserver("mlserver_w0_b64_t5", 0, 64, 0.005),
    mlserver("mlserver_w2_b64_t5", 2, 64, 0.005),
    mlserver("mlserver_w1_b16_t2", 1, 16, 0.002),
    mlserver("mlserver_w1_b128_t10", 1, 128, 0.010),
    bentoml("bentoml_w1_b100_l60000", 1, 100, 60000),
    bentoml("bentoml_w2_b100_l60000", 2, 100, 60000),
    bentoml("bentoml_w2_b32_l1000", 2, 32, 1000),
    bentoml("bentoml_w2_b64_l60000", 2, 64, 60000),
]
SWEEP_BY_KEY = {v.key: v for v in SWEEP}

# The rows `make bench-peers` adds: each peer's best setting from the sweep as its docs
# show it, then the same with the two tricks.
BEST = {
    "mlserver": replace(SWEEP_BY_KEY["mlserver_w1_b64_t5"], key="mlserver"),
    "bentoml": replace(SWEEP_BY_KEY["bentoml_w2_b100_l60000"], key="bentoml"),
}
ROWS = list(chain.from_iterable((v, v.with_tricks()) for v in BEST.values()))
# The same rows on the tabular classifier (the settings chosen on Fashion-MNIST's sweep).
TABULAR_ROWS = [v.serving(TABULAR) for v in ROWS]
# Every named variant, for `python -m benchmarks.peers sweep --only KEY...`.
BY_KEY = {v.key: v for v in [*SWEEP, *ROWS, *TABULAR_ROWS]}


# ---- MLServer's files ------------------------------------------------------------------


def mlserver_settings(variant: Variant, http_port: int, grpc_port: int, metrics_port: int,
                      metrics_dir: Path) -> dict:  # fmt: skip
    """settings.json: the server's own settings (ports, parallel workers).

    `debug` off: on, uvicorn logs every request (the other servers here log none).
    """
    return {
        "debug": False,
        "host": "127.0.0.1",
        "http_port": http_port,
        "grpc_port": grpc_port,
        "metrics_port": metrics_port,
        "metrics_dir": str(metrics_dir),
        "parallel_workers": variant.settings["parallel_workers"],
    }


def mlserver_model_settings(variant: Variant, version_path: Path) -> dict:
    """model-settings.json: the custom runtime, the SavedModel's folder, adaptive batching
    (and for the tabular runtime, the signature's name in `parameters.extra`)."""
    runtime = MLSERVER_RUNTIMES[variant.model][1 if variant.tricks else 0]
    parameters: dict = {"uri": str(version_path), "version": version_path.name}
    if variant.model != MODEL_NAME:
        parameters["extra"] = {"signature": SIGNATURES[variant.model]}
    return {
        "name": variant.model,
        "implementation": f"{MLSERVER_RUNTIME.stem}.{runtime}",
        "max_batch_size": variant.settings["max_batch_size"],
        "max_batch_time": variant.settings["max_batch_time"],
        "parameters": parameters,
    }


def write_mlserver_repository(
    variant: Variant, version_path: Path, root: Path, ports: tuple[int, int, int]
) -> Path:
    """A model repository for `mlserver start root`: settings.json at the top, the model's
    folder with its model-settings.json and the runtime module beside it."""
    http_port, grpc_port, metrics_port = ports
    model_dir = root / variant.model
    model_dir.mkdir(parents=True, exist_ok=True)
    (root / "metrics").mkdir(exist_ok=True)
    settings = mlserver_settings(variant, http_port, grpc_port, metrics_port, root / "metrics")
    (root / "settings.json").write_text(json.dumps(settings, indent=2) + "\n")
    model_settings = mlserver_model_settings(variant, version_path)
    (model_dir / "model-settings.json").write_text(json.dumps(model_settings, indent=2) + "\n")
    (model_dir / MLSERVER_RUNTIME.name).write_text(MLSERVER_RUNTIME.read_text())
    return root


# ---- BentoML's environment ------------------------------------------------------------


def bentoml_environment(variant: Variant, version_path: Path, home: Path) -> dict[str, str]:
    """What the BentoML service of the variant's model reads at import (BENTOML_SERVICES),
    and BentoML's own home."""
    s = variant.settings
    signature = {} if variant.model == MODEL_NAME else {"PEER_SIGNATURE": SIGNATURES[variant.model]}
    return {
        **signature,
        "PEER_MODEL_PATH": str(version_path),
        "PEER_WORKERS": str(s["workers"]),
        "PEER_MAX_BATCH_SIZE": str(s["max_batch_size"]),
        "PEER_MAX_LATENCY_MS": str(s["max_latency_ms"]),
        "PEER_TRICKS": "1" if variant.tricks else "0",
        "BENTOML_HOME": str(home),
        "BENTOML_DO_NOT_TRACK": "true",
    }


# ---- Where each peer answers, and the request bodies ----------------------------------


def infer_path(variant: Variant) -> str:
    """Where the peer takes the variant's model's requests."""
    return f"/v2/models/{variant.model}/infer" if variant.peer == "mlserver" else "/predict"


def ready_path(variant: Variant) -> str:
    """What answers 200 once the peer serves the variant's model."""
    return f"/v2/models/{variant.model}/ready" if variant.peer == "mlserver" else "/readyz"


def instances_of(tfserving_body: str | bytes, model: str = MODEL_NAME) -> list:
    """The instances of one of the benchmark's TF Serving bodies, as parsed: images as nested
    lists, or for the tabular classifier rows as {name: value}."""
    instances = json.loads(tfserving_body)["instances"]
    if model != MODEL_NAME:
        if not instances or not all(isinstance(row, dict) for row in instances):
            raise ValueError("expected instances of named values ({name: value} per row)")
        return instances
    shape = np.shape(instances)
    if len(shape) != 3 or shape[1:] != IMAGE_SHAPE:
        raise ValueError(f"expected instances of shape [n, 28, 28], got {list(shape)}")
    return instances


def mlserver_body(instances: list) -> dict:
    """The Open Inference Protocol's JSON: one FP32 tensor named `image`, data row-major."""
    n = len(instances)
    data = [pixel for image in instances for row in image for pixel in row]
    return {
        "inputs": [
            {"name": INPUT_KEY, "shape": [n, *IMAGE_SHAPE], "datatype": "FP32", "data": data}
        ]
    }


def bentoml_body(instances: list) -> dict:
    """BentoML's JSON for an API taking one argument: {argument name: value}."""
    return {"images": instances}


# A JSON value's type -> the Open Inference Protocol's datatype for its column.
V2_DATATYPES = {float: "FP32", int: "INT64", str: "BYTES"}


def mlserver_tabular_body(rows: list[dict]) -> dict:
    """The Open Inference Protocol's JSON as MLServer's PandasCodec writes a DataFrame: one
    input per column, shape [n, 1], strings as BYTES with content type "str"."""
    inputs = []
    for name in rows[0]:
        values = [row[name] for row in rows]
        datatype = V2_DATATYPES[type(values[0])]
        column = {"name": name, "shape": [len(values), 1], "datatype": datatype, "data": values}
        if datatype == "BYTES":
            column["parameters"] = {"content_type": "str"}
        inputs.append(column)
    return {"parameters": {"content_type": "pd"}, "inputs": inputs}


def bentoml_tabular_body(rows: list[dict]) -> dict:
    """BentoML's JSON for the tabular API: its one argument, a list of named rows."""
    return {"rows": rows}


BODY = {"mlserver": mlserver_body, "bentoml": bentoml_body}
TABULAR_BODY = {"mlserver": mlserver_tabular_body, "bentoml": bentoml_tabular_body}


def peer_body(peer: str, tfserving_body: str | bytes, model: str = MODEL_NAME) -> str:
    """The same instances (the same numbers, as the same text) in the peer's own format."""
    write = BODY[peer] if model == MODEL_NAME else TABULAR_BODY[peer]
    return json.dumps(write(instances_of(tfserving_body, model)))


def probabilities(peer: str, response: dict | list, classes: int = 10) -> np.ndarray:
    """The probabilities [n, classes] in a peer's JSON answer.

    Raises:
        ValueError: the answer has none, or not in the expected shape.
    """
    if peer == "mlserver":
        outputs = {o["name"]: o for o in response.get("outputs", [])}
        if "probabilities" not in outputs:
            raise ValueError(f"no 'probabilities' output in {sorted(outputs)}")
        out = outputs["probabilities"]
        result = np.asarray(out["data"], np.float64).reshape(out["shape"])
    else:
        result = np.asarray(response, np.float64)
    if result.ndim != 2 or result.shape[1] != classes:
        raise ValueError(f"expected probabilities [n, {classes}], got shape {list(result.shape)}")
    return result
