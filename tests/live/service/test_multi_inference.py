"""TF Serving's gRPC MultiInference: Classify and Regress tasks over one Input of tf.Examples,
against a real `python -m service` serving a parsing receiver's pre-made classifier
(conftest's `any_models`) and a tf.Module whose signatures classify and regress the same
examples. Every result is held against the service's own Classify and Regress answers and
against `tf.saved_model.load`, value for value; what TF Serving refuses is refused in its
words and codes (servables/tensorflow/multi_inference.cc, 2.15.1).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tensorflow as tf
from support.any_models import ROWS
from support.servers import Server, serve_models
from support.tf_reference import reference, serialized, tf_example
from tensorflow_serving.apis import (
    classification_pb2,
    inference_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

TIMEOUT = 60.0
CLASSIFY, REGRESS = "tensorflow/serving/classify", "tensorflow/serving/regress"
XS = [0.5, -2.0, 3.0]


def save_mixed(version_dir: Path) -> None:
    """A model whose signatures parse the same tf.Examples (a float `x`) and classify them
    (`classes` neg/pos and `scores`: the sigmoid) and regress them (`outputs`: 3x + 1)."""

    spec = {"x": tf.io.FixedLenFeature([], tf.float32)}

    class Mixed(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def classify(self, inputs):
            x = tf.io.parse_example(inputs, spec)["x"]
            positive = tf.sigmoid(x)
            names = tf.tile(tf.constant([[b"neg", b"pos"]]), [tf.shape(x)[0], 1])
            return {"classes": names, "scores": tf.stack([1 - positive, positive], axis=1)}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def regress(self, inputs):
            return {"outputs": tf.io.parse_example(inputs, spec)["x"] * 3.0 + 1.0}

    module = Mixed()
    tf.saved_model.save(
        module,
        str(version_dir),
        signatures={
            "serving_default": module.classify.get_concrete_function(),
            "classification": module.classify.get_concrete_function(),
            "regression": module.regress.get_concrete_function(),
        },
    )


@pytest.fixture(scope="module")
def models(any_models, tmp_path_factory) -> dict[str, Path]:
    mixed = tmp_path_factory.mktemp("multi") / "mixed"
    save_mixed(mixed / "1")
    return {"classifier_examples": any_models["classifier_examples"], "mixed": mixed}


@pytest.fixture(scope="module")
def server(models, tmp_path_factory) -> Iterator[Server]:
    server = serve_models(models, tmp_path_factory.mktemp("multi-service"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def stub(server) -> Iterator[prediction_service_pb2_grpc.PredictionServiceStub]:
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)


@pytest.fixture(scope="module")
def loaded(models):
    return {name: tf.saved_model.load(str(path / "1")) for name, path in models.items()}


def request(
    *tasks: tuple[str, str, str], rows: list[dict] = ()
) -> inference_pb2.MultiInferenceRequest:
    """A MultiInferenceRequest of (model, signature, method) tasks over the rows."""
    message = inference_pb2.MultiInferenceRequest()
    for model, signature, method in tasks:
        task = message.tasks.add(method_name=method)
        task.model_spec.name = model
        task.model_spec.signature_name = signature
    for row in rows:
        message.input.example_list.examples.add().CopyFrom(tf_example(row))
    return message


def classified(result) -> tuple[list[list[str]], np.ndarray]:
    rows = result.classifications
    return (
        [[c.label for c in row.classes] for row in rows],
        np.array([[c.score for c in row.classes] for row in rows], np.float32),
    )


def test_classify_and_regress_over_the_same_examples(stub, loaded):
    rows = [{"x": x} for x in XS]
    response = stub.MultiInference(
        request(("mixed", "classification", CLASSIFY), ("mixed", "regression", REGRESS), rows=rows),
        timeout=TIMEOUT,
    )
    classes, regression = response.results
    assert classes.WhichOneof("result") == "classification_result"
    assert regression.WhichOneof("result") == "regression_result"
    assert (classes.model_spec.name, classes.model_spec.signature_name) == (
        "mixed",
        "classification",
    )
    assert regression.model_spec.signature_name == "regression"
    assert classes.model_spec.version.value == regression.model_spec.version.value == 1

    want = reference(loaded, "mixed", "classification", inputs=serialized(rows))
    labels, scores = classified(classes.classification_result)
    assert labels == [[n.decode() for n in row] for row in want["classes"]]
    np.testing.assert_array_equal(scores, want["scores"])
    want = reference(loaded, "mixed", "regression", inputs=serialized(rows))["outputs"]
    values = np.array([r.value for r in regression.regression_result.regressions], np.float32)
    np.testing.assert_array_equal(values, want)
    np.testing.assert_allclose(values, np.float32(XS) * 3 + 1)

    # The same as Classify and Regress answer on their own.
    alone = classification_pb2.ClassificationRequest()
    alone.model_spec.name, alone.model_spec.signature_name = "mixed", "classification"
    alone.input.CopyFrom(request(rows=rows).input)
    assert stub.Classify(alone, timeout=TIMEOUT).result == classes.classification_result
    alone = regression_pb2.RegressionRequest()
    alone.model_spec.name, alone.model_spec.signature_name = "mixed", "regression"
    alone.input.CopyFrom(request(rows=rows).input)
    assert stub.Regress(alone, timeout=TIMEOUT).result == regression.regression_result


def test_a_pre_made_classifiers_signatures_with_a_context(stub, loaded):
    message = request(
        ("classifier_examples", "classification", CLASSIFY),
        ("classifier_examples", "", CLASSIFY),
    )
    with_context = message.input.example_list_with_context
    with_context.context.CopyFrom(tf_example({"x2": 5.0}))
    for row in ROWS:
        with_context.examples.add().CopyFrom(
            tf_example({k: v for k, v in row.items() if k != "x2"})
        )
    first, second = stub.MultiInference(message, timeout=TIMEOUT).results
    # An empty signature name is the default one, and the result says so.
    assert second.model_spec.signature_name == "serving_default"
    rows = [{**row, "x2": 5.0} for row in ROWS]
    want = reference(loaded, "classifier_examples", "classification", inputs=serialized(rows))
    for result in (first, second):
        labels, scores = classified(result.classification_result)
        assert labels == [[n.decode() for n in row] for row in want["classes"]]
        np.testing.assert_array_equal(scores, want["scores"])


BAD = [
    pytest.param(request(), grpc.StatusCode.INVALID_ARGUMENT,
                 "ModelSpec has no name specified.", id="no-task"),
    pytest.param(request(("mixed", "classification", CLASSIFY),
                         ("classifier_examples", "classification", CLASSIFY), rows=[{"x": 1.0}]),
                 grpc.StatusCode.INVALID_ARGUMENT,
                 "All ModelSpecs in a MultiInferenceRequest must access the same model name.",
                 id="two-models"),
    pytest.param(request(("mixed", "classification", CLASSIFY), ("", "regression", REGRESS)),
                 grpc.StatusCode.INVALID_ARGUMENT, "Found ModelSpec with an empty model name.",
                 id="empty-name"),
    pytest.param(request(("mixed", "", CLASSIFY), ("mixed", "serving_default", CLASSIFY)),
                 grpc.StatusCode.INVALID_ARGUMENT,
                 "Duplicate evaluation of signature: serving_default", id="same-signature"),
    pytest.param(request(("mixed", "nope", CLASSIFY)), grpc.StatusCode.INVALID_ARGUMENT,
                 "Requested signature not found in model graph: nope", id="unknown-signature"),
    pytest.param(request(("mixed", "classification", "tensorflow/serving/predict")),
                 grpc.StatusCode.UNIMPLEMENTED,
                 "Unsupported signature method_name: tensorflow/serving/predict",
                 id="predict-method"),
    pytest.param(request(("mixed", "classification", REGRESS)), grpc.StatusCode.INVALID_ARGUMENT,
                 "Expected one output Tensor.", id="regress-a-classifier"),
    pytest.param(request(("classifier_examples", "predict", CLASSIFY)),
                 grpc.StatusCode.INVALID_ARGUMENT,
                 "Expected one or two output Tensors, found 6", id="a-predict-signature"),
    pytest.param(request(("mixed", "classification", CLASSIFY)), grpc.StatusCode.INVALID_ARGUMENT,
                 "Input is empty", id="no-example"),
    pytest.param(request(("nope", "", CLASSIFY), rows=[{"x": 1.0}]), grpc.StatusCode.NOT_FOUND,
                 "Servable not found for request: Latest(nope)", id="unknown-model"),
]  # fmt: skip


@pytest.mark.parametrize("message, code, words", BAD)
def test_what_tf_serving_refuses(stub, message, code, words):
    with pytest.raises(grpc.RpcError) as caught:
        stub.MultiInference(message, timeout=TIMEOUT)
    assert caught.value.code() == code
    assert caught.value.details().startswith(words), caught.value.details()


def tf_serving_value(server: Server, name: str, **labels: str) -> float:
    """A sample of TF Serving's metrics, as its exporter writes them, at /metrics."""
    wanted = ",".join(f'{key}="{value}"' for key, value in labels.items())
    for line in httpx.get(f"{server.url}/metrics", timeout=TIMEOUT).text.splitlines():
        if line.startswith(f"{name}{{{wanted}}} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_tf_servings_metrics_count_the_examples_and_time_classify(server, stub):
    examples = ":tensorflow:serving:request_example_count_total"
    runtime = ":tensorflow:serving:runtime_latency_count"
    latency = ":tensorflow:serving:request_latency_count"
    before = (
        tf_serving_value(server, examples, model="mixed"),
        tf_serving_value(server, runtime, model_name="mixed", API="Classify", runtime="TF1"),
        tf_serving_value(server, latency, model_name="mixed", API="Classify", entrypoint="GRPC"),
    )
    rows = [{"x": x} for x in XS]
    stub.MultiInference(request(("mixed", "regression", REGRESS), rows=rows), timeout=TIMEOUT)
    alone = classification_pb2.ClassificationRequest()
    alone.model_spec.name, alone.model_spec.signature_name = "mixed", "classification"
    alone.input.CopyFrom(request(rows=rows).input)
    stub.Classify(alone, timeout=TIMEOUT)
    after = (
        tf_serving_value(server, examples, model="mixed"),
        tf_serving_value(server, runtime, model_name="mixed", API="Classify", runtime="TF1"),
        tf_serving_value(server, latency, model_name="mixed", API="Classify", entrypoint="GRPC"),
    )
    # MultiInference counts its examples (TF Serving's multi_inference.cc); Classify is timed
    # in the runtime and as a gRPC request.
    assert after == (before[0] + len(XS), before[1] + 1, before[2] + 1)
