"""The Open Inference Protocol over gRPC against a real `python -m service` on the session's
trained model, with bearer tokens on: `tritonclient.grpc` unchanged (health, metadata,
inference with raw_input_contents, requested outputs, errors as gRPC codes), KServe's way of
calling (its stubs generated from the same .proto are a plain channel's unary calls) with
typed contents, tokens, metrics; and tritonclient.http's compressed request bodies over real
HTTP. KServe's SDK itself, in a venv of its own: test_kserve_client.py.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import grpc
import httpx
import numpy as np
import pytest
import tensorflow as tf
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from prometheus_client.parser import text_string_to_metric_families
from support.helpers import error_message
from support.servers import MAX_IMAGES, MODEL_NAME, Server, copy_repository, start_server
from tritonclient.utils import InferenceServerException

from artifact import idx as data
from service import v2_proto

TIMEOUT = 30.0
TOKEN = "predict-and-status-token-0123"
STATUS_TOKEN = "status-only-token-0123456789"
BEARER = {"authorization": f"Bearer {TOKEN}"}


# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(trained_model, tmp_path_factory) -> Iterator[tuple[Server, int]]:
    """(the server, its gRPC port): a copy of the trained repository, gRPC and tokens on."""
    root = tmp_path_factory.mktemp("v2-grpc")
    base = copy_repository(trained_model, root)
    tokens = root / "tokens"
    tokens.write_text(f"{TOKEN} predict,status\n{STATUS_TOKEN} status\n")
    srv = start_server(
        root / "server.log",
        grpc=True,
        MODEL_BASE_PATH=str(base),
        AUTH_TOKENS_FILE=str(tokens),
        GRPC_ALLOW_PLAINTEXT_TOKENS="true",  # loopback
    )
    yield srv, srv.grpc_port
    assert srv.stop() in (0, -signal.SIGTERM), srv.log()
    assert "Traceback" not in srv.log(), srv.log()


@pytest.fixture(scope="module")
def http(server) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=server[0].url, timeout=TIMEOUT, headers=headers) as client:
        yield client


@pytest.fixture(scope="module")
def triton(server) -> Iterator[triton_grpc.InferenceServerClient]:
    client = triton_grpc.InferenceServerClient(f"127.0.0.1:{server[1]}")
    yield client
    client.close()


@pytest.fixture(scope="module")
def channel(server) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{server[1]}") as ch:
        yield ch


@pytest.fixture(scope="module")
def images(trained_model) -> np.ndarray:
    """4 real Fashion-MNIST test images as the model takes them: float32 [4, 28, 28] in [0, 1]."""
    _, pixels, _ = data.load_split(trained_model.data_dir, "test")
    return (pixels[:4] / 255.0).astype(np.float32)


@pytest.fixture(scope="module")
def reference(trained_model, images) -> dict[str, np.ndarray]:
    """The serving signature's outputs, called directly."""
    loaded = tf.saved_model.load(str(trained_model.version_path))
    outputs = loaded.signatures["serving_default"](image=tf.constant(images))
    answer = {key: value.numpy() for key, value in outputs.items()}
    # A service that answered a constant would pass a comparison with a constant reference.
    assert np.abs(answer["probabilities"][0] - answer["probabilities"][1]).max() > 1e-3
    return answer


def call(channel: grpc.Channel, method: str, request, token: str | None = TOKEN):
    """One unary call as KServe's generated stub makes it: /inference.GRPCInferenceService/
    <method>, the messages serialized by the same .proto."""
    request_class, response_class = v2_proto.METHODS[method]
    assert isinstance(request, request_class)
    stub = channel.unary_unary(
        f"/{v2_proto.SERVICE}/{method}",
        request_serializer=request_class.SerializeToString,
        response_deserializer=response_class.FromString,
    )
    metadata = [("authorization", f"Bearer {token}")] if token else None
    return stub(request, timeout=TIMEOUT, metadata=metadata)


def call_error(channel, method, request, token: str | None = TOKEN) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call(channel, method, request, token)
    return caught.value


def triton_input(images: np.ndarray, datatype: str = "FP32") -> triton_grpc.InferInput:
    tensor = triton_grpc.InferInput("image", list(images.shape), datatype)
    tensor.set_data_from_numpy(images)
    return tensor


# --- tritonclient.grpc ----------------------------------------------------------------------


def test_tritonclient_health_and_metadata(triton):
    assert triton.is_server_live(headers=BEARER) and triton.is_server_ready(headers=BEARER)
    assert triton.is_model_ready(MODEL_NAME, headers=BEARER)
    assert triton.is_model_ready(MODEL_NAME, "1", headers=BEARER)
    server = triton.get_server_metadata(headers=BEARER, as_json=True)
    assert server["name"] == "estimator-serving" and "binary_tensor_data" in server["extensions"]
    metadata = triton.get_model_metadata(MODEL_NAME, headers=BEARER, as_json=True)
    assert metadata == {
        "name": MODEL_NAME,
        "versions": ["1"],
        "platform": "tensorflow_savedmodel",
        # protobuf's JSON writes int64 as strings
        "inputs": [{"name": "image", "datatype": "FP32", "shape": ["-1", "28", "28"]}],
        "outputs": [
            {"name": "classes", "datatype": "INT64", "shape": ["-1"]},
            {"name": "probabilities", "datatype": "FP32", "shape": ["-1", "10"]},
        ],
    }


def test_tritonclient_infers_with_raw_contents(triton, images, reference):
    result = triton.infer(MODEL_NAME, [triton_input(images)], request_id="r1", headers=BEARER)
    response = result.get_response()
    assert (response.model_name, response.model_version, response.id) == (MODEL_NAME, "1", "r1")
    assert len(response.raw_output_contents) == 2  # raw in, raw out
    np.testing.assert_array_equal(result.as_numpy("classes"), reference["classes"])
    np.testing.assert_allclose(
        result.as_numpy("probabilities"), reference["probabilities"], rtol=0, atol=1e-6
    )
    assert result.as_numpy("probabilities").dtype == np.float32


def test_tritonclient_requested_outputs_and_version(triton, images, reference):
    wanted = [triton_grpc.InferRequestedOutput("probabilities")]
    result = triton.infer(
        MODEL_NAME, [triton_input(images)], model_version="1", outputs=wanted, headers=BEARER
    )
    assert [o.name for o in result.get_response().outputs] == ["probabilities"]
    assert result.as_numpy("classes") is None
    np.testing.assert_allclose(
        result.as_numpy("probabilities"), reference["probabilities"], rtol=0, atol=1e-6
    )


TRITON_ERRORS = [
    pytest.param("nope", "", "FP32", (1, 28, 28), "StatusCode.NOT_FOUND", "Servable not found for request: Latest(nope)", id="unknown-model"),
    pytest.param(MODEL_NAME, "9", "FP32", (1, 28, 28), "StatusCode.NOT_FOUND", "9", id="unknown-version"),
    pytest.param(MODEL_NAME, "one", "FP32", (1, 28, 28), "StatusCode.INVALID_ARGUMENT", "version must be a non-negative integer, got 'one'", id="bad-version"),
    pytest.param(MODEL_NAME, "", "FP64", (1, 28, 28), "StatusCode.INVALID_ARGUMENT", "input 'image': datatype FP64 does not match the model's FP32", id="datatype"),
    pytest.param(MODEL_NAME, "", "FP32", (1, 784), "StatusCode.INVALID_ARGUMENT", "input 'image': shape [1, 784] does not match the model's [-1, 28, 28]", id="shape"),
    pytest.param(MODEL_NAME, "", "FP32", (MAX_IMAGES + 1, 28, 28), "StatusCode.RESOURCE_EXHAUSTED", f"request has {MAX_IMAGES + 1} images; the limit is {MAX_IMAGES} per request (MAX_IMAGES)", id="max-images"),
]  # fmt: skip


@pytest.mark.parametrize("model, version, datatype, shape, status, fragment", TRITON_ERRORS)
def test_tritonclient_errors(triton, model, version, datatype, shape, status, fragment):
    dtype = np.float64 if datatype == "FP64" else np.float32
    tensor = triton_input(np.zeros(shape, dtype), datatype)
    with pytest.raises(InferenceServerException) as caught:
        triton.infer(model, [tensor], model_version=version, headers=BEARER)
    assert caught.value.status() == status
    assert fragment in caught.value.message()


def test_tritonclient_unknown_model_is_not_ready_by_error(triton):
    with pytest.raises(InferenceServerException) as caught:
        triton.is_model_ready("nope", headers=BEARER)
    assert caught.value.status() == "StatusCode.NOT_FOUND"


# --- KServe's way: the generated stub's calls, typed contents -------------------------------


def test_typed_contents_in_typed_contents_out(channel, images, reference):
    request = v2_proto.ModelInferRequest(model_name=MODEL_NAME, id="typed")
    tensor = request.inputs.add(name="image", datatype="FP32", shape=list(images.shape))
    tensor.contents.fp32_contents.extend(images.ravel().tolist())
    response = call(channel, "ModelInfer", request)
    assert not response.raw_output_contents and response.id == "typed"
    outputs = {output.name: output for output in response.outputs}
    assert list(outputs["probabilities"].shape) == [len(images), 10]
    probabilities = np.array(outputs["probabilities"].contents.fp32_contents, np.float32)
    np.testing.assert_allclose(
        probabilities.reshape(len(images), 10), reference["probabilities"], rtol=0, atol=1e-6
    )
    assert list(outputs["classes"].contents.int64_contents) == reference["classes"].tolist()


def test_health_is_open_and_the_rest_takes_a_token(channel):
    assert call(channel, "ServerLive", v2_proto.ServerLiveRequest(), token=None).live
    assert call(channel, "ServerReady", v2_proto.ServerReadyRequest(), token=None).ready
    metadata = v2_proto.ModelMetadataRequest(name=MODEL_NAME)
    assert call(channel, "ModelMetadata", metadata, token=STATUS_TOKEN).name == MODEL_NAME
    error = call_error(channel, "ModelMetadata", metadata, token=None)
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    infer = v2_proto.ModelInferRequest(model_name=MODEL_NAME)
    infer.inputs.add(name="image", datatype="FP32", shape=[1, 28, 28])
    infer.raw_input_contents.append(bytes(3136))
    assert call_error(channel, "ModelInfer", infer, token=None).code() == (
        grpc.StatusCode.UNAUTHENTICATED
    )
    error = call_error(channel, "ModelInfer", infer, token=STATUS_TOKEN)
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert call(channel, "ModelInfer", infer).model_version == "1"


def test_a_bad_typed_request_names_the_field(channel):
    request = v2_proto.ModelInferRequest(model_name=MODEL_NAME)
    request.inputs.add(name="image", datatype="FP32", shape=[2, 28, 28]).contents.fp32_contents.extend([0.0] * 784)  # fmt: skip
    error = call_error(channel, "ModelInfer", request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == (
        "input 'image': shape [2, 28, 28] takes 1568 values; contents.fp32_contents has 784"
    )
    error = call_error(
        channel, "ModelReady", v2_proto.ModelReadyRequest(name=MODEL_NAME, version="7")
    )
    assert error.code() == grpc.StatusCode.NOT_FOUND


def grpc_calls(http: httpx.Client, method: str) -> dict[str, float]:
    counts = {}
    for family in text_string_to_metric_families(http.get("/metrics").text):
        for sample in family.samples:
            if sample.name == "grpc_requests_total" and sample.labels["method"] == method:
                counts[sample.labels["code"]] = sample.value
    return counts


def per_model_answered(http: httpx.Client, protocol: str) -> float:
    """Answered requests in the per-model latency histogram, for one protocol."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(http.get("/metrics").text)
        for sample in family.samples
        if sample.name == "estimator_serving_request_duration_seconds_count"
        and sample.labels["protocol"] == protocol
        and sample.labels["model"] == MODEL_NAME
    )


def test_calls_are_counted_as_tf_servings_methods_are(http, triton, images):
    before = grpc_calls(http, "ModelInfer")
    answered = per_model_answered(http, "v2_grpc")
    triton.infer(MODEL_NAME, [triton_input(images[:1])], headers=BEARER)
    with pytest.raises(InferenceServerException):
        tensor = triton_input(images[:1].astype(np.float64), "FP64")
        triton.infer(MODEL_NAME, [tensor], headers=BEARER)
    after = grpc_calls(http, "ModelInfer")
    assert after.get("OK", 0) == before.get("OK", 0) + 1
    assert after.get("INVALID_ARGUMENT", 0) == before.get("INVALID_ARGUMENT", 0) + 1
    # Timed per model under the V2 gRPC protocol (the answered call only).
    assert per_model_answered(http, "v2_grpc") == answered + 1


# --- tritonclient.http: compressed bodies over real HTTP ------------------------------------


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_tritonclient_http_compressed_requests(server, images, reference, algorithm):
    client = triton_http.InferenceServerClient(f"127.0.0.1:{server[0].port}")
    try:
        tensor = triton_http.InferInput("image", list(images.shape), "FP32")
        tensor.set_data_from_numpy(images)
        result = client.infer(
            MODEL_NAME,
            [tensor],
            request_compression_algorithm=algorithm,
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
    finally:
        client.close()
    np.testing.assert_allclose(
        result.as_numpy("probabilities"), reference["probabilities"], rtol=0, atol=1e-6
    )


def test_model_config_over_real_http(http):
    config = http.get(f"/v2/models/{MODEL_NAME}/config").json()
    assert config["max_batch_size"] == MAX_IMAGES
    assert config["input"] == [{"name": "image", "data_type": "TYPE_FP32", "dims": [28, 28]}]
    response = http.get(f"/v2/models/{MODEL_NAME}/versions/9/config")
    assert "9" in error_message(response, 404)
