"""TF Serving's JSON (service/codecs/tfserving_json.py): inputs typed by any signature in the
row and columnar formats, TF Serving's words for what it refuses, and outputs rendered as TF
Serving renders them; the image contract's bodies, what is accepted and the message for
everything that is not, and its fast path (simdjson) against the general one (orjson).

Fast tier: signatures as typed values, no TensorFlow (served end to end against
tf.saved_model.load: tests/live/service/test_any_signature.py).
"""

from __future__ import annotations

import json

import numpy as np
import orjson
import pytest

from service.codecs import tfserving_json
from service.codecs.signatures import IMAGE_INPUT
from service.codecs.tfserving_json import read_inputs, render_outputs
from service.errors import BadInput, PayloadTooLarge
from service.types import SignatureSpec, TensorSpec

FLOAT, INT64, STRING = np.dtype(np.float32), np.dtype(np.int64), np.dtype(object)
TABULAR = SignatureSpec(
    "predict",
    "tensorflow/serving/predict",
    (
        TensorSpec("color", STRING, (-1,)),
        TensorSpec("rooms", INT64, (-1,)),
        TensorSpec("x1", FLOAT, (-1,)),
    ),
    (TensorSpec("probabilities", FLOAT, (-1, 3)),),
)
ONE = SignatureSpec("serving_default", "", (TensorSpec("pixels", FLOAT, (-1, 2, 2)),), ())
ROWS = [{"color": "red", "rooms": 3, "x1": 0.5}, {"color": "é", "rooms": -1, "x1": 2}]


def test_rows_of_objects_become_one_typed_array_per_input():
    inputs, columnar = read_inputs({"instances": ROWS}, TABULAR, 10)
    assert not columnar
    assert inputs["color"].dtype == object and list(inputs["color"]) == [b"red", "é".encode()]
    assert inputs["rooms"].dtype == np.int64 and inputs["rooms"].tolist() == [3, -1]
    assert inputs["x1"].dtype == np.float32 and inputs["x1"].tolist() == [0.5, 2.0]


def test_columns_and_b64_strings():
    body = {"inputs": {"color": [{"b64": "/w=="}, "b"], "rooms": [1, 2], "x1": [1.5, 2.5]}}
    inputs, columnar = read_inputs(body, TABULAR, 10)
    assert columnar and list(inputs["color"]) == [b"\xff", b"b"]


@pytest.mark.parametrize("body", [
    pytest.param({"instances": [[[1, 2], [3, 4]]]}, id="rows-bare"),
    pytest.param({"instances": [{"pixels": [[1, 2], [3, 4]]}]}, id="rows-named"),
    pytest.param({"inputs": [[[1, 2], [3, 4]]]}, id="columns-bare"),
    pytest.param({"inputs": {"pixels": [[[1, 2], [3, 4]]]}}, id="columns-named"),
])  # fmt: skip
def test_a_single_input_may_be_named_or_not(body):
    inputs, _ = read_inputs(body, ONE, 10)
    assert inputs["pixels"].shape == (1, 2, 2) and inputs["pixels"].dtype == np.float32


BAD = [
    pytest.param({"instances": [{"color": "r", "rooms": 1}]},
                 "Failed to process element: 0 of 'instances' list. JSON object: "
                 '{"color":"r","rooms":1} keys must be equal to: color,rooms,x1', id="missing"),
    pytest.param({"instances": [{**ROWS[0], "zz": 1}]},
                 "Failed to process element: 0 key: zz of 'instances' list. Error: "
                 "INVALID_ARGUMENT: JSON object: does not have named input: zz", id="unknown"),
    pytest.param({"instances": [{**ROWS[0], "rooms": 1.5}]},
                 "JSON Value: 1.5 Type: Number is not of expected type: int64; "
                 "instances[0].rooms", id="float-for-int"),
    pytest.param({"instances": [{**ROWS[0], "rooms": True}]},
                 "JSON Value: true Type: True is not of expected type: int64", id="bool-for-int"),
    pytest.param({"instances": [{**ROWS[0], "x1": [1, True]}]},
                 "JSON Value: true Type: True is not of expected type: float; "
                 "instances[0].x1[1]", id="bool-among-floats"),
    pytest.param({"instances": [{**ROWS[0], "x1": "1.5"}]},
                 'JSON Value: "1.5" Type: String is not of expected type: float',
                 id="string-for-float"),
    pytest.param({"instances": [{**ROWS[0], "color": 7}]},
                 "JSON Value: 7 Type: Number is not of expected type: string", id="number-for-string"),
    pytest.param({"instances": [{**ROWS[0], "rooms": 2**63}]},
                 "is not of expected type: int64", id="int64-overflow"),
    pytest.param({"instances": [{**ROWS[0], "x1": [1]}, {**ROWS[0], "x1": [1, 2]}]},
                 "Failed to process element: 1 of 'instances' list. Error: INVALID_ARGUMENT: "
                 "Expecting tensor size: 1 but got: 2", id="ragged"),
    pytest.param({"instances": [{**ROWS[0], "x1": [[1, 2], [3]]}]}, "lists of unequal lengths",
                 id="ragged-inside"),
    pytest.param({"instances": [{**ROWS[0], "x1": [1, 2]}]},
                 "instances: input 'x1' takes float [-1]; got shape [1,2]", id="rank"),
    pytest.param({"instances": [[1, 2]]}, "Expecting object but got list at item 0",
                 id="not-an-object"),
    pytest.param({"inputs": {"rooms": [1], "x1": [1.0]}},
                 "Missing named input: color in 'inputs' object.", id="columns-missing"),
    pytest.param({"inputs": {"color": ["a"], "rooms": [1, 2], "x1": [1.0]}},
                 "the inputs' batch sizes differ ([1, 2])", id="columns-batch"),
    pytest.param({"inputs": [1, 2]}, "the signature takes several inputs", id="columns-bare"),
    pytest.param({"instances": []}, "No values in 'instances' array", id="empty"),
    pytest.param({"instances": {}}, "Expecting 'instances' to be an list/array", id="not-a-list"),
    pytest.param({"instances": [], "inputs": []}, "expecting only one of 'inputs' or 'instances'",
                 id="both"),
    pytest.param({}, "Missing 'inputs' or 'instances' key", id="neither"),
    pytest.param({"inputs": {"color": [{"b64": "!!"}], "rooms": [1], "x1": [1.0]}},
                 "Unable to base64 decode", id="bad-b64"),
]  # fmt: skip


@pytest.mark.parametrize("body, expected", BAD)
def test_what_tf_serving_refuses_is_refused_in_its_words(body, expected):
    with pytest.raises(BadInput) as caught:
        read_inputs(body, TABULAR, 10)
    assert expected in caught.value.message


def test_too_many_instances():
    with pytest.raises(PayloadTooLarge):
        read_inputs({"instances": ROWS * 3}, TABULAR, 5)


def test_strict_numbers_refuse_nan():
    body = {"inputs": {"color": ["a"], "rooms": [1], "x1": [float("nan")]}}
    assert np.isnan(read_inputs(body, TABULAR, 10)[0]["x1"][0])
    with pytest.raises(BadInput, match=r"input 'x1'\[0\]: values must be finite"):
        read_inputs(body, TABULAR, 10, strict=True)


def dumps(key_value) -> dict:
    key, value = key_value
    # json reads TF Serving's NaN literal; orjson does not.
    return json.loads(orjson.dumps({key: value}, option=orjson.OPT_SERIALIZE_NUMPY))


def test_one_output_is_a_bare_value_per_instance():
    outputs = {"predictions": np.array([[1.5], [2.5]], np.float32)}
    assert dumps(render_outputs(outputs, False)) == {"predictions": [[1.5], [2.5]]}
    assert dumps(render_outputs(outputs, True)) == {"outputs": [[1.5], [2.5]]}


def test_several_outputs_are_objects_and_strings_are_text_or_base64():
    outputs = {
        "classes": np.array([[b"high"], [b"\xc3\xa9"]], object),
        "image_bytes": np.array([b"\xff\x00", b"a"], object),
        "scores": np.array([0.25, float("nan")], np.float32),
    }
    rows = dumps(render_outputs(outputs, False))["predictions"]
    assert rows[0] == {"classes": ["high"], "image_bytes": {"b64": "/wA="}, "scores": 0.25}
    assert rows[1]["classes"] == ["é"] and rows[1]["image_bytes"] == {"b64": "YQ=="}
    text = orjson.dumps(dict([render_outputs(outputs, False)]), option=orjson.OPT_SERIALIZE_NUMPY)
    assert b'"scores":NaN' in text  # TF Serving's literal, not null
    columns = dumps(render_outputs(outputs, True))["outputs"]
    assert columns["classes"] == [["high"], ["é"]]


def test_the_row_format_needs_one_batch_size():
    outputs = {"a": np.zeros(2), "b": np.zeros(3)}
    with pytest.raises(
        BadInput, match="Tensor name: b has inconsistent batch size: 3 expecting: 2"
    ):
        render_outputs(outputs, False)
    with pytest.raises(BadInput, match="Tensor name: s has no shape information"):
        render_outputs({"s": np.float32(1.0).reshape(())}, False)
    assert dumps(render_outputs({"s": np.array(1.0)}, True)) == {"outputs": 1.0}


# --- the image contract's bodies ------------------------------------------------------------

IMAGE_SIGNATURE = SignatureSpec("serving_default", "tensorflow/serving/predict", (IMAGE_INPUT,), ())


def parse_tf_serving_request(raw: bytes, max_images: int, strict: bool = True):
    """(signature name, float32 images, columnar) of a :predict body for the image contract:
    read_predict_request, then its tensors."""
    request = tfserving_json.read_predict_request(raw, max_images, strict)
    images = request.inputs(IMAGE_SIGNATURE, max_images)
    return request.signature_name, images, request.columnar


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
    name, images, is_columnar = parse_tf_serving_request(body(content), 64)
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
        parse_tf_serving_request(raw, 64)
    assert message in excinfo.value.message


# --- the row format's fast path (simdjson) against the general one (orjson) -----------------


def general(raw: bytes, max_images: int = 8):
    """parse_tf_serving_request's answer through the general path only: a result or the error."""
    simple, tfserving_json._usual_rows = tfserving_json._usual_rows, lambda *_: None
    try:
        return outcome(raw, max_images)
    finally:
        tfserving_json._usual_rows = simple


def outcome(raw: bytes, max_images: int = 8):
    try:
        name, images, columnar = parse_tf_serving_request(raw, max_images)
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
        assert tfserving_json._usual_rows(raw, 8) is not None
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


# --- tabular rows' fast path against the general one -------------------------------------

BOOL = np.dtype(np.bool_)
INT32 = np.dtype(np.int32)
WIDE = SignatureSpec(
    "predict",
    "tensorflow/serving/predict",
    (
        TensorSpec("color", STRING, (-1,)),
        TensorSpec("flag", BOOL, (-1,)),
        TensorSpec("rooms", INT64, (-1,)),
        TensorSpec("small", INT32, (-1,)),
        TensorSpec("x1", FLOAT, (-1,)),
    ),
    (TensorSpec("probabilities", FLOAT, (-1, 3)),),
)
ONE_SCALAR = SignatureSpec("s", "", (TensorSpec("x", FLOAT, (-1,)),), ())


def row(**changes):
    return {"color": "red", "flag": True, "rooms": 3, "small": -7, "x1": 0.5, **changes}


@pytest.mark.parametrize(
    "signature, instances",
    [
        pytest.param(WIDE, [row(), row(color="é", rooms=-(2**63), x1=2)], id="plain"),
        pytest.param(WIDE, [row(x1=1e300)], id="past-float32-is-inf"),
        pytest.param(WIDE, [row(x1=2**53 + 1)], id="an-integer-past-2**53-for-a-float"),
        pytest.param(WIDE, [row(x1=True)], id="a-bool-for-a-float"),
        pytest.param(WIDE, [row(rooms=3.0)], id="a-float-for-an-integer"),
        pytest.param(WIDE, [row(rooms=2**63)], id="past-int64"),
        pytest.param(WIDE, [row(small=2**31)], id="past-int32"),
        pytest.param(WIDE, [row(flag=1)], id="a-number-for-a-bool"),
        pytest.param(WIDE, [row(color={"b64": "/w=="})], id="b64"),
        pytest.param(WIDE, [row(color=["red"])], id="a-list-for-a-scalar"),
        pytest.param(WIDE, [row(x1=None)], id="null"),
        pytest.param(WIDE, [{**row(), "extra": 1}], id="an-extra-key"),
        pytest.param(WIDE, [{k: v for k, v in row().items() if k != "flag"}], id="a-missing-key"),
        pytest.param(WIDE, [row(), [1, 2]], id="a-list-for-an-instance"),
        pytest.param(ONE_SCALAR, [1.5, 2, -3e40], id="bare-scalars"),
        pytest.param(ONE_SCALAR, [{"x": 1.5}, {"x": 2}], id="one-named"),
        pytest.param(ONE_SCALAR, [1.5, {"x": 2}], id="bare-then-named"),
        pytest.param(ONE_SCALAR, [{"b64": "AAAA"}], id="b64-for-a-float"),
    ],
)
def test_scalar_rows_read_as_the_general_path_reads_them(monkeypatch, signature, instances):
    """The fast path (one conversion per input) gives the general path's arrays, dtypes and
    all; whatever it does not take, the general path reads, and its words are the answer."""

    def read():
        try:
            inputs, _ = read_inputs({"instances": instances}, signature, 10)
        except BadInput as err:
            return err.message
        return {name: (array.dtype, array.tolist()) for name, array in inputs.items()}

    fast = read()
    monkeypatch.setattr(tfserving_json, "_scalar_rows", lambda *args: None)
    assert fast == read()


def test_scalar_rows_take_the_fast_path():
    calls = []
    column = tfserving_json._scalar_column

    def counted(values, dtype):
        calls.append(dtype)
        return column(values, dtype)

    try:
        tfserving_json._scalar_column = counted
        inputs, _ = read_inputs({"instances": [row(), row()]}, WIDE, 10)
    finally:
        tfserving_json._scalar_column = column
    assert len(calls) == 5 and inputs["x1"].tolist() == [0.5, 0.5]
