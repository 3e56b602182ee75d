"""KServe's own Python clients (`kserve` 0.21's InferenceGRPCClient and InferenceRESTClient)
against a real `python -m service` on the session's trained model, with bearer tokens on.

The SDK cannot be installed in the project's venv (protobuf 6 and a web stack of its own), so
it runs in a venv of its own, installed from its hashed lock on first use
(tests/support/client_venvs.py), and tests/support/clients/kserve_calls.py makes every call
there in one process; these tests check its answers against the service's own `/v1`
predictions for the same images. Skipped only when the package index cannot be reached to
install it, saying so; any other install failure fails.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from support import client_venvs
from support.servers import MODEL_NAME, Server, copy_repository, start_server

from artifact import idx as data

TOKEN = "kserve-predict-and-status-token"
CALLS_SCRIPT = client_venvs.CLIENTS_DIR / "kserve_calls.py"
CALLS_TIMEOUT_SECONDS = 120.0


@pytest.fixture(scope="module")
def kserve_python():
    """KServe's venv's python, installed now from requirements-kserve.lock if need be."""
    try:
        return client_venvs.ensure("kserve")
    except client_venvs.IndexUnreachable as error:
        pytest.skip(f"KServe's client cannot be installed: the package index is unreachable\n{error}")  # fmt: skip


@pytest.fixture(scope="module")
def server(kserve_python, trained_model, tmp_path_factory) -> Iterator[Server]:
    """A copy of the trained repository, both gRPC APIs on, tokens required."""
    root = tmp_path_factory.mktemp("kserve-client")
    base = copy_repository(trained_model, root)
    tokens = root / "tokens"
    tokens.write_text(f"{TOKEN} predict,status\n")
    srv = start_server(
        root / "server.log",
        grpc=True,
        MODEL_BASE_PATH=str(base),
        AUTH_TOKENS_FILE=str(tokens),
        GRPC_ALLOW_PLAINTEXT_TOKENS="true",  # loopback
    )
    yield srv
    assert srv.stop() in (0, -signal.SIGTERM), srv.log()
    assert "Traceback" not in srv.log(), srv.log()


@pytest.fixture(scope="module")
def images(trained_model) -> np.ndarray:
    """4 real Fashion-MNIST test images as the model takes them: float32 [4, 28, 28] in [0, 1]."""
    _, pixels, _ = data.load_split(trained_model.data_dir, "test")
    return (pixels[:4] / np.float32(255.0)).astype(np.float32)


@pytest.fixture(scope="module")
def v1_predictions(server, images) -> dict[str, np.ndarray]:
    """The service's own answer for the images: TF Serving's REST predict, columnar."""
    response = httpx.post(
        f"{server.url}/v1/models/{MODEL_NAME}:predict",
        json={"inputs": images.tolist()},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=30.0,
    )
    assert response.status_code == 200, response.text
    outputs = response.json()["outputs"]
    answer = {
        "classes": np.array(outputs["classes"], np.int64),
        "probabilities": np.array(outputs["probabilities"], np.float32),
    }
    # A client answered a constant would match a constant reference: the images differ.
    assert np.abs(answer["probabilities"][0] - answer["probabilities"][1]).max() > 1e-3
    return answer


@pytest.fixture(scope="module")
def calls(kserve_python, server, images, tmp_path_factory) -> dict:
    """Every call kserve_calls.py makes, in KServe's venv: {"grpc": {...}, "rest": {...}}."""
    path = tmp_path_factory.mktemp("kserve-images") / "images.npy"
    np.save(path, images)
    settings = {
        "grpc": f"127.0.0.1:{server.grpc_port}",
        "http": server.url,
        "model": MODEL_NAME,
        "images": str(path),
        "token": TOKEN,
    }
    result = subprocess.run(
        [str(kserve_python), str(CALLS_SCRIPT)],
        input=json.dumps(settings),
        capture_output=True,
        text=True,
        timeout=CALLS_TIMEOUT_SECONDS,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def ok(calls: dict, protocol: str, name: str):
    """What one call answered; fails with its error when it raised."""
    outcome = calls[protocol][name]
    assert "ok" in outcome, f"{protocol} {name}: {outcome['error']}"
    return outcome["ok"]


def error(calls: dict, protocol: str, name: str) -> dict:
    outcome = calls[protocol][name]
    assert "error" in outcome, f"{protocol} {name} should have failed; it answered {outcome}"
    return outcome["error"]


def outputs(answer: dict) -> dict[str, dict]:
    return {output["name"]: output for output in answer["outputs"]}


def assert_same_as_v1(answer: dict, v1: dict[str, np.ndarray], names=("classes", "probabilities")):
    """The answer's outputs, in this order, hold exactly /v1's values with the model's types."""
    found = outputs(answer)
    assert [o["name"] for o in answer["outputs"]] == list(names)
    if "classes" in names:
        assert (found["classes"]["datatype"], found["classes"]["shape"]) == ("INT64", [4])
        np.testing.assert_array_equal(np.array(found["classes"]["data"], np.int64), v1["classes"])
    probabilities = found["probabilities"]
    assert (probabilities["datatype"], probabilities["shape"]) == ("FP32", [4, 10])
    np.testing.assert_array_equal(np.array(probabilities["data"], np.float32), v1["probabilities"])


# --- gRPC: InferenceGRPCClient ----------------------------------------------------------------


def test_grpc_health_and_model_ready(calls):
    assert ok(calls, "grpc", "server_live") is True
    assert ok(calls, "grpc", "server_ready") is True
    assert ok(calls, "grpc", "model_ready") is True
    failed = error(calls, "grpc", "model_ready_unknown")
    assert (failed["type"], failed["code"]) == ("AioRpcError", "NOT_FOUND")


def test_grpc_model_metadata_through_the_sdks_stub(calls):
    assert ok(calls, "grpc", "model_metadata") == {
        "name": MODEL_NAME,
        "versions": ["1"],
        "platform": "tensorflow_savedmodel",
        # protobuf's JSON writes int64 as strings
        "inputs": [{"name": "image", "datatype": "FP32", "shape": ["-1", "28", "28"]}],
        "outputs": [
            {"name": "classes", "datatype": "INT64", "shape": ["-1"]},
            {"name": "probabilities", "datatype": "FP32", "shape": ["-1", "10"]},
        ],
    }


@pytest.mark.parametrize(
    "name, request_id, raw",
    [
        pytest.param("infer_raw", "grpc-raw", True, id="raw_input_contents"),
        pytest.param("infer_typed", "grpc-typed", False, id="fp32_contents"),
    ],
)
def test_grpc_infer_answers_v1s_predictions(calls, v1_predictions, name, request_id, raw):
    answer = ok(calls, "grpc", name)
    assert (answer["id"], answer["model_name"], answer["model_version"]) == (
        request_id,
        MODEL_NAME,
        "1",
    )
    assert_same_as_v1(answer, v1_predictions)
    # Raw in, raw out; typed contents in, typed contents out.
    assert {o["raw"] for o in answer["outputs"]} == {raw}


def test_grpc_infer_a_version_and_one_output(calls, v1_predictions):
    answer = ok(calls, "grpc", "infer_probabilities_v1")
    assert answer["model_version"] == "1"
    assert_same_as_v1(answer, v1_predictions, names=("probabilities",))


@pytest.mark.parametrize(
    "name, code, fragment",
    [
        pytest.param("infer_unknown_model", "NOT_FOUND", "Servable not found for request: Latest(nope)", id="unknown-model"),
        pytest.param("infer_fp64", "INVALID_ARGUMENT", "input 'image': datatype FP64 does not match the model's FP32", id="datatype"),
    ],
)  # fmt: skip
def test_grpc_errors_reach_the_sdk_as_codes(calls, name, code, fragment):
    failed = error(calls, "grpc", name)
    assert (failed["type"], failed["code"]) == ("AioRpcError", code)
    assert fragment in failed["message"]


# --- REST: InferenceRESTClient, the v2 protocol, and v1 -------------------------------------


def test_rest_health_and_model_ready(calls):
    assert ok(calls, "rest", "server_live") is True
    assert ok(calls, "rest", "server_ready") is True
    assert ok(calls, "rest", "model_ready") is True
    # The SDK reads V2's "4xx is not ready" as False, not as an error.
    assert ok(calls, "rest", "model_ready_unknown") is False


@pytest.mark.parametrize(
    "name, request_id, content_type",
    [
        pytest.param("infer_json", "rest-json", "application/json", id="json"),
        pytest.param("infer_binary", "rest-binary", "application/octet-stream", id="binary-in-and-out"),
    ],
)  # fmt: skip
def test_rest_v2_infer_answers_v1s_predictions(
    calls, v1_predictions, name, request_id, content_type
):
    answer = ok(calls, "rest", name)
    assert (answer["id"], answer["model_name"]) == (request_id, MODEL_NAME)
    assert answer["content_type"] == content_type
    assert_same_as_v1(answer, v1_predictions)


def test_rest_v2_requested_output(calls, v1_predictions):
    assert_same_as_v1(ok(calls, "rest", "infer_probabilities"), v1_predictions, ("probabilities",))


def test_rest_v2_error_carries_the_services_message(calls):
    failed = error(calls, "rest", "infer_unknown_model")
    assert (failed["type"], failed["code"]) == ("HTTPStatusError", 404)
    assert "Servable not found for request: Latest(nope)" in failed["message"]


def test_rest_v1_predict_is_tf_servings(calls, v1_predictions):
    """KServe's v1 protocol is TF Serving's `:predict`: row format in, `predictions` out."""
    answer = ok(calls, "rest", "v1_predict")
    predictions = answer["predictions"]
    assert [p["classes"] for p in predictions] == v1_predictions["classes"].tolist()
    np.testing.assert_array_equal(
        np.array([p["probabilities"] for p in predictions], np.float32),
        v1_predictions["probabilities"],
    )
