"""GRPC_PORT secured by default (service/protocols/grpc_access.py, grpc_server.py): TLS with
HTTP's certificate, no bearer token taken in clear unless GRPC_ALLOW_PLAINTEXT_TOKENS says so,
a token checked before the call's message is parsed, and a cap on the calls served at once.

Slow only because TF Serving's protos import TensorFlow; no model runs (the fake backends).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import re
import threading

import grpc
import numpy as np
import pytest
import tensorflow as tf
from support.fakes import MODEL_NAME, FakeBackend, GatedFakeBackend, app_client, wait_until
from support.helpers import self_signed
from support.servers import free_port
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from service import v2_proto

TOKEN = "predictor-token-0123456789"
GRANTED = (("authorization", f"Bearer {TOKEN}"),)
WAIT_SECONDS = 30.0
LARGE_BYTES = 7 * 1024 * 1024


@pytest.fixture
def tokens(tmp_path):
    path = tmp_path / "tokens"
    path.write_text(f"{TOKEN} predict,status\n")
    return str(path)


def predict_request(images: np.ndarray) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = MODEL_NAME
    request.inputs["image"].CopyFrom(tf.make_tensor_proto(images))
    return request


ONE_IMAGE = predict_request(np.zeros((1, 28, 28), np.float32))


def code_of(call, *args, **kwargs) -> tuple[grpc.StatusCode, str]:
    try:
        call(*args, timeout=WAIT_SECONDS, **kwargs)
    except grpc.RpcError as err:
        return err.code(), err.details()
    return grpc.StatusCode.OK, ""


def test_grpc_serves_tls_with_the_http_certificate(tmp_path, tokens):
    cert, key = self_signed(tmp_path)
    port = free_port()
    credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
    with (
        app_client(
            FakeBackend(),
            serve_grpc=True,
            grpc_port=port,
            tls_cert_file=str(cert),
            tls_key_file=str(key),
            auth_tokens_file=tokens,
        ),
        grpc.secure_channel(f"127.0.0.1:{port}", credentials) as channel,
        grpc.insecure_channel(f"127.0.0.1:{port}") as plaintext,
    ):
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        response = stub.Predict(ONE_IMAGE, metadata=GRANTED, timeout=WAIT_SECONDS)
        assert response.model_spec.version.value == 1
        # Over TLS a token is taken; without one the usual rule holds.
        assert code_of(stub.Predict, ONE_IMAGE)[0] == grpc.StatusCode.UNAUTHENTICATED
        # A client that does not speak TLS never reaches a method.
        refused = prediction_service_pb2_grpc.PredictionServiceStub(plaintext)
        code, _ = code_of(refused.Predict, ONE_IMAGE, metadata=GRANTED)
        assert code == grpc.StatusCode.UNAVAILABLE


def test_a_token_over_plaintext_grpc_is_refused_saying_why(tokens):
    port = free_port()
    with (
        app_client(FakeBackend(), serve_grpc=True, grpc_port=port, auth_tokens_file=tokens),
        grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        code, details = code_of(stub.Predict, ONE_IMAGE, metadata=GRANTED)
        assert code == grpc.StatusCode.UNAUTHENTICATED
        assert "plaintext gRPC" in details and "GRPC_ALLOW_PLAINTEXT_TOKENS" in details
        # The Open Inference Protocol's service is behind the same rule; its health is open.
        live = channel.unary_unary(
            f"/{v2_proto.SERVICE}/ServerLive",
            request_serializer=v2_proto.ServerLiveRequest.SerializeToString,
            response_deserializer=v2_proto.ServerLiveResponse.FromString,
        )
        assert live(v2_proto.ServerLiveRequest(), timeout=WAIT_SECONDS).live
        code, details = code_of(live, v2_proto.ServerLiveRequest(), metadata=GRANTED)
        assert code == grpc.StatusCode.UNAUTHENTICATED and "plaintext" in details


def test_a_token_over_plaintext_is_taken_when_allowed(tokens):
    port = free_port()
    with (
        app_client(
            FakeBackend(),
            serve_grpc=True,
            grpc_port=port,
            auth_tokens_file=tokens,
            grpc_allow_plaintext_tokens=True,
        ),
        grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        assert code_of(stub.Predict, ONE_IMAGE, metadata=GRANTED)[0] == grpc.StatusCode.OK


def test_a_call_without_a_token_is_refused_before_its_message_is_parsed(monkeypatch, tokens):
    parsed = []
    from_string = predict_pb2.PredictRequest.FromString

    def counting(data):
        parsed.append(len(data))
        return from_string(data)

    # The generated stubs pass FromString to the server as its deserializer when the
    # servicer is added: counted from then on.
    monkeypatch.setattr(predict_pb2.PredictRequest, "FromString", counting)
    large = predict_pb2.PredictRequest()
    large.model_spec.name = MODEL_NAME
    large.inputs["image"].dtype = tf.float32.as_datatype_enum
    large.inputs["image"].tensor_content = bytes(LARGE_BYTES)
    port = free_port()
    with (
        app_client(
            FakeBackend(),
            serve_grpc=True,
            grpc_port=port,
            auth_tokens_file=tokens,
            grpc_allow_plaintext_tokens=True,
        ) as client,
        grpc.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 2 * LARGE_BYTES)]
        ) as channel,
    ):
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        for metadata, code in (
            ((), grpc.StatusCode.UNAUTHENTICATED),
            ((("authorization", "Bearer not-a-token-at-all"),), grpc.StatusCode.UNAUTHENTICATED),
        ):
            assert code_of(stub.Predict, large, metadata=metadata)[0] == code
        assert parsed == []
        # The refusals are counted as the servicers count their answers.
        metrics = client.get("/metrics", headers={"authorization": f"Bearer {TOKEN}"}).text
        assert 'grpc_requests_total{code="UNAUTHENTICATED",method="Predict"} 2.0' in metrics
        # With the token the same message is parsed (and refused by the servicer: no shape).
        assert code_of(stub.Predict, large, metadata=GRANTED)[0] == grpc.StatusCode.INVALID_ARGUMENT
        assert parsed == [large.ByteSize()]


def test_calls_past_grpc_max_concurrent_rpcs_are_refused_by_grpc():
    gated = GatedFakeBackend()
    gated.gate.clear()
    port = free_port()
    with (
        concurrent.futures.ThreadPoolExecutor(2) as pool,
        app_client(gated, serve_grpc=True, grpc_port=port, grpc_max_concurrent_rpcs=2),
        grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        try:
            held = [pool.submit(stub.Predict, ONE_IMAGE, timeout=WAIT_SECONDS) for _ in range(2)]
            wait_until(lambda: gated.calls_started == 2, "two calls to hold the model")
            code, details = code_of(stub.Predict, ONE_IMAGE)
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "Concurrent RPC limit exceeded" in details
        finally:
            gated.gate.set()
        assert [call.result().model_spec.version.value for call in held] == [1, 1]
        # Once they are answered there is room again.
        assert code_of(stub.Predict, ONE_IMAGE)[0] == grpc.StatusCode.OK


STALLED_SECONDS = 10.0


@contextlib.contextmanager
def stalled_calls(channel, count: int, metadata=()):
    """`count` calls to Predict that open their stream and never send their message (a
    client-streaming call whose iterator waits); their futures. Released at the end."""
    release = threading.Event()

    def never():
        release.wait(WAIT_SECONDS)
        return
        yield  # a generator that yields nothing, once released

    call = channel.stream_unary(
        "/tensorflow.serving.PredictionService/Predict",
        request_serializer=predict_pb2.PredictRequest.SerializeToString,
        response_deserializer=predict_pb2.PredictResponse.FromString,
    )
    try:
        yield [
            call.future(never(), metadata=metadata, timeout=STALLED_SECONDS) for _ in range(count)
        ]
    finally:
        release.set()


def ended_with(futures) -> list[grpc.StatusCode]:
    codes = []
    for future in futures:
        try:
            future.result()
        except grpc.RpcError as err:
            codes.append(err.code())
        else:
            codes.append(grpc.StatusCode.OK)
    return codes


def server_live(channel) -> tuple[grpc.StatusCode, str]:
    live = channel.unary_unary(
        f"/{v2_proto.SERVICE}/ServerLive",
        request_serializer=v2_proto.ServerLiveRequest.SerializeToString,
        response_deserializer=v2_proto.ServerLiveResponse.FromString,
    )
    return code_of(live, v2_proto.ServerLiveRequest())


def test_a_refused_call_ends_without_waiting_for_its_message(tokens):
    """Calls without a token that never send their message are refused at once: they cannot
    fill GRPC_MAX_CONCURRENT_RPCS (the review's 256 stalled calls, here 4 of 4)."""
    port = free_port()
    with (
        app_client(
            FakeBackend(),
            serve_grpc=True,
            grpc_port=port,
            auth_tokens_file=tokens,
            grpc_allow_plaintext_tokens=True,
            grpc_max_concurrent_rpcs=4,
        ),
        grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
        stalled_calls(channel, 4) as stalled,
    ):
        assert ended_with(stalled) == [grpc.StatusCode.UNAUTHENTICATED] * 4
        assert server_live(channel)[0] == grpc.StatusCode.OK


def test_a_call_whose_message_never_comes_ends_at_the_receive_deadline():
    """A call the server takes (no tokens here) must send its message within
    BODY_TIMEOUT_SECONDS, as an HTTP body must; then its slot is free again."""
    port = free_port()
    with (
        app_client(
            FakeBackend(),
            serve_grpc=True,
            grpc_port=port,
            grpc_max_concurrent_rpcs=4,
            body_timeout_seconds=0.5,
        ),
        grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
        stalled_calls(channel, 4) as stalled,
    ):
        assert ended_with(stalled) == [grpc.StatusCode.DEADLINE_EXCEEDED] * 4
        details = {future.exception().details() for future in stalled}
        assert details == {"the request message did not arrive within 0.5 s (BODY_TIMEOUT_SECONDS)"}
        assert server_live(channel)[0] == grpc.StatusCode.OK
        # A call that sends its message is answered as before.
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        assert code_of(stub.Predict, ONE_IMAGE)[0] == grpc.StatusCode.OK
        # One that ends its stream without a message is not a unary call.
        empty = channel.stream_unary("/tensorflow.serving.PredictionService/Predict")
        code, details = code_of(empty, iter(()))
        assert (code, details) == (
            grpc.StatusCode.INTERNAL,
            "the call ended without its request message",
        )


def test_every_call_is_answered_with_its_request_id_refused_or_not(tokens):
    """x-request-id in the trailing metadata (service/protocols/grpc_access.py): the client's
    when it is a good one, else a new one; and the log records of the call carry it."""
    from artifact.logs import JSONFormatter

    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.setFormatter(JSONFormatter())
    handler.emit = lambda record: lines.append(handler.format(record))
    loggers = [logging.getLogger("service.grpc"), logging.getLogger("service.access")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    port = free_port()
    try:
        with (
            app_client(FakeBackend(), serve_grpc=True, grpc_port=port, auth_tokens_file=tokens,
                       grpc_allow_plaintext_tokens=True),
            grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
        ):  # fmt: skip
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            _, call = stub.Predict.with_call(
                ONE_IMAGE, metadata=(*GRANTED, ("x-request-id", "granted-1")), timeout=WAIT_SECONDS
            )
            assert dict(call.trailing_metadata())["x-request-id"] == "granted-1"
            for metadata, code in [
                ((("x-request-id", "refused-1"),), grpc.StatusCode.UNAUTHENTICATED),
                ((*GRANTED, ("x-request-id", "x" * 129)), grpc.StatusCode.NOT_FOUND),
            ]:
                request = predict_request(np.zeros((1, 28, 28), np.float32))
                if code == grpc.StatusCode.NOT_FOUND:
                    request.model_spec.name = "nobody"
                with pytest.raises(grpc.RpcError) as failed:
                    stub.Predict(request, metadata=metadata, timeout=WAIT_SECONDS)
                assert failed.value.code() == code
                answered = dict(failed.value.trailing_metadata())["x-request-id"]
                if code == grpc.StatusCode.UNAUTHENTICATED:
                    assert answered == "refused-1"
                else:
                    assert re.fullmatch("[0-9a-f]{32}", answered), answered
                    made = answered
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)
    entries = [json.loads(line) for line in lines]
    # The not-found call's own line carries the id it was answered with.
    (logged,) = [
        e for e in entries if e["logger"] == "service.grpc" and "NOT_FOUND" in e["message"]
    ]
    assert logged["request_id"] == made
    # Every call's access line, as HTTP's: the HTTP status of its code, what answered it.
    access = {e["request_id"]: e for e in entries if e["logger"] == "service.access"}
    assert set(access) == {"granted-1", "refused-1", made}, access
    predict = "/tensorflow.serving.PredictionService/Predict"
    for request_id, status, model in [("granted-1", 200, MODEL_NAME), ("refused-1", 401, None),
                                      (made, 404, None)]:  # fmt: skip
        line = access[request_id]
        assert (line["method"], line["path"], line["status"]) == ("gRPC", predict, status), line
        assert line["model"] == model and line["client"].startswith("127.0.0.1:"), line
    assert (access["granted-1"]["version"], access["granted-1"]["batch_size"]) == (1, 1)
    assert access[made]["message"].endswith(f'"gRPC {predict}" NOT_FOUND')
