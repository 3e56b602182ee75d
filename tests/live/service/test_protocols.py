"""Every protocol against a real `python -m service`, spoken by the real clients.

One server serves a copy of the session's trained model over TF Serving's REST API, the Open
Inference Protocol (spoken by `tritonclient[http]`'s InferenceServerClient, binary by
default) and TF Serving's gRPC API (spoken by `tensorflow-serving-api`'s stubs with
`tf.make_tensor_proto` inputs). The same images must get the same probabilities through each
of them and through `tf.saved_model.load`; bad input on each must get the protocol's client
error with a clear message, never a 5xx, INTERNAL or a hang.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import httpx
import numpy as np
import orjson
import pytest
import tensorflow as tf
import tritonclient.http as triton
from prometheus_client.parser import text_string_to_metric_families
from support.helpers import error_message
from support.servers import MAX_IMAGES, MODEL_NAME, Server, copy_repository, start_server
from support.tfserving_requests import predict_request
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)
from tritonclient.utils import InferenceServerException

from artifact import idx as data

TIMEOUT = 60.0
# Room for MAX_IMAGES images (16 x 3,136 bytes) and not for 40.
GRPC_MAX_MESSAGE_BYTES = 100_000
HEADER = "Inference-Header-Content-Length"


# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(trained_model, tmp_path_factory) -> Iterator[tuple[Server, int]]:
    """(the server, its gRPC port): a copy of the trained repository, gRPC on."""
    root = tmp_path_factory.mktemp("protocols")
    base = copy_repository(trained_model, root)
    srv = start_server(
        root / "server.log",
        grpc=True,
        MODEL_BASE_PATH=str(base),
        GRPC_MAX_MESSAGE_BYTES=str(GRPC_MAX_MESSAGE_BYTES),
    )
    yield srv, srv.grpc_port
    # SIGTERM: a graceful shutdown of both servers, exit 0.
    assert srv.stop() == 0, srv.log()
    assert "Shut down: the models" in srv.log()
    assert "Traceback" not in srv.log(), srv.log()


@pytest.fixture(scope="module")
def http(server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server[0].url, timeout=TIMEOUT) as client:
        yield client


@pytest.fixture(scope="module")
def triton_client(server) -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(
        f"127.0.0.1:{server[0].port}", connection_timeout=TIMEOUT, network_timeout=TIMEOUT
    )
    yield client
    client.close()


@pytest.fixture(scope="module")
def channel(server) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{server[1]}") as ch:
        yield ch


@pytest.fixture(scope="module")
def predictions(channel):
    return prediction_service_pb2_grpc.PredictionServiceStub(channel)


@pytest.fixture(scope="module")
def models(channel):
    return model_service_pb2_grpc.ModelServiceStub(channel)


@pytest.fixture(scope="module")
def images(trained_model) -> np.ndarray:
    """4 real Fashion-MNIST test images as the model takes them: float32 [4, 28, 28] in [0, 1]."""
    _, pixels, _ = data.load_split(trained_model.data_dir, "test")
    return (pixels[:4] / 255.0).astype(np.float32)


@pytest.fixture(scope="module")
def reference(trained_model, images) -> np.ndarray:
    """The probabilities from the SavedModel's serving signature, called directly."""
    loaded = tf.saved_model.load(str(trained_model.version_path))
    outputs = loaded.signatures["serving_default"](image=tf.constant(images))
    probabilities = outputs["probabilities"].numpy()
    # A service that answered a constant would pass a comparison with a constant reference.
    assert np.abs(probabilities[0] - probabilities[1]).max() > 1e-3
    return probabilities


def rpc_error(method, request, timeout: float = TIMEOUT) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        method(request, timeout=timeout)
    return caught.value


# --- one image, five ways ---------------------------------------------------------------------


def test_the_same_images_get_the_same_probabilities_through_every_protocol(
    http, triton_client, predictions, images, reference
):
    answers = {}
    rows = http.post(
        f"/v1/models/{MODEL_NAME}:predict", json={"instances": images.tolist()}
    ).json()["predictions"]
    answers["TF Serving REST"] = np.array([row["probabilities"] for row in rows], np.float32)

    for binary in (False, True):
        image = triton.InferInput("image", list(images.shape), "FP32")
        image.set_data_from_numpy(images, binary_data=binary)
        wanted = [triton.InferRequestedOutput("probabilities", binary_data=binary)]
        result = triton_client.infer(MODEL_NAME, [image], outputs=wanted)
        answers[f"V2 {'binary' if binary else 'JSON'}"] = result.as_numpy("probabilities")

    response = predictions.Predict(predict_request(images), timeout=TIMEOUT)
    answers["gRPC"] = tf.make_ndarray(response.outputs["probabilities"])

    for protocol, probabilities in answers.items():
        assert probabilities.dtype == np.float32, protocol
        np.testing.assert_allclose(probabilities, reference, rtol=0, atol=1e-6, err_msg=protocol)


# --- the Open Inference Protocol, with tritonclient --------------------------------------------


def test_tritonclient_health_and_metadata(triton_client):
    assert triton_client.is_server_live()
    assert triton_client.is_server_ready()
    assert triton_client.is_model_ready(MODEL_NAME)
    assert triton_client.is_model_ready(MODEL_NAME, "1")
    assert not triton_client.is_model_ready("other")
    assert not triton_client.is_model_ready(MODEL_NAME, "9")
    server = triton_client.get_server_metadata()
    assert server["name"] == "estimator-serving"
    assert "binary_tensor_data" in server["extensions"]
    metadata = triton_client.get_model_metadata(MODEL_NAME)
    assert metadata == triton_client.get_model_metadata(MODEL_NAME, "1")
    assert metadata == {
        "name": MODEL_NAME,
        "versions": ["1"],
        "platform": "tensorflow_savedmodel",
        "inputs": [{"name": "image", "datatype": "FP32", "shape": [-1, 28, 28]}],
        "outputs": [
            {"name": "classes", "datatype": "INT64", "shape": [-1]},
            {"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]},
        ],
    }


def test_tritonclient_defaults_binary_in_and_out(triton_client, images, reference):
    image = triton.InferInput("image", list(images.shape), "FP32")
    image.set_data_from_numpy(images)
    result = triton_client.infer(MODEL_NAME, [image], request_id="abc", model_version="1")
    response = result.get_response()
    assert response["id"] == "abc"
    assert response["model_version"] == "1"
    assert all("binary_data_size" in o["parameters"] for o in response["outputs"])
    np.testing.assert_allclose(result.as_numpy("probabilities"), reference, atol=1e-6)
    assert result.as_numpy("classes").tolist() == reference.argmax(axis=1).tolist()


def test_tritonclient_json_and_requested_outputs(triton_client, images, reference):
    image = triton.InferInput("image", list(images.shape), "FP32")
    image.set_data_from_numpy(images, binary_data=False)
    wanted = [triton.InferRequestedOutput("classes", binary_data=False)]
    result = triton_client.infer(MODEL_NAME, [image], outputs=wanted)
    (output,) = result.get_response()["outputs"]
    assert output["name"] == "classes" and "data" in output
    assert result.as_numpy("probabilities") is None
    assert result.as_numpy("classes").tolist() == reference.argmax(axis=1).tolist()


TRITON_ERRORS = [
    # name, model, input datatype, input array, requested output, status, message fragment
    pytest.param("other", "FP32", np.float32, "classes", "404", "Servable not found for request: Latest(other)", id="unknown-model"),
    pytest.param(MODEL_NAME, "FP64", np.float64, "classes", "400", "datatype FP64 does not match the model's FP32", id="wrong-datatype"),
    pytest.param(MODEL_NAME, "FP32", np.float32, "logits", "400", "unknown output 'logits'", id="unknown-output"),
    pytest.param(MODEL_NAME, "INT32", np.int32, "classes", "400", "datatype INT32 does not match", id="integers"),
]  # fmt: skip


@pytest.mark.parametrize("model, datatype, dtype, output, status, fragment", TRITON_ERRORS)
def test_tritonclient_errors(triton_client, model, datatype, dtype, output, status, fragment):
    image = triton.InferInput("image", [1, 28, 28], datatype)
    image.set_data_from_numpy(np.zeros((1, 28, 28), dtype))
    with pytest.raises(InferenceServerException) as caught:
        triton_client.infer(model, [image], outputs=[triton.InferRequestedOutput(output)])
    assert caught.value.status() == status
    assert fragment in caught.value.message()


def _binary_body(declared: int, sent: int) -> tuple[bytes, dict]:
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "image",
                    "datatype": "FP32",
                    "shape": [1, 28, 28],
                    "parameters": {"binary_data_size": declared},
                }
            ]
        }
    )
    return header + b"\0" * sent, {
        HEADER: str(len(header)),
        "Content-Type": "application/octet-stream",
    }


V2_BAD_BODIES = [
    pytest.param(*_binary_body(3136, 3000), "binary_data_size add up to 3136 bytes, but only 3000 follow", id="truncated"),
    pytest.param(*_binary_body(3000, 3000), "binary_data_size is 3000 bytes; shape [1, 28, 28] of FP32 takes 3136", id="size-vs-shape"),
    pytest.param(*_binary_body(3136, 3200), "3200 bytes follow", id="sizes-do-not-add-up"),
    pytest.param(orjson.dumps({"inputs": [{"name": "image", "datatype": "FP32", "shape": [2, 28, 28], "data": [0.5] * 784}]}), {}, "shape [2, 28, 28] takes 1568 values; 'data' has 784", id="shape-vs-data"),
]  # fmt: skip


@pytest.mark.parametrize("body, headers, fragment", V2_BAD_BODIES)
def test_v2_bad_bodies_over_real_http(http, body, headers, fragment):
    response = http.post(f"/v2/models/{MODEL_NAME}/infer", content=body, headers=headers)
    assert fragment in error_message(response, 400)


# --- TF Serving's gRPC API, with tensorflow-serving-api ----------------------------------------


def test_grpc_predict_names_what_answered(predictions, images, reference):
    response = predictions.Predict(predict_request(images[:2], version=1), timeout=TIMEOUT)
    assert response.model_spec.name == MODEL_NAME
    assert response.model_spec.version.value == 1
    assert response.model_spec.signature_name == "serving_default"
    assert sorted(response.outputs) == ["classes", "probabilities"]
    classes = tf.make_ndarray(response.outputs["classes"])
    assert classes.dtype == np.int64 and classes.tolist() == reference[:2].argmax(1).tolist()


def test_grpc_output_filter_and_other_signature(predictions, images, reference):
    request = predict_request(images, signature_name="classify")
    request.output_filter.append("probabilities")
    response = predictions.Predict(request, timeout=TIMEOUT)
    assert list(response.outputs) == ["probabilities"]
    assert response.model_spec.signature_name == "classify"
    np.testing.assert_allclose(
        tf.make_ndarray(response.outputs["probabilities"]), reference, atol=1e-6
    )


@pytest.mark.parametrize(
    "tensor",
    [
        pytest.param(lambda x: tf.make_tensor_proto(x), id="tensor-content"),
        pytest.param(
            lambda x: tensor_pb2.TensorProto(
                dtype=types_pb2.DT_FLOAT,
                tensor_shape=tf.TensorShape(x.shape).as_proto(),
                float_val=x.ravel().tolist(),
            ),
            id="float-val",
        ),
    ],
)
def test_grpc_takes_every_form_of_a_float_tensor(predictions, images, reference, tensor):
    request = predict_request()
    request.inputs["image"].CopyFrom(tensor(images))
    response = predictions.Predict(request, timeout=TIMEOUT)
    np.testing.assert_allclose(
        tf.make_ndarray(response.outputs["probabilities"]), reference, atol=1e-6
    )


def test_grpc_scalar_filled_tensor(predictions, trained_model):
    """tf.make_tensor_proto(scalar, shape) sends one float_val for every element."""
    request = predict_request()
    request.inputs["image"].CopyFrom(tf.make_tensor_proto(0.5, tf.float32, shape=[2, 28, 28]))
    response = predictions.Predict(request, timeout=TIMEOUT)
    loaded = tf.saved_model.load(str(trained_model.version_path))
    want = loaded.signatures["serving_default"](image=tf.fill([2, 28, 28], 0.5))["probabilities"]
    np.testing.assert_allclose(
        tf.make_ndarray(response.outputs["probabilities"]), want.numpy(), atol=1e-6
    )


def test_grpc_model_metadata_and_status(predictions, models):
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = MODEL_NAME
    request.metadata_field.append("signature_def")
    response = predictions.GetModelMetadata(request, timeout=TIMEOUT)
    assert (response.model_spec.name, response.model_spec.version.value) == (MODEL_NAME, 1)
    signatures = get_model_metadata_pb2.SignatureDefMap()
    assert response.metadata["signature_def"].Unpack(signatures)
    serving = signatures.signature_def["serving_default"]
    assert serving.method_name == "tensorflow/serving/predict"
    assert serving.inputs["image"].dtype == types_pb2.DT_FLOAT
    assert [d.size for d in serving.inputs["image"].tensor_shape.dim] == [-1, 28, 28]
    assert sorted(serving.outputs) == ["classes", "probabilities"]

    status_request = get_model_status_pb2.GetModelStatusRequest()
    status_request.model_spec.name = MODEL_NAME
    (status,) = models.GetModelStatus(status_request, timeout=TIMEOUT).model_version_status
    assert status.version == 1
    assert status.state == get_model_status_pb2.ModelVersionStatus.AVAILABLE
    assert status.status.error_code == 0 and status.status.error_message == ""


def _tensor(**fields) -> tensor_pb2.TensorProto:
    return tensor_pb2.TensorProto(**fields)


def _shape(*dims: int):
    return tf.TensorShape(dims).as_proto()


def _with_input(**inputs: tensor_pb2.TensorProto) -> predict_pb2.PredictRequest:
    request = predict_request()
    for key, value in inputs.items():
        request.inputs[key].CopyFrom(value)
    return request


ONE = np.full((1, 28, 28), 0.5, np.float32)
INVALID = grpc.StatusCode.INVALID_ARGUMENT

PREDICT_ERRORS = [
    # the list, on gRPC
    pytest.param(predict_request(ONE, name="other"), grpc.StatusCode.NOT_FOUND, "Servable not found for request: Latest(other)", id="unknown-model"),
    pytest.param(predict_request(ONE, version=9), grpc.StatusCode.NOT_FOUND, f"Servable not found for request: Specific({MODEL_NAME}, 9)", id="unknown-version"),
    pytest.param(predict_request(ONE.astype(np.float64)), INVALID, "Expects arg[0] to be float but double is provided", id="wrong-dtype"),
    pytest.param(predict_request(np.zeros((1, 27, 28), np.float32)), INVALID, "input 'image' has shape [1, 27, 28]; the signature takes [-1, 28, 28]", id="wrong-shape"),
    pytest.param(_with_input(image=_tensor(dtype=types_pb2.DT_FLOAT, tensor_shape=_shape(2, 28, 28), tensor_content=ONE.tobytes())), INVALID, "tensor parsing error: image (tensor_content has 3136 bytes; shape [2, 28, 28] of float takes 6272)", id="content-vs-shape"),
    # Fewer values than the shape are filled as TensorFlow fills them, and NaN passes (as TF
    # Serving passes them; STRICT_NUMBERS refuses them: tests/live/service/test_tfserving_client.py);
    # more values than the shape are refused, as TensorFlow refuses them (tensor.cc).
    pytest.param(_with_input(image=_tensor(dtype=types_pb2.DT_FLOAT, tensor_shape=_shape(1, 28, 28), float_val=[0.5] * 900)), INVALID, "tensor parsing error: image (float_val has 900 values; shape [1, 28, 28] takes 784, or 1 for all)", id="float-val-vs-shape"),
    pytest.param(_with_input(image=_tensor(dtype=types_pb2.DT_FLOAT, tensor_shape=tf.TensorShape(None).as_proto())), INVALID, "tensor parsing error: image (its shape must be fully defined", id="unknown-rank"),
    pytest.param(predict_request(np.zeros((0, 28, 28), np.float32)), INVALID, "input 'image' has no images", id="no-images"),
    # TF Serving's own checks and wording
    pytest.param(_with_input(pixels=tf.make_tensor_proto(ONE)), INVALID, "Signature input alias: image(feed name: image:0) not found in request and no default value provided. Inputs expected to be in the request {pixels}", id="unknown-input"),
    pytest.param(_with_input(image=tf.make_tensor_proto(ONE), extra=tf.make_tensor_proto(ONE)), INVALID, "input size does not match signature: 2!=1 len({extra,image}) != len({image}). Sent extra: {extra}. Missing but required: {}.", id="extra-input"),
    pytest.param(predict_request(), INVALID, "input size does not match signature: 0!=1 len({}) != len({image}). Sent extra: {}. Missing but required: {image}.", id="no-input"),
    pytest.param(predict_request(ONE, signature_name="nope"), grpc.StatusCode.FAILED_PRECONDITION, 'Serving signature key "nope" not found.', id="unknown-signature"),
    pytest.param(predict_request(ONE, version_label="stable"), INVALID, "Unrecognized servable version label: stable", id="version-label"),
    pytest.param(predict_request(ONE, name=""), INVALID, "ModelSpec has no name specified.", id="no-model-name"),
    pytest.param(predict_pb2.PredictRequest(), INVALID, "Missing ModelSpec", id="no-model-spec"),
    # limits
    pytest.param(predict_request(np.zeros((MAX_IMAGES + 1, 28, 28), np.float32)), grpc.StatusCode.RESOURCE_EXHAUSTED, f"request has {MAX_IMAGES + 1} images; the limit is {MAX_IMAGES} per request (MAX_IMAGES)", id="max-images"),
    pytest.param(predict_request(np.zeros((40, 28, 28), np.float32)), grpc.StatusCode.RESOURCE_EXHAUSTED, f"vs. {GRPC_MAX_MESSAGE_BYTES}", id="message-size"),
]  # fmt: skip


@pytest.mark.parametrize("request_, code, fragment", PREDICT_ERRORS)
def test_grpc_predict_errors(predictions, request_, code, fragment):
    error = rpc_error(predictions.Predict, request_)
    assert error.code() == code, error.details()
    assert fragment in error.details()


def test_grpc_output_filter_errors(predictions):
    request = predict_request(ONE)
    request.output_filter.append("logits")
    error = rpc_error(predictions.Predict, request)
    assert error.code() == INVALID
    assert error.details() == (
        "output tensor alias not found in signature: logits Outputs expected to be in the set "
        "{classes,probabilities}."
    )
    request = predict_request(ONE)
    request.output_filter.extend(["classes", "classes"])
    assert rpc_error(predictions.Predict, request).details() == (
        "duplicate output tensor alias: classes"
    )


def _metadata_request(*fields: str, name: str = MODEL_NAME):
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = name
    request.metadata_field.extend(fields)
    return request


def _status_request(name: str = MODEL_NAME, version: int | None = None):
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = name
    if version is not None:
        request.model_spec.version.value = version
    return request


OTHER_ERRORS = [
    pytest.param("GetModelMetadata", _metadata_request(), INVALID, "GetModelMetadataRequest must specify at least one metadata_field", id="no-metadata-field"),
    pytest.param("GetModelMetadata", _metadata_request("signature_def", "other"), INVALID, "Metadata field other is not supported", id="unsupported-field"),
    pytest.param("GetModelMetadata", _metadata_request("signature_def", name="other"), grpc.StatusCode.NOT_FOUND, "Servable not found for request: Latest(other)", id="metadata-unknown-model"),
    pytest.param("GetModelStatus", _status_request("other"), grpc.StatusCode.NOT_FOUND, "Could not find any versions of model other", id="status-unknown-model"),
    pytest.param("GetModelStatus", _status_request(version=9), grpc.StatusCode.NOT_FOUND, f"Could not find version 9 of model {MODEL_NAME}", id="status-unknown-version"),
    pytest.param("Classify", classification_pb2.ClassificationRequest(), INVALID, "Missing ModelSpec", id="classify-no-spec"),
    pytest.param("Classify", classification_pb2.ClassificationRequest(model_spec={"name": MODEL_NAME, "signature_name": "nope"}), INVALID, "No signature was found with the name: nope", id="classify-unknown-signature"),
    pytest.param("Classify", classification_pb2.ClassificationRequest(model_spec={"name": MODEL_NAME}), INVALID, 'No classification inputs found in SignatureDef: inputs {\n  key: "image"', id="classify-predict-signature"),
    pytest.param("Regress", regression_pb2.RegressionRequest(model_spec={"name": MODEL_NAME}), INVALID, "Expected one output Tensor.", id="regress-predict-signature"),
    pytest.param("MultiInference", inference_pb2.MultiInferenceRequest(), INVALID, "ModelSpec has no name specified.", id="multi-inference-no-task"),
    pytest.param("MultiInference", inference_pb2.MultiInferenceRequest(tasks=[{"model_spec": {"name": MODEL_NAME}, "method_name": "tensorflow/serving/classify"}]), INVALID, 'No classification inputs found in SignatureDef: inputs {\n  key: "image"', id="multi-inference-predict-signature"),
]  # fmt: skip


@pytest.mark.parametrize("method, request_, code, fragment", OTHER_ERRORS)
def test_grpc_other_errors(predictions, models, method, request_, code, fragment):
    stub = models if method == "GetModelStatus" else predictions
    error = rpc_error(getattr(stub, method), request_)
    assert error.code() == code, error.details()
    assert fragment in error.details()


def test_grpc_deadline(predictions):
    """A call whose deadline passes ends DEADLINE_EXCEEDED, and the server goes on."""
    many = np.zeros((MAX_IMAGES, 28, 28), np.float32)
    error = rpc_error(predictions.Predict, predict_request(many), timeout=1e-6)
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    response = predictions.Predict(predict_request(ONE), timeout=TIMEOUT)
    assert response.model_spec.version.value == 1


def test_grpc_requests_go_through_the_data_plane(http, predictions):
    """Counted where HTTP's predictions are: one data plane for every protocol."""

    def count() -> float:
        for family in text_string_to_metric_families(http.get("/metrics").text):
            for sample in family.samples:
                if sample.name == "images_per_request_sum":
                    return sample.value
        return 0.0

    before = count()
    predictions.Predict(predict_request(np.zeros((3, 28, 28), np.float32)), timeout=TIMEOUT)
    assert count() == before + 3
