"""`python -m training` end to end: train, resume, export atomically, evaluate, bad input."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import struct
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from support.helpers import assert_one_error_line
from support.training_harness import call_main, checkpoint_step, integer_dirs
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import saved_model_pb2

import training.publish
from artifact.contract import (
    ASSETS_EXTRA,
    CLASSES_KEY,
    FASHION_MNIST_LABELS,
    INPUT_KEY,
    LABELS_FILE,
    PROBABILITIES_KEY,
    REPORT_FILE,
    SIGNATURE_NAME,
    normalize_pixels,
)
from training import data, hooks
from training.publish import STAGING_PREFIX

# The conftest's small test split and trained_model run (conftest.SMALL_TEST_COUNT, TRAIN_STEPS).
SMALL_TEST_COUNT = 300
TRAIN_STEPS = 40


@pytest.fixture(autouse=True)
def _matches_conftest(request):
    if "trained_model" in request.fixturenames:
        assert request.getfixturevalue("trained_model").max_steps == TRAIN_STEPS
    if "small_test_data" in request.fixturenames:
        assert len(request.getfixturevalue("small_test_data")[1]) == SMALL_TEST_COUNT


def staging_dirs(base: Path) -> list[str]:
    return sorted(p.name for p in base.glob(STAGING_PREFIX + "*")) if base.exists() else []


def train_argv(data_dir, model_dir, *extra, max_steps=10):
    return [
        "train",
        "--data-dir", data_dir,
        "--model-dir", model_dir,
        "--max-steps", max_steps,
        "--batch-size", 50,
        "--labels", "fashion",
        "--deterministic",
        *extra,
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# End to end: the session's trained_model fixture ran `train` and exported version 1.


def test_train_exports_a_complete_version(trained_model, small_test_data):
    version = trained_model.version_path
    assert version == trained_model.export_base / "1"
    assert (version / "saved_model.pb").is_file()
    assert (version / "variables" / "variables.index").is_file()
    assert staging_dirs(trained_model.export_base) == []

    labels = (version / ASSETS_EXTRA / LABELS_FILE).read_text(encoding="utf-8").splitlines()
    assert tuple(labels) == FASHION_MNIST_LABELS

    _, test_labels = small_test_data
    report = json.loads((version / ASSETS_EXTRA / REPORT_FILE).read_text(encoding="utf-8"))
    assert report["global_step"] == TRAIN_STEPS
    assert report["examples"] == SMALL_TEST_COUNT
    assert report["split"] == "test"
    assert report["data_dir"] == str(trained_model.data_dir)
    confusion = np.array(report["confusion_matrix"])
    assert confusion.shape == (10, 10)
    assert confusion.sum() == SMALL_TEST_COUNT
    np.testing.assert_array_equal(confusion.sum(axis=1), np.bincount(test_labels, minlength=10))
    assert report["accuracy"] == pytest.approx(np.trace(confusion) / SMALL_TEST_COUNT, abs=1e-4)
    # 40 steps on 600 images is far better than chance (0.1); it reaches about 0.75.
    assert 0.3 < report["accuracy"] <= 1.0
    assert [row["label"] for row in report["per_class"]] == list(FASHION_MNIST_LABELS)
    for k, row in enumerate(report["per_class"]):
        assert row["class_id"] == k
        assert 0.0 <= row["precision"] <= 1.0 and 0.0 <= row["recall"] <= 1.0
        assert row["support"] == confusion[k].sum()
        if confusion[:, k].sum():
            assert row["precision"] == pytest.approx(
                confusion[k, k] / confusion[:, k].sum(), abs=1e-4
            )
        assert row["recall"] == pytest.approx(confusion[k, k] / confusion[k].sum(), abs=1e-4)

    params = json.loads((trained_model.model_dir / "params.json").read_text())
    assert params["max_steps"] == TRAIN_STEPS and params["data_format"] == "channels_last"
    assert checkpoint_step(trained_model.model_dir) == TRAIN_STEPS


def test_exported_signature_matches_the_contract(trained_model):
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((trained_model.version_path / "saved_model.pb").read_bytes())
    (meta_graph,) = proto.meta_graphs
    assert "serve" in meta_graph.meta_info_def.tags
    signature = meta_graph.signature_def[SIGNATURE_NAME]

    def dims(info):
        return [d.size for d in info.tensor_shape.dim]

    # What TF Serving's REST/gRPC API sees.
    assert set(signature.inputs) == {INPUT_KEY}
    assert signature.inputs[INPUT_KEY].dtype == types_pb2.DT_FLOAT
    assert dims(signature.inputs[INPUT_KEY]) == [-1, 28, 28]
    assert set(signature.outputs) == {CLASSES_KEY, PROBABILITIES_KEY}
    assert signature.outputs[CLASSES_KEY].dtype == types_pb2.DT_INT64
    assert dims(signature.outputs[CLASSES_KEY]) == [-1]
    assert signature.outputs[PROBABILITIES_KEY].dtype == types_pb2.DT_FLOAT
    assert dims(signature.outputs[PROBABILITIES_KEY]) == [-1, 10]


def test_exported_model_loads_and_predicts(trained_model, small_test_data):
    loaded = tf.saved_model.load(str(trained_model.version_path))
    assert SIGNATURE_NAME in loaded.signatures
    signature = loaded.signatures[SIGNATURE_NAME]

    args, kwargs = signature.structured_input_signature
    assert args == ()
    assert set(kwargs) == {INPUT_KEY}
    assert kwargs[INPUT_KEY].dtype == tf.float32
    assert kwargs[INPUT_KEY].shape.as_list() == [None, 28, 28]
    outputs = signature.structured_outputs
    assert set(outputs) == {CLASSES_KEY, PROBABILITIES_KEY}
    assert outputs[CLASSES_KEY].dtype == tf.int64
    assert outputs[CLASSES_KEY].shape.as_list() == [None]
    assert outputs[PROBABILITIES_KEY].dtype == tf.float32
    assert outputs[PROBABILITIES_KEY].shape.as_list() == [None, 10]

    images, labels = small_test_data
    result = signature(**{INPUT_KEY: tf.constant(normalize_pixels(images[:5]))})
    classes = result[CLASSES_KEY].numpy()
    probabilities = result[PROBABILITIES_KEY].numpy()
    assert classes.dtype == np.int64 and classes.shape == (5,)
    assert probabilities.dtype == np.float32 and probabilities.shape == (5, 10)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
    assert (probabilities >= 0).all()
    np.testing.assert_array_equal(np.argmax(probabilities, axis=1), classes)

    # The exported report describes this very model on the whole test split.
    all_classes = signature(**{INPUT_KEY: tf.constant(normalize_pixels(images))})[CLASSES_KEY]
    report = json.loads((trained_model.version_path / ASSETS_EXTRA / REPORT_FILE).read_text())
    accuracy = float(np.mean(all_classes.numpy() == labels))
    assert report["accuracy"] == pytest.approx(accuracy, abs=1e-4)


# ---------------------------------------------------------------------------------------------
# Resuming.


def test_train_resumes_from_the_saved_step(tmp_path, small_data_dir, capsys):
    model_dir, export_dir = tmp_path / "run", tmp_path / "models" / "m"
    common = ["--export-dir", export_dir, "--checkpoint-steps", 5, "--no-export"]

    assert call_main(*train_argv(small_data_dir, model_dir, *common, max_steps=10)) == 0
    out, err = capsys.readouterr()
    assert checkpoint_step(model_dir) == 10
    assert "resuming" not in out
    assert "starting at step 0 of 10" in err

    assert call_main(*train_argv(small_data_dir, model_dir, *common, max_steps=20)) == 0
    out, err = capsys.readouterr()
    assert checkpoint_step(model_dir) == 20
    assert "resuming at step 10" in out
    assert "starting at step 10 of 20" in err
    assert "20/20" in err
    assert json.loads((model_dir / "params.json").read_text())["max_steps"] == 20

    # Already there: nothing to train, the checkpoint is untouched.
    assert call_main(*train_argv(small_data_dir, model_dir, *common, max_steps=20)) == 0
    out, _ = capsys.readouterr()
    assert "resuming at step 20" in out and "nothing to train" in out
    assert checkpoint_step(model_dir) == 20
    assert not export_dir.exists()  # --no-export


def test_killed_run_keeps_last_checkpoint_and_resumes(
    tmp_path, small_data_dir, capsys, monkeypatch
):
    model_dir, export_dir = tmp_path / "run", tmp_path / "models" / "m"
    original_after_run = hooks.ProgressHook.after_run
    interrupted_at = []

    def after_run_then_interrupt(self, run_context, run_values):
        original_after_run(self, run_context, run_values)
        if self._step >= 7:
            interrupted_at.append(self._step)
            raise KeyboardInterrupt

    monkeypatch.setattr(hooks.ProgressHook, "after_run", after_run_then_interrupt)
    argv = train_argv(small_data_dir, model_dir, "--export-dir", export_dir,
                      "--checkpoint-steps", 5, max_steps=12)  # fmt: skip
    assert call_main(*argv) == 130
    _, err = capsys.readouterr()
    assert interrupted_at == [7]
    assert "interrupted" in err and "Traceback" not in err
    assert checkpoint_step(model_dir) == 5
    assert integer_dirs(export_dir) == [] and staging_dirs(export_dir) == []

    monkeypatch.undo()
    assert call_main(*argv, "--no-export") == 0
    out, err = capsys.readouterr()
    assert "resuming at step 5" in out
    assert "starting at step 5 of 12" in err
    assert "12/12" in err
    assert checkpoint_step(model_dir) == 12


# ---------------------------------------------------------------------------------------------
# Export: a version appears complete or not at all, numbered after the existing ones.


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_failed_export_leaves_no_version_or_staging_dir(
    tmp_path, trained_model, capsys, monkeypatch, error
):
    export_dir = tmp_path / "models" / "m"
    calls = []

    def failing_build_report(*args, **kwargs):
        calls.append(args)
        raise error("report failed")

    monkeypatch.setattr(training.publish, "build_report", failing_build_report)
    argv = ["export", "--model-dir", trained_model.model_dir, "--export-dir", export_dir,
            "--data-dir", trained_model.data_dir]  # fmt: skip
    if error is KeyboardInterrupt:
        assert call_main(*argv) == 130
    else:
        with pytest.raises(RuntimeError, match="report failed"):
            call_main(*argv)
    assert len(calls) == 1, "the report builder was not reached: the test proves nothing"
    assert export_dir.is_dir()
    assert integer_dirs(export_dir) == []
    assert staging_dirs(export_dir) == []
    assert list(export_dir.iterdir()) == []


def test_exports_get_consecutive_versions_and_sweep_stale_staging(tmp_path, trained_model, capsys):
    export_dir = tmp_path / "models" / "m"
    stale = export_dir / (STAGING_PREFIX + "killed")
    fresh = export_dir / (STAGING_PREFIX + "in-progress")
    for path in (stale, fresh):
        (path / "1234").mkdir(parents=True)
    two_hours_ago = time.time() - 7200
    os.utime(stale, (two_hours_ago, two_hours_ago))
    argv = ["export", "--model-dir", trained_model.model_dir, "--export-dir", export_dir,
            "--data-dir", trained_model.data_dir]  # fmt: skip

    assert call_main(*argv) == 0
    out, _ = capsys.readouterr()
    assert integer_dirs(export_dir) == ["1"]
    assert f"Exported step {TRAIN_STEPS} of {trained_model.model_dir} as {export_dir / '1'}" in out
    assert not stale.exists(), "a staging dir older than an hour should be swept"
    assert fresh.exists(), "a recent staging dir may be another export at work"

    assert call_main(*argv) == 0
    assert integer_dirs(export_dir) == ["1", "2"]
    for version in ("1", "2"):
        assert (export_dir / version / "saved_model.pb").is_file()
        report = json.loads((export_dir / version / ASSETS_EXTRA / REPORT_FILE).read_text())
        assert report["global_step"] == TRAIN_STEPS
    assert staging_dirs(export_dir) == [fresh.name]


def test_export_adds_a_version_to_an_existing_repository(tmp_path, trained_model, capsys):
    export_dir = tmp_path / "fashion_mnist"
    shutil.copytree(trained_model.export_base, export_dir)
    before = (export_dir / "1" / "saved_model.pb").read_bytes()
    argv = ["export", "--model-dir", trained_model.model_dir, "--export-dir", export_dir,
            "--data-dir", trained_model.data_dir]  # fmt: skip
    assert call_main(*argv) == 0
    assert integer_dirs(export_dir) == ["1", "2"]
    assert (export_dir / "1" / "saved_model.pb").read_bytes() == before
    labels = (export_dir / "2" / ASSETS_EXTRA / LABELS_FILE).read_text().splitlines()
    assert tuple(labels) == FASHION_MNIST_LABELS  # from the model dir's params.json
    original = json.loads((export_dir / "1" / ASSETS_EXTRA / REPORT_FILE).read_text())
    again = json.loads((export_dir / "2" / ASSETS_EXTRA / REPORT_FILE).read_text())
    assert again["confusion_matrix"] == original["confusion_matrix"]


# ---------------------------------------------------------------------------------------------
# Evaluate.


def test_evaluate_version_and_model_dir_agree(tmp_path, trained_model, capsys):
    reports = {}
    for name, path in (
        ("version", trained_model.version_path),
        ("repository", trained_model.export_base),
        ("model_dir", trained_model.model_dir),
    ):
        output = tmp_path / f"{name}.json"
        code = call_main("evaluate", path, "--data-dir", trained_model.data_dir, "--output", output)
        assert code == 0, name
        out, _ = capsys.readouterr()
        assert f"Wrote {output}" in out
        reports[name] = json.loads(output.read_text())

    assert reports["version"]["saved_model"] == str(trained_model.version_path)
    assert reports["repository"]["saved_model"] == str(trained_model.version_path)
    assert reports["model_dir"]["model_dir"] == str(trained_model.model_dir)
    assert reports["model_dir"]["global_step"] == TRAIN_STEPS
    exported = json.loads((trained_model.version_path / ASSETS_EXTRA / REPORT_FILE).read_text())
    for name, report in reports.items():
        assert report["examples"] == SMALL_TEST_COUNT, name
        assert [row["label"] for row in report["per_class"]] == list(FASHION_MNIST_LABELS)
        assert report["accuracy"] == pytest.approx(reports["version"]["accuracy"], abs=1e-6), name
        assert report["accuracy"] == pytest.approx(exported["accuracy"], abs=1e-6), name


def test_evaluate_reports_bad_paths(tmp_path, small_data_dir, capsys):
    not_a_model = tmp_path / "empty"
    not_a_model.mkdir()
    for path, problem in ((tmp_path / "missing", "not found"), (not_a_model, "not a model dir")):
        code = call_main("evaluate", path, "--data-dir", small_data_dir,
                         "--output", tmp_path / "out.json")  # fmt: skip
        assert code == 2
        _, err = capsys.readouterr()
        assert err.startswith(f"error: {path}: {problem}")
    assert not (tmp_path / "out.json").exists()


def test_export_without_checkpoint_is_a_usage_error(tmp_path, small_data_dir, capsys):
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    (model_dir / "params.json").write_text(json.dumps({"data_format": "channels_last"}))
    export_dir = tmp_path / "models" / "m"
    code = call_main("export", "--model-dir", model_dir, "--export-dir", export_dir,
                     "--data-dir", small_data_dir)  # fmt: skip
    assert code == 2
    _, err = capsys.readouterr()
    assert err.startswith(f"error: {model_dir}: holds no checkpoint")
    assert integer_dirs(export_dir) == []


# ---------------------------------------------------------------------------------------------
# Bad input: one "error:" line naming the file, exit code 2, nothing written.


def _valid_dir(tmp: Path) -> Path:
    rng = np.random.default_rng(0)
    directory = tmp / "data"
    for split, n in (("train", 20), ("test", 10)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        data.write_idx(directory, split, images, (np.arange(n) % 10).astype(np.uint8))
    return directory


def bad_missing_dir(tmp):
    return tmp / "nowhere", tmp / "nowhere", "data directory not found"


def bad_wrong_magic(tmp):
    directory = _valid_dir(tmp)
    path = directory / "train-images-idx3-ubyte.gz"
    raw = bytearray(data.read_bytes(path))
    raw[:4] = struct.pack(">I", 2049)
    path.write_bytes(gzip.compress(bytes(raw)))
    return directory, path, "wrong magic number"


def bad_truncated(tmp):
    directory = _valid_dir(tmp)
    path = directory / "t10k-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-50])
    return directory, path, "truncated gzip stream"


def bad_truncated_plain(tmp):
    directory = _valid_dir(tmp)
    path = directory / "train-labels-idx1-ubyte"
    path.write_bytes(data.read_bytes(directory / "train-labels-idx1-ubyte.gz")[:-3])
    (directory / "train-labels-idx1-ubyte.gz").unlink()
    return directory, path, "truncated"


def bad_count_mismatch(tmp):
    directory = _valid_dir(tmp)
    data.write_idx(directory, "test", np.zeros((10, 28, 28), np.uint8), np.zeros(9, np.uint8))
    return directory, directory / "t10k-images-idx3-ubyte.gz", "10 images but"


def bad_image_size(tmp):
    directory = _valid_dir(tmp)
    data.write_idx(directory, "train", np.zeros((20, 27, 28), np.uint8), np.zeros(20, np.uint8))
    return directory, directory / "train-images-idx3-ubyte.gz", "images are 27x28"


def bad_label_out_of_range(tmp):
    directory = _valid_dir(tmp)
    data.write_idx(directory, "test", np.zeros((10, 28, 28), np.uint8), np.full(10, 10, np.uint8))
    return directory, directory / "t10k-labels-idx1-ubyte.gz", "label 10 at index 0"


BAD_DATA = [
    pytest.param(bad_missing_dir, id="missing_dir"),
    pytest.param(bad_wrong_magic, id="wrong_magic"),
    pytest.param(bad_truncated, id="truncated"),
    pytest.param(bad_truncated_plain, id="truncated_plain"),
    pytest.param(bad_count_mismatch, id="count_mismatch"),
    pytest.param(bad_image_size, id="image_size"),
    pytest.param(bad_label_out_of_range, id="label_out_of_range"),
]


@pytest.mark.parametrize("build", BAD_DATA)
def test_train_with_bad_data_fails_cleanly(tmp_path, capsys, build):
    data_dir, path, problem = build(tmp_path)
    model_dir, export_dir = tmp_path / "run", tmp_path / "models" / "m"
    capsys.readouterr()
    code = call_main(*train_argv(data_dir, model_dir, "--export-dir", export_dir, max_steps=5))
    out, err = capsys.readouterr()
    assert code == 2
    line = assert_one_error_line(err, problem)
    assert line.startswith(f"error: {path}: "), line
    assert "Training on" not in out
    assert not export_dir.exists() or integer_dirs(export_dir) == []
    assert not model_dir.exists()


def test_evaluate_with_bad_data_fails_cleanly(tmp_path, capsys):
    data_dir, path, problem = bad_count_mismatch(tmp_path)
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    (model_dir / "params.json").write_text(json.dumps({"data_format": "channels_last"}))
    output = tmp_path / "out.json"
    code = call_main("evaluate", model_dir, "--data-dir", data_dir, "--output", output)
    _, err = capsys.readouterr()
    assert code == 2
    line = assert_one_error_line(err, problem)
    assert line.startswith(f"error: {path}: "), line
    assert not output.exists()


def test_export_with_bad_data_fails_cleanly(tmp_path, trained_model, capsys):
    data_dir, path, problem = bad_truncated(tmp_path)  # export reads only the test split
    export_dir = tmp_path / "models" / "m"
    code = call_main("export", "--model-dir", trained_model.model_dir, "--export-dir", export_dir,
                     "--data-dir", data_dir)  # fmt: skip
    _, err = capsys.readouterr()
    assert code == 2
    line = assert_one_error_line(err, problem)
    assert line.startswith(f"error: {path}: "), line
    assert not export_dir.exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--max-steps", "0"], "must be a positive integer, got 0"),
        (["--batch-size", "-1"], "must be a positive integer, got -1"),
        (["--max-steps", "ten"], "argument --max-steps: invalid"),
        (["--epochs", "0"], "must be a positive number, got 0"),
        (["--epochs", "nan"], "must be a positive number, got nan"),
        (["--epochs", "1", "--max-steps", "5"], "not allowed with argument"),
        (["--data-format", "NHWC"], "invalid choice"),
    ],
)
def test_invalid_arguments_exit_2(tmp_path, capsys, extra, message):
    export_dir = tmp_path / "models" / "m"
    argv = ["train", "--data-dir", tmp_path, "--model-dir", tmp_path / "run",
            "--export-dir", export_dir, *extra]  # fmt: skip
    with pytest.raises(SystemExit) as excinfo:
        call_main(*argv)
    assert excinfo.value.code == 2
    _, err = capsys.readouterr()
    assert message in err
    assert not export_dir.exists() and not (tmp_path / "run").exists()


def test_resuming_with_another_data_format_is_refused(tmp_path, trained_model, capsys):
    model_dir = tmp_path / "run"
    shutil.copytree(trained_model.model_dir, model_dir)
    params_before = (model_dir / "params.json").read_text()
    export_dir = tmp_path / "models" / "m"
    argv = train_argv(trained_model.data_dir, model_dir, "--export-dir", export_dir,
                      "--data-format", "channels_first", max_steps=TRAIN_STEPS + 10)  # fmt: skip
    code = call_main(*argv)
    _, err = capsys.readouterr()
    assert code == 2
    line = assert_one_error_line(err, "was trained with --data-format channels_last")
    assert line.startswith(f"error: {model_dir}: "), line
    assert (model_dir / "params.json").read_text() == params_before
    assert checkpoint_step(model_dir) == TRAIN_STEPS
    assert not export_dir.exists()
