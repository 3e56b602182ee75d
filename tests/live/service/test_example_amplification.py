"""tf.Example `context` amplification: a small :classify or Classify body whose context is
copied into each of many examples. The review's proof: a 504 KB REST body took peak RSS from
585 MB to 6.9 GB, and a 210 KB gRPC message added about 1 GB before its example count was
refused. Here, against a real `python -m service` serving a parsing receiver's model: the
count is checked before any copy, the copies are held in MAX_BODY_BYTES_IN_FLIGHT (413 /
RESOURCE_EXHAUSTED past it, before they are made), and the process's peak memory grows by
less than the budget and a margin.
"""

from __future__ import annotations

import grpc
import httpx
import pytest
from support.any_models import ROWS
from support.servers import resident_bytes, serve_models
from support.tf_reference import tf_example
from tensorflow_serving.apis import classification_pb2, prediction_service_pb2_grpc

BUDGET = 32 * 1024 * 1024  # MAX_BODY_BYTES_IN_FLIGHT for this server
MAX_IMAGES = 1024
# What the peak may grow beyond the budget (the interpreter's and TensorFlow's own churn of a
# few requests; the unbounded copies measured 6.3 GB).
MARGIN = 96 * 1024 * 1024


@pytest.fixture(scope="module")
def server(any_models, tmp_path_factory):
    server = serve_models(
        {"classifier_examples": any_models["classifier_examples"]},
        tmp_path_factory.mktemp("amplification"),
        MAX_BODY_BYTES_IN_FLIGHT=str(BUDGET),
        MAX_IMAGES=str(MAX_IMAGES),
        MAX_BODY_BYTES=str(1024 * 1024),
    )
    yield server
    server.stop()


def peak_from_now(pid: int) -> int:
    """The process's resident memory now, its peak (VmHWM) reset to it first, so that a
    later reading of the peak is this test's own (Linux's clear_refs, value 5). One server
    serves the module: memory an earlier case's regression freed may stay resident and hide
    a later one's, but that earlier case fails."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")
    return resident_bytes(pid, "VmHWM")


def context_of(size: int) -> dict:
    """A JSON context of about `size` bytes: one string feature no example overrides."""
    return {"pad": "x" * size}


def test_rest_context_copies_past_the_budget_are_refused_before_they_are_made(server):
    # 500 KB of context into 1,024 examples: 512 MB of copies, past the 32 MB budget.
    body = {"context": context_of(500_000), "examples": [ROWS[0]] * MAX_IMAGES}
    before = peak_from_now(server.process.pid)
    url = f"{server.url}/v1/models/classifier_examples:classify"
    response = httpx.post(url, json=body, timeout=60)
    assert response.status_code == 413, response.text
    assert "MAX_BODY_BYTES_IN_FLIGHT" in response.json()["error"]
    assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200
    grown = resident_bytes(server.process.pid, "VmHWM") - before
    assert grown < BUDGET + MARGIN, f"peak memory grew {grown >> 20} MB"


def test_rest_context_copies_within_the_budget_are_answered(server):
    # 16 KB of context into 1,024 examples: 16 MB of copies, within the budget.
    body = {"context": context_of(16_000), "examples": [ROWS[0]] * MAX_IMAGES}
    url = f"{server.url}/v1/models/classifier_examples:classify"
    response = httpx.post(url, json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert len(response.json()["results"]) == MAX_IMAGES


def classify_request(context_bytes: int, count: int) -> classification_pb2.ClassificationRequest:
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "classifier_examples"
    listed = request.input.example_list_with_context
    listed.context.CopyFrom(tf_example({"pad": "x" * context_bytes}))
    for _ in range(count):
        listed.examples.add().CopyFrom(tf_example(ROWS[0]))
    return request


@pytest.mark.parametrize(
    "context_bytes, count, fragment",
    [
        # 200 KB of context into one example past MAX_IMAGES: refused by count, no copy made.
        pytest.param(200_000, MAX_IMAGES + 1, "1025", id="count-first"),
        # 200 KB into 1,024 examples: 200 MB of copies, past the 32 MB budget.
        pytest.param(200_000, MAX_IMAGES, "MAX_BODY_BYTES_IN_FLIGHT", id="budget"),
    ],
)
def test_grpc_context_copies_are_counted_and_bounded(server, context_bytes, count, fragment):
    before = peak_from_now(server.process.pid)
    with grpc.insecure_channel(
        f"127.0.0.1:{server.grpc_port}",
        options=[("grpc.max_send_message_length", 64 << 20)],
    ) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Classify(classify_request(context_bytes, count), timeout=60)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, caught.value.details()
    assert fragment in caught.value.details()
    grown = resident_bytes(server.process.pid, "VmHWM") - before
    assert grown < BUDGET + MARGIN, f"peak memory grew {grown >> 20} MB"
