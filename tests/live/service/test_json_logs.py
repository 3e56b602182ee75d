"""`python -m service` with LOG_FORMAT=json and a LOG_CONFIG file, end to end: every line it
writes is one JSON object, the access line of a request carries the id it was sent with, the
answers (HTTP headers, gRPC trailing metadata) and the prediction log carry the same ids."""

from __future__ import annotations

import json
import re

import grpc
import httpx
import numpy as np
import pytest
import tensorflow as tf
from support.servers import MODEL_NAME, copy_repository, start_server
from tensorflow_serving.apis import predict_pb2, prediction_log_pb2, prediction_service_pb2_grpc

from artifact.contract import INPUT_KEY
from artifact.logs import REQUEST_FIELDS
from service.prediction_log import closed_logs

NEW_ID = re.compile(r"[0-9a-f]{32}")
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
BODY = {"instances": np.zeros((2, 28, 28)).tolist()}
PREDICT = f"/v1/models/{MODEL_NAME}:predict"


def grpc_request(model: str = MODEL_NAME) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.inputs[INPUT_KEY].CopyFrom(tf.make_tensor_proto(np.zeros((1, 28, 28), np.float32)))
    return request


def trailing_id(metadata) -> str | None:
    return dict(metadata or ()).get("x-request-id")


@pytest.fixture(scope="module")
def run(trained_model, tmp_path_factory):
    """A JSON-logging server with a LOG_CONFIG that also writes the access lines to a file,
    and prediction logging on; what the test sent it, once it stopped: (the server, its
    answers, the access-lines file, the prediction logs' folder)."""
    root = tmp_path_factory.mktemp("json-logs")
    access_file = root / "access.jsonl"
    config = root / "logging.yaml"
    config.write_text(
        "version: 1\n"
        "formatters:\n  json:\n    (): artifact.logs.JSONFormatter\n"
        f"handlers:\n  access:\n    class: logging.FileHandler\n    filename: {access_file}\n"
        "    formatter: json\n"
        "loggers:\n  service.access:\n    handlers: [access]\n"
    )
    log_dir = root / "prediction-logs"
    server = start_server(
        root / "server.log",
        grpc=True,
        MODEL_BASE_PATH=str(copy_repository(trained_model, root)),
        LOG_FORMAT="json",
        LOG_CONFIG=str(config),
        PREDICTION_LOG_SAMPLING_RATE="1",
        PREDICTION_LOG_DIR=str(log_dir),
    )
    answers = {}
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            headers = {
                "X-Request-ID": "live-http-1",
                "traceparent": f"00-{TRACE}-00f067aa0ba902b7-01",
            }
            answers["predict"] = client.post(PREDICT, json=BODY, headers=headers)
            answers["error"] = client.post(
                "/v1/models/nobody:predict", json=BODY, headers={"X-Request-ID": "x" * 129}
            )
            answers["plain"] = client.get("/healthz")
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            _, call = stub.Predict.with_call(
                grpc_request(), metadata=(("x-request-id", "live-grpc-1"),), timeout=60
            )
            answers["grpc"] = call.trailing_metadata()
            with pytest.raises(grpc.RpcError) as failed:
                stub.Predict(grpc_request("nobody"), metadata=(("x-request-id", "live-grpc-2"),),
                             timeout=60)  # fmt: skip
            answers["grpc error"] = (failed.value.code(), failed.value.trailing_metadata())
            _, call = stub.Predict.with_call(grpc_request(), timeout=60)
            answers["grpc new"] = call.trailing_metadata()
    finally:
        assert server.stop() == 0, server.log()
    return server, answers, access_file, log_dir


def test_every_line_the_service_writes_is_a_json_object(run):
    server, _, _, _ = run
    lines = server.log().splitlines()
    assert len(lines) > 5, lines
    for line in lines:
        entry = json.loads(line)  # a line that is not JSON fails here, and names itself
        assert {"time", "level", "logger", "message"} <= set(entry), line


def test_the_access_line_carries_the_id_the_request_was_sent_with(run):
    server, answers, _, _ = run
    assert answers["predict"].status_code == 200
    assert answers["predict"].headers["x-request-id"] == "live-http-1"
    entries = [json.loads(line) for line in server.log().splitlines()]
    (access,) = [e for e in entries if e.get("request_id") == "live-http-1"]
    assert set(REQUEST_FIELDS) <= set(access)
    assert access["logger"] == "service.access"
    assert (access["method"], access["path"], access["status"]) == ("POST", PREDICT, 200)
    assert (access["model"], access["version"], access["signature"]) == (
        MODEL_NAME,
        1,
        "serving_default",
    )
    assert (access["batch_size"], access["trace_id"]) == (2, TRACE)
    assert access["duration_ms"] > 0 and access["client"].startswith("127.0.0.1:")


def test_a_bad_id_is_replaced_and_an_error_answered_with_the_new_one(run):
    server, answers, _, _ = run
    error = answers["error"]
    assert error.status_code == 404
    made = error.headers["x-request-id"]
    assert NEW_ID.fullmatch(made), made
    entries = [json.loads(line) for line in server.log().splitlines()]
    logged = [e for e in entries if e.get("request_id") == made]
    # The error's own line and the access line.
    assert {e["logger"] for e in logged} == {"service", "service.access"}, logged
    assert NEW_ID.fullmatch(answers["plain"].headers["x-request-id"])


def test_grpc_answers_carry_the_request_id_in_trailing_metadata(run):
    server, answers, _, _ = run
    entries = [json.loads(line) for line in server.log().splitlines()]
    (access,) = [e for e in entries if e.get("request_id") == "live-grpc-1"]
    assert (access["logger"], access["method"], access["status"]) == ("service.access", "gRPC", 200)
    assert (access["model"], access["version"], access["batch_size"]) == (MODEL_NAME, 1, 1)
    assert trailing_id(answers["grpc"]) == "live-grpc-1"
    code, metadata = answers["grpc error"]
    assert code == grpc.StatusCode.NOT_FOUND
    assert trailing_id(metadata) == "live-grpc-2"
    assert NEW_ID.fullmatch(trailing_id(answers["grpc new"]) or ""), answers["grpc new"]


def test_the_log_config_file_is_applied(run):
    _, _, access_file, _ = run
    entries = [json.loads(line) for line in access_file.read_text().splitlines()]
    assert {e["logger"] for e in entries} == {"service.access"}
    assert "live-http-1" in {e["request_id"] for e in entries}


def test_the_prediction_log_holds_the_request_ids(run):
    _, _, _, log_dir = run
    records = [
        prediction_log_pb2.PredictionLog.FromString(record)
        for path in closed_logs(log_dir / MODEL_NAME)
        for record in tf.data.TFRecordDataset(str(path)).as_numpy_iterator()
    ]
    origins = [entry.log_metadata.request_origin for entry in records]
    assert sorted(origins[:2]) == ["live-grpc-1", "live-http-1"], origins
    assert len(origins) == 3 and NEW_ID.fullmatch(origins[2]), origins
