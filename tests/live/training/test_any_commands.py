"""`compare`, `evaluate` and `predict` on CSV files and image folders, by the task.

One `compare` run per kind of model trains the module's models (a few steps each, through the
real command line): the CSV classifiers (every tabular kind, raw receivers), two CSV regressors
(tf.Example parsing receivers) and the image-folder CNN. `evaluate` and `predict` then run on
their exports; their answers are held against `estimator.predict` on the run's checkpoint, or
against the export's own report on the same rows. Bad input fails with one error line, exit
code 2 and nothing written.
"""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
from contextlib import redirect_stdout
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import tensorflow as tf
from support.helpers import assert_one_error_line
from support.training_harness import assert_real_png, call_main

from artifact.contract import (
    ASSETS_EXTRA,
    CLASSIFIER_PLOTS,
    LABELS_FILE,
    LEARNING_CURVES_PLOT,
    REGRESSOR_PLOTS,
)
from artifact.repository import read_report
from training import image_folder, plots, runs, tabular
from training.comparison_table import CHART_FILE, RESULTS_FILE, TABLE_FILE
from training.sample_data import write_sample_data
from training.tabular_schema import holdout_rows, infer_schema, read_rows

# Keras' graph-mode code under model_to_estimator warns about its own internals.
pytestmark = [
    pytest.mark.filterwarnings("ignore:`tf.keras.backend.set_learning_phase` is deprecated"),
]

CLASSIFIER_STEPS = 20
REGRESSOR_STEPS = 40
IMAGE_STEPS = 10
CLASSES = ("high", "low", "mid")
IMAGE_SIZE = 32


class Comparison(NamedTuple):
    work_dir: Path
    stdout: str
    results: dict

    def version(self, kind: str) -> Path:
        return self.work_dir / "models" / kind / "1"


def run_compare(work_dir: Path, *argv) -> Comparison:
    out = io.StringIO()
    with redirect_stdout(out):
        code = call_main("compare", "--work-dir", work_dir, "--batch-size", 32, "--deterministic",
                         "--learning-rate", 0.05, "--hidden-units", 8, *argv)  # fmt: skip
    assert code == 0, out.getvalue()
    results = json.loads((work_dir / RESULTS_FILE).read_text())
    return Comparison(work_dir, out.getvalue(), results)


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> dict[str, Path]:
    return write_sample_data(tmp_path_factory.mktemp("sample"))


@pytest.fixture(scope="module")
def classifiers(sample, tmp_path_factory) -> Comparison:
    """linear, dnn and dnn_linear (compare's default kinds for a CSV) on classification.csv."""
    work_dir = tmp_path_factory.mktemp("compare-classifiers") / "work"
    return run_compare(work_dir, "--csv", sample["classification"], "--max-steps",
                       CLASSIFIER_STEPS)  # fmt: skip


@pytest.fixture(scope="module")
def regressors(sample, tmp_path_factory) -> Comparison:
    """dnn and linear regressors on regression.csv, exported with the parsing receiver."""
    work_dir = tmp_path_factory.mktemp("compare-regressors") / "work"
    return run_compare(work_dir, "--csv", sample["regression"], "--label", "price",
                       "--models", "dnn,linear", "--receiver", "parsing",
                       "--max-steps", REGRESSOR_STEPS)  # fmt: skip


@pytest.fixture(scope="module")
def images(sample, tmp_path_factory) -> Comparison:
    """The image-folder CNN on shapes/ at 32x32x3."""
    work_dir = tmp_path_factory.mktemp("compare-images") / "work"
    return run_compare(work_dir, "--image-folder", sample["images"], "--models", "cnn",
                       "--image-size", IMAGE_SIZE, "--channels", 3, "--max-steps", IMAGE_STEPS,
                       "--batch-size", 16)  # fmt: skip


def tabular_estimator(comparison: Comparison, kind: str, csv_path: Path, label: str):
    model_dir = comparison.work_dir / kind
    params = runs.load_params(model_dir)
    schema = infer_schema(csv_path, label)
    config = tf.estimator.RunConfig(model_dir=str(model_dir))
    return schema, tabular.make_estimator(schema, params, config)


def estimator_predict(estimator, features: dict[str, np.ndarray]) -> list[dict]:
    count = len(next(iter(features.values())))
    return list(
        estimator.predict(lambda: tf.data.Dataset.from_tensor_slices(features).batch(count))
    )


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_refused(code: int, capsys, output: Path, *fragments: str) -> None:
    """Exit code 2, one error line holding every fragment, and no output written."""
    assert code == 2
    assert_one_error_line(capsys.readouterr().err, *fragments)
    assert not output.exists()


def write_csv(path: Path, header, rows) -> Path:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


# --- compare ---------------------------------------------------------------------------------


def test_compare_ranks_the_csv_classifiers_by_held_out_accuracy(classifiers):
    results = classifiers.results
    assert results["task"] == "classification" and results["labels"] == list(CLASSES)
    rows = results["results"]
    assert sorted(row["model"] for row in rows) == sorted(tabular.TABULAR_KINDS)
    accuracies = [row["accuracy"] for row in rows]
    assert accuracies == sorted(accuracies, reverse=True), "not best first"
    for row in rows:
        version = classifiers.version(row["model"])
        report = read_report(version)
        assert row["version"] == str(version) and report["split"] == "holdout"
        assert row["accuracy"] == report["accuracy"]
        assert row["recall"] == [r["recall"] for r in report["per_class"]]
        assert row["steps"] == CLASSIFIER_STEPS == report["global_step"]
        assert row["parameters"] > 0 and row["export_bytes"] == runs.directory_bytes(version)
    table = (classifiers.work_dir / TABLE_FILE).read_text()
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    assert lines[0].startswith("| rank | model | held-out accuracy |")
    assert lines[0].endswith("| recall high | recall low | recall mid |")
    assert [line.split(" | ")[1] for line in lines[1:]] == [row["model"] for row in rows]
    assert "best first" in classifiers.stdout and lines[1] in classifiers.stdout
    assert_real_png(classifiers.work_dir / CHART_FILE, 800, 300, "Comparison")


def test_compare_ranks_the_regressors_by_rmse(regressors):
    results = regressors.results
    assert results["task"] == "regression" and "labels" not in results
    rows = results["results"]
    assert {row["model"] for row in rows} == {"dnn", "linear"}
    rmses = [row["rmse"] for row in rows]
    assert rmses == sorted(rmses), "not lowest first"
    table = (regressors.work_dir / TABLE_FILE).read_text()
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    assert lines[0].startswith("| rank | model | rmse | mae | largest error | largest slice error")
    for row, line in zip(rows, lines[1:], strict=True):
        report = read_report(regressors.version(row["model"]))
        assert (row["rmse"], row["mae"], row["max_error"]) == (
            report["rmse"], report["mae"], report["max_error"]
        )  # fmt: skip
        # The largest slice error, found here from the report's slices.
        column, worst = max(
            ((column, slice_) for column, slices in report["slices"].items() for slice_ in slices),
            key=lambda pair: pair[1]["rmse"],
        )
        assert row["worst_slice"] == {"column": column, "value": worst["value"],
                                      "rmse": worst["rmse"], "examples": worst["examples"]}  # fmt: skip
        assert f"| {worst['rmse']:.4f} ({column}={worst['value']}) |" in line
        assert line.split(" | ")[1] == row["model"]
    assert_real_png(regressors.work_dir / CHART_FILE, 600, 300, "Comparison")


def test_compare_of_an_image_folder(images):
    (row,) = images.results["results"]
    assert row["model"] == "cnn" and images.results["labels"] == ["circle", "square", "triangle"]
    report = read_report(images.version("cnn"))
    assert row["accuracy"] == report["accuracy"] and report["examples"] == 9


# --- the export's plots ------------------------------------------------------------------------

PLOT_SIZES = {
    "confusion_matrix.png": (400, 350),
    "learning_curves.png": (700, 300),
    "predicted_vs_true.png": (450, 450),
    "residuals.png": (550, 300),
}


@pytest.mark.parametrize(
    "which, kind, expected",
    [
        pytest.param("classifiers", "linear", CLASSIFIER_PLOTS, id="csv-classifier"),
        pytest.param("regressors", "dnn", REGRESSOR_PLOTS, id="csv-regressor"),
        pytest.param("images", "cnn", CLASSIFIER_PLOTS, id="image-folder"),
    ],
)
def test_each_export_draws_the_plots_of_its_task(request, which, kind, expected):
    extra = request.getfixturevalue(which).version(kind) / ASSETS_EXTRA
    assert sorted(p.name for p in extra.glob("*.png")) == sorted(expected)
    for name in expected:
        assert_real_png(extra / name, *PLOT_SIZES[name], title=plots.TITLES[name])


def test_a_regressors_learning_curves_end_at_its_reports_rmse(regressors):
    """The RMSE panel is the root of the evaluations' mean squared error: its last point is
    the evaluation of the exported step on the same held-out rows as the report."""
    model_dir = regressors.work_dir / "dnn"
    curves = plots.learning_curves(model_dir, "regression")
    report = read_report(regressors.version("dnn"))
    step, rmse = curves["eval"]["rmse"][-1]
    assert step == REGRESSOR_STEPS
    assert rmse == pytest.approx(report["rmse"], rel=1e-4)
    loss = plots.read_scalars(model_dir, ["loss"])["loss"]
    assert curves["train"]["rmse"] == [(s, pytest.approx(math.sqrt(v))) for s, v in loss]
    assert (regressors.version("dnn") / ASSETS_EXTRA / LEARNING_CURVES_PLOT).is_file()


# --- evaluate ------------------------------------------------------------------------------------


def test_evaluate_a_csv_classifier_on_every_row(classifiers, sample, tmp_path, capsys):
    output = tmp_path / "report.json"
    assert call_main("evaluate", classifiers.work_dir / "models" / "dnn_linear",
                     "--csv", sample["classification"], "--output", output) == 0  # fmt: skip
    report = json.loads(output.read_text())
    schema, estimator = tabular_estimator(
        classifiers, "dnn_linear", sample["classification"], "label"
    )
    header, rows = read_rows(sample["classification"])
    expected = estimator_predict(estimator, tabular.feature_arrays(schema, header, rows))
    predicted = [p["class_ids"][0] for p in expected]
    truth = [CLASSES.index(row[header.index("label")]) for row in rows]
    confusion = np.zeros((3, 3), int)
    np.add.at(confusion, (truth, predicted), 1)
    assert report["task"] == "classification" and report["examples"] == len(rows) == 200
    np.testing.assert_array_equal(report["confusion_matrix"], confusion)
    assert report["accuracy"] == pytest.approx(np.trace(confusion) / len(rows), abs=1e-4)
    for k, row in enumerate(report["per_class"]):
        assert row["label"] == CLASSES[k]
        assert row["recall"] == pytest.approx(confusion[k, k] / confusion[k].sum(), abs=1e-4)
    assert report["csv"] == str(sample["classification"]) and report["split"] == "all"
    assert f"accuracy {report['accuracy']:.4f} on 200 examples" in capsys.readouterr().out


def test_evaluate_a_regressor_on_its_held_out_rows_gives_its_report(regressors, sample, tmp_path):
    header, rows = holdout_rows(sample["regression"])
    held_out = write_csv(tmp_path / "held-out.csv", header, rows)
    output = tmp_path / "report.json"
    version = regressors.version("linear")
    assert call_main("evaluate", version, "--csv", held_out, "--output", output) == 0
    report, exported = json.loads(output.read_text()), read_report(version)
    assert report["receiver"] == "parsing" and report["examples"] == len(rows)
    for key in ("rmse", "mae", "max_error", "label_mean"):
        assert report[key] == pytest.approx(exported[key], rel=1e-5), key
    assert [s["value"] for s in report["slices"]["city"]] == [
        s["value"] for s in exported["slices"]["city"]
    ]


def test_evaluate_an_image_model_on_its_held_out_images_gives_its_report(images, sample, tmp_path):
    folder = tmp_path / "held-out"
    for path, class_id in image_folder.scan_image_folder(sample["images"]).holdout:
        target = folder / images.results["labels"][class_id] / Path(path).name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    output = tmp_path / "report.json"
    version = images.version("cnn")
    assert call_main("evaluate", version, "--image-folder", folder, "--output", output) == 0
    report, exported = json.loads(output.read_text()), read_report(version)
    assert report["examples"] == exported["examples"] == 9
    assert report["confusion_matrix"] == exported["confusion_matrix"]
    assert report["accuracy"] == exported["accuracy"]


# --- predict -------------------------------------------------------------------------------------


def test_predict_csv_rows_with_a_classifier(classifiers, sample, tmp_path):
    header, rows = holdout_rows(sample["classification"])
    without_label = [[v for n, v in zip(header, row, strict=True) if n != "label"] for row in rows]
    features_only = [n for n in header if n != "label"]
    source = write_csv(tmp_path / "rows.csv", features_only, without_label)
    output = tmp_path / "predictions.jsonl"
    version = classifiers.version("linear")
    assert call_main("predict", "--model", version, "--input", source, "--output", output,
                     "--batch-size", 16) == 0  # fmt: skip
    lines = read_lines(output)
    schema, estimator = tabular_estimator(classifiers, "linear", sample["classification"], "label")
    expected = estimator_predict(estimator, tabular.feature_arrays(schema, header, rows))
    assert [line["index"] for line in lines] == list(range(len(rows)))
    for line, answer in zip(lines, expected, strict=True):
        assert set(line) == {"index", "class_id", "label", "probabilities"}
        assert line["class_id"] == answer["class_ids"][0]
        assert line["label"] == CLASSES[line["class_id"]]
        assert list(line["probabilities"]) == list(CLASSES)
        np.testing.assert_allclose(
            list(line["probabilities"].values()), answer["probabilities"], rtol=1e-5, atol=1e-6
        )
    assert len({line["label"] for line in lines}) > 1  # not a constant model
    # With the label column in the file, it is ignored: the same answers.
    again = tmp_path / "again.jsonl"
    labeled = write_csv(tmp_path / "labeled.csv", header, rows)
    assert call_main("predict", "--model", version, "--input", labeled, "--output", again) == 0
    assert read_lines(again) == lines


def test_predict_csv_rows_with_a_regressor(regressors, sample, tmp_path):
    output = tmp_path / "predictions.jsonl"
    assert call_main("predict", "--model", regressors.work_dir / "models" / "dnn",
                     "--input", sample["regression"], "--output", output) == 0  # fmt: skip
    lines = read_lines(output)
    schema, estimator = tabular_estimator(regressors, "dnn", sample["regression"], "price")
    header, rows = read_rows(sample["regression"])
    expected = estimator_predict(estimator, tabular.feature_arrays(schema, header, rows))
    assert [set(line) for line in lines] == [{"index", "value"}] * len(rows)
    np.testing.assert_allclose(
        [line["value"] for line in lines],
        [p["predictions"][0] for p in expected],
        rtol=1e-5,
        atol=1e-5,
    )


def test_predict_an_image_folder(images, sample, tmp_path):
    output = tmp_path / "predictions.jsonl"
    assert call_main("predict", "--model", images.version("cnn"), "--input", sample["images"],
                     "--output", output, "--batch-size", 8) == 0  # fmt: skip
    lines = read_lines(output)
    files = sorted(p for p in sample["images"].rglob("*") if p.is_file())
    assert [line["file"] for line in lines] == [
        p.relative_to(sample["images"]).as_posix() for p in files
    ]
    pixels = np.stack([image_folder.load_image(str(p), IMAGE_SIZE, 3).numpy() for p in files])
    params = runs.load_params(images.work_dir / "cnn")
    estimator = image_folder.make_estimator(
        params, tf.estimator.RunConfig(model_dir=str(images.work_dir / "cnn"))
    )
    expected = estimator_predict(estimator, {"image": pixels})
    labels = (images.version("cnn") / ASSETS_EXTRA / LABELS_FILE).read_text().splitlines()
    for line, answer in zip(lines, expected, strict=True):
        assert line["class_id"] == answer["classes"] and line["label"] == labels[line["class_id"]]
        np.testing.assert_allclose(
            list(line["probabilities"].values()), answer["probabilities"], rtol=1e-5, atol=1e-6
        )
    # One file: named by its own name.
    one = tmp_path / "one.jsonl"
    assert call_main("predict", "--model", images.version("cnn"), "--input", files[0],
                     "--output", one) == 0  # fmt: skip
    (line,) = read_lines(one)
    # A batch of one: the same answer up to float32 rounding of another batch size.
    assert (line["file"], line["label"]) == (files[0].name, lines[0]["label"])
    assert line["probabilities"] == pytest.approx(lines[0]["probabilities"], rel=1e-5)


# --- bad input -----------------------------------------------------------------------------------

GOOD_HEADER = ["x1", "x2", "rooms", "color", "label"]
GOOD_ROW = ["0.5", "4.2", "3", "red", "mid"]


def rows_with(change: dict, header=GOOD_HEADER) -> tuple[list, list]:
    """A header and four rows like GOOD_ROW; change maps (row, column) -> the text there
    (row -1: the header's column name; None removes the column)."""
    header = list(header)
    rows = [list(GOOD_ROW) for _ in range(4)]
    for (row, column), value in change.items():
        if row == -1 and value is None:
            at = header.index(column)
            header.pop(at)
            for r in rows:
                r.pop(at)
        elif row == -1:
            header.append(column)
            for r in rows:
                r.append(value)
        else:
            rows[row][header.index(column)] = value
    return header, rows


BAD_CSV = [
    pytest.param("evaluate", {(-1, "x2"): None},
                 "the columns differ from the model's inputs (missing x2)", id="missing-feature"),
    pytest.param("evaluate", {(-1, "id"): "7"},
                 "(not inputs of the model: id)", id="unknown-column"),
    pytest.param("evaluate", {(-1, "label"): None}, "no label column 'label'", id="no-label"),
    pytest.param("evaluate", {(2, "label"): "huge"},
                 "line 4, label column 'label': 'huge' is not a class of the model (its classes: "
                 "high, low, mid)", id="unknown-class"),
    pytest.param("predict", {(0, "x1"): "abc"},
                 "line 2, column 'x1': 'abc' is not a number (the model takes float32)",
                 id="not-a-number"),
    pytest.param("predict", {(1, "rooms"): "2.5"},
                 "line 3, column 'rooms': '2.5' is not an integer (the model takes int64)",
                 id="not-an-integer"),
    pytest.param("predict", {(-1, "x1"): None}, "(missing x1); it takes x1 (float32), x2 "
                 "(float32), rooms (int64), color (string)", id="predict-missing-feature"),
]  # fmt: skip


def run_bad(command: str, version: Path, source: Path, output: Path, *extra) -> int:
    if command == "evaluate":
        return call_main("evaluate", version, "--output", output, *extra)
    return call_main("predict", "--model", version, "--input", source, "--output", output, *extra)


@pytest.mark.parametrize("command, change, problem", BAD_CSV)
def test_a_csv_that_does_not_fit_the_model(classifiers, tmp_path, capsys, command, change, problem):
    source = write_csv(tmp_path / "data.csv", *rows_with(change))
    output = tmp_path / "out.json"
    extra = ("--csv", source) if command == "evaluate" else ()
    code = run_bad(command, classifiers.version("linear"), source, output, *extra)
    assert_refused(code, capsys, output, f"error: {source}: ", problem)


def test_a_regressors_label_must_be_a_number(regressors, tmp_path, capsys):
    header, rows = rows_with({(-1, "color"): None, (-1, "city"): "a", (-1, "label"): None,
                              (-1, "price"): "n/a"})  # fmt: skip
    source = write_csv(tmp_path / "data.csv", header, rows)
    output = tmp_path / "out.json"
    code = call_main("evaluate", regressors.version("dnn"), "--csv", source, "--output", output)
    assert_refused(
        code,
        capsys,
        output,
        f"error: {source}: line 2, label column 'price': 'n/a' is not a number (the model is a "
        "regressor)",
    )


def _png(path: Path, color=(200, 30, 30)) -> Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (20, 14), color).save(path)
    return path


def test_an_image_folder_with_a_class_the_model_does_not_know(images, tmp_path, capsys):
    folder = tmp_path / "imgs"
    _png(folder / "circle" / "a.png")
    _png(folder / "hexagon" / "b.png")
    output = tmp_path / "out.json"
    code = call_main("evaluate", images.version("cnn"), "--image-folder", folder,
                     "--output", output)  # fmt: skip
    assert_refused(
        code,
        capsys,
        output,
        f"error: {folder}: class folder(s) hexagon name no class of the model (its classes: "
        "circle, square, triangle)",
    )


def test_an_unreadable_image_is_named(images, tmp_path, capsys):
    folder = tmp_path / "imgs"
    _png(folder / "a.png")
    bad = folder / "b.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n not really")
    output = tmp_path / "out.jsonl"
    code = call_main("predict", "--model", images.version("cnn"), "--input", folder,
                     "--output", output)  # fmt: skip
    assert_refused(code, capsys, output, f"error: {bad}: unreadable image")
    assert list(tmp_path.glob(".out.jsonl*")) == []  # no temporary file left either


@pytest.mark.parametrize(
    "which, kind, argv, problem",
    [
        pytest.param("classifiers", "linear", ["evaluate", "--image-folder", "{tmp}"],
                     "is a model of CSV rows (it takes x1 (float32), x2 (float32), rooms (int64), "
                     "color (string)): evaluate it with --csv FILE", id="csv-model-image-folder"),
        pytest.param("classifiers", "linear", ["evaluate"],
                     "evaluate it with --csv FILE holding those columns and the label column "
                     "'label'", id="csv-model-no-data"),
        pytest.param("images", "cnn", ["evaluate", "--csv", "{tmp}/x.csv"],
                     "is a model of 32x32x3 images: evaluate it with --image-folder DIR holding "
                     "a subfolder per class (circle, square, triangle)", id="image-model-csv"),
        pytest.param("classifiers", "linear", ["predict", "--input", "{tmp}"],
                     "a folder; {version} is a model of CSV rows: give a CSV file",
                     id="predict-csv-model-folder"),
        pytest.param("classifiers", "linear", ["evaluate", "--label", "y"],
                     "--label is for --csv", id="label-without-csv"),
    ],
)  # fmt: skip
def test_data_of_the_wrong_kind(request, tmp_path, capsys, which, kind, argv, problem):
    version = request.getfixturevalue(which).version(kind)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    output = tmp_path / "out"
    if argv[0] == "evaluate":
        code = call_main("evaluate", version, *argv[1:], "--output", output)
    else:
        code = call_main("predict", "--model", version, *argv[1:], "--output", output)
    assert_refused(code, capsys, output, problem.replace("{version}", str(version)))


def test_a_model_dir_of_a_csv_run_is_not_evaluated_as_idx(classifiers, tmp_path, capsys):
    output = tmp_path / "o"
    code = call_main("evaluate", classifiers.work_dir / "linear", "--output", output)
    assert_refused(code, capsys, output, "a model dir of a --csv or --image-folder run: "
                   "evaluate its exported version")  # fmt: skip


@pytest.mark.parametrize(
    "argv, problem",
    [
        pytest.param(["--csv", "{csv}", "--models", "linear,cnn"],
                     "--models: unknown kind(s) cnn; known kinds for --csv: linear, dnn, "
                     "dnn_linear", id="image-kind-for-csv"),
        pytest.param(["--image-folder", "{tmp}", "--models", "dnn_linear"],
                     "--models: unknown kind(s) dnn_linear; known kinds for --image-folder: cnn, "
                     "keras", id="csv-kind-for-images"),
        pytest.param(["--receiver", "parsing"], "--receiver is for --csv", id="idx-receiver"),
        pytest.param(["--csv", "{csv}", "--image-size", "16"],
                     "--image-size is for --image-folder", id="csv-image-size"),
    ],
)  # fmt: skip
def test_compare_refuses_kinds_and_options_of_other_data(sample, tmp_path, capsys, argv, problem):
    work_dir = tmp_path / "work"
    argv = [a.replace("{csv}", str(sample["classification"])).replace("{tmp}", str(tmp_path))
            for a in argv]  # fmt: skip
    code = call_main("compare", "--work-dir", work_dir, "--max-steps", 1, *argv)
    assert_refused(code, capsys, work_dir, problem)
