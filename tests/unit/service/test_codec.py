"""JSON bodies to numpy: what is accepted, and the message for everything that is not."""

from __future__ import annotations

import base64

import numpy as np
import orjson
import pytest
from support.helpers import png_bytes

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
        pytest.param(b"", "JSON Parse error: The document is empty", id="empty"),
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
        pytest.param(body({"instances": [IMAGE], "signature_name": 3}), "'signature_name' key must be a string value", id="signature-type"),
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


# --- the row format's fast path (simdjson) against the general one (orjson) -----------------


def general(raw: bytes, max_images: int = 8):
    """parse_tf_serving_request's answer through the general path only: a result or the error."""
    simple, codec._simple_rows = codec._simple_rows, lambda *_: None
    try:
        return outcome(raw, max_images)
    finally:
        codec._simple_rows = simple


def outcome(raw: bytes, max_images: int = 8):
    try:
        name, images, columnar = codec.parse_tf_serving_request(raw, max_images)
    except Exception as err:  # noqa: BLE001 - compared as (type, message)
        return type(err).__name__, str(err)
    return name, images.dtype.str, images.shape, images.tobytes(), columnar


def random_rows(rng: np.random.Generator) -> bytes:
    n = int(rng.integers(1, 5))
    kind = rng.choice(["unit", "int", "wide", "mixed", "rounded"])
    if kind == "unit":
        values = rng.random((n, 28, 28))
    elif kind == "int":
        values = rng.integers(0, 256, (n, 28, 28))
    elif kind == "wide":
        values = rng.normal(0, 1e30, (n, 28, 28))
    elif kind == "rounded":
        values = np.round(rng.random((n, 28, 28)), 4)
    else:
        values = rng.random((n, 28, 28)).astype(object)
        values[rng.random((n, 28, 28)) < 0.5] = int(rng.integers(-5, 300))
    content = {"instances": values.tolist()}
    if rng.random() < 0.3:
        content["signature_name"] = str(rng.choice(["", "serving_default", "classify"]))
    text = orjson.dumps(content)
    if rng.random() < 0.3:
        text = text.replace(b",", b" ,\n ").replace(b":", b" : ")  # whitespace anywhere
    return text


def test_the_fast_path_takes_the_usual_bodies_and_reads_them_as_the_general_one():
    rng = np.random.default_rng(7)
    for _ in range(200):
        raw = random_rows(rng)
        assert codec._simple_rows(raw, 8) is not None
        assert outcome(raw) == general(raw)


ROW = "[" + ",".join(["0.5"] * 28) + "]"
IMAGE_TEXT = "[" + ",".join([ROW] * 28) + "]"
# A row of 28 elements whose nesting keeps the flattened count at 28.
COMPENSATED = "[[],[1,2]," + ",".join(["0.5"] * 26) + "]"


@pytest.mark.parametrize(
    "raw",
    [
        f'{{"instances": [{IMAGE_TEXT}], "instances": [{IMAGE_TEXT}, {IMAGE_TEXT}]}}',
        f'{{"instances": [{IMAGE_TEXT}], "instances": 5}}',
        f'{{"instances": 5, "instances": [{IMAGE_TEXT}]}}',
        f'{{"instances": [{IMAGE_TEXT.replace(ROW, COMPENSATED, 1)}]}}',
        f'{{"instances": [{IMAGE_TEXT.replace(ROW, COMPENSATED, 1)}], "signature_name": "]"}}',
        f'{{"instances": [{IMAGE_TEXT}], "signature_name": "[["}}',
        f'{{"instances": [{IMAGE_TEXT}], "signature_name": 5}}',
        f'{{"instances": [{IMAGE_TEXT}], "extra": 1}}',
        f'{{"instances": [{IMAGE_TEXT}], "inputs": [{IMAGE_TEXT}]}}',
        f'{{"instances": [{IMAGE_TEXT.replace("0.5", "true", 1)}]}}',
        f'{{"instances": [{IMAGE_TEXT.replace("0.5", "null", 1)}]}}',
        f'{{"instances": [{IMAGE_TEXT.replace("0.5", chr(34) + "1" + chr(34), 1)}]}}',
        f'{{"instances": [{IMAGE_TEXT.replace("0.5", "{}", 1)}]}}',
        f'{{"instances": [{IMAGE_TEXT.replace("0.5", "1e400", 1)}]}}',
        f'{{"instances": [{IMAGE_TEXT.replace("0.5", "1e39", 1)}]}}',
        f'{{"instances": [{IMAGE_TEXT.replace("0.5", "-0", 1)}]}}',
        f'{{"instances": [{IMAGE_TEXT.replace("0.5", "99999999999999999999999", 1)}]}}',
        f'{{"instances": [{IMAGE_TEXT.replace("0.5", "18446744073709551615", 1)}]}}',
        f'{{"instances": [{IMAGE_TEXT.replace("0.5", "NaN", 1)}]}}',
        f'{{"instances": [{IMAGE_TEXT.replace("0.5", "1")}]}}',
        f'{{"instances": [{IMAGE_TEXT.replace("0.5", str(2**62 + 2**38 + 1))}]}}',
        f'{{"instances": [{IMAGE_TEXT.replace("0.5", str(2**62 + 2**38 + 1), 1)}]}}',
        f'{{"instances": [{IMAGE_TEXT.replace("0.5", str(2**63 + 2**40 + 1))}]}}',
        f'{{"instances": [{IMAGE_TEXT.replace("0.5", str(2**63 + 2**40 + 1), 1)}]}}',
        f'{{"instances": [{IMAGE_TEXT.replace("0.5", "-1", 1).replace("0.5", str(2**63))}]}}',
        "\ufeff" + f'{{"instances": [{IMAGE_TEXT}]}}',
        f'{{"instances": [{IMAGE_TEXT.replace(ROW, ROW[:-1] + ",0.5]", 1)}]}}',
        f'{{"instances": [{IMAGE_TEXT[:-1] + "," + ROW + "]"}]}}',
        f'{{"instances": [{IMAGE_TEXT}]}} trailing',
        f'{{"instances": [{IMAGE_TEXT}]',
        f'{{"instances": [{{"image": {IMAGE_TEXT}}}]}}',
        f'{{"instances": {IMAGE_TEXT}}}',
        f'{{"instances": [{", ".join([IMAGE_TEXT] * 9)}]}}',
        '{"instances": []}',
        '{"instances": 1}',
        f"[{IMAGE_TEXT}]",
        "",
        "\xff",
    ],
    ids=lambda raw: raw[:12] + "..." + raw[-12:] if len(raw) > 30 else raw,
)
def test_anything_unusual_is_read_as_the_general_path_reads_it(raw):
    data = raw.encode("utf-8", "surrogateescape") if raw != "\xff" else b"\xff"
    assert outcome(data) == general(data)


# --- the friendly /predict's pixel arrays: the fast path against the general one ------------


def friendly(raw: bytes, fast: bool = True):
    """What /predict makes of a JSON body (PeopleAPI._json_images): images or the error."""
    import types

    from service.errors import check_image_count
    from service.protocols.people import PeopleAPI

    dataplane = types.SimpleNamespace(
        max_images=8, check_image_count=lambda n: check_image_count(n, 8)
    )
    api = PeopleAPI(dataplane, 200_000, 48_000_000)
    simple = codec.simple_pixel_images
    if not fast:
        codec.simple_pixel_images = lambda *_: None
    try:
        images = api._json_images(raw, "auto")
    except Exception as err:  # noqa: BLE001 - compared as (type, message)
        return type(err).__name__, str(err)
    finally:
        codec.simple_pixel_images = simple
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
        taken += codec.simple_pixel_images(raw, 8) is not None
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
