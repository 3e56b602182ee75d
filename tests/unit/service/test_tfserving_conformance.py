"""TF Serving's own test cases, asked of this service's /v1 API: the request, the status and
the body as TensorFlow Serving 2.15.1 gives them.

Each case is ported from tensorflow/serving's `tensorflow_serving/util/json_tensor_test.cc`
or `tensorflow_serving/model_servers/http_rest_api_handler_test.cc` (file and test name in
its `source`), or, where TF Serving's behaviour is in its code and not in a test, from the
source file that does it. Only the cases that apply to this model's signature (one float32
input `image` [-1, 28, 28]; outputs `classes` and `probabilities`) or to routing and errors
are here; docs/protocols.md lists the others and why they do not apply. An error is checked
as TF Serving's tests check it: its status and TF Serving's words in the message (this
service adds where and what after them). Answers are compared whole, with
TFSERVING_EXTRA_KEYS off: TF Serving's keys and nothing else.

The real app over a fake backend (tests/service/fakes.py): no TensorFlow.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from support.fakes import MODEL_NAME, FakeBackend, app_client, toy_model

from artifact.contract import CLASSES_KEY, PROBABILITIES_KEY

JSON_TENSOR_TEST = "tensorflow_serving/util/json_tensor_test.cc"
HANDLER_TEST = "tensorflow_serving/model_servers/http_rest_api_handler_test.cc"
JSON_TENSOR = "tensorflow_serving/util/json_tensor.cc"
HANDLER = "tensorflow_serving/model_servers/http_rest_api_handler.cc"
REST_UTIL = "tensorflow_serving/model_servers/http_rest_api_util.cc"
STATUS_IMPL = "tensorflow_serving/model_servers/get_model_status_impl.cc"

PREDICT = f"/v1/models/{MODEL_NAME}:predict"
IMAGE = np.linspace(0.0, 1.0, 28 * 28, dtype=np.float32).reshape(28, 28)
ROWS = IMAGE.tolist()
DBL_MAX = sys.float_info.max
DBL_MIN = sys.float_info.min


def body(content) -> bytes:
    """Python's json: it writes NaN, Infinity and -Infinity as TF Serving reads them."""
    return json.dumps(content).encode()


class RecordingBackend(FakeBackend):
    """The fake backend, keeping the images each prediction got (what the model was fed)."""

    def __init__(self):
        super().__init__(versions=(1, 2))
        self.labels = {"stable": 2}
        self.fed: list[np.ndarray] = []

    async def predict(self, name, images, *args, **kwargs):
        self.fed.append(images.copy())
        with np.errstate(invalid="ignore", over="ignore"):  # NaN and Inf, as TF would take them
            return await super().predict(name, images, *args, **kwargs)


@pytest.fixture(scope="module")
def backend():
    return RecordingBackend()


@pytest.fixture(scope="module")
def client(backend):
    with app_client(backend, tfserving_extra_keys=False) as c:
        yield c


def error_of(response, status: int) -> str:
    assert response.status_code == status, response.text
    answer = response.json()
    assert set(answer) == {"error"}, answer
    return answer["error"]


# --- errors: (source, method, path, body, status, TF Serving's words) -----------------------

ERRORS = [
    # Routing (http_rest_api_handler_test.cc, UnsupportedApiCalls).
    pytest.param(f"{HANDLER_TEST} UnsupportedApiCalls", "GET", "/v1/foo", b"", 400, "Malformed request", id="get-v1-foo"),
    pytest.param(f"{HANDLER_TEST} UnsupportedApiCalls", "POST", "/v1/foo", b"", 400, "Malformed request", id="post-v1-foo"),
    pytest.param(f"{HANDLER_TEST} UnsupportedApiCalls", "GET", "/v1/models", b"", 400, "Missing model name in request.", id="get-no-model-name"),
    pytest.param(f"{HANDLER_TEST} UnsupportedApiCalls", "GET", "/v1/models/debug/model_name", b"", 400, "Malformed request", id="get-debug-path"),
    pytest.param(f"{HANDLER_TEST} UnsupportedApiCalls", "POST", "/v1/models", b"", 400, "Malformed request", id="post-models"),
    pytest.param(f"{HANDLER_TEST} UnsupportedApiCalls", "GET", "/v1/models/foo:predict", b"", 400, "Malformed request", id="get-predict"),
    pytest.param(f"{HANDLER_TEST} UnsupportedApiCalls", "GET", "/v1/models/foo/version/50:predict", b"", 400, "Malformed request", id="version-singular"),
    pytest.param(f"{HANDLER_TEST} UnsupportedApiCalls", "POST", "/v1/models/foo/versions/HELLO:predict", b"", 400, "Malformed request", id="version-not-a-number"),
    pytest.param(f"{HANDLER_TEST} UnsupportedApiCalls", "POST", f"/v1/models/foo/versions/{2**64 - 1}:predict", b"", 400, "Failed to convert version", id="version-past-int64"),
    pytest.param(f"{HANDLER_TEST} UnsupportedApiCalls", "POST", "/v1/models/foo/metadata", b"", 400, "Malformed request", id="post-metadata"),
    pytest.param(f"{HANDLER_TEST} UnsupportedApiCalls", "POST", "/v1/models/foo/label/some_label:predict", b"", 400, "Malformed request", id="label-singular"),
    pytest.param(f"{HANDLER_TEST} UnsupportedApiCalls", "POST", "/v1/models/foo/versions/50/labels/some_label:predict", b"", 400, "Malformed request", id="version-and-label"),
    pytest.param(f"{HANDLER_TEST} UnsupportedApiCalls", "POST", "/v1/models/foo/versions/some_label:predict", b"", 400, "Malformed request", id="label-as-version"),
    # The model, version and label are found before the instances are read
    # (http_rest_api_handler_test.cc, PredictModelNameVersionErrors: `[1]` is no image here).
    pytest.param(f"{HANDLER_TEST} PredictModelNameVersionErrors", "POST", "/v1/models/foo:predict", b'{ "instances": [1] }', 404, "Servable not found for request: Latest(foo)", id="unknown-model-bad-instances"),
    pytest.param(f"{HANDLER_TEST} PredictModelNameVersionErrors", "POST", "/v1/models/foo/versions/50:predict", b'{ "instances": [1] }', 404, "Servable not found for request: Specific(foo, 50)", id="unknown-model-version-bad-instances"),
    pytest.param(f"{HANDLER_TEST} PredictModelNameVersionErrors", "POST", f"/v1/models/{MODEL_NAME}/versions/99:predict", b'{ "instances": [1] }', 404, f"Servable not found for request: Specific({MODEL_NAME}, 99)", id="unknown-version-bad-instances"),
    pytest.param(f"{HANDLER_TEST} PredictRequestErrors", "POST", f"/v1/models/{MODEL_NAME}/labels/some_label:predict", b'{ "instances": ["x", "y"] }', 400, "Unrecognized servable version label", id="unknown-label-bad-instances"),
    # ... and the signature too (json_tensor.cc, FillPredictRequestFromJson: get_tensorinfo_map
    # before the instances; http_rest_api_handler.cc, GetInfoMap's words).
    pytest.param(f"{JSON_TENSOR} FillPredictRequestFromJson", "POST", PREDICT, b'{"signature_name": "nope", "instances": [1]}', 400, 'Serving signature name: "nope" not found in signature def', id="unknown-signature-bad-instances"),
    pytest.param(f"{JSON_TENSOR} FillPredictRequestFromJson", "POST", "/v1/models/foo:predict", b"{}", 404, "Servable not found for request: Latest(foo)", id="unknown-model-no-instances"),
    # But the JSON itself is read first: a body that is not JSON is 400 even for another model.
    pytest.param(f"{JSON_TENSOR} FillPredictRequestFromJson", "POST", "/v1/models/foo:predict", b"instances = [1, 2]", 400, "JSON Parse error: Invalid value", id="unknown-model-not-json"),
    # The body (http_rest_api_handler_test.cc, PredictRequestErrors).
    pytest.param(f"{HANDLER_TEST} PredictRequestErrors", "POST", PREDICT, b"", 400, "JSON Parse error: The document is empty", id="empty-body"),
    pytest.param(f"{HANDLER_TEST} PredictRequestErrors", "POST", PREDICT, b"instances = [1, 2]", 400, "JSON Parse error: Invalid value", id="not-json"),
    pytest.param(f"{HANDLER_TEST} PredictRequestErrors", "POST", PREDICT, b'{ "instances": ["x", "y"] }', 400, "not of expected type: float", id="strings-for-floats"),
    pytest.param(f"{HANDLER_TEST} PredictRequestErrors", "POST", PREDICT, b'{ "signature_name": 100 }', 400, "'signature_name' key must be a string value", id="signature-name-number"),
    # The tensors (json_tensor_test.cc, SingleUnnamedTensorErrors, with this model's float).
    pytest.param(f"{JSON_TENSOR_TEST} SingleUnnamedTensorErrors", "POST", PREDICT, b"", 400, "document is empty", id="tensor-empty-document"),
    pytest.param(f"{JSON_TENSOR_TEST} SingleUnnamedTensorErrors", "POST", PREDICT, b'{"signature_name": 5, "instances": [[1,2],[3,4],[5,6,7]]}', 400, "must be a string value", id="signature-before-instances"),
    pytest.param(f"{JSON_TENSOR_TEST} SingleUnnamedTensorErrors", "POST", PREDICT, b'{"instances": [[1,2],[3,4],[5,6,7]], "inputs": [[1,2],[3,4],[5,6,7]]}', 400, "Not formatted correctly", id="both-formats"),
    pytest.param(f"{JSON_TENSOR_TEST} SingleUnnamedTensorErrors", "POST", PREDICT, b'{"instances": [[1,2],[3,4],[5,6,7]]}', 400, "Expecting tensor size", id="tensor-size"),
    pytest.param(f"{JSON_TENSOR_TEST} SingleUnnamedTensorErrors", "POST", PREDICT, body({"instances": [ROWS, ROWS[:27]]}), 400, "Failed to process element: 1 of 'instances' list. Error: INVALID_ARGUMENT: Expecting tensor size: 784 but got: 756", id="image-size"),
    pytest.param(f"{JSON_TENSOR_TEST} SingleUnnamedTensorErrors", "POST", PREDICT, b'{"instances": [[1,2],[3,4],[[5,6]]]}', 400, "Expecting shape", id="tensor-shape"),
    pytest.param(f"{JSON_TENSOR_TEST} SingleUnnamedTensorErrors", "POST", PREDICT, b'{"instances": [1, [1]]}', 400, "Expecting shape", id="scalar-then-list"),
    pytest.param(f"{JSON_TENSOR_TEST} SingleUnnamedTensorErrors", "POST", PREDICT, b'{"instances": [[1,2],["a", "b"]]}', 400, "not of expected type", id="string-in-second-element"),
    pytest.param(f"{JSON_TENSOR_TEST} SingleUnnamedTensorErrors", "POST", PREDICT, body({"instances": [ROWS, [["a"] * 28] * 28]}), 400, "Failed to process element: 1 of 'instances' list. Error: INVALID_ARGUMENT: JSON Value: \"a\" Type: String is not of expected type: float", id="string-image"),
    # json_tensor.cc, FillPredictRequestFromJson and TypeError: no format, a boolean.
    pytest.param(f"{JSON_TENSOR} FillPredictRequestFromJson", "POST", PREDICT, b"{}", 400, "Missing 'inputs' or 'instances' key", id="no-format"),
    pytest.param(f"{JSON_TENSOR} TypeError", "POST", PREDICT, body({"instances": [[[True] * 28] * 28]}), 400, "JSON Value: true Type: True is not of expected type: float", id="boolean"),
    # json_tensor.cc, FillTensorMapFromInputsMap: the columnar object must hold the input.
    pytest.param(f"{JSON_TENSOR} FillTensorMapFromInputsMap", "POST", PREDICT, body({"inputs": {"pixels": [ROWS]}}), 400, "Missing named input: image in 'inputs' object.", id="columnar-without-input"),
    # json_tensor.cc, FillTensorMapFromInstancesList: a named instance with a key the
    # signature does not have.
    pytest.param(f"{JSON_TENSOR} FillTensorMapFromInstancesList", "POST", PREDICT, body({"instances": [{"image": ROWS, "extra": 1}]}), 400, "JSON object: does not have named input: extra", id="row-with-extra-key"),
    # TF Serving's patterns are case-insensitive, but names are names (http_rest_api_util.cc).
    pytest.param(f"{REST_UTIL} kPredictionApiGegex", "POST", f"/v1/models/{MODEL_NAME.upper()}:predict", body({"instances": [ROWS]}), 404, f"Servable not found for request: Latest({MODEL_NAME.upper()})", id="model-name-keeps-its-case"),
]  # fmt: skip


@pytest.mark.parametrize(("source", "method", "path", "content", "status", "words"), ERRORS)
def test_tf_serving_errors(client, source, method, path, content, status, words):
    message = error_of(client.request(method, path, content=content), status)
    assert words in message, f"{source}: {message}"


def predictions(images: np.ndarray, version: int = 2) -> list[dict]:
    """The row format's answer for images, computed from the fake's model, not the service."""
    with np.errstate(invalid="ignore", over="ignore"):  # NaN and Inf in, NaN out
        outputs = toy_model(version, images)
    return [
        {CLASSES_KEY: int(c), PROBABILITIES_KEY: p.tolist()}
        for c, p in zip(outputs[CLASSES_KEY], outputs[PROBABILITIES_KEY], strict=True)
    ]


def same_answer(got, expected) -> None:
    """JSON answers equal, floats to float32's precision (NaN equal to NaN)."""
    assert type(got) is type(expected), (got, expected)
    if isinstance(expected, dict):
        assert got.keys() == expected.keys(), (got, expected)
        for key in expected:
            same_answer(got[key], expected[key])
    elif isinstance(expected, list):
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            same_answer(g, e)
    elif isinstance(expected, float):
        np.testing.assert_allclose(got, expected, rtol=1e-6)
    else:
        assert got == expected


# --- answers: (source, path, request, what the model is fed, the answer's key) --------------

MIXED = [[1 if (r + c) % 2 else 0.5 for c in range(28)] for r in range(28)]
ANSWERS = [
    # http_rest_api_handler_test.cc, Predict: the row format answers `predictions`, the
    # columnar `outputs`; signature_name serving_default or none; a version by number.
    pytest.param(f"{HANDLER_TEST} Predict", PREDICT, {"instances": [ROWS, ROWS]}, np.stack([IMAGE, IMAGE]), "predictions", id="row"),
    pytest.param(f"{HANDLER_TEST} Predict", f"/v1/models/{MODEL_NAME}/versions/2:predict", {"signature_name": "serving_default", "instances": [ROWS]}, IMAGE[None], "predictions", id="row-signature-version"),
    pytest.param(f"{HANDLER_TEST} Predict", f"/v1/models/{MODEL_NAME}/versions/2:predict", {"signature_name": "serving_default", "inputs": [ROWS]}, IMAGE[None], "outputs", id="columnar"),
    # json_tensor_test.cc, SingleUnnamedTensorColumnarFormat, and FillTensorMapFromInputsMap:
    # only the signature's inputs are read from the columnar object.
    pytest.param(f"{JSON_TENSOR_TEST} SingleUnnamedTensorColumnarFormat", PREDICT, {"inputs": {"image": [ROWS]}}, IMAGE[None], "outputs", id="columnar-named"),
    pytest.param(f"{JSON_TENSOR} FillTensorMapFromInputsMap", PREDICT, {"inputs": {"image": [ROWS], "extra": [1, 2]}}, IMAGE[None], "outputs", id="columnar-extra-key"),
    # json_tensor_test.cc, MixedInputForFloatTensor: integers and floats in one float tensor.
    pytest.param(f"{JSON_TENSOR_TEST} MixedInputForFloatTensor", PREDICT, {"instances": [MIXED]}, np.array([MIXED], np.float32), "predictions", id="mixed-numbers"),
    # json_tensor_test.cc, FloatTensorThatExceedsMaxReturnsInf and ...MinReturnsZero.
    pytest.param(f"{JSON_TENSOR_TEST} FloatTensorThatExceedsMaxReturnsInf", PREDICT, {"instances": [[[DBL_MAX] * 28] * 28]}, np.full((1, 28, 28), np.inf, np.float32), "predictions", id="past-float-max-is-inf"),
    pytest.param(f"{JSON_TENSOR_TEST} FloatTensorThatExceedsMaxReturnsInf", PREDICT, {"instances": [[[-DBL_MAX] * 28] * 28]}, np.full((1, 28, 28), -np.inf, np.float32), "predictions", id="past-float-min-is-minus-inf"),
    pytest.param(f"{JSON_TENSOR_TEST} FloatTensorThatExceedsMinReturnsZero", PREDICT, {"instances": [[[DBL_MIN] * 28] * 28]}, np.zeros((1, 28, 28), np.float32), "predictions", id="below-float-min-is-zero"),
    # json_tensor.cc, ParseJson: rapidjson's kParseNanAndInfFlag reads the literals.
    pytest.param(f"{JSON_TENSOR} ParseJson", PREDICT, {"instances": [[[float("nan")] * 28] * 28]}, np.full((1, 28, 28), np.nan, np.float32), "predictions", id="nan-literal"),
    pytest.param(f"{JSON_TENSOR} ParseJson", PREDICT, {"instances": [[[float("inf"), float("-inf")] * 14] * 28]}, np.tile(np.array([np.inf, -np.inf], np.float32), (1, 28, 14)), "predictions", id="infinity-literals"),
    # TF Serving's patterns are RE2 with (?i) (http_rest_api_util.cc, kPredictionApiGegex).
    pytest.param(f"{REST_UTIL} kPredictionApiGegex", f"/V1/MODELS/{MODEL_NAME}/VERSIONS/2:PREDICT", {"instances": [ROWS]}, IMAGE[None], "predictions", id="upper-case-path"),
    pytest.param(f"{REST_UTIL} kPredictionApiGegex", f"/v1/Models/{MODEL_NAME}/Labels/stable:Predict", {"instances": [ROWS]}, IMAGE[None], "predictions", id="mixed-case-label-path"),
]  # fmt: skip


@pytest.mark.parametrize(("source", "path", "request_body", "fed", "key"), ANSWERS)
def test_tf_serving_answers(client, backend, source, path, request_body, fed, key):
    backend.fed.clear()
    response = client.post(path, content=body(request_body))
    assert response.status_code == 200, f"{source}: {response.text}"
    # The model got what TF Serving would have fed it.
    (images,) = backend.fed
    np.testing.assert_array_equal(images, fed)
    assert images.dtype == np.float32
    rows = predictions(fed)
    if key == "predictions":
        expected = {"predictions": rows}
    else:
        expected = {"outputs": {name: [row[name] for row in rows] for name in rows[0]}}
    # Python's json reads NaN and Infinity, as TF Serving writes them (json_tensor_test.cc,
    # FromJsonSingleFloatTensorNonFinite).
    same_answer(json.loads(response.content), expected)


def test_non_finite_outputs_are_written_as_tf_serving_writes_them(client):
    # json_tensor_test.cc, FromJsonSingleFloatTensorNonFinite: NaN, Infinity, -Infinity.
    response = client.post(PREDICT, content=body({"instances": [[[float("nan")] * 28] * 28]}))
    assert response.status_code == 200, response.text
    assert b'"probabilities":[NaN,NaN,' in response.content


# --- status and metadata --------------------------------------------------------------------


def status_of(*versions: int) -> dict:
    return {
        "model_version_status": [
            {
                "version": str(v),
                "state": "AVAILABLE",
                "status": {"error_code": "OK", "error_message": ""},
            }
            for v in versions
        ]
    }


@pytest.mark.parametrize(
    ("source", "path", "expected"),
    [
        pytest.param(f"{HANDLER_TEST} GetStatus", f"/v1/models/{MODEL_NAME}", status_of(2, 1), id="all-versions"),
        pytest.param(f"{HANDLER_TEST} GetStatus", f"/v1/models/{MODEL_NAME}/versions/1", status_of(1), id="one-version"),
        # GetModelStatus reads no label (get_model_status_impl.cc): every version, whatever
        # the label, known or not.
        pytest.param(f"{HANDLER_TEST} GetStatus; {STATUS_IMPL}", f"/v1/models/{MODEL_NAME}/labels/stable", status_of(2, 1), id="label"),
        pytest.param(STATUS_IMPL, f"/v1/models/{MODEL_NAME}/labels/no_such_label", status_of(2, 1), id="unknown-label"),
        pytest.param(f"{REST_UTIL} kModelsApiRegex", f"/V1/MODELS/{MODEL_NAME}/VERSIONS/1", status_of(1), id="upper-case"),
    ],
)  # fmt: skip
def test_tf_serving_status(client, source, path, expected):
    response = client.get(path)
    assert response.status_code == 200, f"{source}: {response.text}"
    assert response.json() == expected, source


def test_metadata_has_tf_serving_keys_only(client):
    # http_rest_api_handler_test.cc, GetModelMetadata: model_spec and metadata, nothing else.
    response = client.get(f"/V1/models/{MODEL_NAME}/Versions/1/METADATA")
    assert response.status_code == 200, response.text
    answer = response.json()
    assert set(answer) == {"model_spec", "metadata"}
    assert answer["model_spec"] == {"name": MODEL_NAME, "signature_name": "", "version": "1"}
    assert set(answer["metadata"]) == {"signature_def"}
