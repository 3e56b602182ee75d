"""Feedback for any signature, over a fake backend with the signatures of a pre-made tabular
classifier, a regressor and a 32x32x3 image model: instances in TF Serving's row format,
checked against the signature in its words, stored as tf.Examples of the inputs (by dtype)
and the label; every refusal a 400 that stores nothing. No TensorFlow (the fast tier)."""

from __future__ import annotations

import numpy as np
import pytest
from support.fakes import AnyFakeBackend, FakeModel, app_client
from support.feedback_stores import stored_shards
from support.helpers import error_message, ok_json

from artifact.feedback import LABEL_FEATURE, store_dir
from service.types import SignatureSpec, TensorSpec

MODEL_NAME = "any"  # served beside the fake backend's default model
URL = f"/v1/models/{MODEL_NAME}/feedback"
F32, I64, STR = np.dtype(np.float32), np.dtype(np.int64), np.dtype(object)
FEATURES = (
    TensorSpec("color", STR, (-1,)),
    TensorSpec("rooms", I64, (-1,)),
    TensorSpec("x1", F32, (-1,)),
)
# What TF's canned heads export through a raw receiver: only `predict`.
CLASSIFIER = SignatureSpec(
    "predict",
    "tensorflow/serving/predict",
    FEATURES,
    (
        TensorSpec("class_ids", I64, (-1, 1)),
        TensorSpec("classes", STR, (-1, 1)),
        TensorSpec("probabilities", F32, (-1, 3)),
    ),
)
REGRESSOR = SignatureSpec(
    "predict", "tensorflow/serving/predict", FEATURES, (TensorSpec("predictions", F32, (-1, 1)),)
)
IMAGES = SignatureSpec(
    "serving_default",
    "tensorflow/serving/predict",
    (TensorSpec("image", F32, (-1, 32, 32, 3)),),
    (TensorSpec("classes", I64, (-1,)), TensorSpec("probabilities", F32, (-1, 5))),
)
CLASSES = ("high", "low", "mid")
ROWS = [
    {"x1": 0.5, "rooms": 3, "color": "red"},
    {"x1": -1.25, "rooms": 1, "color": "blue"},
]


def client_for(tmp_path, *signatures, labels=CLASSES):
    model = FakeModel({spec.name: spec for spec in signatures}, lambda name, inputs: {}, labels)
    backend = AnyFakeBackend({MODEL_NAME: model})
    return app_client(backend, feedback_dir=str(tmp_path))


def stored(tmp_path):
    return stored_shards(store_dir(tmp_path, MODEL_NAME))


def test_a_tabular_classifiers_rows_are_stored_as_tf_examples_of_its_features(tmp_path):
    with client_for(tmp_path, CLASSIFIER) as client:
        body = ok_json(client.post(URL, json={"instances": ROWS, "labels": ["mid", 1]}))
        assert body == {
            "model_name": MODEL_NAME,
            "stored": 2,
            "labels": ["mid", "low"],
            "model_version": None,
        }
        registry = client.app.dataplane.metrics.registry
        labels = {"model": MODEL_NAME, "label": "mid"}
        assert registry.get_sample_value("feedback_examples_total", labels) == 1
    (shard,) = stored(tmp_path)
    assert shard.examples[0] == {
        "x1": ("float", [0.5]),
        "rooms": ("int64", [3]),
        "color": ("bytes", [b"red"]),
        LABEL_FEATURE: ("int64", [2]),
    }
    assert shard.labels == [2, 1] and shard.values("color") == [[b"red"], [b"blue"]]


def test_a_regressors_rows_are_stored_with_their_values(tmp_path):
    with client_for(tmp_path, REGRESSOR) as client:
        body = ok_json(client.post(URL, json={"instances": ROWS, "labels": [3, 250000.5]}))
        assert body["labels"] == [3.0, 250000.5]
        registry = client.app.dataplane.metrics.registry
        labels = {"model": MODEL_NAME, "label": ""}
        assert registry.get_sample_value("feedback_examples_total", labels) == 2
    (shard,) = stored(tmp_path)
    assert shard.examples[1][LABEL_FEATURE] == ("float", [250000.5])
    assert shard.values("x1") == [[0.5], [-1.25]]


def test_images_of_another_shape_are_stored_flat_as_the_signature_takes_them(tmp_path):
    image = np.random.default_rng(1).random((32, 32, 3)).astype(np.float32)
    named = {"image": image.tolist()}
    with client_for(tmp_path, IMAGES, labels=tuple("abcde")) as client:
        ok_json(client.post(URL, json={"instances": [image.tolist()], "labels": ["e"]}))
        ok_json(client.post(URL, json={"instances": [named], "labels": [0]}))
    (shard,) = stored(tmp_path)
    kind, values = shard.examples[0]["image"]
    assert kind == "float" and len(values) == 32 * 32 * 3
    np.testing.assert_array_equal(np.asarray(values, np.float32).reshape(32, 32, 3), image)
    assert shard.examples[1]["image"] == shard.examples[0]["image"]
    assert shard.labels == [4, 0]


def test_signature_name_picks_the_signature_when_a_model_has_several(tmp_path):
    other = SignatureSpec("other", IMAGES.method_name, IMAGES.inputs, IMAGES.outputs)
    several = (CLASSIFIER, other)
    with client_for(tmp_path, *several) as client:
        response = client.post(URL, json={"instances": ROWS[:1], "labels": [0]})
        assert "name the one the instances are for with signature_name" in error_message(
            response, 400
        )
        body = {"signature_name": "predict", "instances": ROWS[:1], "labels": [0]}
        ok_json(client.post(URL, json=body))
    assert [shard.labels for shard in stored(tmp_path)] == [[0]]


PARSING = SignatureSpec(
    "serving_default",
    "tensorflow/serving/classify",
    (TensorSpec("inputs", STR, (-1,)),),
    CLASSIFIER.outputs,
)
NEITHER = SignatureSpec(
    "serving_default", "tensorflow/serving/predict", FEATURES, (TensorSpec("upper", STR, (-1,)),)
)
CLASHING = SignatureSpec(
    "predict", "tensorflow/serving/predict", (*FEATURES, TensorSpec(LABEL_FEATURE, F32, (-1,))),
    CLASSIFIER.outputs,
)  # fmt: skip
COMPLEX = SignatureSpec(
    "serving_default", "tensorflow/serving/predict",
    (TensorSpec("z", np.dtype(np.complex64), (-1,)),), CLASSIFIER.outputs,
)  # fmt: skip
ROW = ROWS[0]
BAD = [
    pytest.param(CLASSIFIER, {"instances": [{"x1": 0.5, "rooms": 3}], "labels": [0]}, "keys must be equal to: color,rooms,x1; instances[0]: missing ['color']", id="missing-feature"),
    pytest.param(CLASSIFIER, {"instances": [{**ROW, "size": 2}], "labels": [0]}, "does not have named input: size", id="unknown-feature"),
    pytest.param(CLASSIFIER, {"instances": [{**ROW, "x1": "big"}], "labels": [0]}, 'JSON Value: "big" Type: String is not of expected type: float', id="string-for-a-number"),
    pytest.param(CLASSIFIER, {"instances": [{**ROW, "rooms": 2.5}], "labels": [0]}, "is not of expected type: int64", id="float-for-an-integer"),
    pytest.param(CLASSIFIER, {"instances": [{**ROW, "x1": [1.0, 2.0]}], "labels": [0]}, "input 'x1' takes float [-1]; got shape [1,2]", id="a-list-for-a-scalar"),
    pytest.param(CLASSIFIER, {"instances": [ROW], "labels": ["huge"]}, "labels[0]: unknown label 'huge'; the model's labels are high, low, mid", id="unknown-class"),
    pytest.param(CLASSIFIER, {"instances": [ROW], "labels": [3]}, "labels[0]: class id 3 is out of range 0-2", id="class-id-out-of-range"),
    pytest.param(CLASSIFIER, {"instances": [ROW, ROW], "labels": [0]}, "labels: 1 label(s) for 2 instance(s)", id="count-mismatch"),
    pytest.param(CLASSIFIER, {"inputs": {"x1": [0.5]}, "labels": [0]}, "Missing 'instances' key; feedback takes the row format", id="columnar-format"),
    pytest.param(CLASSIFIER, {"instances": [ROW], "labels": [0], "signature_name": "nope"}, "nope", id="unknown-signature"),
    pytest.param(REGRESSOR, {"instances": [ROW], "labels": ["3.5"]}, "labels[0]: expected a number (the true value of a regressor's output), got str", id="regression-label-as-text"),
    pytest.param(REGRESSOR, {"instances": [ROW], "labels": [1e300]}, "labels[0]: expected a finite number, got 1e+300", id="regression-label-past-float32"),
    pytest.param(REGRESSOR, {"instances": [ROW], "labels": [True]}, "expected a number", id="regression-label-bool"),
    pytest.param(IMAGES, {"instances": [np.zeros((32, 31, 3)).tolist()], "labels": [0]}, "input 'image' takes float [-1,32,32,3]; got shape [1,32,31,3]", id="image-of-the-wrong-size"),
    pytest.param(IMAGES, {"instances": [np.zeros((32, 32, 3)).tolist(), np.zeros((32, 32, 1)).tolist()], "labels": [0, 1]}, "ragged instances", id="ragged-images"),
    pytest.param(PARSING, {"instances": [ROW], "labels": [0]}, "takes serialized tf.Examples (a parsing receiver)", id="parsing-receiver"),
    pytest.param(NEITHER, {"instances": [ROW], "labels": [0]}, "feedback labels a classifier", id="neither-classifier-nor-regressor"),
    pytest.param(CLASHING, {"instances": [ROW], "labels": [0]}, f"has an input named '{LABEL_FEATURE}'", id="input-named-as-the-label"),
    pytest.param(COMPLEX, {"instances": [1.5], "labels": [0]}, "these instances cannot be stored as tf.Examples: a tf.Example cannot hold values of dtype complex64", id="a-dtype-no-tf-example-holds"),
]  # fmt: skip


@pytest.mark.parametrize("signature, body, words", BAD)
def test_bad_feedback_for_any_signature_is_a_400_naming_it_and_stores_nothing(
    tmp_path, signature, body, words
):
    with client_for(tmp_path, signature) as client:
        assert words in error_message(client.post(URL, json=body), 400)
    assert stored(tmp_path) == []


def test_a_multipart_upload_is_for_the_image_contract_only(tmp_path):
    files = [("files", ("a.png", b"\x89PNG not really", "image/png"))]
    with client_for(tmp_path, IMAGES, labels=tuple("abcde")) as client:
        response = client.post(URL, files=files, data={"labels": "a"})
        message = error_message(response, 400)
    assert "multipart uploads of image files are for models that take 28x28 images" in message
    assert "image float [-1,32,32,3]" in message
    assert stored(tmp_path) == []
