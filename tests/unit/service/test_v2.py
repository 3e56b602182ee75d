"""The Open Inference Protocol (/v2) over a fake backend (Starlette's TestClient, no TensorFlow):
health, metadata, readiness, inference in JSON and with the binary tensor data extension, and
every bad request answered with a clear 4xx.

The real clients (tritonclient) against a real server: tests/live/service/test_protocols.py.
"""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from support.fakes import MODEL_NAME, FakeBackend, app_client, toy_model
from support.helpers import error_message, ok_json

V2 = f"/v2/models/{MODEL_NAME}"
INFER = f"{V2}/infer"
HEADER = "Inference-Header-Content-Length"
IMAGES = np.random.default_rng(1).random((3, 28, 28)).astype(np.float32)
ONE = IMAGES[:1]


@pytest.fixture
def client():
    with app_client(FakeBackend(versions=(1, 2))) as c:
        yield c


def expected(version: int, images: np.ndarray) -> dict[str, np.ndarray]:
    return toy_model(version, images)


def json_input(images: np.ndarray, **changes) -> dict:
    return {
        "name": "image",
        "datatype": "FP32",
        "shape": list(images.shape),
        "data": images.ravel().tolist(),
        **changes,
    }


def binary_body(header: dict, *blobs: bytes) -> tuple[bytes, dict]:
    """A binary extension request: the JSON, then the blobs; and its headers."""
    text = orjson.dumps(header)
    return text + b"".join(blobs), {HEADER: str(len(text))}


def binary_request(images: np.ndarray, **request) -> tuple[bytes, dict]:
    blob = images.astype("<f4").tobytes()
    header = {
        "inputs": [
            {
                "name": "image",
                "datatype": "FP32",
                "shape": list(images.shape),
                "parameters": {"binary_data_size": len(blob)},
            }
        ],
        **request,
    }
    return binary_body(header, blob)


def read_binary_answer(response) -> tuple[dict, dict[str, np.ndarray]]:
    """(the JSON header, every output as an array) of a 200 answer, binary or not."""
    assert response.status_code == 200, response.text
    types = {"FP32": "<f4", "INT64": "<i8"}
    if HEADER.lower() not in response.headers:
        assert response.headers["content-type"] == "application/json"
        answer = response.json()
        arrays = {
            o["name"]: np.array(o["data"], types[o["datatype"]]).reshape(o["shape"])
            for o in answer["outputs"]
        }
        return answer, arrays
    assert response.headers["content-type"] == "application/octet-stream"
    length = int(response.headers[HEADER])
    answer = orjson.loads(response.content[:length])
    arrays, offset = {}, length
    for output in answer["outputs"]:
        if "data" in output:
            arrays[output["name"]] = np.array(output["data"], types[output["datatype"]]).reshape(
                output["shape"]
            )
            continue
        size = output["parameters"]["binary_data_size"]
        blob = response.content[offset : offset + size]
        offset += size
        arrays[output["name"]] = np.frombuffer(blob, types[output["datatype"]]).reshape(
            output["shape"]
        )
    assert offset == len(response.content), "bytes left over after the outputs"
    return answer, arrays


def assert_outputs(arrays: dict, version: int, images: np.ndarray) -> None:
    want = expected(version, images)
    np.testing.assert_array_equal(arrays["classes"], want["classes"])
    np.testing.assert_allclose(arrays["probabilities"], want["probabilities"], rtol=0, atol=1e-7)


# --- health and metadata --------------------------------------------------------------------


def test_server_metadata_advertises_the_extensions_it_serves(client):
    assert ok_json(client.get("/v2")) == {
        "name": "estimator-serving",
        "version": "0.1.0",
        "extensions": ["binary_tensor_data", "model_configuration"],
    }


def test_health(client):
    assert ok_json(client.get("/v2/health/live")) == {"live": True}
    assert ok_json(client.get("/v2/health/ready")) == {"ready": True}
    assert ok_json(client.get(f"{V2}/ready")) == {"name": MODEL_NAME, "ready": True}
    assert ok_json(client.get(f"{V2}/versions/1/ready")) == {"name": MODEL_NAME, "ready": True}


def test_not_ready_is_503_saying_why_and_live_stays_200():
    backend = FakeBackend(versions=())
    backend.reason = "no version under models/fashion_mnist"
    with app_client(backend) as client:
        assert ok_json(client.get("/v2/health/live")) == {"live": True}
        assert "no version under" in error_message(client.get("/v2/health/ready"), 503)
        assert "no version under" in error_message(client.get(f"{V2}/ready"), 503)
        body = {"inputs": [json_input(ONE)]}
        assert "no version under" in error_message(client.post(INFER, json=body), 503)


def test_model_metadata_from_the_versions_signature(client):
    want = {
        "name": MODEL_NAME,
        "versions": ["1", "2"],
        "platform": "tensorflow_savedmodel",
        "inputs": [{"name": "image", "datatype": "FP32", "shape": [-1, 28, 28]}],
        "outputs": [
            {"name": "classes", "datatype": "INT64", "shape": [-1]},
            {"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]},
        ],
    }
    assert ok_json(client.get(V2)) == want
    assert ok_json(client.get(f"{V2}/versions/1")) == want


METADATA_ERRORS = [
    pytest.param("/v2/models/other", 404, "Servable not found for request: Latest(other)", id="unknown-model"),
    pytest.param(f"{V2}/versions/9", 404, f"Servable not found for request: Specific({MODEL_NAME}, 9)", id="unknown-version"),
    pytest.param(f"{V2}/versions/one", 400, "version must be a non-negative integer, got 'one'", id="bad-version"),
    pytest.param("/v2/models/other/ready", 404, "Could not find any versions of model other", id="ready-unknown-model"),
    pytest.param(f"{V2}/versions/9/ready", 404, f"Specific({MODEL_NAME}, 9)", id="ready-unknown-version"),
]  # fmt: skip


@pytest.mark.parametrize("path, status, fragment", METADATA_ERRORS)
def test_metadata_errors(client, path, status, fragment):
    assert fragment in error_message(client.get(path), status)


# --- inference ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(IMAGES.ravel().tolist(), id="flat"),
        pytest.param(IMAGES.tolist(), id="nested"),
        pytest.param(IMAGES.reshape(3, 784).tolist(), id="rows"),
    ],
)
def test_json_inference_flat_or_nested(client, data):
    body = {"id": "request-7", "inputs": [json_input(IMAGES, data=data)]}
    response = client.post(INFER, json=body)
    answer, arrays = read_binary_answer(response)
    assert response.headers["content-type"] == "application/json"
    assert answer["model_name"] == MODEL_NAME and answer["model_version"] == "2"
    assert answer["id"] == "request-7"
    assert [(o["name"], o["datatype"], o["shape"]) for o in answer["outputs"]] == [
        ("classes", "INT64", [3]),
        ("probabilities", "FP32", [3, 10]),
    ]
    assert_outputs(arrays, 2, IMAGES)


def test_binary_inference_with_every_output_binary(client):
    body, headers = binary_request(IMAGES, parameters={"binary_data_output": True})
    response = client.post(f"{V2}/versions/1/infer", content=body, headers=headers)
    answer, arrays = read_binary_answer(response)
    assert answer["model_version"] == "1" and "id" not in answer
    assert [o["parameters"] for o in answer["outputs"]] == [
        {"binary_data_size": 3 * 8},
        {"binary_data_size": 3 * 10 * 4},
    ]
    assert all("data" not in o for o in answer["outputs"])
    assert_outputs(arrays, 1, IMAGES)


def test_requested_outputs_choose_names_order_and_form(client):
    outputs = [
        {"name": "probabilities", "parameters": {"binary_data": True}},
        {"name": "classes"},
    ]
    body, headers = binary_request(IMAGES, outputs=outputs)
    answer, arrays = read_binary_answer(client.post(INFER, content=body, headers=headers))
    assert [o["name"] for o in answer["outputs"]] == ["probabilities", "classes"]
    assert "data" in answer["outputs"][1] and "data" not in answer["outputs"][0]
    assert_outputs(arrays, 2, IMAGES)
    # binary_data on an output overrides binary_data_output; an output not asked for is left out.
    body = {
        "inputs": [json_input(ONE)],
        "parameters": {"binary_data_output": True},
        "outputs": [{"name": "classes", "parameters": {"binary_data": False}}],
    }
    response = client.post(INFER, json=body)
    answer = ok_json(response)
    assert [o["name"] for o in answer["outputs"]] == ["classes"]
    assert answer["outputs"][0]["data"] == expected(2, ONE)["classes"].tolist()


def test_raw_binary_request_is_the_one_input(client):
    response = client.post(INFER, content=IMAGES.astype("<f4").tobytes(), headers={HEADER: "0"})
    answer, arrays = read_binary_answer(response)
    assert all("binary_data_size" in o["parameters"] for o in answer["outputs"])
    assert_outputs(arrays, 2, IMAGES)


def test_v2_and_v1_answer_the_same(client):
    v1 = ok_json(client.post(f"/v1/models/{MODEL_NAME}:predict", json={"inputs": IMAGES.tolist()}))
    body, headers = binary_request(IMAGES)
    _, arrays = read_binary_answer(client.post(INFER, content=body, headers=headers))
    assert arrays["classes"].tolist() == v1["outputs"]["classes"]
    np.testing.assert_array_equal(
        arrays["probabilities"], np.array(v1["outputs"]["probabilities"], np.float32)
    )


# --- bad requests ---------------------------------------------------------------------------


def _binary(size: int | None = None, extra: bytes = b"", cut: int = 0, **input_changes):
    """A binary request for ONE whose declared size, trailing bytes or body length is off."""
    blob = ONE.astype("<f4").tobytes()
    item = {
        "name": "image",
        "datatype": "FP32",
        "shape": [1, 28, 28],
        "parameters": {"binary_data_size": len(blob) if size is None else size},
        **input_changes,
    }
    body, headers = binary_body({"inputs": [item]}, blob, extra)
    return body[: len(body) - cut], headers


def _json(**input_changes):
    return orjson.dumps({"inputs": [json_input(ONE, **input_changes)]}), {}


def _raw(body: bytes, headers: dict | None = None):
    return body, headers or {}


NAN_IMAGE = ONE.copy()
NAN_IMAGE[0, 3, 4] = np.nan

BAD_REQUESTS = [
    # the list: datatype, shape against data length, binary sizes, truncation, outputs
    pytest.param(*_json(datatype="FP64"), 400, "input 'image': datatype FP64 does not match the model's FP32", id="wrong-datatype"),
    pytest.param(*_json(datatype="FLOAT32"), 400, "unknown datatype 'FLOAT32'; the model takes FP32", id="unknown-datatype"),
    pytest.param(*_binary(datatype="INT64"), 400, "datatype INT64 does not match the model's FP32", id="wrong-datatype-binary"),
    pytest.param(*_json(shape=[2, 28, 28]), 400, "input 'image': shape [2, 28, 28] takes 1568 values; 'data' has 784", id="shape-vs-data"),
    pytest.param(*_json(shape=[1, 28, 27]), 400, "shape [1, 28, 27] does not match the model's [-1, 28, 28]", id="shape-vs-model"),
    pytest.param(*_binary(shape=[2, 28, 28]), 400, "binary_data_size is 3136 bytes; shape [2, 28, 28] of FP32 takes 6272", id="shape-vs-binary-size"),
    pytest.param(*_binary(extra=b"\0" * 8), 400, "3144 bytes follow the Inference-Header-Content-Length bytes of JSON, but the inputs' binary_data_size add up to 3136", id="sizes-short"),
    pytest.param(*_binary(size=4000), 400, "binary_data_size add up to 4000 bytes, but only 3136 follow", id="sizes-over"),
    pytest.param(*_binary(cut=100), 400, "add up to 3136 bytes, but only 3036 follow", id="truncated-binary"),
    pytest.param(b'{"inputs": []}', {HEADER: "500"}, 400, "Inference-Header-Content-Length is 500 bytes, but the whole body has only 14", id="truncated-header"),
    pytest.param(*_raw(orjson.dumps({"inputs": [json_input(ONE)], "outputs": [{"name": "logits"}]})), 400, "unknown output 'logits': the model's outputs are 'classes', 'probabilities'", id="unknown-output"),
    # the rest of the request's form
    pytest.param(*_json(name="pixels"), 400, "unknown input 'pixels': the model takes one input, 'image' (FP32 [-1, 28, 28])", id="unknown-input"),
    pytest.param(*_raw(orjson.dumps({"inputs": [json_input(ONE), json_input(ONE)]})), 400, "input 'image' is given 2 times", id="input-twice"),
    pytest.param(*_raw(b'{"inputs": []}'), 400, "'inputs' must be a list holding the model's one input", id="no-inputs"),
    pytest.param(*_json(parameters={"binary_data_size": 3136}), 400, "must set exactly one of 'data' and parameters.binary_data_size; it sets both", id="data-and-binary"),
    pytest.param(*_raw(orjson.dumps({"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 28, 28]}]})), 400, "it sets neither", id="no-data"),
    pytest.param(*_raw(orjson.dumps({"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 28, 28], "parameters": {"binary_data_size": 3136}}]}) + ONE.tobytes()), 400, "a body with binary tensor data after its JSON needs the Inference-Header-Content-Length header", id="binary-without-header"),
    pytest.param(*_raw(orjson.dumps({"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 28, 28], "parameters": {"binary_data_size": 3136}}]})), 400, "has binary_data_size, but the request has no Inference-Header-Content-Length header", id="binary-size-without-header"),
    pytest.param(*_raw(b"{}", {HEADER: "two"}), 400, "Inference-Header-Content-Length must be a number of bytes, got 'two'", id="header-not-a-number"),
    pytest.param(*_raw(b"\0" * 100, {HEADER: "0"}), 400, "a raw binary request (Inference-Header-Content-Length: 0) is the input 'image' (FP32 [-1, 28, 28]) as raw little-endian floats, 3136 bytes per image; got 100 bytes", id="raw-size"),
    pytest.param(*_json(data=[[0.5] * 28] * 27 + [[0.5] * 27]), 400, "'data' must be a regular array of numbers", id="ragged-data"),
    pytest.param(*_json(data=["x"] * 784), 400, "'data' must hold numbers for FP32, got strings", id="string-data"),
    pytest.param(*_json(data=[True] * 784), 400, "'data' must hold numbers for FP32, got booleans", id="bool-data"),
    pytest.param(*_json(data={"b64": "AAAA"}), 400, "'data' must be an array of numbers, got dict", id="data-not-array"),
    pytest.param(*_json(shape=[1, 28, "28"]), 400, "'shape' must be a list of non-negative integers", id="shape-not-ints"),
    pytest.param(*_json(shape=[0, 28, 28], data=[]), 400, "input 'image' has no images (shape [0, 28, 28])", id="no-images"),
    pytest.param(*_binary(size=-4), 400, "binary_data_size must be a number of bytes, got -4", id="negative-size"),
    pytest.param(*_raw(orjson.dumps({"id": 7, "inputs": [json_input(ONE)]})), 400, "'id' must be a string, got int", id="id-not-string"),
    pytest.param(*_raw(orjson.dumps({"inputs": [json_input(ONE)], "parameters": {"binary_data_output": "yes"}})), 400, "request.parameters.binary_data_output must be true or false, got 'yes'", id="flag-not-bool"),
    pytest.param(*_raw(orjson.dumps({"inputs": [json_input(ONE)], "outputs": [{"name": "classes"}, {"name": "classes"}]})), 400, "output 'classes' is requested twice", id="output-twice"),
    pytest.param(*_raw(orjson.dumps({"inputs": [json_input(ONE)], "outputs": [{"name": "probabilities", "parameters": {"classification": 3}}]})), 400, "the classification extension is not supported", id="classification"),
    pytest.param(*_raw(b'{"inputs": [' + b"1" * 20), 400, "JSON Parse error", id="bad-json"),
    pytest.param(*_raw(b"[1, 2]"), 400, "the request must be a JSON object, got list", id="not-an-object"),
    pytest.param(*_raw(*binary_request(NAN_IMAGE)), 400, "input 'image'[0]: values must be finite numbers", id="nan-binary"),
    pytest.param(*_json(data=[1e39] * 784), 400, "input 'image'[0]: values must be finite numbers (NaN/Inf or too large)", id="too-large-json"),
    pytest.param(*_raw(orjson.dumps({"inputs": [json_input(ONE)]}), {"Content-Encoding": "br"}), 400, "Content-Encoding 'br' is not supported; send gzip, deflate or identity", id="unsupported-encoding"),
    # limits
    pytest.param(*_raw(orjson.dumps({"inputs": [json_input(np.zeros((17, 28, 28), np.float32))]})), 413, "request has 17 images; the limit is 16 per request (MAX_IMAGES)", id="count-json"),
    pytest.param(*binary_request(np.zeros((17, 28, 28), np.float32)), 413, "request has 17 images; the limit is 16", id="count-binary"),
    pytest.param(*_raw(np.zeros((17, 28, 28), "<f4").tobytes(), {HEADER: "0"}), 413, "request has 17 images", id="count-raw"),
    pytest.param(*binary_request(np.zeros((64, 28, 28), np.float32)), 413, "the limit is 200000 bytes (MAX_BODY_BYTES)", id="body-size"),
]  # fmt: skip


@pytest.mark.parametrize("body, headers, status, fragment", BAD_REQUESTS)
def test_bad_requests_get_a_clear_4xx(client, body, headers, status, fragment):
    message = error_message(client.post(INFER, content=body, headers=headers), status)
    assert fragment in message


@pytest.mark.parametrize(
    "path, status, fragment",
    [
        pytest.param("/v2/models/other/infer", 404, "Servable not found for request: Latest(other)", id="unknown-model"),
        pytest.param(f"{V2}/versions/9/infer", 404, f"Specific({MODEL_NAME}, 9)", id="unknown-version"),
        pytest.param(f"{V2}/versions/x/infer", 400, "version must be a non-negative integer", id="bad-version"),
    ],
)  # fmt: skip
def test_unknown_models_and_versions(client, path, status, fragment):
    body, headers = binary_request(ONE)
    assert fragment in error_message(client.post(path, content=body, headers=headers), status)


def test_a_refused_request_never_reaches_the_model():
    backend = FakeBackend()
    with app_client(backend) as client:
        body, headers = _binary(size=4000)
        error_message(client.post(INFER, content=body, headers=headers), 400)
        client.post(INFER, json={"inputs": [json_input(np.zeros((17, 28, 28), np.float32))]})
        assert backend.calls == []
        client.post(INFER, json={"inputs": [json_input(ONE)]})
        assert backend.calls == [(None, None, 1)]
