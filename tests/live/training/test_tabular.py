"""`train --csv`: pre-made Estimators on feature columns, exported and served by TF itself.

Each kind is trained once per module on sample-data's CSV files (a few dozen steps) through
the real command line; the tests load the exported versions with tf.saved_model.load and
hold their answers against estimator.predict on the same rows.
"""

from __future__ import annotations

import io
import json
import shutil
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from support.helpers import assert_one_error_line

import training.tabular
from artifact.contract import ASSETS_EXTRA, LABELS_FILE, REPORT_FILE
from training import runs, tabular
from training.__main__ import main
from training.sample_data import write_sample_data
from training.tabular_schema import holdout_rows, infer_schema

STEPS = 40
CLASSES = ("high", "low", "mid")  # sorted: label_vocabulary's order and labels.txt's
# sample-data's classification.csv: 200 rows, every 5th held out.
HOLDOUT = 40


def run_main(*argv) -> tuple[int, str]:
    out = io.StringIO()
    with redirect_stdout(out):
        code = main([str(a) for a in argv])
    return code, out.getvalue()


def train(csv, model_dir, export_dir, *extra) -> Path:
    """`train --csv` to STEPS steps; the version it exported."""
    code, out = run_main(
        "train", "--csv", csv, "--model-dir", model_dir, "--export-dir", export_dir,
        "--max-steps", STEPS, "--batch-size", 32, "--learning-rate", 0.05, "--deterministic",
        "--eval-every-secs", 1, *extra,
    )  # fmt: skip
    assert code == 0, out
    return Path(out.strip().splitlines()[-1].split()[1])


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> dict[str, Path]:
    return write_sample_data(tmp_path_factory.mktemp("sample"))


class Run:
    """A trained model dir and its exported versions (by receiver)."""

    def __init__(self, csv, label, model_dir, versions):
        self.csv, self.label, self.model_dir, self.versions = csv, label, model_dir, versions
        self.schema = infer_schema(csv, label)

    def estimator(self):
        params = runs.load_params(self.model_dir)
        config = tf.estimator.RunConfig(model_dir=str(self.model_dir))
        return tabular.make_estimator(self.schema, params, config)

    def holdout(self) -> tuple[dict[str, np.ndarray], list[list[str]], list[str]]:
        header, rows = holdout_rows(self.csv)
        return tabular.feature_arrays(self.schema, header, rows), rows, list(header)

    def estimator_predict(self, features: dict[str, np.ndarray]) -> list[dict]:
        count = len(next(iter(features.values())))
        return list(
            self.estimator().predict(
                lambda: tf.data.Dataset.from_tensor_slices(features).batch(count)
            )
        )


def _both_receivers(sample, tmp, csv_key, label, *extra) -> Run:
    """Train once; export through the raw receiver, then (no training: the run is at its
    last step) the same checkpoint through the parsing receiver, as version 2."""
    model_dir, export_dir = tmp / "run", tmp / "models" / "m"
    raw = train(sample[csv_key], model_dir, export_dir, *extra)
    parsing = train(sample[csv_key], model_dir, export_dir, *extra, "--receiver", "parsing")
    assert (raw.name, parsing.name) == ("1", "2")
    return Run(sample[csv_key], label, model_dir, {"raw": raw, "parsing": parsing})


@pytest.fixture(scope="module")
def linear_classifier(sample, tmp_path_factory) -> Run:
    """LinearClassifier: floats x1, x2, int64 rooms, string color; string labels."""
    tmp = tmp_path_factory.mktemp("linear")
    return _both_receivers(sample, tmp, "classification", "label", "--label", "label")


@pytest.fixture(scope="module")
def dnn_regressor(sample, tmp_path_factory) -> Run:
    """DNNRegressor: floats x1, x2, int64 rooms, string city -> float price."""
    tmp = tmp_path_factory.mktemp("dnn")
    return _both_receivers(
        sample, tmp, "regression", "price", "--label", "price", "--model", "dnn",
        "--hidden-units", "16,8",
    )  # fmt: skip


def spec_of(signature) -> tuple[dict, dict]:
    """(inputs, outputs) of a loaded signature as name -> (dtype, shape list)."""
    inputs = {
        k: (v.dtype, v.shape.as_list()) for k, v in signature.structured_input_signature[1].items()
    }
    outputs = {k: (v.dtype, v.shape.as_list()) for k, v in signature.structured_outputs.items()}
    return inputs, outputs


FEATURE_INPUTS_CLASSIFICATION = {
    "x1": (tf.float32, [None]),
    "x2": (tf.float32, [None]),
    "rooms": (tf.int64, [None]),
    "color": (tf.string, [None]),
}


def test_raw_export_has_one_input_per_feature_of_its_dtype(linear_classifier):
    loaded = tf.saved_model.load(str(linear_classifier.versions["raw"]))
    # TF's own signatures: a raw receiver has no single string input, so only `predict`.
    assert set(loaded.signatures) == {"predict"}
    inputs, outputs = spec_of(loaded.signatures["predict"])
    assert inputs == FEATURE_INPUTS_CLASSIFICATION
    assert outputs["class_ids"] == (tf.int64, [None, 1])
    assert outputs["classes"] == (tf.string, [None, 1])
    assert outputs["probabilities"] == (tf.float32, [None, 3])
    assert outputs["logits"] == (tf.float32, [None, 3])


def test_parsing_export_has_tf_servings_classify_signatures(linear_classifier):
    loaded = tf.saved_model.load(str(linear_classifier.versions["parsing"]))
    assert set(loaded.signatures) == {"predict", "classification", "serving_default"}
    inputs, outputs = spec_of(loaded.signatures["predict"])
    assert inputs == {"examples": (tf.string, [None])}
    assert outputs["probabilities"] == (tf.float32, [None, 3])
    for name in ("classification", "serving_default"):
        inputs, outputs = spec_of(loaded.signatures[name])
        assert inputs == {"inputs": (tf.string, [None])}
        assert outputs == {"classes": (tf.string, [None, 3]), "scores": (tf.float32, [None, 3])}


def test_classifier_exports_answer_as_estimator_predict(linear_classifier):
    run = linear_classifier
    features, _, _ = run.holdout()
    expected = run.estimator_predict(features)
    assert len(expected) == HOLDOUT
    probabilities = np.array([p["probabilities"] for p in expected])
    class_ids = np.array([p["class_ids"][0] for p in expected])
    # Not a constant model: the test could tell two models apart.
    assert len(set(class_ids.tolist())) > 1

    raw = tf.saved_model.load(str(run.versions["raw"])).signatures["predict"]
    answer = raw(**{k: tf.constant(v) for k, v in features.items()})
    np.testing.assert_allclose(answer["probabilities"].numpy(), probabilities, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(answer["class_ids"].numpy()[:, 0], class_ids)
    assert [c[0].decode() for c in answer["classes"].numpy()] == [CLASSES[k] for k in class_ids]

    examples = tf.constant(tabular.to_examples(run.schema, features))
    parsing = tf.saved_model.load(str(run.versions["parsing"]))
    predicted = parsing.signatures["predict"](examples=examples)
    np.testing.assert_allclose(
        predicted["probabilities"].numpy(), probabilities, rtol=1e-5, atol=1e-6
    )
    classified = parsing.signatures["classification"](inputs=examples)
    np.testing.assert_allclose(classified["scores"].numpy(), probabilities, rtol=1e-5, atol=1e-6)
    assert [c.decode() for c in classified["classes"].numpy()[0]] == list(CLASSES)


def _with_unknown_color(features):
    changed = dict(features)
    changed["color"] = np.array([b"purple"] * len(features["color"]), object)
    return changed


def test_a_category_outside_the_vocabulary_is_served(linear_classifier):
    run = linear_classifier
    features, _, _ = run.holdout()
    assert "purple" not in run.schema.columns[3].vocabulary
    unknown = _with_unknown_color(features)
    raw = tf.saved_model.load(str(run.versions["raw"])).signatures["predict"]
    answer = raw(**{k: tf.constant(v) for k, v in unknown.items()})["probabilities"].numpy()
    np.testing.assert_allclose(answer.sum(axis=1), 1.0, rtol=1e-5)
    # The OOV bucket is what estimator.predict gives too.
    expected = np.array([p["probabilities"] for p in run.estimator_predict(unknown)])
    np.testing.assert_allclose(answer, expected, rtol=1e-5, atol=1e-6)
    parsing = tf.saved_model.load(str(run.versions["parsing"])).signatures["classification"]
    scores = parsing(inputs=tf.constant(tabular.to_examples(run.schema, unknown)))["scores"]
    np.testing.assert_allclose(scores.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_classifier_report_and_labels(linear_classifier):
    run = linear_classifier
    features, rows, header = run.holdout()
    truth = [CLASSES.index(row[header.index("label")]) for row in rows]
    predicted = [p["class_ids"][0] for p in run.estimator_predict(features)]
    for receiver, version in run.versions.items():
        extra = version / ASSETS_EXTRA
        assert (extra / LABELS_FILE).read_text(encoding="utf-8").splitlines() == list(CLASSES)
        report = json.loads((extra / REPORT_FILE).read_text(encoding="utf-8"))
        assert report["task"] == "classification" and report["receiver"] == receiver
        assert report["split"] == "holdout" and report["examples"] == HOLDOUT
        assert report["global_step"] == STEPS
        confusion = np.array(report["confusion_matrix"])
        expected = np.zeros((3, 3), int)
        np.add.at(expected, (truth, predicted), 1)
        np.testing.assert_array_equal(confusion, expected)
        assert report["accuracy"] == pytest.approx(np.trace(expected) / HOLDOUT, abs=1e-4)
        assert [row["label"] for row in report["per_class"]] == list(CLASSES)
        for k, row in enumerate(report["per_class"]):
            assert row["support"] == expected[k].sum()
            assert row["recall"] == pytest.approx(expected[k, k] / expected[k].sum(), abs=1e-4)


def test_regressor_exports_answer_as_estimator_predict(dnn_regressor):
    run = dnn_regressor
    features, _, _ = run.holdout()
    expected = np.array([p["predictions"][0] for p in run.estimator_predict(features)])
    assert expected.std() > 0.1  # not a constant

    raw = tf.saved_model.load(str(run.versions["raw"]))
    assert set(raw.signatures) == {"predict"}
    inputs, outputs = spec_of(raw.signatures["predict"])
    assert inputs == {
        "x1": (tf.float32, [None]),
        "x2": (tf.float32, [None]),
        "rooms": (tf.int64, [None]),
        "city": (tf.string, [None]),
    }
    assert outputs == {"predictions": (tf.float32, [None, 1])}
    answer = raw.signatures["predict"](**{k: tf.constant(v) for k, v in features.items()})
    np.testing.assert_allclose(answer["predictions"].numpy()[:, 0], expected, rtol=1e-5, atol=1e-5)

    parsing = tf.saved_model.load(str(run.versions["parsing"]))
    assert set(parsing.signatures) == {"predict", "regression", "serving_default"}
    for name in ("regression", "serving_default"):
        inputs, outputs = spec_of(parsing.signatures[name])
        assert inputs == {"inputs": (tf.string, [None])}
        assert outputs == {"outputs": (tf.float32, [None, 1])}
    examples = tf.constant(tabular.to_examples(run.schema, features))
    regressed = parsing.signatures["regression"](inputs=examples)["outputs"].numpy()[:, 0]
    np.testing.assert_allclose(regressed, expected, rtol=1e-5, atol=1e-5)
    unknown = dict(features, city=np.array([b"atlantis"] * len(expected), object))
    served = raw.signatures["predict"](**{k: tf.constant(v) for k, v in unknown.items()})
    assert np.isfinite(served["predictions"].numpy()).all()


def test_regressor_report(dnn_regressor):
    run = dnn_regressor
    features, rows, header = run.holdout()
    truth = np.array([float(row[header.index("price")]) for row in rows])
    predicted = np.array([p["predictions"][0] for p in run.estimator_predict(features)])
    errors = np.abs(predicted - truth)
    report = json.loads((run.versions["raw"] / ASSETS_EXTRA / REPORT_FILE).read_text())
    assert not (run.versions["raw"] / ASSETS_EXTRA / LABELS_FILE).exists()
    assert report["task"] == "regression" and report["examples"] == len(truth)
    assert report["rmse"] == pytest.approx(np.sqrt(np.mean(errors**2)), rel=1e-4)
    assert report["mae"] == pytest.approx(errors.mean(), rel=1e-4)
    assert report["max_error"] == pytest.approx(errors.max(), rel=1e-4)
    cities = np.array([row[header.index("city")] for row in rows])
    by_value = {row["value"]: row for row in report["slices"]["city"]}
    assert set(by_value) == set(cities.tolist()) and len(by_value) > 1
    for value, row in by_value.items():
        mask = cities == value
        assert row["examples"] == mask.sum()
        assert row["max_error"] == pytest.approx(errors[mask].max(), rel=1e-4)
    rmses = [row["rmse"] for row in report["slices"]["city"]]
    assert rmses == sorted(rmses, reverse=True), "worst slice first"


def test_dnn_linear_classifier_with_a_hashed_column(sample, tmp_path):
    """DNNLinearCombinedClassifier; --max-vocabulary 2 hashes the 3 colors (the DNN side
    embeds them); one int64 input among the features."""
    version = train(
        sample["classification"], tmp_path / "run", tmp_path / "models" / "m",
        "--model", "dnn_linear", "--hidden-units", "8", "--max-vocabulary", "2",
    )  # fmt: skip
    params = json.loads((tmp_path / "run" / "params.json").read_text())
    (color,) = [c for c in params["data"]["columns"] if c["name"] == "color"]
    assert color["vocabulary"] is None and color["hash_buckets"] == 6
    loaded = tf.saved_model.load(str(version)).signatures["predict"]
    assert spec_of(loaded)[0] == FEATURE_INPUTS_CLASSIFICATION
    schema = infer_schema(sample["classification"], "label", max_vocabulary=2)
    header, rows = holdout_rows(sample["classification"])
    features = tabular.feature_arrays(schema, header, rows)
    estimator = tabular.make_estimator(
        schema, params, tf.estimator.RunConfig(model_dir=str(tmp_path / "run"))
    )
    expected = np.array(
        [p["probabilities"] for p in estimator.predict(
            lambda: tf.data.Dataset.from_tensor_slices(features).batch(len(rows)))]
    )  # fmt: skip
    answer = loaded(**{k: tf.constant(v) for k, v in features.items()})["probabilities"]
    np.testing.assert_allclose(answer.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_a_failed_export_leaves_no_version(linear_classifier, tmp_path, monkeypatch):
    model_dir = tmp_path / "run"
    shutil.copytree(linear_classifier.model_dir, model_dir)
    export_dir = tmp_path / "models" / "m"
    calls = []

    def failing_report(*args, **kwargs):
        calls.append(args)
        raise RuntimeError("report failed")

    monkeypatch.setattr(training.tabular, "evaluation_report", failing_report)
    with pytest.raises(RuntimeError, match="report failed"):
        run_main("train", "--csv", linear_classifier.csv, "--model-dir", model_dir,
                 "--export-dir", export_dir, "--max-steps", STEPS, "--learning-rate", 0.05,
                 "--batch-size", 32, "--deterministic")  # fmt: skip
    assert len(calls) == 1, "the report was not reached: the test proves nothing"
    assert export_dir.is_dir() and list(export_dir.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# Bad input: one "error:" line naming the file, exit code 2, nothing written.

GOOD_HEADER = "x1,color,label\n"
GOOD_ROWS = "".join(f"{i / 10},{'ab'[i % 2]},{'yn'[i % 3 == 0]}\n" for i in range(10))


def csv_file(tmp, text) -> tuple[list, Path]:
    path = tmp / "data.csv"
    path.write_text(text, encoding="utf-8")
    return ["--csv", path], path


BAD_CSV = [
    pytest.param(
        GOOD_HEADER.replace("label", "target") + GOOD_ROWS,
        "no label column 'label'",
        id="missing_label",
    ),
    pytest.param("", "empty file", id="empty"),
    pytest.param(GOOD_HEADER, "no data rows", id="header_only"),
    pytest.param(
        GOOD_HEADER + GOOD_ROWS + "1.0,a\n", "line 12 has 2 fields, the header has 3", id="ragged"
    ),
    pytest.param(
        GOOD_HEADER + GOOD_ROWS.replace("0.5,", "abc,"),
        "line 7, column 'x1': 'abc' is not a number",
        id="non_numeric",
    ),
    pytest.param(
        GOOD_HEADER + GOOD_ROWS.replace("0.3,", ","),
        "line 5, column 'x1': an empty value is not a number",
        id="empty_number",
    ),
]


@pytest.mark.parametrize("text, problem", BAD_CSV)
def test_bad_csv_fails_cleanly(tmp_path, capsys, text, problem):
    argv, path = csv_file(tmp_path, text)
    code = main(["train", *map(str, argv), "--model-dir", str(tmp_path / "run"),
                 "--export-dir", str(tmp_path / "models" / "m")])  # fmt: skip
    assert code == 2
    assert_one_error_line(capsys.readouterr().err, f"error: {path}: ", problem)
    assert not (tmp_path / "run").exists() and not (tmp_path / "models").exists()


def _png(path: Path, color) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (12, 9), color).save(path)


def folder_one_class(tmp):
    for i in range(6):
        _png(tmp / "imgs" / "cats" / f"{i}.png", (i * 20, 0, 0))
    return tmp / "imgs", tmp / "imgs", "1 class subfolder(s)"


def folder_unreadable_image(tmp):
    for name in ("cats", "dogs"):
        for i in range(6):
            _png(tmp / "imgs" / name / f"{i}.png", (i * 20, 0, 0))
    bad = tmp / "imgs" / "dogs" / "3.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n not really")
    return tmp / "imgs", bad, "unreadable image"


def folder_tiff_named_png(tmp):
    from PIL import Image

    for name in ("cats", "dogs"):
        for i in range(6):
            _png(tmp / "imgs" / name / f"{i}.png", (i * 20, 0, 0))
    tiff = tmp / "imgs" / "cats" / "2.png"
    Image.new("RGB", (12, 9)).save(tiff, format="TIFF")
    return tmp / "imgs", tiff, "a TIFF file, not PNG or JPEG"


def folder_missing(tmp):
    return tmp / "nowhere", tmp / "nowhere", "image folder not found"


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(folder_one_class, id="one_class"),
        pytest.param(folder_unreadable_image, id="unreadable_image"),
        pytest.param(folder_tiff_named_png, id="tiff_named_png"),
        pytest.param(folder_missing, id="missing"),
    ],
)
def test_bad_image_folder_fails_cleanly(tmp_path, capsys, build):
    folder, named, problem = build(tmp_path)
    code = main(["train", "--image-folder", str(folder), "--model-dir", str(tmp_path / "run"),
                 "--export-dir", str(tmp_path / "models" / "m")])  # fmt: skip
    assert code == 2
    assert_one_error_line(capsys.readouterr().err, f"error: {named}: ", problem)
    assert not (tmp_path / "run").exists() and not (tmp_path / "models").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        pytest.param(
            ["--task", "regression", "--label", "color"],
            "--task regression: label column 'color' holds",
            id="regression_on_strings",
        ),
        pytest.param(["--model", "cnn"], "--model cnn is not for --csv", id="image_kind"),
        pytest.param(
            ["--check-numerics"],
            "--check-numerics is for the IDX image kinds",
            id="idx_only_option",
        ),
    ],
)
def test_csv_usage_errors(tmp_path, capsys, extra, message):
    argv, _ = csv_file(tmp_path, GOOD_HEADER + GOOD_ROWS)
    code = main(["train", *map(str, argv), *extra, "--model-dir", str(tmp_path / "run"),
                 "--export-dir", str(tmp_path / "models" / "m")])  # fmt: skip
    assert code == 2
    assert_one_error_line(capsys.readouterr().err, message)
    assert not (tmp_path / "run").exists() and not (tmp_path / "models").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        pytest.param(["--model", "dnn_linear"], "--model dnn_linear is for --csv", id="dnn_linear"),
        pytest.param(["--receiver", "parsing"], "--receiver is for --csv", id="receiver"),
        pytest.param(["--label", "y"], "--label is for --csv", id="label"),
        pytest.param(["--image-size", "16"], "--image-size is for --image-folder", id="image_size"),
    ],
)
def test_the_idx_path_refuses_the_other_kinds_options(tmp_path, capsys, extra, message):
    code = main(["train", *extra, "--model-dir", str(tmp_path / "run"),
                 "--export-dir", str(tmp_path / "models" / "m")])  # fmt: skip
    assert code == 2
    assert_one_error_line(capsys.readouterr().err, message)
    assert not (tmp_path / "run").exists() and not (tmp_path / "models").exists()


def test_a_model_dir_of_another_model_is_not_resumed(linear_classifier, tmp_path, capsys):
    model_dir = tmp_path / "run"
    shutil.copytree(linear_classifier.model_dir, model_dir)
    before = (model_dir / "params.json").read_bytes()
    code = main(["train", "--csv", str(linear_classifier.csv), "--model", "dnn",
                 "--model-dir", str(model_dir), "--export-dir", str(tmp_path / "models" / "m")])  # fmt: skip
    assert code == 2
    assert_one_error_line(
        capsys.readouterr().err, f"error: {model_dir}: holds a run of another model"
    )
    assert (model_dir / "params.json").read_bytes() == before
    assert not (tmp_path / "models").exists()


def test_sample_data_command(tmp_path, capsys):
    code = main(
        ["sample-data", "--out", str(tmp_path / "s"), "--rows", "20", "--images-per-class", "2"]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert f"--csv {tmp_path / 's' / 'classification.csv'} --label label" in out
    assert len((tmp_path / "s" / "regression.csv").read_text().splitlines()) == 21
    assert sorted(p.name for p in (tmp_path / "s" / "shapes" / "square").iterdir()) == [
        "square_000.png",
        "square_001.png",
    ]


def test_sample_data_is_deterministic(tmp_path, sample):
    again = write_sample_data(tmp_path / "again")
    for key in ("classification", "regression"):
        assert again[key].read_bytes() == sample[key].read_bytes()
    first = sorted(p.relative_to(sample["images"]) for p in sample["images"].rglob("*.*"))
    assert first == sorted(p.relative_to(again["images"]) for p in again["images"].rglob("*.*"))
    assert {p.parts[0] for p in first} == {"circle", "square", "triangle"}
    for name in first:
        assert (sample["images"] / name).read_bytes() == (again["images"] / name).read_bytes()
