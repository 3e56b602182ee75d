"""`python -m service` exporting traces over OTLP/HTTP to a real receiver
(tests/support/otlp_receiver.py, decoding opentelemetry-proto's ExportTraceServiceRequest):
a REST `:predict`, a V2 `/infer` and a gRPC Predict, each sent with a `traceparent`, make
spans under the caller's span (the request, admission, parsing, queue wait, the batched
model call linked to the request, rendering) with their attributes, and the JSON access
line names the same trace."""

from __future__ import annotations

import json

import grpc
import httpx
import numpy as np
import pytest
import tensorflow as tf
from support.otlp_receiver import Receiver
from support.servers import MODEL_NAME, copy_repository, start_server
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from artifact.contract import INPUT_KEY

PARENT = "00f067aa0ba902b7"
# One trace per protocol, each sent sampled by its caller.
TRACES = {
    "rest": "4bf92f3577b34da6a3ce929d0e0e4736",
    "v2": "5bf92f3577b34da6a3ce929d0e0e4737",
    "grpc": "6bf92f3577b34da6a3ce929d0e0e4738",
}
SERVER_KIND = 2  # opentelemetry-proto's Span.SPAN_KIND_SERVER


def traceparent(protocol: str) -> str:
    return f"00-{TRACES[protocol]}-{PARENT}-01"


@pytest.fixture(scope="module")
def run(trained_model, tmp_path_factory):
    """A server exporting to the receiver, sent one request of each protocol; (the spans the
    receiver got, the server's JSON lines, the answers)."""
    root = tmp_path_factory.mktemp("tracing")
    with Receiver() as receiver:
        server = start_server(
            root / "server.log",
            grpc=True,
            MODEL_BASE_PATH=str(copy_repository(trained_model, root)),
            LOG_FORMAT="json",
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_SERVICE_NAME="estimator-serving-test",
            OTEL_BSP_SCHEDULE_DELAY="50",
        )
        answers = {}
        try:
            with httpx.Client(base_url=server.url, timeout=60) as client:
                answers["rest"] = client.post(
                    f"/v1/models/{MODEL_NAME}:predict",
                    json={"instances": np.zeros((2, 28, 28)).tolist()},
                    headers={"traceparent": traceparent("rest")},
                )
                v2 = {"inputs": [{"name": INPUT_KEY, "shape": [3, 28, 28], "datatype": "FP32",
                                  "data": np.zeros(3 * 28 * 28).tolist()}]}  # fmt: skip
                answers["v2"] = client.post(
                    f"/v2/models/{MODEL_NAME}/infer",
                    json=v2,
                    headers={"traceparent": traceparent("v2")},
                )
            with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
                stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
                request = predict_pb2.PredictRequest()
                request.model_spec.name = MODEL_NAME
                request.inputs[INPUT_KEY].CopyFrom(
                    tf.make_tensor_proto(np.zeros((1, 28, 28), np.float32))
                )
                answers["grpc"] = stub.Predict(
                    request, metadata=(("traceparent", traceparent("grpc")),), timeout=60
                )

            def every_request_done(spans) -> bool:
                done = {(s.trace_id, s.kind) for s in spans if s.parent_span_id == PARENT}
                return all((trace, SERVER_KIND) in done for trace in TRACES.values()) and all(
                    any(s.name == "model" and s.trace_id == t for s in spans)
                    for t in TRACES.values()
                )

            spans = receiver.wait_for(every_request_done, "every request's spans")
        finally:
            assert server.stop() == 0, server.log()
        assert receiver.refused == []
    lines = [json.loads(line) for line in server.log().splitlines()]
    return spans, lines, answers


@pytest.mark.parametrize(
    "protocol, request_name, parse_names",
    [
        pytest.param("rest", "POST /v1/models/{name}:predict", ("admission", "read body",
                     "parse", "read inputs", "render"), id="rest"),
        pytest.param("v2", "POST /v2/models/{name}/infer", ("read body", "parse", "render"),
                     id="v2"),
        pytest.param("grpc", "/tensorflow.serving.PredictionService/Predict",
                     ("admission", "parse", "render"), id="grpc"),
    ],
)  # fmt: skip
def test_a_request_is_traced_under_its_callers_span(run, protocol, request_name, parse_names):
    spans, lines, answers = run
    trace = TRACES[protocol]
    mine = [s for s in spans if s.trace_id == trace]
    (request,) = [s for s in mine if s.parent_span_id == PARENT]
    assert (request.name, request.kind) == (request_name, SERVER_KIND)
    assert request.service_name == "estimator-serving-test"
    assert request.attributes["model"] == MODEL_NAME
    assert request.attributes["model.version"] == 1
    assert request.attributes["model.signature"] == "serving_default"
    named = {s.name: s for s in mine if s is not request}
    for name in (*parse_names, "queue wait", "model"):
        assert named[name].parent_span_id == request.span_id, (name, sorted(named))
    model = named["model"]
    assert model.links == ((trace, request.span_id),)
    expected_rows = {"rest": 2, "v2": 3, "grpc": 1}[protocol]
    assert model.attributes["batch.size"] == expected_rows
    assert model.attributes["batch.requests"] == 1
    assert model.attributes["model.version"] == 1
    queued = named["queue wait"]
    assert request.start_ns <= queued.start_ns <= queued.end_ns <= model.start_ns
    assert model.end_ns <= named["render"].start_ns <= request.end_ns
    # The access line names the same trace.
    (access,) = [
        line
        for line in lines
        if line.get("logger") == "service.access" and line["trace_id"] == trace
    ]
    assert access["status"] == 200


def test_every_answer_was_a_prediction(run):
    _, _, answers = run
    assert answers["rest"].status_code == 200, answers["rest"].text
    assert answers["v2"].status_code == 200, answers["v2"].text
    assert answers["grpc"].outputs
