"""TF Serving's example client's way of reading answers, against the real gRPC server.

tensorflow/serving's `tensorflow_serving/example/mnist_client.py` sends
`tf.make_tensor_proto(image)` to `stub.Predict.future(request, 5.0)` and reads
`result.outputs['scores'].float_val` (here `probabilities`), then takes its argmax: it works
only when the answer fills the typed fields, as TF Serving does by default
(servables/tensorflow/predict_util.cc). Also here: GRPC_TENSOR_CONTENT, and the inputs TF
Serving takes that a strict reader would refuse (NaN, a short float_val; STRICT_NUMBERS).

Slow only because TF Serving's protos import TensorFlow; the model is the fake backend's.
"""

from __future__ import annotations

import contextlib

import grpc
import numpy as np
import pytest
import tensorflow as tf
from support.fakes import MODEL_NAME, FakeBackend, app_client, toy_model
from support.servers import free_port
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from artifact.contract import CLASSES_KEY, PROBABILITIES_KEY

TIMEOUT_SECONDS = 30.0
IMAGES = np.random.default_rng(7).random((3, 28, 28)).astype(np.float32)


class RecordingBackend(FakeBackend):
    """The fake backend, keeping the images each prediction got."""

    def __init__(self):
        super().__init__()
        self.fed: list[np.ndarray] = []

    async def predict(self, name, images, *args, **kwargs):
        self.fed.append(images.copy())
        with np.errstate(invalid="ignore", over="ignore"):
            return await super().predict(name, images, *args, **kwargs)


@contextlib.contextmanager
def stub_of(backend, **settings):
    """A PredictionService stub on the app's real gRPC server (a free loopback port)."""
    port = free_port()
    with (
        app_client(backend, serve_grpc=True, grpc_port=port, **settings),
        grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)


def request_of(tensor_proto) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = MODEL_NAME
    request.inputs["image"].CopyFrom(tensor_proto)
    return request


def test_the_example_clients_way_of_reading_answers():
    expected = toy_model(1, IMAGES)
    with stub_of(FakeBackend()) as stub:
        for image, probabilities, label in zip(
            IMAGES, expected[PROBABILITIES_KEY], expected[CLASSES_KEY], strict=True
        ):
            # As mnist_client.py's do_inference: one image, a future, float_val, argmax.
            request = request_of(tf.make_tensor_proto(image, shape=[1, *image.shape]))
            result = stub.Predict.future(request, 5.0).result()
            response = np.array(result.outputs[PROBABILITIES_KEY].float_val)
            np.testing.assert_allclose(response, probabilities, rtol=1e-6)
            assert np.argmax(response) == label
            assert list(result.outputs[CLASSES_KEY].int64_val) == [label]
            assert [d.size for d in result.outputs[PROBABILITIES_KEY].tensor_shape.dim] == [1, 10]
            assert result.outputs[PROBABILITIES_KEY].tensor_content == b""


def test_tensor_content_is_an_option():
    with stub_of(FakeBackend(), grpc_tensor_content=True) as stub:
        result = stub.Predict(request_of(tf.make_tensor_proto(IMAGES)), timeout=TIMEOUT_SECONDS)
    probabilities = result.outputs[PROBABILITIES_KEY]
    assert list(probabilities.float_val) == []
    assert len(probabilities.tensor_content) == IMAGES.shape[0] * 10 * 4
    np.testing.assert_array_equal(
        tf.make_ndarray(probabilities), toy_model(1, IMAGES)[PROBABILITIES_KEY]
    )


def short_float_val():
    proto = tf.make_tensor_proto(np.zeros((1, 28, 28), np.float32))
    proto.ClearField("tensor_content")
    proto.float_val.extend([0.25, 0.5, 0.75])
    return proto


def non_finite():
    values = np.full((1, 28, 28), 0.5, np.float32)
    values[0, 0, :3] = [np.nan, np.inf, -np.inf]
    return tf.make_tensor_proto(values)


def test_inputs_tf_serving_takes_reach_the_model_as_tensorflow_reads_them():
    backend = RecordingBackend()
    with stub_of(backend) as stub:
        # TensorFlow fills a short float_val with its last value (tensor.cc, FromProtoField).
        stub.Predict(request_of(short_float_val()), timeout=TIMEOUT_SECONDS)
        # NaN and Inf pass, as TF Serving passes them.
        stub.Predict(request_of(non_finite()), timeout=TIMEOUT_SECONDS)
    short, special = backend.fed
    assert short.shape == (1, 28, 28)
    assert short.ravel()[:3].tolist() == [0.25, 0.5, 0.75]
    assert (short.ravel()[3:] == 0.75).all()
    np.testing.assert_array_equal(special, tf.make_ndarray(non_finite()))


@pytest.mark.parametrize("proto", [short_float_val, non_finite], ids=["short", "non-finite"])
def test_strict_numbers_refuses_them(proto):
    with (
        stub_of(FakeBackend(), strict_numbers=True) as stub,
        pytest.raises(grpc.RpcError) as caught,
    ):
        stub.Predict(request_of(proto()), timeout=TIMEOUT_SECONDS)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "image" in caught.value.details()


def test_an_unknown_model_is_not_found_before_its_inputs_are_read():
    # TF Serving finds the servable first (servables/tensorflow/predict_impl.cc), then
    # checks the inputs: a double tensor for an unknown model is NOT_FOUND, not
    # INVALID_ARGUMENT.
    request = request_of(tf.make_tensor_proto(IMAGES.astype(np.float64)))
    request.model_spec.name = "other"
    with stub_of(FakeBackend()) as stub, pytest.raises(grpc.RpcError) as caught:
        stub.Predict(request, timeout=TIMEOUT_SECONDS)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert caught.value.details() == "Servable not found for request: Latest(other)"
