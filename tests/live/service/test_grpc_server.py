"""The gRPC server in the test process, over fake backends: one data plane and one batcher with
HTTP, deadlines that free a request's place in the queue, the server's lifetime, and the
service's errors as gRPC codes.

Slow only because TF Serving's protos import TensorFlow; no model runs. The real service and
the real clients: tests/live/service/test_protocols.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf
from prometheus_client.parser import text_string_to_metric_families
from support.fakes import FakeBackend, GatedFakeBackend, app_client, toy_model
from support.servers import MODEL_NAME, free_port
from support.tfserving_requests import predict_request
from tensorflow_serving.apis import prediction_service_pb2_grpc

from artifact.contract import PROBABILITIES_KEY
from service.backends.batching import BatchingBackend
from service.errors import (
    BadInput,
    ClientClosedRequest,
    Conflict,
    Forbidden,
    NotFound,
    NotImplementedUpstream,
    NotReady,
    Overloaded,
    PayloadTooLarge,
    ServiceError,
    TooManyRequests,
    Unauthorized,
    UpstreamError,
    UpstreamInternal,
    UpstreamTimeout,
)
from service.protocols.grpc_server import GRPCServer, status_code_of

WAIT_SECONDS = 30.0
PIXELS = np.random.default_rng(3).random((4, 28, 28)).astype(np.float32)
EXPECTED = toy_model(1, PIXELS)[PROBABILITIES_KEY]


def wait_until(condition, what: str) -> None:
    """Wait for a condition another thread makes true (bounded; not a timing assertion)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


@contextlib.contextmanager
def serving(max_batch_size=4):
    """The app over a gated fake behind the batcher, with gRPC on a free port; yields
    (HTTP client, gRPC stub, gated backend, batcher)."""
    gated = GatedFakeBackend()
    batcher = BatchingBackend(gated, max_batch_size, timeout_ms=0, max_queue=8)
    port = free_port()
    with (
        app_client(batcher, serve_grpc=True, grpc_port=port) as client,
        grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        try:
            yield client, prediction_service_pb2_grpc.PredictionServiceStub(channel), gated, batcher
        finally:
            gated.gate.set()


def probabilities(response) -> np.ndarray:
    return tf.make_ndarray(response.outputs[PROBABILITIES_KEY])


def grpc_calls(client, method: str) -> dict[str, float]:
    """grpc_requests_total of one method, by code, from /metrics."""
    counts = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == "grpc_requests_total" and sample.labels["method"] == method:
                counts[sample.labels["code"]] = sample.value
    return counts


def test_grpc_and_both_http_protocols_share_one_batch():
    v2_body = {
        "inputs": [
            {"name": "image", "datatype": "FP32", "shape": [1, 28, 28], "data": PIXELS[2].tolist()}
        ]
    }
    with (
        concurrent.futures.ThreadPoolExecutor(4) as pool,
        serving() as (client, stub, gated, batcher),
    ):
        gated.gate.clear()
        first = pool.submit(stub.Predict, predict_request(PIXELS[0:1]), timeout=WAIT_SECONDS)
        wait_until(lambda: gated.calls_started == 1, "the first request to hold the model")
        v1 = pool.submit(
            client.post, f"/v1/models/{MODEL_NAME}:predict", json={"inputs": PIXELS[1:2].tolist()}
        )
        wait_until(lambda: batcher.waiting == 1, "the /v1 request queued")
        v2 = pool.submit(client.post, f"/v2/models/{MODEL_NAME}/infer", json=v2_body)
        wait_until(lambda: batcher.waiting == 2, "the /v2 request queued")
        rpc = pool.submit(stub.Predict, predict_request(PIXELS[3:4]), timeout=WAIT_SECONDS)
        wait_until(lambda: batcher.waiting == 3, "the gRPC request queued")
        gated.gate.set()
        np.testing.assert_allclose(probabilities(first.result()), EXPECTED[0:1], atol=1e-6)
        np.testing.assert_allclose(
            v1.result().json()["outputs"][PROBABILITIES_KEY], EXPECTED[1:2], atol=1e-6
        )
        (output,) = [o for o in v2.result().json()["outputs"] if o["name"] == PROBABILITIES_KEY]
        np.testing.assert_allclose(output["data"], EXPECTED[2], atol=1e-6)
        np.testing.assert_allclose(probabilities(rpc.result()), EXPECTED[3:4], atol=1e-6)
    assert gated.sizes == [1, 3]


def test_a_deadline_frees_the_requests_place_in_the_queue():
    with (
        concurrent.futures.ThreadPoolExecutor(2) as pool,
        serving() as (client, stub, gated, batcher),
    ):
        gated.gate.clear()
        first = pool.submit(stub.Predict, predict_request(PIXELS[0:1]), timeout=WAIT_SECONDS)
        wait_until(lambda: gated.calls_started == 1, "the first request to hold the model")
        # Queued behind a model that does not answer until the gate opens: the deadline passes.
        with pytest.raises(grpc.RpcError) as caught:
            stub.Predict(predict_request(PIXELS[1:2]), timeout=0.5)
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        wait_until(lambda: batcher.waiting == 0, "the expired request to leave the queue")
        gated.gate.set()
        first.result()
        after = stub.Predict(predict_request(PIXELS[2:3]), timeout=WAIT_SECONDS)
        np.testing.assert_allclose(probabilities(after), EXPECTED[2:3], atol=1e-6)
        assert grpc_calls(client, "Predict") == {"OK": 2, "DEADLINE_EXCEEDED": 1}
    # The model never saw the expired request's image.
    assert gated.sizes == [1, 1]


def test_the_server_lives_and_dies_with_the_app():
    port = free_port()
    request = predict_request(PIXELS[0:1])
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with app_client(GatedFakeBackend(), serve_grpc=True, grpc_port=port):
            assert stub.Predict(request, timeout=WAIT_SECONDS).model_spec.version.value == 1
        with pytest.raises(grpc.RpcError) as caught:
            stub.Predict(request, timeout=WAIT_SECONDS)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_not_ready_is_unavailable_saying_why():
    backend = FakeBackend(versions=())
    backend.reason = "no version under models/fashion_mnist"
    port = free_port()
    with (
        app_client(backend, serve_grpc=True, grpc_port=port),
        grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Predict(predict_request(PIXELS[0:1]), timeout=WAIT_SECONDS)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "no version under models/fashion_mnist" in caught.value.details()


def test_a_port_another_server_holds_is_refused():
    """gRPC shares ports between servers by default (SO_REUSEPORT): ours must not."""
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = GRPCServer(dataplane=None, host="127.0.0.1", port=port, max_message_bytes=4096)
        with pytest.raises(RuntimeError, match=f"gRPC cannot listen on 127.0.0.1:{port}"):
            asyncio.run(server.start())


def _upstream(code: grpc.StatusCode) -> ServiceError:
    """A service error raised from TF Serving's answer, as the TF Serving backend raises it."""
    upstream = grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), "upstream")
    try:
        raise BadInput("upstream") from upstream
    except BadInput as err:
        return err


# Written out independently of the code: what a TF Serving client gets for each error.
STATUS_CODES = [
    pytest.param(BadInput("x"), grpc.StatusCode.INVALID_ARGUMENT, id="bad-input"),
    pytest.param(NotFound("x"), grpc.StatusCode.NOT_FOUND, id="not-found"),
    pytest.param(PayloadTooLarge("x"), grpc.StatusCode.RESOURCE_EXHAUSTED, id="over-max-images"),
    pytest.param(Overloaded("x"), grpc.StatusCode.UNAVAILABLE, id="queue-full"),
    pytest.param(TooManyRequests("x"), grpc.StatusCode.RESOURCE_EXHAUSTED, id="too-many"),
    pytest.param(NotReady("x"), grpc.StatusCode.UNAVAILABLE, id="not-ready"),
    pytest.param(UpstreamError("x"), grpc.StatusCode.UNAVAILABLE, id="shutting-down"),
    pytest.param(UpstreamTimeout("x"), grpc.StatusCode.DEADLINE_EXCEEDED, id="upstream-timeout"),
    pytest.param(ClientClosedRequest("x"), grpc.StatusCode.CANCELLED, id="client-gone"),
    pytest.param(Conflict("x"), grpc.StatusCode.ALREADY_EXISTS, id="conflict"),
    pytest.param(Forbidden("x"), grpc.StatusCode.PERMISSION_DENIED, id="forbidden"),
    pytest.param(Unauthorized("x"), grpc.StatusCode.UNAUTHENTICATED, id="unauthorized"),
    pytest.param(NotImplementedUpstream("x"), grpc.StatusCode.UNIMPLEMENTED, id="unimplemented"),
    pytest.param(UpstreamInternal("x"), grpc.StatusCode.UNKNOWN, id="upstream-internal"),
    pytest.param(ServiceError("x"), grpc.StatusCode.INTERNAL, id="base"),
    pytest.param(_upstream(grpc.StatusCode.FAILED_PRECONDITION), grpc.StatusCode.FAILED_PRECONDITION, id="tf-serving-code-passes-through"),
    pytest.param(_upstream(grpc.StatusCode.OUT_OF_RANGE), grpc.StatusCode.OUT_OF_RANGE, id="tf-serving-out-of-range"),
]  # fmt: skip


@pytest.mark.parametrize("error, code", STATUS_CODES)
def test_service_errors_as_grpc_codes(error, code):
    assert status_code_of(error) == code


def test_no_client_error_is_internal():
    client_errors = [BadInput, NotFound, PayloadTooLarge, Overloaded, TooManyRequests, NotReady]
    internal = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DATA_LOSS}
    assert all(status_code_of(error("x")) not in internal for error in client_errors)


def test_grpc_calls_need_the_http_sides_bearer_tokens(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("predictor-token-0123456789 predict\nwatcher-token-0123456789 status\n")
    port = free_port()
    request = predict_request(PIXELS[0:1])
    with (
        app_client(
            FakeBackend(),
            serve_grpc=True,
            grpc_port=port,
            auth_tokens_file=str(tokens),
            grpc_allow_plaintext_tokens=True,  # loopback
        ),
        grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        for metadata, code in (
            ((), grpc.StatusCode.UNAUTHENTICATED),
            ((("authorization", "Bearer not-a-token-at-all"),), grpc.StatusCode.UNAUTHENTICATED),
            (
                (("authorization", "Bearer watcher-token-0123456789"),),
                grpc.StatusCode.PERMISSION_DENIED,
            ),
        ):
            with pytest.raises(grpc.RpcError) as caught:
                stub.Predict(request, metadata=metadata, timeout=WAIT_SECONDS)
            assert caught.value.code() == code, metadata
        granted = (("authorization", "Bearer predictor-token-0123456789"),)
        assert (
            stub.Predict(request, metadata=granted, timeout=WAIT_SECONDS).model_spec.version.value
            == 1
        )
