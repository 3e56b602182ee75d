"""Models of other contracts than Fashion-MNIST's, served side by side from one model config
by a real `python -m service`, through TF Serving's REST and gRPC APIs and the Open Inference
Protocol (REST and gRPC); every answer is held against `tf.saved_model.load` in this process,
value for value.

The models (tests/support/any_models.py): a pre-made LinearClassifier with label_vocabulary
and a string categorical column behind a raw receiver (only a `predict` signature), a
DNNRegressor, a CNN on 32x32x3 images, and a tf.Module with int64 and string inputs, string
outputs and a signature whose input has no batch dimension.
"""

from __future__ import annotations

import base64
import concurrent.futures
import shutil
from collections.abc import Iterator

import grpc
import httpx
import numpy as np
import pytest
import tensorflow as tf
from support.any_models import CITY_ROWS, ROWS
from support.helpers import error_message
from support.servers import start_server, wait_for
from support.tf_reference import columns, reference, serialized, tf_example
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from service import v2_proto

TIMEOUT = 60.0


@pytest.fixture(scope="module")
def client(any_server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=any_server.url, timeout=TIMEOUT) as c:
        yield c


@pytest.fixture(scope="module")
def stub(any_server) -> Iterator[prediction_service_pb2_grpc.PredictionServiceStub]:
    with grpc.insecure_channel(f"127.0.0.1:{any_server.grpc_port}") as channel:
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)


@pytest.fixture(scope="module")
def loaded(any_models):
    """Each model's SavedModel loaded in this process: the reference answers."""
    return {name: tf.saved_model.load(str(path / "1")) for name, path in any_models.items()}


def as_served(value, like: np.ndarray) -> np.ndarray:
    """A JSON answer's values as the output's dtype (strings back to bytes)."""
    if like.dtype == object:
        return np.vectorize(lambda s: s.encode(), otypes=[object])(np.array(value, dtype=object))
    return np.array(value, dtype=like.dtype)


def assert_same(served: dict, expected: dict[str, np.ndarray]) -> None:
    """Every output, value for value (float32's shortest text reads back to the same float)."""
    assert sorted(served) == sorted(expected)
    for key, want in expected.items():
        got = as_served(served[key], want)
        assert got.shape == want.shape, key
        np.testing.assert_array_equal(got, want, err_msg=key)


def rows_to_outputs(predictions: list) -> dict:
    """The row format's objects back to columns."""
    return {key: [row[key] for row in predictions] for key in predictions[0]}


# --- loading --------------------------------------------------------------------------------


def test_every_model_loads_side_by_side(client, any_models):
    for name in any_models:
        (status,) = client.get(f"/v1/models/{name}").json()["model_version_status"]
        assert status["state"] == "AVAILABLE", (name, status)


def test_metadata_is_the_savedmodels_signatures(client, loaded):
    signatures = client.get("/v1/models/classifier/metadata").json()["metadata"]
    signature = signatures["signature_def"]["signature_def"]
    assert list(signature) == ["predict"]
    inputs = signature["predict"]["inputs"]
    assert {k: v["dtype"] for k, v in inputs.items()} == {
        "x1": "DT_FLOAT", "x2": "DT_FLOAT", "rooms": "DT_INT64", "color": "DT_STRING",
    }  # fmt: skip
    assert signature["predict"]["method_name"] == "tensorflow/serving/predict"


# --- TF Serving REST ------------------------------------------------------------------------


def test_a_request_naming_no_signature_gets_tf_servings_error(client):
    response = client.post("/v1/models/classifier:predict", json={"instances": ROWS[:1]})
    assert response.status_code == 400
    assert error_message(response, 400).startswith(
        'Serving signature name: "serving_default" not found in signature def'
    )


def test_classifier_rows_and_columns_answer_as_tensorflow(client, loaded):
    expected = reference(loaded, "classifier", "predict", **columns(ROWS))
    body = {"signature_name": "predict", "instances": ROWS}
    response = client.post("/v1/models/classifier:predict", json=body)
    assert response.status_code == 200, response.text
    assert_same(rows_to_outputs(response.json()["predictions"]), expected)
    assert response.json()["predictions"][2]["classes"] in (["high"], ["low"], ["mid"])
    columnar = {"signature_name": "predict", "inputs": {k: [r[k] for r in ROWS] for k in ROWS[0]}}
    response = client.post("/v1/models/classifier:predict", json=columnar)
    assert response.status_code == 200, response.text
    assert_same(response.json()["outputs"], expected)


def test_regressor_answers_one_output_as_a_bare_list(client, loaded):
    expected = reference(loaded, "regressor", "predict", **columns(CITY_ROWS))
    (key,) = expected
    body = {"signature_name": "predict", "instances": CITY_ROWS}
    response = client.post("/v1/models/regressor:predict", json=body)
    assert response.status_code == 200, response.text
    predictions = response.json()["predictions"]
    assert isinstance(predictions[0], list)  # the value itself, not {"predictions": ...}
    assert_same({key: predictions}, expected)


def test_a_32x32x3_image_model_answers_as_tensorflow(client, loaded):
    images = np.random.default_rng(0).random((2, 32, 32, 3), dtype=np.float32)
    expected = reference(loaded, "shapes", "serving_default", image=images)
    response = client.post("/v1/models/shapes:predict", json={"instances": images.tolist()})
    assert response.status_code == 200, response.text
    assert_same(rows_to_outputs(response.json()["predictions"]), expected)
    wrong = client.post("/v1/models/shapes:predict", json={"instances": [[[0.0] * 28] * 28]})
    assert wrong.status_code == 400
    assert "input 'image' takes float [-1,32,32,3]; got shape [1,28,28]" in error_message(
        wrong, 400
    )


def test_int64_and_string_inputs_and_outputs(client, loaded):
    ids, words = np.array([3, -7], np.int64), np.array([b"ab", b"\xc3\xa9t\xc3\xa9"], object)
    expected = reference(loaded, "tokens", "serving_default", ids=ids, words=words)
    body = {"instances": [{"ids": 3, "words": "ab"}, {"ids": -7, "words": {"b64": "w6l0w6k="}}]}
    response = client.post("/v1/models/tokens:predict", json=body)
    assert response.status_code == 200, response.text
    predictions = response.json()["predictions"]
    # Strings as UTF-8 text; an output named *_bytes as base64 objects.
    assert predictions[1]["upper"] == "éTé"
    assert predictions[0]["echo_bytes"] == {"b64": base64.b64encode(b"ab\xff").decode()}
    echoed = [base64.b64decode(p["echo_bytes"]["b64"]) for p in predictions]
    assert echoed == list(expected["echo_bytes"])
    assert [p["doubled"] for p in predictions] == expected["doubled"].tolist()
    assert [p["upper"].encode() for p in predictions] == list(expected["upper"])


def test_an_input_without_a_batch_dimension(client, loaded):
    expected = reference(loaded, "tokens", "fixed", x=np.array([1, 2, 3], np.float32))
    body = {"signature_name": "fixed", "inputs": [1, 2, 3]}
    response = client.post("/v1/models/tokens:predict", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"] == expected["scaled"].tolist()
    short = client.post("/v1/models/tokens:predict", json={**body, "inputs": [1, 2]})
    assert short.status_code == 400
    assert "input 'x' takes float [3]; got shape [2]" in error_message(short, 400)


def test_concurrent_requests_each_get_their_own_answer(client, loaded):
    """Batched per model and signature (the `fixed` signature, without a batch dimension,
    never joins another request): every answer is its own request's."""

    def ask(i: int):
        if i % 2:
            body = {"signature_name": "fixed", "inputs": [i, i, i]}
            return i, client.post("/v1/models/tokens:predict", json=body).json()["outputs"]
        body = {"instances": [{"ids": i, "words": "w"}]}
        return i, client.post("/v1/models/tokens:predict", json=body).json()["predictions"]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(24)))
    for i, answer in answers:
        if i % 2:
            assert answer == [10.0 * i] * 3
        else:
            assert [row["doubled"] for row in answer] == [2 * i]


BAD_INPUTS = [
    pytest.param({"instances": [{"x1": 0.5, "x2": 4.0, "rooms": 3}]},
                 "Failed to process element: 0 of 'instances' list. JSON object: "
                 '{"x1":0.5,"x2":4.0,"rooms":3} keys must be equal to: color,rooms,x1,x2',
                 id="missing-feature"),
    pytest.param({"instances": [{**ROWS[0], "size": 2}]},
                 "Failed to process element: 0 key: size of 'instances' list. Error: "
                 "INVALID_ARGUMENT: JSON object: does not have named input: size",
                 id="unknown-feature"),
    pytest.param({"instances": [{**ROWS[0], "rooms": 2.5}]},
                 "JSON Value: 2.5 Type: Number is not of expected type: int64; "
                 "instances[0].rooms", id="float-for-int64"),
    pytest.param({"instances": [{**ROWS[0], "x1": "big"}]},
                 'JSON Value: "big" Type: String is not of expected type: float; '
                 "instances[0].x1", id="string-for-number"),
    pytest.param({"instances": [{**ROWS[0], "color": 3}]},
                 "JSON Value: 3 Type: Number is not of expected type: string",
                 id="number-for-string"),
    pytest.param({"instances": [{**ROWS[0], "x1": [1.0, 2.0]}, {**ROWS[0], "x1": [1.0]}]},
                 "Failed to process element: 1 of 'instances' list. Error: INVALID_ARGUMENT: "
                 "Expecting tensor size: 2 but got: 1", id="ragged"),
    pytest.param({"inputs": {"x1": [1.0], "x2": [1.0], "rooms": [1]}},
                 "Missing named input: color in 'inputs' object.", id="columnar-missing"),
]  # fmt: skip


@pytest.mark.parametrize("body, expected", BAD_INPUTS)
def test_bad_input_is_refused_in_tf_servings_words(client, body, expected):
    response = client.post(
        "/v1/models/classifier:predict", json={"signature_name": "predict", **body}
    )
    assert response.status_code == 400
    assert expected in error_message(response, 400)


# --- TF Serving gRPC ------------------------------------------------------------------------


def predict_request(model: str, signature: str = "", **inputs) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature
    for key, value in inputs.items():
        request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
    return request


def test_grpc_predict_answers_as_tensorflow(stub, loaded):
    features = columns(ROWS)
    expected = reference(loaded, "classifier", "predict", **features)
    response = stub.Predict(predict_request("classifier", "predict", **features), timeout=TIMEOUT)
    served = {k: tf.make_ndarray(v) for k, v in response.outputs.items()}
    assert sorted(served) == sorted(expected)
    for key, want in expected.items():
        np.testing.assert_array_equal(served[key], want, err_msg=key)
    ids, words = np.array([5], np.int64), np.array([b"x"], object)
    expected = reference(loaded, "tokens", "serving_default", ids=ids, words=words)
    response = stub.Predict(predict_request("tokens", ids=ids, words=words), timeout=TIMEOUT)
    for key, want in expected.items():
        np.testing.assert_array_equal(tf.make_ndarray(response.outputs[key]), want, err_msg=key)


def test_grpc_errors_are_tf_servings(stub):
    with pytest.raises(grpc.RpcError) as caught:
        stub.Predict(predict_request("classifier", x1=np.array([1.0], np.float32)), timeout=30)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.details() == 'Serving signature key "serving_default" not found.'
    request = predict_request("classifier", "predict", x1=np.array([1.0], np.float32))
    with pytest.raises(grpc.RpcError) as caught:
        stub.Predict(request, timeout=TIMEOUT)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith(
        "input size does not match signature: 1!=4 len({x1}) != len({color,rooms,x1,x2}). "
        "Sent extra: {}. Missing but required: {color,rooms,x2}."
    )
    features = columns(ROWS) | {"rooms": np.array([1.0, 2.0, 3.0], np.float32)}
    with pytest.raises(grpc.RpcError) as caught:
        stub.Predict(predict_request("classifier", "predict", **features), timeout=TIMEOUT)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "to be int64 but float is provided" in caught.value.details()


def test_grpc_metadata_is_the_savedmodels(stub, any_models):
    from artifact.saved_model import signature_def_map

    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = "regressor"
    response = stub.GetModelMetadata(request, timeout=TIMEOUT)
    served = get_model_metadata_pb2.SignatureDefMap()
    assert response.metadata["signature_def"].Unpack(served)
    assert served == signature_def_map(any_models["regressor"] / "1")


# --- the Open Inference Protocol ------------------------------------------------------------


def v2_inputs(rows: list[dict]) -> list[dict]:
    kinds = {str: "BYTES", int: "INT64", float: "FP32"}
    return [
        {"name": key, "datatype": kinds[type(rows[0][key])], "shape": [len(rows)],
         "data": [r[key] for r in rows]}
        for key in rows[0]
    ]  # fmt: skip


def test_v2_metadata_is_the_only_signatures(client):
    metadata = client.get("/v2/models/classifier").json()
    assert {t["name"]: t["datatype"] for t in metadata["inputs"]} == {
        "color": "BYTES", "rooms": "INT64", "x1": "FP32", "x2": "FP32",
    }  # fmt: skip
    assert {"name": "probabilities", "datatype": "FP32", "shape": [-1, 3]} in metadata["outputs"]


def test_v2_rest_answers_as_tensorflow(client, loaded):
    expected = reference(loaded, "classifier", "predict", **columns(ROWS))
    response = client.post("/v2/models/classifier/infer", json={"inputs": v2_inputs(ROWS)})
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o for o in response.json()["outputs"]}
    assert sorted(outputs) == sorted(expected)
    for key, want in expected.items():
        assert outputs[key]["shape"] == list(want.shape)
        got = as_served(outputs[key]["data"], want).reshape(want.shape)
        np.testing.assert_array_equal(got, want, err_msg=key)
    bad = client.post("/v2/models/classifier/infer", json={"inputs": v2_inputs(ROWS)[:3]})
    assert bad.status_code == 400
    assert error_message(bad, 400).startswith("input 'color' is missing: the model takes 'color'")


def test_v2_grpc_with_bytes_answers_as_tensorflow(any_server, loaded):
    ids, words = np.array([2, 9], np.int64), np.array([b"hi", b"yo"], object)
    expected = reference(loaded, "tokens", "serving_default", ids=ids, words=words)
    request = v2_proto.ModelInferRequest(model_name="tokens")
    request.inputs.add(name="ids", datatype="INT64", shape=[2]).contents.int64_contents.extend(
        ids.tolist()
    )
    request.inputs.add(name="words", datatype="BYTES", shape=[2]).contents.bytes_contents.extend(
        words.tolist()
    )
    with grpc.insecure_channel(f"127.0.0.1:{any_server.grpc_port}") as channel:
        infer = channel.unary_unary(
            f"/{v2_proto.SERVICE}/ModelInfer",
            request_serializer=v2_proto.ModelInferRequest.SerializeToString,
            response_deserializer=v2_proto.ModelInferResponse.FromString,
        )
        response = infer(request, timeout=TIMEOUT)
    outputs = {o.name: o for o in response.outputs}
    assert list(outputs["doubled"].contents.int64_contents) == expected["doubled"].tolist()
    assert list(outputs["upper"].contents.bytes_contents) == list(expected["upper"])
    assert list(outputs["echo_bytes"].contents.bytes_contents) == list(expected["echo_bytes"])


# --- Classify and Regress: tf.Examples through a parsing receiver's export ----------------


def test_rest_classify_and_regress_answer_as_tensorflow(client, loaded):
    # Each reference runs the same batch the request makes: a batch of one and a batch of
    # several can differ in the last bits of a float (another kernel).
    expected = reference(
        loaded, "classifier_examples", "classification", inputs=serialized(ROWS[:1])
    )
    # The context's features go into every example.
    context = {"x2": ROWS[0]["x2"]}
    body = {"context": context, "examples": [{k: v for k, v in ROWS[0].items() if k != "x2"}]}
    response = client.post("/v1/models/classifier_examples:classify", json=body)
    assert response.status_code == 200, response.text
    (row,) = response.json()["results"]
    assert [label for label, _ in row] == [c.decode() for c in expected["classes"][0]]
    np.testing.assert_array_equal(np.float32([s for _, s in row]), expected["scores"][0])
    response = client.post("/v1/models/classifier_examples:classify", json={"examples": ROWS})
    assert len(response.json()["results"]) == len(ROWS)
    expected = reference(loaded, "regressor_examples", "regression", inputs=serialized(CITY_ROWS))
    response = client.post("/v1/models/regressor_examples:regress", json={"examples": CITY_ROWS})
    assert response.status_code == 200, response.text
    np.testing.assert_array_equal(
        np.float32(response.json()["results"]), expected["outputs"].reshape(-1)
    )
    # A raw receiver's export has no tf.Example signature: TF Serving's words.
    response = client.post(
        "/v1/models/classifier:classify", json={"signature_name": "predict", "examples": ROWS}
    )
    assert error_message(response, 400) == "Expected one input Tensor."


def test_grpc_classify_and_regress_answer_as_tensorflow(stub, loaded):
    expected = reference(loaded, "classifier_examples", "classification", inputs=serialized(ROWS))
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "classifier_examples"
    for row in ROWS:
        request.input.example_list.examples.add().CopyFrom(tf_example(row))
    response = stub.Classify(request, timeout=TIMEOUT)
    for i, classification in enumerate(response.result.classifications):
        assert [c.label.encode() for c in classification.classes] == list(expected["classes"][i])
        np.testing.assert_array_equal(
            np.float32([c.score for c in classification.classes]), expected["scores"][i]
        )
    # The request is one example (its context merged in): the reference is that batch of one.
    expected = reference(
        loaded, "regressor_examples", "regression", inputs=serialized(CITY_ROWS[:1])
    )
    request = regression_pb2.RegressionRequest()
    request.model_spec.name = "regressor_examples"
    context = request.input.example_list_with_context
    context.context.CopyFrom(tf_example({"city": CITY_ROWS[0]["city"]}))
    context.examples.add().CopyFrom(
        tf_example({k: v for k, v in CITY_ROWS[0].items() if k != "city"})
    )
    response = stub.Regress(request, timeout=TIMEOUT)
    (regression,) = response.result.regressions
    assert np.float32(regression.value) == expected["outputs"].reshape(-1)[0]


# --- a version whose signatures differ ------------------------------------------------------


def test_a_changed_signature_serves_when_the_setting_allows_it(any_models, tmp_path):
    model_dir = tmp_path / "models" / "tokens"
    shutil.copytree(any_models["tokens"], model_dir)
    server = start_server(
        tmp_path / "server.log",
        MODEL_NAME="tokens",
        MODEL_BASE_PATH=str(model_dir.parent),
        MODEL_POLL_SECONDS="0.2",
        ALLOW_SIGNATURE_CHANGES="true",
    )
    try:
        with httpx.Client(base_url=server.url, timeout=TIMEOUT) as client:
            shutil.copytree(any_models["regressor"] / "1", model_dir / ".staging")
            (model_dir / ".staging").rename(model_dir / "2")
            wait_for(lambda: client.get("/readyz").json().get("version") == "2",
                     "version 2 serving", server)  # fmt: skip
            body = {"signature_name": "predict", "instances": CITY_ROWS[:1]}
            response = client.post("/v1/models/tokens:predict", json=body)
            assert response.status_code == 200, response.text
    finally:
        server.stop()
