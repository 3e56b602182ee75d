"""ModelInferRequest to images and results to ModelInferResponse (service/codecs/v2_grpc.py):
typed contents and raw_input_contents give the same images, and every bad request gets the
HTTP route's words with the field named as gRPC names it.

Fast tier: no TensorFlow, no server (the server: tests/live/service/test_v2_grpc.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from service import v2_proto
from service.codecs.v2_grpc import parse_grpc_infer_request, render_grpc_infer_response
from service.errors import BadInput, PayloadTooLarge
from service.types import PredictResult

IMAGES = np.random.default_rng(9).random((2, 28, 28)).astype(np.float32)


def typed_request(images: np.ndarray = IMAGES, **tensor) -> v2_proto.ModelInferRequest:
    request = v2_proto.ModelInferRequest(model_name="m")
    fields = {"name": "image", "datatype": "FP32", "shape": list(images.shape), **tensor}
    request.inputs.add(**fields).contents.fp32_contents.extend(images.ravel().tolist())
    return request


def raw_request(images: np.ndarray = IMAGES, **tensor) -> v2_proto.ModelInferRequest:
    request = v2_proto.ModelInferRequest(model_name="m")
    request.inputs.add(
        **{"name": "image", "datatype": "FP32", "shape": list(images.shape), **tensor}
    )
    request.raw_input_contents.append(images.astype("<f4").tobytes())
    return request


@pytest.mark.parametrize("make", [typed_request, raw_request], ids=["typed", "raw"])
def test_both_forms_give_the_images(make):
    parsed = parse_grpc_infer_request(make())
    np.testing.assert_array_equal(parsed.inputs, IMAGES)
    assert parsed.inputs.dtype == np.float32 and parsed.outputs is None
    assert parsed.binary_output == (make is raw_request)


def test_requested_outputs_and_the_id():
    request = raw_request()
    request.id = "42"
    request.outputs.add(name="probabilities")
    request.outputs.add(name="classes")
    parsed = parse_grpc_infer_request(request)
    assert parsed.id == "42" and list(parsed.outputs) == ["probabilities", "classes"]


def test_the_count_is_checked_before_the_values_are_read():
    counted = []

    def check(count):
        counted.append(count)
        raise PayloadTooLarge("too many")

    with pytest.raises(PayloadTooLarge):
        parse_grpc_infer_request(raw_request(), check)
    assert counted == [2]


def _with(request, change):
    change(request)
    return request


NAN = IMAGES.copy()
NAN[1, 3, 4] = np.nan
BAD = [
    pytest.param(v2_proto.ModelInferRequest(model_name="m"), "'inputs' must hold the model's one input, 'image' (FP32 [-1, 28, 28])", id="no-inputs"),
    pytest.param(typed_request(name="pixels"), "unknown input 'pixels': the model takes one input, 'image' (FP32 [-1, 28, 28])", id="unknown-input"),
    pytest.param(_with(typed_request(), lambda r: r.inputs.append(r.inputs[0])), "input 'image' is given 2 times; send it once", id="input-twice"),
    pytest.param(typed_request(datatype="FP64"), "input 'image': datatype FP64 does not match the model's FP32", id="datatype"),
    pytest.param(typed_request(datatype="FLOAT"), "input 'image': unknown datatype 'FLOAT'", id="unknown-datatype"),
    pytest.param(typed_request(shape=[2, 784]), "input 'image': shape [2, 784] does not match the model's [-1, 28, 28]", id="shape"),
    pytest.param(typed_request(shape=[-2, 28, 28]), "input 'image': 'shape' must hold non-negative integers, got [-2, 28, 28]", id="negative-shape"),
    pytest.param(typed_request(IMAGES[:0]), "input 'image' has no images (shape [0, 28, 28])", id="no-images"),
    pytest.param(typed_request(shape=[3, 28, 28]), "input 'image': shape [3, 28, 28] takes 2352 values; contents.fp32_contents has 1568", id="too-few-values"),
    pytest.param(_with(v2_proto.ModelInferRequest(model_name="m"), lambda r: r.inputs.add(name="image", datatype="FP32", shape=[1, 28, 28]).contents.fp64_contents.extend([0.0] * 784)), "input 'image': its values are in contents.fp64_contents; FP32 takes contents.fp32_contents", id="wrong-contents-field"),
    pytest.param(raw_request(shape=[3, 28, 28]), "input 'image': raw_input_contents[0] has 6272 bytes; shape [3, 28, 28] of FP32 takes 9408", id="raw-size"),
    pytest.param(_with(raw_request(), lambda r: r.raw_input_contents.append(b"")), "raw_input_contents has 2 entries for 1 inputs; send one per input, in the order of 'inputs'", id="raw-count"),
    pytest.param(_with(raw_request(), lambda r: r.inputs[0].contents.fp32_contents.append(1.0)), "input 'image' sets contents, but the request has raw_input_contents", id="raw-and-contents"),
    pytest.param(typed_request(NAN), "input 'image'[1]: values must be finite numbers", id="nan-typed"),
    pytest.param(raw_request(NAN), "input 'image'[1]: values must be finite numbers", id="nan-raw"),
    pytest.param(_with(raw_request(), lambda r: r.outputs.add(name="logits")), "unknown output 'logits': the model's outputs are 'classes', 'probabilities'", id="unknown-output"),
    pytest.param(_with(raw_request(), lambda r: [r.outputs.add(name="classes") for _ in "ab"]), "output 'classes' is requested twice", id="output-twice"),
    pytest.param(_with(raw_request(), lambda r: r.outputs.add(name="probabilities").parameters["classification"].MergeFrom(v2_proto.InferParameter(int64_param=3))), "output 'probabilities': the classification extension is not supported", id="classification"),
]  # fmt: skip


@pytest.mark.parametrize("request_, fragment", BAD)
def test_bad_requests_say_what_is_wrong(request_, fragment):
    with pytest.raises(BadInput) as caught:
        parse_grpc_infer_request(request_)
    assert fragment in caught.value.message


RESULT = PredictResult(
    "m",
    3,
    {
        "classes": np.array([4, 1], np.int64),
        "probabilities": np.linspace(0, 1, 20, dtype=np.float32).reshape(2, 10),
    },
    ("a",) * 10,
)


def test_a_raw_request_is_answered_raw_in_the_order_asked():
    request = raw_request()
    request.id = "7"
    request.outputs.add(name="probabilities")
    request.outputs.add(name="classes")
    response = render_grpc_infer_response(RESULT, parse_grpc_infer_request(request))
    assert (response.model_name, response.model_version, response.id) == ("m", "3", "7")
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("probabilities", "FP32", [2, 10]),
        ("classes", "INT64", [2]),
    ]
    assert not any(o.HasField("contents") for o in response.outputs)
    probabilities, classes = response.raw_output_contents
    np.testing.assert_array_equal(
        np.frombuffer(probabilities, "<f4"), RESULT.outputs["probabilities"].ravel()
    )
    np.testing.assert_array_equal(np.frombuffer(classes, "<i8"), [4, 1])


def test_a_typed_request_is_answered_in_typed_contents():
    response = render_grpc_infer_response(RESULT, parse_grpc_infer_request(typed_request()))
    assert not response.raw_output_contents and response.id == ""
    classes, probabilities = response.outputs
    assert classes.name == "classes" and list(classes.contents.int64_contents) == [4, 1]
    np.testing.assert_allclose(
        probabilities.contents.fp32_contents, RESULT.outputs["probabilities"].ravel()
    )
