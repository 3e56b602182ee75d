"""JSON bodies to numpy: what is accepted, and the message for everything that is not."""

from __future__ import annotations

import base64

import numpy as np
import orjson
import pytest
from helpers import png_bytes

from service import codec
from service.errors import BadInput

IMAGE = np.linspace(0, 1, 28 * 28, dtype=np.float32).reshape(28, 28)


def body(content) -> bytes:
    return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


@pytest.mark.parametrize(
    "content, signature, columnar",
    [
        pytest.param({"instances": [IMAGE, IMAGE]}, "serving_default", False, id="rows"),
        pytest.param({"instances": [{"image": IMAGE}]}, "serving_default", False, id="named-rows"),
        pytest.param({"inputs": [IMAGE]}, "serving_default", True, id="columns"),
        pytest.param({"inputs": {"image": [IMAGE]}}, "serving_default", True, id="named-columns"),
        pytest.param({"instances": [IMAGE], "signature_name": "classify"}, "classify", False,
                     id="signature"),
        pytest.param({"instances": [IMAGE], "signature_name": ""}, "serving_default", False,
                     id="empty-signature-is-default"),
    ],
)  # fmt: skip
def test_tf_serving_bodies(content, signature, columnar):
    name, images, is_columnar = codec.parse_tf_serving_request(body(content), 64)
    assert (name, is_columnar) == (signature, columnar)
    assert images.dtype == np.float32 and images.shape[1:] == (28, 28)
    np.testing.assert_array_equal(images[0], IMAGE)


@pytest.mark.parametrize(
    "raw, message",
    [
        pytest.param(b"", "JSON Parse error: the request body is empty", id="empty"),
        pytest.param(b"{", "JSON Parse error", id="truncated"),
        pytest.param(b'{"instances": [NaN]}', "JSON Parse error", id="nan-literal"),
        pytest.param(b"[1]", "Request body must be a JSON object, got list", id="not-object"),
        pytest.param(b"{}", "it has neither", id="neither"),
        pytest.param(b'{"instances": 3}', "instances: expected a list of 28x28 arrays, got a single number", id="number"),
        pytest.param(b'{"instances": []}', "instances: is empty", id="empty-list"),
        pytest.param(body({"instances": [IMAGE[:27]]}), "instances[0]: expected a 28x28 array of numbers, got shape (27, 28)", id="short"),
        pytest.param(body({"instances": [IMAGE, [[1] * 28] * 27 + [[1] * 5]]}), "instances[1]: expected a 28x28 array of numbers, got a ragged nested list", id="ragged"),
        pytest.param(body({"instances": [IMAGE, [[1] * 28] * 27 + [[1] * 27 + ["a"]]]}), "instances[1][27][27]: expected a number, got str 'a'", id="string-in-last-row"),
        pytest.param(body({"instances": [[[None] * 28] * 28]}), "instances[0][0][0]: expected a number, got NoneType", id="null"),
        pytest.param(body({"instances": [[[1e39] * 28] * 28]}), "instances[0]: values must be finite", id="past-float32"),
        pytest.param(body({"instances": [{"img": IMAGE}]}), "instances[0]: expected an object with the one input 'image', got ['img']", id="wrong-name"),
        pytest.param(body({"instances": [IMAGE], "signature_name": 3}), "'signature_name' must be a string", id="signature-type"),
    ],
)  # fmt: skip
def test_tf_serving_errors_say_where_and_what(raw, message):
    with pytest.raises(BadInput) as excinfo:
        codec.parse_tf_serving_request(raw, 64)
    assert message in excinfo.value.message


def test_pixel_instances_are_read_each_on_its_own():
    ints = (IMAGE * 255).astype(int)
    images = codec.decode_pixel_instances([ints.tolist(), IMAGE.tolist()], invert="auto")
    # The integers are 0-255 pixels, the floats already in [0, 1]: both give the same image.
    np.testing.assert_allclose(images[0], images[1], atol=1 / 255)


def test_b64_instances_decode_like_uploads():
    pixels = (IMAGE * 255).astype(np.uint8)
    item = {"b64": base64.b64encode(png_bytes(pixels)).decode()}
    images = codec.decode_pixel_instances([item], invert="no")
    np.testing.assert_allclose(images[0], pixels / 255.0, atol=1e-6)


@pytest.mark.parametrize(
    "instances, message",
    [
        pytest.param([IMAGE.tolist(), [[256] * 28] * 28], "instances[1]: integer pixels must be 0-255", id="int-range"),
        pytest.param([[[-0.5] * 28] * 28], "instances[0]: float pixels must be in [0, 1]", id="float-range"),
        pytest.param([IMAGE.tolist(), IMAGE.tolist(), [[1] * 28] * 3], "instances[2]: expected a 28x28 array of numbers, got shape (3, 28)", id="shape-names-its-index"),
        pytest.param([{"b64": "x", "more": 1}], 'instances[0]: expected a 28x28 array or {"b64": "<base64 image>"}', id="b64-extra-key"),
        pytest.param([{"b64": "not base64!"}], "instances[0].b64: not valid base64", id="b64-invalid"),
    ],
)  # fmt: skip
def test_pixel_instance_errors_name_the_instance(instances, message):
    with pytest.raises(BadInput) as excinfo:
        codec.decode_pixel_instances(instances, invert="auto")
    assert message in excinfo.value.message


@pytest.mark.parametrize(
    "content, message",
    [
        pytest.param([], 'Request body must be a JSON object with "instances"', id="list"),
        pytest.param({"inputs": []}, 'Request body must be a JSON object with "instances"', id="no-instances"),
        pytest.param({"instances": []}, "instances: is empty", id="empty"),
    ],
)  # fmt: skip
def test_pixel_request_shape(content, message):
    with pytest.raises(BadInput, match=message.replace("[", r"\[")):
        codec.pixel_instances(content)
