"""The friendly /predict's JSON (service/codecs/simple_json.py): the image contract's pixel
instances (integers 0-255 or floats in [0, 1], base64 image files), what is accepted and the
message for everything that is not, and the usual body's fast path (simdjson) against the
general one (orjson)."""

from __future__ import annotations

import base64

import numpy as np
import orjson
import pytest
from support.helpers import png_bytes

from artifact.images import MNIST_INPUT
from service.codecs import simple_json
from service.errors import BadInput

IMAGE = np.linspace(0, 1, 28 * 28, dtype=np.float32).reshape(28, 28)


def test_pixel_instances_are_read_each_on_its_own():
    ints = (IMAGE * 255).astype(int)
    images = simple_json.decode_pixel_instances([ints.tolist(), IMAGE.tolist()], invert="auto")
    # The integers are 0-255 pixels, the floats already in [0, 1]: both give the same image.
    np.testing.assert_allclose(images[0], images[1], atol=1 / 255)


def test_b64_instances_decode_like_uploads():
    pixels = (IMAGE * 255).astype(np.uint8)
    item = {"b64": base64.b64encode(png_bytes(pixels)).decode()}
    images = simple_json.decode_pixel_instances([item], invert="no")
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
        simple_json.decode_pixel_instances(instances, invert="auto")
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
        simple_json.pixel_instances(content)


# --- the friendly /predict's pixel arrays: the fast path against the general one ------------


def friendly(raw: bytes, fast: bool = True):
    """What /predict makes of the image contract's JSON body (read_images, then decode):
    images or the error."""
    simple = simple_json.usual_pixel_images
    if not fast:
        simple_json.usual_pixel_images = lambda *_: None
    try:
        images = simple_json.read_images(raw, MNIST_INPUT, True, 8).decode("auto", 48_000_000)
    except Exception as err:  # noqa: BLE001 - compared as (type, message)
        return type(err).__name__, str(err)
    finally:
        simple_json.usual_pixel_images = simple
    return images.dtype.str, images.shape, images.tobytes()


def random_pixels(rng: np.random.Generator) -> bytes:
    images = []
    for _ in range(int(rng.integers(1, 5))):
        kind = rng.choice(["int", "unit", "int-out", "float-out", "whole-floats"])
        if kind == "int":
            image = rng.integers(0, 256, (28, 28)).tolist()
        elif kind == "unit":
            image = np.round(rng.random((28, 28)), 3).tolist()
        elif kind == "int-out":
            image = rng.integers(-3, 259, (28, 28)).tolist()
        elif kind == "float-out":
            image = (rng.random((28, 28)) * 1.01).tolist()
        else:
            image = rng.integers(0, 2, (28, 28)).astype(float).tolist()  # 0.0 and 1.0
        images.append(image)
    return orjson.dumps({"instances": images})


def test_pixel_bodies_read_the_same_both_ways():
    rng = np.random.default_rng(11)
    taken = 0
    for _ in range(200):
        raw = random_pixels(rng)
        taken += simple_json.usual_pixel_images(raw, 8) is not None
        assert friendly(raw) == friendly(raw, fast=False)
    assert taken == 200


PIXEL_ROW = "[" + ",".join(["7"] * 28) + "]"
PIXEL_IMAGE = "[" + ",".join([PIXEL_ROW] * 28) + "]"


@pytest.mark.parametrize(
    "raw",
    [
        f'{{"instances": [{PIXEL_IMAGE}], "other": 1}}',
        f'{{"instances": [{PIXEL_IMAGE}], "instances": 5}}',
        f'{{"instances": [{PIXEL_IMAGE.replace("7", "9223372036854775808", 1)}]}}',
        f'{{"instances": [{PIXEL_IMAGE.replace("7", "18446744073709551615", 1)}]}}',
        f'{{"instances": [{PIXEL_IMAGE.replace("7", "9223372036854775808")}]}}',
        f'{{"instances": [{PIXEL_IMAGE.replace("7", "-1", 1)}]}}',
        f'{{"instances": [{PIXEL_IMAGE.replace("7", "7.0", 1)}]}}',
        f'{{"instances": [{PIXEL_IMAGE.replace("7", "1e2", 1)}]}}',
        f'{{"instances": [{PIXEL_IMAGE.replace("7", "true", 1)}]}}',
        f'{{"instances": [{PIXEL_IMAGE}, {{"b64": "AAAA"}}]}}',
        f'{{"instances": [{", ".join([PIXEL_IMAGE] * 9)}]}}',
        f'{{"instances": [{PIXEL_IMAGE.replace(PIXEL_ROW, "[[],[1,2]," + ",".join(["7"] * 26) + "]", 1)}]}}',
        '{"instances": []}',
        "\ufeff" + f'{{"instances": [{PIXEL_IMAGE}]}}',
        f'{{"instances": [{PIXEL_IMAGE.replace("7", str(2**63 + 1), 1)}]}}',
        f'{{"instances": [{PIXEL_IMAGE.replace("7", "0.5", 1)}]}}',
    ],
    ids=lambda raw: raw[:12] + "..." + raw[-30:] if len(raw) > 50 else raw,
)
def test_unusual_pixel_bodies_read_as_the_general_path_reads_them(raw):
    assert friendly(raw.encode()) == friendly(raw.encode(), fast=False)
