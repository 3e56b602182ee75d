"""`--deterministic`: the same command trains the same model bit for bit, for every kind of
data: the CNN on MNIST-format files, a pre-made Estimator on a CSV file, the CNN on an image
folder, and a retrain of a CSV model (warm start, sources sampled by seed).

Each is run twice into folders of its own, and the two compared exactly: every variable of
the last checkpoint, every evaluation metric TensorBoard's events hold, the export's report,
and the exported SavedModel's outputs on the same inputs. A third run with another --seed
shows the comparison sees a difference when there is one.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from support.training_harness import call_main

from artifact.contract import ASSETS_EXTRA, BLESSING_FILE, REPORT_FILE, normalize_pixels
from artifact.idx import load_split
from training import determinism, plots
from training.runs import load_params
from training.sample_data import write_sample_data

# What differs between two runs by its nature: when, and in which folder.
RUN_SPECIFIC = {"date", "model_dir", "checkpoint", "train_seconds", "data_dir"}
EVAL_TAGS = ("accuracy", "loss", "average_loss", "recall/0", "precision/1")


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> dict[str, Path]:
    return write_sample_data(tmp_path_factory.mktemp("deterministic") / "sample")


def commands(kind: str, small_data_dir: Path, sample: dict[str, Path]) -> list:
    """The `train` options of one kind of data, and its exported signature."""
    common = ["--eval-every-secs", 1000, "--hooks", "none"]
    if kind == "idx":
        return [
            ["--data-dir", small_data_dir, "--labels", "fashion", "--max-steps", 20,
             "--batch-size", 50, *common],
            "serving_default",
        ]  # fmt: skip
    if kind == "csv":
        return [
            ["--csv", sample["classification"], "--model", "dnn_linear", "--hidden-units", 8,
             "--max-steps", 30, "--batch-size", 32, "--learning-rate", 0.05, *common],
            "predict",
        ]  # fmt: skip
    return [
        ["--image-folder", sample["images"], "--image-size", 32, "--channels", 3,
         "--max-steps", 20, "--batch-size", 16, *common],
        "serving_default",
    ]  # fmt: skip


def signature_inputs(kind: str, small_data_dir: Path, sample: dict[str, Path]) -> dict:
    if kind == "idx":
        _, images, _ = load_split(small_data_dir, "test")
        return {"image": tf.constant(normalize_pixels(images[:64]))}
    if kind == "csv":
        with sample["classification"].open(newline="") as f:
            rows = list(csv.DictReader(f))[:64]
        return {
            "x1": tf.constant([float(r["x1"]) for r in rows], tf.float32),
            "x2": tf.constant([float(r["x2"]) for r in rows], tf.float32),
            "rooms": tf.constant([int(r["rooms"]) for r in rows], tf.int64),
            "color": tf.constant([r["color"] for r in rows]),
        }
    pixels = np.random.default_rng(0).random((16, 32, 32, 3), dtype=np.float32)
    return {"image": tf.constant(pixels)}


def train(tmp_path: Path, name: str, options: list, *extra) -> tuple[Path, Path]:
    """`train --deterministic` into folders of its own: (its model dir, its version)."""
    model_dir, export_dir = tmp_path / name / "run", tmp_path / name / "models" / "m"
    code = call_main(
        "train", *options, "--model-dir", model_dir, "--export-dir", export_dir,
        "--deterministic", *extra,
    )  # fmt: skip
    assert code == 0
    return model_dir, export_dir / "1"


def variables(model_dir: Path) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir)))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def assert_same_variables(first: dict, second: dict) -> None:
    assert sorted(first) == sorted(second)
    for name, value in first.items():
        assert value.dtype == second[name].dtype, name
        assert np.array_equal(value, second[name]), f"{name} differs"


def outputs(version: Path, signature: str, inputs: dict) -> dict[str, np.ndarray]:
    function = tf.saved_model.load(str(version)).signatures[signature]
    return {name: value.numpy() for name, value in function(**inputs).items()}


def report_without_run_details(version: Path) -> dict:
    report = json.loads((version / ASSETS_EXTRA / REPORT_FILE).read_text())
    return {k: v for k, v in report.items() if k not in RUN_SPECIFIC}


@pytest.mark.parametrize("kind", ["idx", "csv", "image_folder"])
def test_the_same_command_trains_the_same_model_bit_for_bit(kind, small_data_dir, sample, tmp_path):
    options, signature = commands(kind, small_data_dir, sample)
    first_dir, first = train(tmp_path, "first", options)
    second_dir, second = train(tmp_path, "second", options)
    assert load_params(first_dir)["seed"] == determinism.DEFAULT_SEED  # none given
    weights = variables(first_dir)
    assert len(weights) > 4
    assert_same_variables(weights, variables(second_dir))
    evaluated = plots.read_scalars(first_dir / "eval", EVAL_TAGS)
    assert evaluated["accuracy"] or evaluated["average_loss"]  # the comparison compares
    assert plots.read_scalars(second_dir / "eval", EVAL_TAGS) == evaluated
    assert report_without_run_details(first) == report_without_run_details(second)
    inputs = signature_inputs(kind, small_data_dir, sample)
    answers = outputs(first, signature, inputs)
    again = outputs(second, signature, inputs)
    assert sorted(answers) == sorted(again)
    for name, value in answers.items():
        assert np.array_equal(value, again[name]), f"{name} differs"

    # Another seed, another model: the comparison above sees a difference when there is one.
    other_dir, _ = train(tmp_path, "other", options, "--seed", 1)
    others = variables(other_dir)
    differing = [name for name, value in weights.items() if not np.array_equal(value, others[name])]
    assert differing, "another seed trained the same weights"


def test_a_retrain_repeats_bit_for_bit(sample, tmp_path):
    """Warm-started from the same version, on the base rows and new ones sampled by the
    seed: the same candidate and the same verdict."""
    options, _ = commands("csv", Path(), sample)
    base_dir, version = train(tmp_path, "base", options)
    new = write_sample_data(tmp_path / "new", rows=100, images_per_class=1, seed=1)
    candidates = []
    for name in ("first", "second"):
        repository = tmp_path / name / "models"
        shutil.copytree(version.parent, repository / "m")
        code = call_main(
            "retrain", "--export-dir", repository / "m", "--model-dir", tmp_path / name / "runs",
            "--extra-data", new["classification"], "--max-steps", 60, "--batch-size", 32,
            "--learning-rate", 0.05, "--eval-every-secs", 1000, "--hooks", "none",
            "--deterministic",
        )  # fmt: skip
        assert code in (0, 3)
        (run_dir,) = (tmp_path / name / "runs").glob("retrain-*")
        candidates.append((code, run_dir))
    (first_code, first), (second_code, second) = candidates
    assert first_code == second_code
    assert first.name == second.name  # the same inputs and start: the same run id
    assert_same_variables(variables(first), variables(second))
    verdicts = [json.loads((run / BLESSING_FILE).read_text()) for run in (first, second)]
    for key in ("blessed", "candidate", "baseline", "checks"):
        assert verdicts[0][key] == verdicts[1][key], key
