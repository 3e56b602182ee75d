"""The Open Inference Protocol's gRPC service in the test process over fake backends: not
ready and overloaded are UNAVAILABLE saying why, and a V2 gRPC call shares a batch with TF
Serving's Predict and HTTP's /v2 (one data plane, one batcher).

Slow only because the gRPC server imports TF Serving's protos (TensorFlow); no model runs.
"""

from __future__ import annotations

import concurrent.futures
import contextlib

import grpc
import numpy as np
import pytest
from support.fakes import (
    MODEL_NAME,
    FakeBackend,
    GatedFakeBackend,
    app_client,
    toy_model,
    wait_until,
)
from support.servers import free_port

from service import v2_proto
from service.backends.batching import BatchingBackend
from service.errors import OVERLOADED

TIMEOUT = 30.0
PIXELS = np.random.default_rng(4).random((3, 28, 28)).astype(np.float32)


def call(channel: grpc.Channel, method: str, request):
    request_class, response_class = v2_proto.METHODS[method]
    stub = channel.unary_unary(
        f"/{v2_proto.SERVICE}/{method}",
        request_serializer=request_class.SerializeToString,
        response_deserializer=response_class.FromString,
    )
    return stub(request, timeout=TIMEOUT)


def infer_request(images: np.ndarray) -> v2_proto.ModelInferRequest:
    request = v2_proto.ModelInferRequest(model_name=MODEL_NAME)
    request.inputs.add(name="image", datatype="FP32", shape=list(images.shape))
    request.raw_input_contents.append(images.astype("<f4").tobytes())
    return request


@contextlib.contextmanager
def serving(backend):
    port = free_port()
    with (
        app_client(backend, serve_grpc=True, grpc_port=port) as client,
        grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        yield client, channel


def test_not_ready_says_so_and_inference_is_unavailable_saying_why():
    backend = FakeBackend(versions=())
    backend.reason = "no version under models/fashion_mnist"
    with serving(backend) as (_, channel):
        assert call(channel, "ServerLive", v2_proto.ServerLiveRequest()).live
        assert not call(channel, "ServerReady", v2_proto.ServerReadyRequest()).ready
        ready = call(channel, "ModelReady", v2_proto.ModelReadyRequest(name=MODEL_NAME))
        assert not ready.ready
        with pytest.raises(grpc.RpcError) as caught:
            call(channel, "ModelInfer", infer_request(PIXELS[:1]))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "no version under models/fashion_mnist" in caught.value.details()


def test_a_full_queue_is_unavailable_before_the_tensors_are_read():
    gated = GatedFakeBackend()
    batcher = BatchingBackend(gated, 1, timeout_ms=0, max_queue=1)
    with (
        concurrent.futures.ThreadPoolExecutor(2) as pool,
        serving(batcher) as (_, channel),
    ):
        gated.gate.clear()
        try:
            first = pool.submit(call, channel, "ModelInfer", infer_request(PIXELS[:1]))
            wait_until(lambda: gated.calls_started == 1, "the first request to hold the model")
            second = pool.submit(call, channel, "ModelInfer", infer_request(PIXELS[1:2]))
            wait_until(lambda: batcher.waiting == 1, "the second request queued")
            with pytest.raises(grpc.RpcError) as caught:
                call(channel, "ModelInfer", infer_request(PIXELS[2:3]))
        finally:
            gated.gate.set()
        assert first.result().model_version == "1" and second.result().model_version == "1"
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert caught.value.details() == OVERLOADED
    assert gated.sizes == [1, 1]  # the refused request never reached the model


def test_v2_grpc_shares_one_batch_with_tf_serving_grpc_and_http():
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    from service.codecs.tensor_proto import fill_tensor_proto

    gated = GatedFakeBackend()
    batcher = BatchingBackend(gated, 4, timeout_ms=0, max_queue=8)
    body = {"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 28, 28], "data": PIXELS[1].ravel().tolist()}]}  # fmt: skip
    predict = predict_pb2.PredictRequest()
    predict.model_spec.name = MODEL_NAME
    fill_tensor_proto(predict.inputs["image"], PIXELS[2:3])
    with (
        concurrent.futures.ThreadPoolExecutor(4) as pool,
        serving(batcher) as (client, channel),
    ):
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        gated.gate.clear()
        try:
            holder = pool.submit(call, channel, "ModelInfer", infer_request(PIXELS[:1]))
            wait_until(lambda: gated.calls_started == 1, "the first request to hold the model")
            v2_http = pool.submit(client.post, f"/v2/models/{MODEL_NAME}/infer", json=body)
            wait_until(lambda: batcher.waiting == 1, "the /v2 request queued")
            tf_grpc = pool.submit(stub.Predict, predict, timeout=TIMEOUT)
            wait_until(lambda: batcher.waiting == 2, "the Predict call queued")
            v2_grpc = pool.submit(call, channel, "ModelInfer", infer_request(PIXELS[:1]))
            wait_until(lambda: batcher.waiting == 3, "the ModelInfer call queued")
        finally:
            gated.gate.set()
        holder.result()
        assert v2_http.result().status_code == 200 and tf_grpc.result().outputs
        answer = v2_grpc.result()
    assert gated.sizes == [1, 3]  # the three queued requests: one model call
    probabilities = np.frombuffer(answer.raw_output_contents[1], "<f4").reshape(1, 10)
    np.testing.assert_allclose(probabilities, toy_model(1, PIXELS[:1])["probabilities"], atol=1e-6)
