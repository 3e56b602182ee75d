"""The api image, run as the Kubernetes Deployment runs it, on a version the trainer image
trained: every protocol answers, the same, from a hardened, non-root container."""

from __future__ import annotations

import json

import grpc
import httpx
import numpy as np
import pytest
from support.containers import APP_UID, podman
from support.helpers import REPO_ROOT, ok_json
from support.servers import MODEL_NAME
from support.tfserving_requests import predict_request
from tensorflow_serving.apis import prediction_service_pb2_grpc

from artifact.contract import CLASSES_KEY, NUM_CLASSES, PROBABILITIES_KEY

V1 = f"/v1/models/{MODEL_NAME}"
# The README's sample: a sneaker, as a TF Serving request body and as the PNG it came from
# (the same pixels: examples/make_examples.py).
PREDICT_JSON = json.loads((REPO_ROOT / "examples" / "predict.json").read_text())
SNEAKER_PNG = (REPO_ROOT / "examples" / "sneaker.png").read_bytes()
PIXELS = np.asarray(PREDICT_JSON["instances"][0], dtype=np.float32)


@pytest.fixture(scope="module")
def http(api):
    with httpx.Client(base_url=api.url, headers=api.headers, timeout=30.0) as client:
        yield client


@pytest.fixture(scope="module")
def rest_answer(http) -> dict:
    """TF Serving's REST predict of the sneaker: {"predictions": [...], "model_version": ...}."""
    return ok_json(http.post(f"{V1}:predict", json=PREDICT_JSON))


def test_rest_predict_answers_a_distribution_over_the_classes(rest_answer):
    (prediction,) = rest_answer["predictions"]
    probabilities = np.asarray(prediction[PROBABILITIES_KEY])
    assert probabilities.shape == (NUM_CLASSES,)
    np.testing.assert_allclose(probabilities.sum(), 1.0, atol=1e-5)
    assert prediction[CLASSES_KEY] == int(probabilities.argmax())
    assert rest_answer["model_version"].isdigit()


def test_model_status_says_the_trained_version_is_available(http, rest_answer):
    status = ok_json(http.get(V1))["model_version_status"]
    states = {entry["version"]: entry["state"] for entry in status}
    assert states[rest_answer["model_version"]] == "AVAILABLE", status


def test_an_uploaded_image_gets_the_same_answer_with_labels(http, rest_answer):
    (expected,) = rest_answer["predictions"]
    answer = ok_json(http.post("/predict", files={"files": ("sneaker.png", SNEAKER_PNG)}))
    (prediction,) = answer["predictions"]
    assert prediction["class_id"] == expected[CLASSES_KEY]
    assert len(prediction["probabilities"]) == NUM_CLASSES
    np.testing.assert_allclose(
        list(prediction["probabilities"].values()), expected[PROBABILITIES_KEY], atol=1e-6
    )
    assert answer["model_version"] == rest_answer["model_version"]


def test_open_inference_protocol_gives_the_same_probabilities(http, rest_answer):
    (expected,) = rest_answer["predictions"]
    body = {
        "inputs": [
            {"name": "image", "datatype": "FP32", "shape": [1, 28, 28], "data": PIXELS.tolist()}
        ]
    }
    answer = ok_json(http.post(f"/v2/models/{MODEL_NAME}/infer", json=body))
    outputs = {output["name"]: output for output in answer["outputs"]}
    assert outputs[PROBABILITIES_KEY]["shape"] == [1, NUM_CLASSES]
    np.testing.assert_allclose(
        outputs[PROBABILITIES_KEY]["data"], expected[PROBABILITIES_KEY], atol=1e-6
    )
    assert outputs[CLASSES_KEY]["data"] == [expected[CLASSES_KEY]]


def test_tf_serving_grpc_predict_gives_the_same_probabilities(api, rest_answer):
    (expected,) = rest_answer["predictions"]
    metadata = [("authorization", f"Bearer {api.token}")]
    with grpc.insecure_channel(api.grpc_address) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        response = stub.Predict(predict_request(PIXELS[None]), timeout=30, metadata=metadata)
    probabilities = np.asarray(response.outputs[PROBABILITIES_KEY].float_val)
    np.testing.assert_allclose(probabilities, expected[PROBABILITIES_KEY], atol=1e-6)
    assert list(response.outputs[CLASSES_KEY].int64_val) == [expected[CLASSES_KEY]]
    assert str(response.model_spec.version.value) == rest_answer["model_version"]


def test_predictions_need_the_token(api):
    answer = httpx.post(f"{api.url}{V1}:predict", json=PREDICT_JSON, timeout=30)
    assert answer.status_code == 401, answer.text


def test_the_image_health_check_passes(api):
    result = podman("healthcheck", "run", api.name, check=False)
    assert result.returncode == 0, f"{result.stdout}{result.stderr}\n{api.logs()}"


def test_the_service_runs_as_the_unprivileged_app_user(api):
    # The service itself (PID 1 of the container), not only a shell exec'd beside it.
    status = podman("exec", api.name, "cat", "/proc/1/status").stdout
    uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
    assert uids == [str(APP_UID)] * 4, status
    assert podman("exec", api.name, "id", "-u").stdout.strip() == str(APP_UID)


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("/home/app/probe", id="the-app-users-home"),
        pytest.param("/models/probe", id="the-model-repository"),
        pytest.param("/run/secrets/api-tokens/probe", id="the-tokens"),
    ],
)
def test_nothing_but_tmp_is_writable(api, path):
    result = podman("exec", api.name, "touch", path, check=False)
    assert result.returncode != 0
    assert "Read-only file system" in result.stderr, result.stderr


def test_tmp_is_writable(api):
    result = podman("exec", api.name, "touch", "/tmp/probe", check=False)
    assert result.returncode == 0, result.stderr
