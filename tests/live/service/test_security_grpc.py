"""TF Serving's gRPC API (service/protocols/grpc_server.py) under the rules HTTP keeps: a
rotated token is seen by both transports at once (one TokenFile), a model name with a
newline cannot forge a log line, and an error message names no folder of the server's.

Slow only because TF Serving's protos import TensorFlow; no model runs (the fake backend).
"""

from __future__ import annotations

import os

import grpc
import numpy as np
import pytest
import tensorflow as tf
from support.fakes import FakeBackend, app_client
from support.helpers import logged
from support.servers import MODEL_NAME, free_port
from tensorflow_serving.apis import (
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

OLD_TOKEN = "status-token-0123456789"
NEW_TOKEN = "rotated-token-0123456789"
WAIT_SECONDS = 30


def status_request(name: str) -> get_model_status_pb2.GetModelStatusRequest:
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = name
    return request


def test_a_rotated_token_is_seen_by_http_and_grpc_at_once(tmp_path):
    path = tmp_path / "tokens"
    path.write_text(f"{OLD_TOKEN} status\n")
    port = free_port()
    with (
        app_client(
            FakeBackend(),
            serve_grpc=True,
            grpc_port=port,
            auth_tokens_file=str(path),
            auth_tokens_check_seconds=0,
            grpc_allow_plaintext_tokens=True,  # loopback
        ) as client,
        grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        stub = model_service_pb2_grpc.ModelServiceStub(channel)

        def grpc_code(token: str) -> grpc.StatusCode:
            try:
                stub.GetModelStatus(
                    status_request(MODEL_NAME),
                    metadata=[("authorization", f"Bearer {token}")],
                    timeout=WAIT_SECONDS,
                )
            except grpc.RpcError as err:
                return err.code()
            return grpc.StatusCode.OK

        def http_status(token: str) -> int:
            headers = {"Authorization": f"Bearer {token}"}
            return client.get(f"/v1/models/{MODEL_NAME}", headers=headers).status_code

        assert (grpc_code(OLD_TOKEN), http_status(OLD_TOKEN)) == (grpc.StatusCode.OK, 200)
        assert grpc_code(NEW_TOKEN) == grpc.StatusCode.UNAUTHENTICATED
        new = path.with_suffix(".new")
        new.write_text(f"{NEW_TOKEN} status\n")
        os.replace(new, path)  # as a Secret's update swaps the file
        assert (grpc_code(NEW_TOKEN), http_status(NEW_TOKEN)) == (grpc.StatusCode.OK, 200)
        assert grpc_code(OLD_TOKEN) == grpc.StatusCode.UNAUTHENTICATED
        assert http_status(OLD_TOKEN) == 401


def test_a_model_name_with_a_newline_writes_one_escaped_log_line():
    port = free_port()
    forged = "nope\n2026-01-01 00:00:00 ERROR service: forged"
    with (
        app_client(FakeBackend(), serve_grpc=True, grpc_port=port),
        grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
        logged("service.grpc") as records,
    ):
        stub = model_service_pb2_grpc.ModelServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.GetModelStatus(status_request(forged), timeout=WAIT_SECONDS)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    (line,) = [r.getMessage() for r in records if "NOT_FOUND" in r.getMessage()]
    assert "\n" not in line
    assert "nope\\x0a2026-01-01 00:00:00 ERROR service: forged" in line


def test_grpc_errors_name_no_folder_of_the_server():
    """A reason the model is not ready (a version that failed to load) names its file, as
    HTTP's answer does (service/errors.py: redact_paths), not its folders."""
    backend = FakeBackend(versions=())
    backend.reason = "version 3 failed to load: /srv/secret/models/fashion_mnist/3/saved_model.pb"
    port = free_port()
    request = predict_pb2.PredictRequest()
    request.model_spec.name = MODEL_NAME
    request.inputs["image"].CopyFrom(tf.make_tensor_proto(np.zeros((1, 28, 28), np.float32)))
    with (
        app_client(backend, serve_grpc=True, grpc_port=port) as client,
        grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Predict(request, timeout=WAIT_SECONDS)
        http = client.post(
            f"/v1/models/{MODEL_NAME}:predict", json={"instances": [[[0.0] * 28] * 28]}
        )
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "/srv" not in caught.value.details()
    assert caught.value.details().endswith("failed to load: saved_model.pb")
    assert http.status_code == 503 and http.json()["error"].endswith(caught.value.details()[-40:])


def test_made_up_methods_are_counted_as_other(tmp_path):
    """Refused calls to methods no service has (200 names a client made up) are one series,
    `method="other"`: an anonymous client cannot grow /metrics without bound."""
    path = tmp_path / "tokens"
    path.write_text(f"{OLD_TOKEN} status\n")
    port = free_port()
    with (
        app_client(
            FakeBackend(), serve_grpc=True, grpc_port=port, auth_tokens_file=str(path)
        ) as client,
        grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        for number in range(200):
            call = channel.unary_unary(f"/made.Up/Method{number}")
            with pytest.raises(grpc.RpcError) as caught:
                call(b"", timeout=WAIT_SECONDS)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # A known method's name under a made-up service is not that method either.
        with pytest.raises(grpc.RpcError):
            channel.unary_unary("/made.Up/Predict")(b"", timeout=WAIT_SECONDS)
        metrics = client.get("/metrics", headers={"authorization": f"Bearer {OLD_TOKEN}"}).text
    assert 'grpc_requests_total{code="UNAUTHENTICATED",method="other"} 201.0' in metrics
    assert "Method1" not in metrics and 'method="Predict"' not in metrics
