"""The Open Inference Protocol's HTTP routes as KServe, MLServer and Triton clients use them,
over the fake backend: gzip and deflate request bodies (tritonclient's
request_compression_algorithm), bounded when decompressed; `"parameters": null` at every
level; Triton's model configuration extension (`/v2/models/{m}[/versions/{v}]/config`).

Fast tier: the app in-process (Starlette's TestClient), no TensorFlow.
"""

from __future__ import annotations

import gzip
import tracemalloc
import zlib

import numpy as np
import orjson
import pytest
from support.fakes import MODEL_NAME, FakeBackend, app_client, toy_model
from support.helpers import error_message, ok_json

from service.codecs.compression import decompress_body
from service.errors import BadInput, PayloadTooLarge

V2 = f"/v2/models/{MODEL_NAME}"
HEADER = "Inference-Header-Content-Length"
IMAGES = np.random.default_rng(5).random((3, 28, 28)).astype(np.float32)
MAX_BODY_BYTES = 200_000


@pytest.fixture
def client():
    with app_client(FakeBackend(versions=(1, 2)), max_body_bytes=MAX_BODY_BYTES) as c:
        yield c


def json_body(images: np.ndarray = IMAGES, **request) -> bytes:
    tensor = {"name": "image", "datatype": "FP32", "shape": list(images.shape)}
    tensor["data"] = images.ravel().tolist()
    return orjson.dumps({"inputs": [tensor], **request})


def binary_body(images: np.ndarray = IMAGES) -> tuple[bytes, dict]:
    blob = images.astype("<f4").tobytes()
    tensor = {"name": "image", "datatype": "FP32", "shape": list(images.shape)}
    header = orjson.dumps({"inputs": [{**tensor, "parameters": {"binary_data_size": len(blob)}}]})
    return header + blob, {HEADER: str(len(header))}


def assert_answers_the_images(answer: dict, images: np.ndarray = IMAGES, version: int = 2):
    outputs = {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in answer["outputs"]}
    want = toy_model(version, images)
    np.testing.assert_array_equal(outputs["classes"], want["classes"])
    np.testing.assert_allclose(outputs["probabilities"], want["probabilities"], atol=1e-7)


COMPRESS = [
    pytest.param("gzip", gzip.compress, id="gzip"),
    pytest.param("deflate", zlib.compress, id="deflate"),  # the zlib format, as tritonclient
    pytest.param("GZip ", gzip.compress, id="case-and-space"),
]


# --- compressed bodies ----------------------------------------------------------------------


@pytest.mark.parametrize("encoding, compress", COMPRESS)
def test_a_compressed_json_body_is_answered_as_the_plain_one(client, encoding, compress):
    body = compress(json_body())
    answer = ok_json(
        client.post(f"{V2}/infer", content=body, headers={"Content-Encoding": encoding})
    )
    assert_answers_the_images(answer)


@pytest.mark.parametrize("encoding, compress", COMPRESS)
def test_a_compressed_binary_body_splits_at_the_header_length_of_the_decompressed_body(
    client, encoding, compress
):
    body, headers = binary_body()
    response = client.post(
        f"{V2}/infer", content=compress(body), headers={**headers, "Content-Encoding": encoding}
    )
    assert_answers_the_images(ok_json(response))


def test_a_body_over_the_limit_once_decompressed_is_413_naming_the_limit(client):
    # Well under the limit on the wire (the door lets it in), far over it decompressed.
    body = gzip.compress(json_body(np.zeros((16, 28, 28), np.float32)) + b" " * 400_000)
    assert len(body) < MAX_BODY_BYTES // 10
    message = error_message(
        client.post(f"{V2}/infer", content=body, headers={"Content-Encoding": "gzip"}), 413
    )
    assert message == (
        f"the gzip body is over {MAX_BODY_BYTES} bytes decompressed; the limit is "
        f"{MAX_BODY_BYTES} bytes (MAX_BODY_BYTES)"
    )


def test_a_body_exactly_at_the_limit_decompressed_is_read():
    data = b"x" * 1000
    assert decompress_body(gzip.compress(data), "gzip", 1000) == data
    with pytest.raises(PayloadTooLarge):
        decompress_body(gzip.compress(data), "gzip", 999)


def test_a_decompression_bomb_costs_no_more_memory_than_the_limit():
    bomb = zlib.compress(bytes(64 * 1024 * 1024), 9)  # 64 MiB of zeros in about 64 KB
    limit = 1024 * 1024
    tracemalloc.start()
    try:
        with pytest.raises(PayloadTooLarge):
            decompress_body(bomb, "deflate", limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Bounded by the limit (+1 byte to see it is over; zlib's output buffer is built in blocks
    # and joined, so up to about twice that at the peak), never by the bomb's 64 MiB.
    assert peak < 3 * limit


PLAIN = json_body()
BAD_BODIES = [
    pytest.param(b"not gzip at all", "gzip", "the body is not valid gzip data (Content-Encoding): Error -3", id="not-gzip"),
    pytest.param(gzip.compress(PLAIN), "deflate", "the body is not valid deflate data (Content-Encoding)", id="gzip-sent-as-deflate"),
    pytest.param(gzip.compress(PLAIN)[:-20], "gzip", "the gzip body ends before its compressed data does (truncated?)", id="truncated"),
    pytest.param(zlib.compress(PLAIN) + b"junk", "deflate", "the deflate body has 4 bytes after its compressed data", id="trailing-bytes"),
    pytest.param(gzip.compress(b"[1, 2]"), "gzip", "the request must be a JSON object, got list", id="decompressed-then-parsed"),
    pytest.param(PLAIN, "br", "Content-Encoding 'br' is not supported; send gzip, deflate or identity", id="brotli"),
    pytest.param(PLAIN, "gzip, identity", "Content-Encoding 'gzip, identity' is not supported", id="a-list"),
]  # fmt: skip


@pytest.mark.parametrize("body, encoding, fragment", BAD_BODIES)
def test_a_malformed_or_unknown_encoding_is_400_saying_what(client, body, encoding, fragment):
    response = client.post(f"{V2}/infer", content=body, headers={"Content-Encoding": encoding})
    assert fragment in error_message(response, 400)


def test_decompress_body_passes_identity_through():
    assert decompress_body(PLAIN, None, 10) is PLAIN
    assert decompress_body(PLAIN, "identity", 10) is PLAIN
    with pytest.raises(BadInput):
        decompress_body(PLAIN, "compress", 10**6)


# --- "parameters": null ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "where",
    [
        pytest.param("request", id="request"),
        pytest.param("input", id="input"),
        pytest.param("output", id="output"),
    ],
)
def test_null_parameters_are_no_parameters(client, where):
    request = orjson.loads(json_body())
    request["outputs"] = [{"name": "probabilities"}, {"name": "classes"}]
    holder = {"request": request, "input": request["inputs"][0], "output": request["outputs"][0]}
    holder[where]["parameters"] = None
    answer = ok_json(client.post(f"{V2}/infer", json=request))
    assert [o["name"] for o in answer["outputs"]] == ["probabilities", "classes"]
    assert_answers_the_images(answer)


def test_parameters_that_are_not_an_object_are_still_refused(client):
    request = orjson.loads(json_body(parameters=[]))
    message = error_message(client.post(f"{V2}/infer", json=request), 400)
    assert message == "request.parameters must be a JSON object, got list"


# --- the model configuration extension ------------------------------------------------------

CONFIG = {
    "name": MODEL_NAME,
    "platform": "tensorflow_savedmodel",
    "max_batch_size": 16,  # MAX_IMAGES (app_client's)
    "input": [{"name": "image", "data_type": "TYPE_FP32", "dims": [28, 28]}],
    "output": [
        {"name": "classes", "data_type": "TYPE_INT64", "dims": [1], "reshape": {"shape": []}},
        {"name": "probabilities", "data_type": "TYPE_FP32", "dims": [10]},
    ],
}


@pytest.mark.parametrize("path", [f"{V2}/config", f"{V2}/versions/1/config"])
def test_model_config_says_what_the_signature_says(client, path):
    assert ok_json(client.get(path)) == CONFIG


def test_model_config_max_batch_size_is_max_images():
    with app_client(FakeBackend(), max_images=5) as client:
        assert ok_json(client.get(f"{V2}/config"))["max_batch_size"] == 5


@pytest.mark.parametrize(
    "path, status, fragment",
    [
        pytest.param("/v2/models/nope/config", 404, "nope", id="unknown-model"),
        pytest.param(f"{V2}/versions/9/config", 404, "9", id="unknown-version"),
        pytest.param(f"{V2}/versions/x/config", 400, "version must be a non-negative integer, got 'x'", id="bad-version"),
    ],
)  # fmt: skip
def test_model_config_errors(client, path, status, fragment):
    assert fragment in error_message(client.get(path), status)


def test_the_server_metadata_advertises_the_model_configuration_extension(client):
    assert "model_configuration" in ok_json(client.get("/v2"))["extensions"]
