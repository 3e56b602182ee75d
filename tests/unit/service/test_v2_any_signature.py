"""The Open Inference Protocol for any signature (service/codecs/v2_rest.py, v2_grpc.py):
named inputs of the signature's datatypes, BYTES as JSON strings, Triton's length-prefixed
binary and gRPC's bytes_contents, both transports' words for what is refused, and BYTES
outputs; TF Serving's TensorProto for any input (service/codecs/tensor_proto.py) read through
its fields.

Fast tier: signatures as typed values, stand-in messages for TensorProto (no TensorFlow).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from service import v2_proto
from service.codecs.tensor_proto import fill_tensor_proto, read_tensor
from service.codecs.v2_grpc import parse_grpc_infer_request, render_grpc_infer_response
from service.codecs.v2_metadata import v2_signature_name
from service.codecs.v2_rest import parse_infer_request, render_infer_response
from service.errors import BadInput
from service.types import PredictResult, SignatureSpec, TensorSpec, batchable

FLOAT, INT64, STRING = np.dtype(np.float32), np.dtype(np.int64), np.dtype(object)
SIGNATURE = SignatureSpec(
    "predict",
    "tensorflow/serving/predict",
    (TensorSpec("color", STRING, (-1,)), TensorSpec("rooms", INT64, (-1,))),
    (TensorSpec("classes", STRING, (-1, 1)), TensorSpec("probabilities", FLOAT, (-1, 3))),
)


def body(*inputs, **extra) -> bytes:
    return json.dumps({"inputs": list(inputs), **extra}).encode()


COLOR = {"name": "color", "datatype": "BYTES", "shape": [2], "data": ["red", "é"]}
ROOMS = {"name": "rooms", "datatype": "INT64", "shape": [2], "data": [3, 4]}


def test_json_inputs_take_the_signatures_dtypes():
    parsed = parse_infer_request(body(COLOR, ROOMS), None, signature=SIGNATURE)
    assert list(parsed.inputs["color"]) == [b"red", "é".encode()]
    assert parsed.inputs["rooms"].dtype == np.int64 and parsed.inputs["rooms"].tolist() == [3, 4]


def test_binary_bytes_are_length_prefixed():
    blob = b"".join(len(w).to_bytes(4, "little") + w for w in (b"ab", b""))
    color = {"name": "color", "datatype": "BYTES", "shape": [2],
             "parameters": {"binary_data_size": len(blob)}}  # fmt: skip
    rooms = np.array([1, 2], "<i8").tobytes()
    room = {"name": "rooms", "datatype": "INT64", "shape": [2],
            "parameters": {"binary_data_size": len(rooms)}}  # fmt: skip
    header = body(color, room)
    parsed = parse_infer_request(header + blob + rooms, str(len(header)), signature=SIGNATURE)
    assert list(parsed.inputs["color"]) == [b"ab", b""]
    assert parsed.inputs["rooms"].tolist() == [1, 2]


BAD = [
    pytest.param([COLOR], "input 'rooms' is missing: the model takes 'color' (BYTES [-1]), "
                 "'rooms' (INT64 [-1])", id="missing"),
    pytest.param([COLOR, ROOMS, {**ROOMS, "name": "size"}], "unknown input 'size'", id="unknown"),
    pytest.param([COLOR, ROOMS, ROOMS], "input 'rooms' is given more than once", id="twice"),
    pytest.param([COLOR, {**ROOMS, "datatype": "FP32"}],
                 "input 'rooms': datatype FP32 does not match the model's INT64", id="datatype"),
    pytest.param([COLOR, {**ROOMS, "data": [3, 4.5]}],
                 "input 'rooms': 'data' must hold integers for INT64; element 1 is float '4.5'",
                 id="float-for-int"),
    pytest.param([COLOR, {**ROOMS, "data": [3, True]}], "element 1 is bool", id="bool-for-int"),
    pytest.param([{**COLOR, "data": ["a", 1]}, ROOMS],
                 "input 'color': 'data' must hold strings for BYTES; element 1 is int",
                 id="number-for-bytes"),
    pytest.param([COLOR, {**ROOMS, "shape": [2, 1]}],
                 "input 'rooms': shape [2, 1] does not match the model's [-1]", id="rank"),
    pytest.param([COLOR, {**ROOMS, "shape": [3]}],
                 "input 'rooms': shape [3] takes 3 values; 'data' has 2", id="count"),
    pytest.param([COLOR, {**ROOMS, "shape": [1], "data": [1]}],
                 "the inputs' batch sizes differ ([1, 2])", id="batch-sizes"),
]  # fmt: skip


@pytest.mark.parametrize("inputs, expected", BAD)
def test_bad_inputs_are_named(inputs, expected):
    with pytest.raises(BadInput) as caught:
        parse_infer_request(body(*inputs), None, signature=SIGNATURE)
    assert expected in caught.value.message


@pytest.mark.parametrize("datatype", ["unsupported", "FP32"])
def test_an_input_no_datatype_holds_is_refused_whatever_it_is_sent_as(datatype):
    """A model input of a TensorFlow type numpy has no match for (dtype None)."""
    odd = SignatureSpec("predict", "tensorflow/serving/predict",
                        (TensorSpec("odd", None, (-1,)),), (TensorSpec("out", FLOAT, (-1,)),))  # fmt: skip
    sent = {"name": "odd", "datatype": datatype, "shape": [1], "data": [1]}
    with pytest.raises(BadInput) as caught:
        parse_infer_request(body(sent), None, signature=odd)
    assert caught.value.message == (
        "input 'odd': the model takes it as a TensorFlow type, which no Open Inference "
        "Protocol datatype holds"
    )


def test_outputs_asked_for_are_the_signatures():
    parsed = parse_infer_request(
        body(COLOR, ROOMS, outputs=[{"name": "classes"}]), None, signature=SIGNATURE
    )
    assert list(parsed.outputs) == ["classes"]
    with pytest.raises(BadInput, match="unknown output 'logits': the model's outputs are"):
        parse_infer_request(
            body(COLOR, ROOMS, outputs=[{"name": "logits"}]), None, signature=SIGNATURE
        )


def result() -> PredictResult:
    outputs = {
        "classes": np.array([[b"high"], [b"\xc3\xa9"]], object),
        "probabilities": np.full((2, 3), 1 / 3, np.float32),
    }
    return PredictResult("m", 1, outputs, ())


def test_bytes_outputs_as_json_text_and_as_binary():
    parsed = parse_infer_request(body(COLOR, ROOMS), None, signature=SIGNATURE)
    answer = json.loads(render_infer_response(result(), parsed).body)
    classes = next(o for o in answer["outputs"] if o["name"] == "classes")
    assert classes == {"name": "classes", "datatype": "BYTES", "shape": [2, 1],
                       "data": ["high", "é"]}  # fmt: skip
    binary = parse_infer_request(
        body(COLOR, ROOMS, parameters={"binary_data_output": True}), None, signature=SIGNATURE
    )
    response = render_infer_response(result(), binary)
    header = int(response.headers["Inference-Header-Content-Length"])
    assert response.body[header:].startswith(b"\x04\x00\x00\x00high\x02\x00\x00\x00\xc3\xa9")


def test_grpc_typed_contents_and_bytes_outputs():
    request = v2_proto.ModelInferRequest(model_name="m")
    request.inputs.add(name="color", datatype="BYTES", shape=[1]).contents.bytes_contents.append(
        b"red"
    )
    request.inputs.add(name="rooms", datatype="INT64", shape=[1]).contents.int64_contents.append(7)
    parsed = parse_grpc_infer_request(request, signature=SIGNATURE)
    assert parsed.inputs["rooms"].dtype == np.int64 and parsed.inputs["rooms"].tolist() == [7]
    assert list(parsed.inputs["color"]) == [b"red"]
    response = render_grpc_infer_response(result(), parsed)
    classes = next(o for o in response.outputs if o.name == "classes")
    assert list(classes.contents.bytes_contents) == [b"high", b"\xc3\xa9"]
    request.inputs[1].contents.ClearField("int64_contents")
    request.inputs[1].contents.fp32_contents.append(7.0)
    with pytest.raises(BadInput, match="its values are in contents.fp32_contents; INT64 takes"):
        parse_grpc_infer_request(request, signature=SIGNATURE)


def test_the_served_signature():
    assert v2_signature_name({"predict": 1}) == "predict"
    assert v2_signature_name({"predict": 1, "serving_default": 2}) == "serving_default"
    assert v2_signature_name({"a": 1, "b": 2}) is None


def test_a_signature_without_a_batch_dimension_is_not_batchable():
    assert batchable(SIGNATURE)
    fixed = SignatureSpec("f", "", (TensorSpec("x", FLOAT, (3,)),), (TensorSpec("y", FLOAT, (3,)),))
    assert not batchable(fixed)
    unknown = SignatureSpec(
        "u", "", (TensorSpec("x", FLOAT, (-1,)),), (TensorSpec("y", FLOAT, None),)
    )
    assert not batchable(unknown)


# --- TF Serving's TensorProto, for any input ------------------------------------------------


def proto(dtype: int, dims, **fields):
    """A stand-in TensorProto: its fields only, as service/codecs/tensor_proto.py reads them."""
    shape = SimpleNamespace(unknown_rank=False, dim=[SimpleNamespace(size=d) for d in dims])
    empty = {f: [] for f in ("float_val", "int64_val", "string_val", "int_val", "half_val")}
    values = {"tensor_content": b"", **empty, **fields}
    return SimpleNamespace(dtype=dtype, tensor_shape=shape, **values)


def test_tensor_protos_of_any_input():
    ids = TensorSpec("ids", INT64, (-1,))
    assert read_tensor(proto(9, [2], int64_val=[5, 6]), ids, 0).tolist() == [5, 6]
    raw = proto(9, [2], tensor_content=np.array([1, 2], "<i8").tobytes())
    assert read_tensor(raw, ids, 0).tolist() == [1, 2]
    words = TensorSpec("w", STRING, (-1,))
    assert list(read_tensor(proto(7, [2], string_val=[b"a", b"b"]), words, 1)) == [
        b"a",
        b"b",
    ]
    with pytest.raises(BadInput, match=r"Expects arg\[0\] to be int64 but float is provided"):
        read_tensor(proto(1, [2], float_val=[1.0, 2.0]), ids, 0)
    with pytest.raises(
        BadInput, match=r"input 'ids' has shape \[2, 1\]; the signature takes \[-1\]"
    ):
        read_tensor(proto(9, [2, 1], int64_val=[1, 2]), ids, 0)
    with pytest.raises(BadInput, match="int64_val has 3 values; shape"):
        read_tensor(proto(9, [2], int64_val=[1, 2, 3]), ids, 0)


class _Dims(list):
    def add(self):
        self.append(SimpleNamespace(size=None))
        return self[-1]


def test_string_outputs_go_in_string_val():
    message = SimpleNamespace(dtype=0, tensor_shape=SimpleNamespace(dim=_Dims()), string_val=[])
    fill_tensor_proto(message, np.array([b"x", b"yz"], object))
    assert message.dtype == 7 and message.string_val == [b"x", b"yz"]
    assert [d.size for d in message.tensor_shape.dim] == [2]
