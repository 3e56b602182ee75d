"""The trainer's TensorFlow (2.15) exports every kind, the service's (2.21) serves them alike.

The two sides run different TensorFlows (docs/architecture.md, "Two TensorFlows"). Every model
kind `python -m training` makes is exported by the training side (in its own interpreter,
support/sides.py) and served by one `python -m service` from one model config; every
signature of every export is asked over gRPC `Predict` and its answer is held against what the
training side's own TensorFlow answers for the same SavedModel, signature and inputs: the
classes and strings exactly, the floats to float32 rounding.

The kinds: the IDX CNN (the session's), the CSV models (LinearClassifier with a label
vocabulary, DNNRegressor, both through the raw and the parsing receiver: support/any_models.py;
a DNNLinearCombinedClassifier and a LinearRegressor here) and the image-folder models (the CNN
at 32x32x3, support/any_models.py; the Keras model here, in grayscale at 24x24). The other IDX
kinds (`linear`, `dnn`, `keras`: one signature of the CNN's shape each) are served by the
service's TensorFlow and held against the trainer's answers in
tests/live/training/test_baselines.py.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from support.helpers import REPO_ROOT
from support.servers import Server, serve_models
from support.sides import run_trainings, service_python, signature_answers_on_the_training_side
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from artifact.contract import normalize_pixels

STEPS = 4
# Tabular rows: every feature either CSV file has (a row's missing ones are left out).
ROWS = [
    {"x1": 0.5, "x2": 4.0, "rooms": 3, "color": "red", "city": "a"},
    {"x1": -1.25, "x2": 6.5, "rooms": 1, "color": "blue", "city": "d"},
    # Outside the vocabularies: served, as TensorFlow serves it.
    {"x1": 2.0, "x2": 3.0, "rooms": 5, "color": "purple", "city": "zz"},
]
IMAGES = 4


@pytest.fixture(scope="module")
def exports(trained_model, any_models, tmp_path_factory) -> dict[str, Path]:
    """Every kind's model folder (version 1 in each), by the name it is served as."""
    root = tmp_path_factory.mktemp("compatibility")
    sample, work, base = root / "sample", root / "work", root / "models"
    common = ("--max-steps", STEPS, "--batch-size", 16, "--deterministic", "--eval-every-secs", 1)
    made = {
        "csv_dnn_linear": [
            "train", "--csv", sample / "classification.csv", "--label", "label", "--model",
            "dnn_linear", "--hidden-units", "8", "--model-dir", work / "csv_dnn_linear",
            "--export-dir", base / "csv_dnn_linear", *common,
        ],
        "csv_linear_regressor": [
            "train", "--csv", sample / "regression.csv", "--label", "price", "--model",
            "linear", "--receiver", "parsing", "--model-dir", work / "csv_linear_regressor",
            "--export-dir", base / "csv_linear_regressor", *common,
        ],
        "folder_keras": [
            "train", "--image-folder", sample / "shapes", "--model", "keras", "--image-size",
            24, "--channels", 1, "--model-dir", work / "folder_keras", "--export-dir",
            base / "folder_keras", *common,
        ],
    }  # fmt: skip
    run_trainings([["sample-data", "--out", sample], *made.values()])
    return (
        {"idx_cnn": trained_model.export_base}
        | {name: base / name for name in made}
        | {f"csv_{name}": path for name, path in any_models.items() if name != "tokens"}
    )


@pytest.fixture(scope="module")
def server(exports, tmp_path_factory) -> Iterator[Server]:
    srv = serve_models(exports, tmp_path_factory.mktemp("compatibility-service"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def stub(server) -> Iterator[prediction_service_pb2_grpc.PredictionServiceStub]:
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)


def signatures(stub, model: str) -> dict:
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = model
    reply = stub.GetModelMetadata(request, timeout=60)
    defs = get_model_metadata_pb2.SignatureDefMap()
    reply.metadata["signature_def"].Unpack(defs)
    return dict(defs.signature_def)


def tf_example(row: dict) -> bytes:
    def feature(value):
        if isinstance(value, str):
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))
        if isinstance(value, int):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
        return tf.train.Feature(float_list=tf.train.FloatList(value=[value]))

    features = {name: feature(value) for name, value in row.items()}
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def inputs_for(signature, small_test_data) -> dict[str, np.ndarray]:
    """Inputs for every tensor a signature takes: test images for an image input, the rows'
    features for a tabular model's, and the rows as serialized tf.Examples for any other
    string input (a parsing receiver's `examples`, Classify's and Regress's `inputs`)."""
    inputs = {}
    for name, info in signature.inputs.items():
        dtype = tf.dtypes.as_dtype(info.dtype).as_numpy_dtype
        dims = [d.size for d in info.tensor_shape.dim]
        if info.dtype == tf.string.as_datatype_enum and name not in ROWS[0]:
            inputs[name] = np.array([tf_example(row) for row in ROWS], dtype=object)
        elif len(dims) >= 3:  # an image: [-1, h, w] or [-1, h, w, c]
            if dims[1:] == [28, 28]:
                pixels = normalize_pixels(small_test_data[0][:IMAGES])
            else:
                pixels = np.random.default_rng(7).random([IMAGES, *dims[1:]])
            inputs[name] = pixels.astype(dtype)
        else:
            values = [row[name] for row in ROWS]
            shape = [len(ROWS)] + [1] * (len(dims) - 1)
            if info.dtype == tf.string.as_datatype_enum:
                inputs[name] = np.array([v.encode() for v in values], dtype=object).reshape(shape)
            else:
                inputs[name] = np.array(values, dtype=dtype).reshape(shape)
    return inputs


def served(stub, model: str, signature: str, inputs: dict[str, np.ndarray]) -> dict:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature
    for name, value in inputs.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
    reply = stub.Predict(request, timeout=60)
    return {name: tf.make_ndarray(tensor) for name, tensor in reply.outputs.items()}


def test_every_kind_answers_as_the_trainers_tensorflow(exports, stub, small_test_data, tmp_path):
    calls, asked = [], []
    for model, folder in exports.items():
        for name, signature in signatures(stub, model).items():
            inputs = inputs_for(signature, small_test_data)
            asked.append((model, name, served(stub, model, name, inputs)))
            training_inputs = {
                key: value.astype(bytes) if value.dtype == object else value
                for key, value in inputs.items()
            }
            calls.append((folder / "1", name, training_inputs))
    expected = signature_answers_on_the_training_side(calls, tmp_path / "answers")
    # Every model kind, and both receivers' signatures, were asked.
    assert {model for model, _, _ in asked} == set(exports)
    assert {"predict", "serving_default", "classify", "classification", "regression"} <= {
        name for _, name, _ in asked
    }
    for (model, name, answer), reference in zip(asked, expected, strict=True):
        assert answer.keys() == reference.keys(), (model, name)
        for key, value in reference.items():
            got = answer[key]
            if got.dtype == object:
                got = got.astype(bytes)
            where = f"{model}/{name}/{key}"
            if np.issubdtype(value.dtype, np.floating):
                np.testing.assert_allclose(got, value, rtol=1e-5, atol=1e-6, err_msg=where)
            else:
                np.testing.assert_array_equal(got, value, err_msg=where)


def test_the_service_imports_tensorflow_without_keras():
    """`python -m service` keeps Keras out (service/__main__.py, keep_keras_out): TensorFlow
    imports without it. (The server above runs so, and loads every kind the trainer exports,
    the Keras ones included.)"""
    program = (
        "import json, sys\n"
        "from service.__main__ import keep_keras_out\n"
        "keep_keras_out()\n"
        "import tensorflow as tf\n"
        "keras = [m for m, v in sys.modules.items() if m.split('.')[0] == 'keras' and v]\n"
        "print(json.dumps({'keras': keras, 'tensorflow': tf.__version__}))\n"
    )
    done = subprocess.run(
        [service_python(), "-c", program], cwd=REPO_ROOT, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.splitlines()[-1])
    assert answer["keras"] == [] and answer["tensorflow"].startswith("2.")
