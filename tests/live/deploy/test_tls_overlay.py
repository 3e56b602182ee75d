"""The Kubernetes TLS overlay (deploy/kubernetes/overlays/tls) works as a pod would run it: the
service, started with the rendered API container's own TLS and token settings (paths mapped
into a tmp dir, the files from `make tls` and deploy/make_tokens.py), answers the kubelet's
HTTPS probe and a gRPC client over TLS that sends a token, and refuses plaintext gRPC.

Live: a real `python -m service` on the session's trained model; TF Serving's gRPC stubs
import TensorFlow. The rendered settings themselves are checked fast, in
tests/unit/deploy/test_secure_kubernetes.py.
"""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tensorflow as tf
from support.helpers import REPO_ROOT
from support.manifest_harness import KUBE_DIR, containers, env, pods, render
from support.servers import copy_repository, start_server
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

# A name the certificate of `make tls` carries: the one a client in the cluster dials.
SERVICE_NAME = "api.estimator-serving.svc"
WAIT_SECONDS = 30.0


def api_container() -> dict:
    (container,) = [
        c
        for obj in render(KUBE_DIR / "overlays" / "tls")
        for pod in pods(obj)
        for c in containers(pod, init=False)
        if c["image"].startswith("estimator-serving-api:")
    ]
    return container


def local(root: Path, path: str) -> Path:
    """A path of the pod's filesystem, inside root."""
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    return target


@pytest.fixture(scope="module")
def pod_files(tmp_path_factory) -> tuple[dict[str, str], str]:
    """(the container's TLS and token settings with local paths, a `predict` token)."""
    root = tmp_path_factory.mktemp("pod")
    variables = env(api_container())
    secrets = root / "made"
    subprocess.run(["make", "-s", "-C", str(REPO_ROOT), "tls", f"TLS_DIR={secrets}"], check=True)
    spec = importlib.util.spec_from_file_location(
        "make_tokens", REPO_ROOT / "deploy" / "make_tokens.py"
    )
    make_tokens = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_tokens)
    tokens = local(root, variables["AUTH_TOKENS_FILE"])
    issued = make_tokens.write_tokens(tokens)  # the service's file holds digests only
    # The kubernetes.io/tls Secret's keys are tls.crt and tls.key.
    local(root, variables["TLS_CERT_FILE"]).write_bytes((secrets / "api-tls.crt").read_bytes())
    local(root, variables["TLS_KEY_FILE"]).write_bytes((secrets / "api-tls.key").read_bytes())
    (predict_token,) = [line.split()[0] for line in issued.read_text().splitlines()
                        if line.split()[1:] and "predict" in line.split()[1]]  # fmt: skip
    settings = {
        name: str(local(root, variables[name]))
        for name in ("TLS_CERT_FILE", "TLS_KEY_FILE", "AUTH_TOKENS_FILE")
    }
    return settings, predict_token


def test_the_tls_overlays_pod_serves_https_probes_and_grpc_over_tls(
    pod_files, trained_model, tmp_path
):
    settings, token = pod_files
    cert = Path(settings["TLS_CERT_FILE"]).read_bytes()
    server = start_server(
        tmp_path / "server.log",
        grpc=True,
        MODEL_BASE_PATH=str(copy_repository(trained_model, tmp_path)),
        **settings,
    )
    try:
        # The probes' paths, over HTTPS (start_server already waited on /readyz that way).
        assert server.url.startswith("https://")
        with httpx.Client(base_url=server.url, verify=server.verify, timeout=10) as client:
            assert client.get("/healthz").status_code == 200
            assert client.get("/v1/models/fashion_mnist").status_code == 401  # a token is due

        request = predict_pb2.PredictRequest()
        request.model_spec.name = "fashion_mnist"
        request.inputs["image"].CopyFrom(tf.make_tensor_proto(np.zeros((1, 28, 28), np.float32)))
        credentials = grpc.ssl_channel_credentials(root_certificates=cert)
        options = (("grpc.ssl_target_name_override", SERVICE_NAME),)
        address = f"127.0.0.1:{server.grpc_port}"
        with grpc.secure_channel(address, credentials, options) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            response = stub.Predict(
                request, metadata=(("authorization", f"Bearer {token}"),), timeout=WAIT_SECONDS
            )
        probabilities = tf.make_ndarray(response.outputs["probabilities"])
        assert probabilities.shape == (1, 10)
        assert abs(float(probabilities.sum()) - 1.0) < 1e-4

        with grpc.insecure_channel(address) as plaintext:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(plaintext)
            with pytest.raises(grpc.RpcError) as refused:
                stub.Predict(
                    request, metadata=(("authorization", f"Bearer {token}"),), timeout=WAIT_SECONDS
                )
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        assert server.stop() == 0
