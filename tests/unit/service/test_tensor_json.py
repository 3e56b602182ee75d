"""TF Serving's JSON tensors for any signature (service/tensor_json.py): inputs typed by the
signature in the row and columnar formats, TF Serving's words for what it refuses, and
outputs rendered as TF Serving renders them.

Fast tier: signatures as typed values, no TensorFlow (served end to end against
tf.saved_model.load: tests/live/service/test_any_signature.py).
"""

from __future__ import annotations

import json

import numpy as np
import orjson
import pytest

from service.errors import BadInput, PayloadTooLarge
from service.tensor_json import read_inputs, render_outputs
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
