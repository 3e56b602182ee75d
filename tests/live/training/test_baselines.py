"""Every model kind (cnn, linear, dnn, keras): one export contract, served unchanged.

The exports come from the session's `comparison` fixture (`python -m training compare` on
the small data), so these tests also check what `compare` leaves behind.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf
from support.helpers import assert_one_error_line
from support.training_harness import COMPARE_STEPS, LABELS, call_main, serve_models
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import saved_model_pb2

from artifact.contract import (
    ASSETS_EXTRA,
    CLASSES_KEY,
    INPUT_KEY,
    LABELS_FILE,
    PREDICT_OUTPUT_KEY,
    PROBABILITIES_KEY,
    REPORT_FILE,
    SIGNATURE_NAME,
    WARMUP_FILE,
    normalize_pixels,
)
from artifact.repository import read_report
from artifact.saved_model import SavedModelPredictor
from training import baselines
from training.estimator import DEFAULT_PARAMS, MODEL_KINDS, make_estimator

MODES = tf.estimator.ModeKeys
# Keras' graph-mode code under model_to_estimator warns about its own internals.
pytestmark = [
    pytest.mark.filterwarnings("ignore:`tf.keras.backend.set_learning_phase` is deprecated"),
    pytest.mark.filterwarnings("ignore:`Model.state_updates` will be removed"),
]
PARAMETERS = {
    "cnn": 3_274_634,
    "keras": 3_274_634,
    "linear": 28 * 28 * 10 + 10,
    "dnn": 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10,
}


def version_of(comparison, kind):
    return comparison.work_dir / "models" / kind / "1"


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_every_kind_exports_the_same_contract(comparison, kind):
    version = version_of(comparison, kind)
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((version / "saved_model.pb").read_bytes())
    (meta_graph,) = proto.meta_graphs
    signatures = {k: v for k, v in meta_graph.signature_def.items() if not k.startswith("__")}
    # No pre-made `predict`/`classification` signature, no string classes: the CNN's two.
    assert set(signatures) == {SIGNATURE_NAME, PREDICT_OUTPUT_KEY}
    for signature in signatures.values():
        assert signature.method_name == "tensorflow/serving/predict"
        assert set(signature.inputs) == {INPUT_KEY}
        assert signature.inputs[INPUT_KEY].dtype == types_pb2.DT_FLOAT
        assert [d.size for d in signature.inputs[INPUT_KEY].tensor_shape.dim] == [-1, 28, 28]
        assert set(signature.outputs) == {CLASSES_KEY, PROBABILITIES_KEY}
        classes, probabilities = (
            signature.outputs[CLASSES_KEY],
            signature.outputs[PROBABILITIES_KEY],
        )
        assert classes.dtype == types_pb2.DT_INT64
        assert [d.size for d in classes.tensor_shape.dim] == [-1]
        assert probabilities.dtype == types_pb2.DT_FLOAT
        assert [d.size for d in probabilities.tensor_shape.dim] == [-1, 10]
    extra = version / ASSETS_EXTRA
    assert (extra / LABELS_FILE).read_text().splitlines() == list(LABELS)
    assert (extra / WARMUP_FILE).stat().st_size > 0
    report = json.loads((extra / REPORT_FILE).read_text())
    assert report["global_step"] == COMPARE_STEPS
    assert report["params"]["model"] == kind


@pytest.fixture(scope="module")
def service(comparison):
    """The service (in its own venv, on its own TensorFlow) serving every kind's export."""
    with serve_models({kind: version_of(comparison, kind).parent for kind in MODEL_KINDS}) as c:
        yield c


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_the_service_serves_every_kind_unchanged(comparison, service, kind, small_test_data):
    images, labels = small_test_data
    version = version_of(comparison, kind)
    metadata = service.get(f"/v1/models/{kind}/metadata").json()
    rows = service.post(
        f"/v1/models/{kind}:predict",
        json={"instances": normalize_pixels(images[:6]).tolist()},
    ).json()["predictions"]
    friendly = service.post(f"/predict/{kind}", json={"instances": images[:6].tolist()}).json()
    signature = metadata["metadata"]["signature_def"]["signature_def"][SIGNATURE_NAME]
    assert set(signature["outputs"]) == {CLASSES_KEY, PROBABILITIES_KEY}
    classes, probabilities = SavedModelPredictor(version).predict(normalize_pixels(images[:6]))
    assert [row[CLASSES_KEY] for row in rows] == classes.tolist()
    np.testing.assert_allclose([row[PROBABILITIES_KEY] for row in rows], probabilities, rtol=1e-5)
    assert [p["class_id"] for p in friendly["predictions"]] == classes.tolist()
    assert [p["label"] for p in friendly["predictions"]] == [LABELS[c] for c in classes]
    # 20 steps on 600 images: every kind is far better than chance on the 300 test images.
    accuracy = read_report(version)["accuracy"]
    assert accuracy > 0.4, (kind, accuracy)


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_model_fn_of_every_kind_in_each_mode(tmp_path, kind):
    """Like the CNN's model_fn tests: each mode's spec, shapes and dtypes, on a tiny batch."""
    estimator = make_estimator(str(tmp_path / kind), model=kind, seed=0, hooks=[])
    rng = np.random.default_rng(0)
    images = rng.random((8, 28, 28), np.float32)
    labels = rng.integers(0, 10, 8).astype(np.int32)
    for mode in (MODES.TRAIN, MODES.EVAL, MODES.PREDICT):
        with tf.Graph().as_default() as graph:
            tf.compat.v1.train.get_or_create_global_step()
            # Batch size unknown to the graph, as in an export.
            features = {INPUT_KEY: tf.compat.v1.placeholder_with_default(images, [None, 28, 28])}
            target = None if mode == MODES.PREDICT else tf.constant(labels)
            spec = estimator.model_fn(features, target, mode, estimator.config)
            if mode == MODES.PREDICT:
                assert set(spec.predictions) == {CLASSES_KEY, PROBABILITIES_KEY}
                # The Estimator adds serving_default as a copy of the one PredictOutput.
                assert set(spec.export_outputs) == {PREDICT_OUTPUT_KEY, SIGNATURE_NAME}
                assert spec.predictions[CLASSES_KEY].dtype == tf.int64
                assert spec.predictions[CLASSES_KEY].shape.as_list() == [None]
                assert spec.predictions[PROBABILITIES_KEY].shape.as_list() == [None, 10]
            elif mode == MODES.EVAL:
                expected = {"accuracy"} | {
                    f"{m}/{k}" for m in ("precision", "recall") for k in range(10)
                }
                assert set(spec.eval_metric_ops) == expected
            else:
                assert spec.train_op is not None and spec.loss.shape == ()
                graph.get_tensor_by_name("train_accuracy:0")
            with tf.compat.v1.Session() as session:
                session.run(
                    [
                        tf.compat.v1.global_variables_initializer(),
                        tf.compat.v1.local_variables_initializer(),
                        tf.compat.v1.tables_initializer(),
                    ]
                )
                if mode == MODES.PREDICT:
                    out = session.run(spec.predictions)
                    assert out[CLASSES_KEY].shape == (8,)
                    np.testing.assert_allclose(out[PROBABILITIES_KEY].sum(axis=1), 1, atol=1e-5)
                    np.testing.assert_array_equal(
                        out[CLASSES_KEY], out[PROBABILITIES_KEY].argmax(axis=1)
                    )
                elif mode == MODES.TRAIN:
                    first = session.run(spec.loss)
                    for _ in range(5):
                        session.run(spec.train_op)
                    assert session.run(spec.loss) < first, kind


def test_premade_kinds_are_the_premade_estimators_over_a_numeric_column():
    config = tf.estimator.RunConfig(model_dir="unused")
    params = dict(DEFAULT_PARAMS)
    assert isinstance(baselines.premade_estimator("linear", params, config),
                      tf.estimator.LinearClassifier)  # fmt: skip
    dnn = baselines.premade_estimator("dnn", {**params, "hidden_units": [64, 32]}, config)
    assert isinstance(dnn, tf.estimator.DNNClassifier)
    column = baselines.image_feature_column(0.25, 0.5)
    assert column.key == INPUT_KEY and column.shape == (28, 28)
    np.testing.assert_allclose(column.normalizer_fn(np.array([0.25, 0.75, 0.0])), [0, 1, -0.5])


def test_dnn_hidden_units_are_settable(tmp_path):
    from training.estimator import trainable_variable_shapes

    estimator = make_estimator(str(tmp_path / "dnn"), model="dnn", hidden_units=[64, 32])
    shapes = trainable_variable_shapes(estimator)
    assert shapes["dnn/hiddenlayer_0/kernel"] == [784, 64]
    assert shapes["dnn/hiddenlayer_1/kernel"] == [64, 32]
    assert shapes["dnn/logits/kernel"] == [32, 10]


def test_unknown_model_kind(tmp_path, small_data_dir, capsys):
    with pytest.raises(ValueError, match="unknown model kind 'svm'; known kinds: cnn, linear"):
        make_estimator(str(tmp_path / "run"), model="svm")
    model_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as excinfo:
        call_main("train", "--model", "svm", "--data-dir", small_data_dir,
                  "--model-dir", model_dir)  # fmt: skip
    assert excinfo.value.code == 2
    _, err = capsys.readouterr()
    assert (
        "argument --model: invalid choice: 'svm' (choose from 'cnn', 'linear', 'dnn', 'keras', 'dnn_linear')"
        in err
    )
    assert not model_dir.exists()


def test_resuming_with_another_kind_is_refused(tmp_path, comparison, capsys):
    import shutil

    model_dir = tmp_path / "run"
    shutil.copytree(comparison.work_dir / "linear", model_dir)
    before = (model_dir / "params.json").read_text()
    code = call_main("train", "--model", "dnn", "--data-dir",
                     json.loads(before)["data_dir"], "--model-dir", model_dir,
                     "--max-steps", COMPARE_STEPS + 5)  # fmt: skip
    _, err = capsys.readouterr()
    assert code == 2
    assert_one_error_line(err, f"{model_dir}: was trained with --model linear, not dnn")
    assert (model_dir / "params.json").read_text() == before


@pytest.mark.parametrize("kind", ["linear", "keras"])
def test_evaluate_and_export_a_baseline_model_dir(tmp_path, comparison, kind, capsys):
    """evaluate and export rebuild the kind from the model dir's params.json."""
    model_dir = comparison.work_dir / kind
    data_dir = json.loads((model_dir / "params.json").read_text())["data_dir"]
    output = tmp_path / "evaluation.json"
    assert call_main("evaluate", model_dir, "--data-dir", data_dir, "--output", output) == 0
    evaluated = json.loads(output.read_text())
    exported = read_report(version_of(comparison, kind))
    assert evaluated["global_step"] == COMPARE_STEPS
    assert evaluated["confusion_matrix"] == exported["confusion_matrix"]

    export_dir = tmp_path / "models" / kind
    code = call_main("export", "--model-dir", model_dir, "--export-dir", export_dir,
                     "--data-dir", data_dir)  # fmt: skip
    assert code == 0
    again = read_report(export_dir / "1")
    assert again["confusion_matrix"] == exported["confusion_matrix"]
    assert again["params"]["model"] == kind
