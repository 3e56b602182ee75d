"""The api image in tensorflow/serving's place, run as TF Serving's own instructions run it, on
the model the repository ships (models/shipped; the trainer image is not needed):

- TF Serving's quickstart with only the image name changed: `podman run -p 8501:8501 -v
  <model>:/models/x -e MODEL_NAME=x IMAGE`, then `:predict` with `{"instances": ...}`;
- KServe's TF Serving runtime (deploy/kubernetes/overlays/kserve-runtime, KServe's own with
  this image): its command and arguments exactly, the model at /mnt/models, REST on 8080 and
  gRPC on 9000, with the runtime's security context; the image's health check finds the port
  from the flags.
"""

from __future__ import annotations

import json

import grpc
import httpx
import numpy as np
import pytest
import yaml
from support.containers import APP_UID, ApiContainer, podman
from support.helpers import REPO_ROOT, ok_json
from support.servers import free_ports
from support.tfserving_requests import predict_request
from tensorflow_serving.apis import prediction_service_pb2_grpc

from artifact.contract import NUM_CLASSES, PROBABILITIES_KEY

PREDICT_JSON = json.loads((REPO_ROOT / "examples" / "predict.json").read_text())
RUNTIME = REPO_ROOT / "deploy/kubernetes/overlays/kserve-runtime/clusterservingruntime.yaml"
INFERENCE_SERVICE = REPO_ROOT / "deploy/kubernetes/overlays/kserve-runtime/inferenceservice.yaml"


def started(name: str, http_port: int, grpc_port: int, *run_args: str) -> ApiContainer:
    podman("run", "--detach", "--name", name, *run_args)
    container = ApiContainer(name, http_port, grpc_port, token="")
    try:
        container.wait_ready()
    except pytest.fail.Exception:
        podman("rm", "--force", name, check=False)
        raise
    return container


def assert_predicts(url: str, model: str) -> None:
    answer = ok_json(httpx.post(f"{url}/v1/models/{model}:predict", json=PREDICT_JSON, timeout=30))
    (prediction,) = answer["predictions"]
    probabilities = np.asarray(prediction[PROBABILITIES_KEY])
    assert probabilities.shape == (NUM_CLASSES,)
    np.testing.assert_allclose(probabilities.sum(), 1.0, atol=1e-5)


def test_tf_servings_quickstart_with_only_the_image_changed(api_image, shipped_model, run_id):
    (http_port,) = free_ports(1)
    name = f"{run_id}-quickstart"
    container = started(
        name, http_port, 0,
        # TF Serving's README: -p 8501:8501 --mount ...,target=/models/x -e MODEL_NAME=x IMAGE
        # (on loopback and a free host port here).
        "--publish", f"127.0.0.1:{http_port}:8501",
        "--volume", f"{shipped_model}:/models/x:ro",
        "--env", "MODEL_NAME=x",
        api_image,
    )  # fmt: skip
    try:
        status = ok_json(httpx.get(f"{container.url}/v1/models/x", timeout=30))
        assert status["model_version_status"][0]["state"] == "AVAILABLE"
        assert_predicts(container.url, "x")
        # Run bare, it says once that it answers anyone (as TF Serving does, silently).
        assert "No AUTH_TOKENS_FILE and HOST=0.0.0.0 (ALLOW_ANONYMOUS=true)" in container.logs()
    finally:
        podman("rm", "--force", "--time", "0", name, check=False)


def test_kserves_tensorflow_serving_runtime_runs_the_image(api_image, shipped_model, run_id):
    runtime = yaml.safe_load(RUNTIME.read_text())
    (spec,) = runtime["spec"]["containers"]
    model = yaml.safe_load(INFERENCE_SERVICE.read_text())["metadata"]["name"]
    # KServe's template, filled in with the InferenceService's name.
    args = [arg.replace("{{.Name}}", model) for arg in spec["args"]]
    security = spec["securityContext"]
    assert security["runAsUser"] == APP_UID and security["capabilities"]["drop"] == ["ALL"]
    (command,) = spec["command"]
    http_port, grpc_port = free_ports(2)
    name = f"{run_id}-kserve-runtime"
    container = started(
        name, http_port, grpc_port,
        "--user", str(security["runAsUser"]),
        "--cap-drop", "ALL",
        "--security-opt", "no-new-privileges",
        # What KServe's storage initializer leaves: the model's versions at /mnt/models.
        "--volume", f"{shipped_model}:/mnt/models:ro",
        "--publish", f"127.0.0.1:{http_port}:8080",
        "--publish", f"127.0.0.1:{grpc_port}:9000",
        "--entrypoint", command,
        api_image, *args,
    )  # fmt: skip
    try:
        assert_predicts(container.url, model)
        with grpc.insecure_channel(container.grpc_address) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            pixels = np.asarray(PREDICT_JSON["instances"], dtype=np.float32)
            response = stub.Predict(predict_request(pixels, model), timeout=30)
        assert len(response.outputs[PROBABILITIES_KEY].float_val) == NUM_CLASSES
        # The health check reads the port from the flags (PORT still says 8501).
        result = podman("healthcheck", "run", name, check=False)
        assert result.returncode == 0, f"{result.stdout}{result.stderr}\n{container.logs()}"
        assert "warning:" not in container.logs()  # every flag the runtime passes applies
    finally:
        podman("rm", "--force", "--time", "0", name, check=False)
