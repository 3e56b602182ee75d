"""`make bench`'s rows for models of other contracts than Fashion-MNIST's, beside its rows.

Fashion-MNIST has the service's fast paths (28x28 float images, the contract's outputs). Two
models that take the generic path are measured the same way, so a generic path that is slow
shows next to the fast one:

- `tabular_classifier`: the shipped example (`make serve-examples`), a LinearClassifier on
  the CSV file `python -m training sample-data` writes, asked through TF Serving's `:predict`
  with named instances (`{"x1": ..., "x2": ..., "rooms": ..., "color": "red"}`) and
  `signature_name` "predict" (its raw receiver exports no other signature);
- `shapes`: the image-folder CNN on sample-data's shapes/ at 32x32x3, rows of
  [32][32][3] floats through `serving_default`.

Each is the newest version under models/<name> when there is one (speed does not depend on
accuracy), else trained now, in seconds, on freshly written sample data. Each gets its own
in-process ceiling (its SavedModel at its best batch size) and then the service (batching on,
the defaults) serving both from one model config is loaded with wrk, one model at a time,
at GENERIC_LOADS. Before it is timed, each model's answer to the one-instance body is held
against its SavedModel's, so a row measures real answers.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np

from benchmarks.common import (
    PATH,
    ROOT,
    find_or_train_model,
    free_port,
    measure_ceiling,
    request_bodies,
    run_loads,
    run_wrk,
    start_server,
    stop_server,
    training_python,
)

# (concurrency, instances per request): one instance at c=1 and c=64, eight at c=16, as
# Fashion-MNIST's rows of the same loads.
GENERIC_LOADS = [(1, 1), (64, 1), (16, 8)]
# Largest difference allowed between a served answer and the SavedModel's own (JSON floats).
TOLERANCE = 1e-4
# How the bench trains a missing model: quickly (its speed does not depend on its accuracy).
TRAIN_STEPS = 20
# TF Serving's signature dtypes (DataType enum values) -> how a JSON instance writes them.
_JSON_TYPES = {1: float, 9: int, 7: str}  # DT_FLOAT, DT_INT64, DT_STRING


@dataclasses.dataclass(frozen=True)
class GenericModel:
    """A model of another contract: its name in the repository, how to train it from the
    sample data (options after `python -m training train`), the signature a request names
    (None: serving_default), and what its instances are."""

    key: str
    name: str
    title: str
    train_options: tuple[str, ...]
    signature: str | None
    instance_kind: str  # "row" or "image"


MODELS = (
    GenericModel(
        "tabular",
        "tabular_classifier",
        "tabular classifier (LinearClassifier, 4 named features)",
        ("--csv", "{data}/classification.csv", "--label", "label", "--model", "linear",
         "--batch-size", "32", "--learning-rate", "0.05"),
        "predict",
        "row",
    ),
    GenericModel(
        "image32",
        "shapes",
        "32x32x3 image CNN (shapes)",
        ("--image-folder", "{data}/shapes", "--image-size", "32", "--channels", "3",
         "--batch-size", "16"),
        None,
        "image",
    ),
)  # fmt: skip


def sample_data(workdir: Path) -> Path:
    """sample-data's files under workdir/data, written once (the training side's command)."""
    data = workdir / "data"
    if not (data / "classification.csv").is_file():
        subprocess.run(
            [training_python(), "-m", "training", "sample-data", "--out", str(data)],
            check=True,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
        )
    return data


def find_or_train(model: GenericModel, workdir: Path, models_root: Path) -> Path:
    """The newest version under models_root/<name>, or one trained now into workdir."""
    from artifact.repository import list_versions

    versions = list_versions(models_root / model.name)
    if versions:
        return versions[-1][1]
    print(f"No version of {model.name} under {models_root}: training one quickly.", flush=True)
    data = sample_data(workdir)
    export = workdir / "models" / model.name
    options = [option.replace("{data}", str(data)) for option in model.train_options]
    subprocess.run(
        [training_python(), "-m", "training", "train", *options, "--max-steps", str(TRAIN_STEPS),
         "--seed", "0", "--model-dir", str(workdir / "runs" / model.name),
         "--export-dir", str(export)],
        check=True, cwd=ROOT, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    return list_versions(export)[-1][1]


def signature_inputs(version: Path, signature: str | None) -> dict[str, tuple[int, list[int]]]:
    """A signature's inputs: name -> (dtype enum, shape with -1 for unknown dimensions)."""
    from artifact.saved_model import signature_def_map

    name = signature or "serving_default"
    inputs = signature_def_map(version).signature_def[name].inputs
    return {
        key: (info.dtype, [dim.size for dim in info.tensor_shape.dim])
        for key, info in sorted(inputs.items())
    }


def csv_instances(path: Path, types: dict[str, type], count: int) -> list[dict]:
    """The first `count` rows of a CSV file as named instances, each value of its input's
    JSON type (other columns, the label's, left out)."""
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))[:count]
    return [{name: kind(row[name]) for name, kind in types.items()} for row in rows]


def image_instances(folder: Path, height: int, width: int, channels: int, count: int) -> list:
    """The first `count` images under a folder as [height][width][channels] floats in
    [0, 1], four decimals, as a client writes them."""
    from PIL import Image

    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in (".png", ".jpg"))[:count]
    mode = "RGB" if channels == 3 else "L"
    out = []
    for path in files:
        with Image.open(path) as image:
            pixels = np.asarray(image.convert(mode).resize((width, height)), np.float64) / 255
        out.append(np.round(pixels.reshape(height, width, channels), 4).tolist())
    return out


def instances_for(model: GenericModel, version: Path, data: Path, count: int) -> list:
    """`count` instances of the model's request, from the sample data."""
    inputs = signature_inputs(version, model.signature)
    if model.instance_kind == "row":
        types = {name: _JSON_TYPES[dtype] for name, (dtype, _) in inputs.items()}
        return csv_instances(data / "classification.csv", types, count)
    ((_, (_, shape)),) = inputs.items()
    return image_instances(data / "shapes", *shape[1:], count)


def request_body(model: GenericModel, instances: list) -> dict:
    body = {"instances": instances}
    if model.signature:
        body["signature_name"] = model.signature
    return body


def write_bodies(model: GenericModel, instances: list, workdir: Path, loads) -> dict[int, Path]:
    """One TF Serving row-format body per instance count the loads use."""
    bodies = {}
    for n in sorted({n for _, n in loads}):
        path = workdir / f"body-{model.key}-{n}.json"
        path.write_text(json.dumps(request_body(model, instances[:n])))
        bodies[n] = path
    return bodies


def model_bodies(key: str, version: Path, workdir: Path, loads=GENERIC_LOADS) -> dict[int, Path]:
    """The bodies bench_generic loads a model (MODELS' key) with, written again: for the peers
    serving the same model in the same run."""
    model = next(m for m in MODELS if m.key == key)
    instances = instances_for(model, version, sample_data(workdir), max(n for _, n in loads))
    return write_bodies(model, instances, workdir, loads)


def batch_inputs(version: Path, signature: str | None, instances: list) -> Callable:
    """make_inputs(batch) for measure_ceiling: the instances repeated to the batch size, as
    the signature's arrays."""
    inputs = signature_inputs(version, signature)

    def make(batch: int) -> dict[str, np.ndarray]:
        chosen = [instances[i % len(instances)] for i in range(batch)]
        if len(inputs) == 1 and not isinstance(chosen[0], dict):
            ((name, (dtype, _)),) = inputs.items()
            return {name: np.asarray(chosen, np.float32)}
        arrays = {}
        for name, (dtype, _) in inputs.items():
            values = [row[name] for row in chosen]
            kind = _JSON_TYPES[dtype]
            arrays[name] = (
                np.array([v.encode() for v in values], object)
                if kind is str
                else np.asarray(values, np.float32 if kind is float else np.int64)
            )
        return arrays

    return make


def served_difference(port: int, model: GenericModel, instances: list, version: Path) -> float:
    """The largest difference between the service's answer to one instance and the
    SavedModel's own, over every numeric output; RuntimeError when the request fails."""
    import httpx

    from artifact.saved_model import SavedModelPredictor

    response = httpx.post(
        f"http://127.0.0.1:{port}/v1/models/{model.name}:predict",
        json=request_body(model, instances[:1]),
        timeout=60,
    )
    if response.status_code != 200:
        raise RuntimeError(f"{model.name}: {response.status_code} {response.text[:300]}")
    (served,) = response.json()["predictions"]
    make = batch_inputs(version, model.signature, instances)
    reference = SavedModelPredictor(version).run(make(1), model.signature or "serving_default")
    if not isinstance(served, dict):  # one output: TF Serving renders it bare
        ((key, value),) = reference.items()
        served = {key: served}
    worst = 0.0
    for key, value in reference.items():
        if value.dtype.kind in "fiu":
            worst = max(worst, float(np.max(np.abs(np.asarray(served[key]) - value[0]))))
    return worst


def model_config(versions: dict[str, Path], path: Path) -> Path:
    """TF Serving's model config serving each model's folder (newest version)."""
    entries = "".join(
        f'config {{ name: "{name}" base_path: "{version.parent}" model_platform: "tensorflow" }} '
        for name, version in versions.items()
    )
    path.write_text(f"model_config_list {{ {entries}}}\n")
    return path


def bench_generic(
    base_env: dict,
    workdir: Path,
    seconds: int,
    loads=GENERIC_LOADS,
    models_root: Path = ROOT / "models",
    log: Callable[..., None] = print,
    ceiling_seconds: float = 2.0,
) -> dict:
    """Each generic model's ceiling and the service's rows at each load.

    Args:
        models_root: where to look for exported versions before training one.
        ceiling_seconds: how long each batch size of the ceiling runs.

    Returns:
        key -> {"model", "title", "version", "ceiling": measure_ceiling's, "loads": {"c64x1":
        run_wrk's with images_per_s (instances per second)}, "max_abs_diff"}.
    """
    data = sample_data(workdir)
    prepared = {}
    for model in MODELS:
        version = find_or_train(model, workdir, models_root)
        instances = instances_for(model, version, data, max(n for _, n in loads))
        log(f"== {model.title}: {version}; measuring its in-process ceiling...", flush=True)
        ceiling = measure_ceiling(
            version,
            batch_inputs(version, model.signature, instances),
            model.signature,
            ceiling_seconds,
        )
        prepared[model.key] = (model, version, instances, ceiling)
    served = {model.name: version for model, version, _, _ in prepared.values()}
    config = model_config(served, workdir / "generic.config")
    env = {k: v for k, v in base_env.items() if k not in ("MODEL_NAME", "MODEL_BASE_PATH")}
    port = free_port()
    env.update({"MODEL_CONFIG_FILE": str(config), "PORT": str(port), "GRPC_PORT": "0"})
    proc = start_server([sys.executable, "-m", "service"], env, port, workdir / "generic.log")
    results = {}
    try:
        for key, (model, version, instances, ceiling) in prepared.items():
            difference = served_difference(port, model, instances, version)
            if difference > TOLERANCE:
                raise RuntimeError(
                    f"{model.name}: the service's answer differs from the SavedModel's by "
                    f"{difference:g}"
                )
            bodies = write_bodies(model, instances, workdir, loads)
            path = f"/v1/models/{model.name}:predict"
            log(f"== (4) this service, batching on: {model.title}", flush=True)
            run_wrk(port, bodies[min(bodies)], 16, 1, path)  # warm up
            results[key] = {
                "model": model.name,
                "title": model.title,
                "version": str(version),
                "ceiling": ceiling,
                "loads": run_loads(
                    port, bodies, loads, seconds, path, log=log, server_pid=proc.pid
                ),
                "max_abs_diff": difference,
            }
    finally:
        stop_server(proc)
    return results


def generic_table(result: dict) -> str:
    """The generic models' rows beside Fashion-MNIST's at the same loads: the service's
    throughput, each model's share of its own in-process ceiling and of the HTTP floor
    (benchmarks/floor.py), and the server's CPU per request; with `make bench-peers`, the
    peers' rows on the tabular classifier too, and the service against them at c=64."""
    from benchmarks.floor import SHARE_ALIGN, SHARE_HEADER, floor_rows, share_cells
    from benchmarks.peers import report

    generic = result["generic"]
    ceiling = result.get("ceiling")
    batched = (result.get("servers") or {}).get("batched") or {}
    floor = floor_rows(result)
    lines = [
        "Other models: (4) the service, batching on, against each model's own in-process "
        "ceiling (1) and the HTTP floor (F1); instances/s are images or rows per second:",
        "",
        "| model | load | req/s | instances/s | p50 ms | p99 ms | errors |" + SHARE_HEADER,
        "|---|---|---:|---:|---:|---:|---:|" + SHARE_ALIGN,
    ]
    rows = []
    if ceiling and batched:
        rows.append(("fashion_mnist (28x28, the fast paths)", ceiling, batched))
    rows += [(entry["title"], entry["ceiling"], entry["loads"]) for entry in generic.values()]
    ceilings = list(rows)
    # The peers serving a model: each a row of its own after the service's, numbered as in
    # the main table.
    for entry in generic.values():
        names = report.labels(entry.get("peers") or {})
        for key, peer in (entry.get("peers") or {}).items():
            rows.append((f"{entry['title']} on {names[key]}", entry["ceiling"], peer["loads"]))
    loads = list(dict.fromkeys(load for entry in generic.values() for load in entry["loads"]))
    for load in loads:
        c, n = load[1:].split("x")
        for title, model_ceiling, by_load in rows:
            r = by_load.get(load)
            if r is None:
                continue
            lines.append(
                f"| {title} | c={c}, {n}/req | {r['requests_per_s']:,.0f} | "
                f"{r['images_per_s']:,.0f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
                f"{r['errors']} |" + share_cells(r, model_ceiling, floor, load)
            )
    lines.append("")
    lines.append(
        "The ceilings (1) of these rows: "
        + "; ".join(
            f"{title}: {model_ceiling['images_per_s']:,.0f}/s at batch "
            f"{model_ceiling['best_batch']}, batch 1 p50 {model_ceiling['batch1_p50_ms']:.2f} ms"
            for title, model_ceiling, _ in ceilings
        )
        + "."
    )
    tabular = generic.get("tabular") or {}
    if tabular.get("peers"):
        lines += [
            "",
            report.versus_table(
                tabular["loads"], tabular["peers"],
                heading="(4) against the peers on the tabular classifier at c=64, 1 row/req "
                "(target: at least 3x their throughput):",
            ),
            "",
            report.settings_table(
                tabular["peers"], "Peers on the tabular classifier (benchmarks/peers/):"
            ),
        ]  # fmt: skip
    return "\n".join(lines)


class Served(NamedTuple):
    """The model every side serves, and the request each one is asked."""

    version: Path  # the export's version directory (<base>/<name>/<version>)
    body: Path  # one instance a request
    path: str  # the :predict path

    @property
    def environment(self) -> dict[str, str]:
        return {"MODEL_NAME": self.version.parent.name,
                "MODEL_BASE_PATH": str(self.version.parent.parent)}  # fmt: skip


def served_model(model: str, scratch: Path) -> Served:
    """The model `make bench` serves, Fashion-MNIST's CNN or ("tabular") the tabular
    classifier of benchmarks/generic.py, trained into scratch when none is exported, with a
    one-instance body."""
    if model == "fashion_mnist":
        version = find_or_train_model(scratch)
        return Served(version, request_bodies(scratch)[1], PATH)
    if model != "tabular":
        raise ValueError(f"unknown model {model!r}: fashion_mnist or tabular")
    tabular = next(m for m in MODELS if m.key == "tabular")
    version = find_or_train(tabular, scratch, ROOT / "models")
    body = model_bodies("tabular", version, scratch, [(1, 1)])[1]
    return Served(version, body, f"/v1/models/{version.parent.name}:predict")
