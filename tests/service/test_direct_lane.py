"""The direct lane (service/directlane.py): plain predictions answered by the server's protocol
itself give exactly the app's answers (status, headers, body), are counted and timed as the
app's are, keep the connection's rules (keep-alive, HTTP/1.0, pipelining, the body's
deadline), and stop when their client leaves; anything else goes through the app.

Two real servers over the same fake backend, one with the lane and one without, answer the
same requests; a spy on the lane says which ones it took, so each comparison is known to
compare the two paths.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import socket
import threading

import httpx
import numpy as np
import orjson
import pytest
from fakes import MODEL_NAME, FakeBackend, GatedFakeBackend, threaded_server, wait_until
from helpers import png_bytes
from test_hostile import http_answers, raw_exchange, response_complete

from service import codec
from service.app import create_app
from service.backends.batching import BatchingBackend
from service.server import guarded_protocol
from service.settings import Settings

PREDICT = f"/v1/models/{MODEL_NAME}:predict"
IMAGE = (np.arange(784).reshape(28, 28) % 256 / 255).round(4).tolist()
PIXELS = (np.arange(784).reshape(28, 28) % 256).tolist()
V2_JSON = {"inputs": [{"name": "image", "shape": [1, 28, 28], "datatype": "FP32",
                       "data": sum(IMAGE, [])}]}  # fmt: skip


def v2_binary() -> tuple[bytes, dict]:
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "image",
                    "shape": [1, 28, 28],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 784 * 4},
                }
            ]
        }  # fmt: skip
    )
    body = header + np.asarray(IMAGE, "<f4").tobytes()
    return body, {
        "content-type": "application/octet-stream",
        "inference-header-content-length": str(len(header)),
    }


def serve(backend, direct: bool, keepalive: float = 5, **settings):
    """A real server over `backend`, its direct lane on or off, and a spy on what it took."""
    app = create_app(Settings(model_name=MODEL_NAME, max_body_bytes=200_000, **settings), backend)
    lane = app.state.direct_lane
    took: list[str] = []
    take = lane.take

    def spy(method, url, headers):
        taken = take(method, url, headers)
        if taken is not None:
            took.append(url.decode())
        return taken

    lane.take = spy
    protocol = guarded_protocol(
        16 * 1024, 10.0, app.state.refusal, lane if direct else None
    )  # fmt: skip
    return threaded_server(app, http=protocol, timeout_keep_alive=keepalive), took


@pytest.fixture(scope="module")
def servers():
    backend = FakeBackend(versions=(1, 2))
    backend.labels = {"stable": 1}
    with contextlib.ExitStack() as stack:
        direct, took = serve(backend, direct=True)
        plain, _ = serve(backend, direct=False)
        direct_url, direct_server = stack.enter_context(direct)
        plain_url, _ = stack.enter_context(plain)
        STATES[direct_url] = direct_server.server_state
        yield direct_url, plain_url, took


STATES: dict = {}  # url -> uvicorn's server state (its live connections)


def servers_state(url: str):
    return STATES[url]


def exchange(url: str, method: str, path: str, **kwargs) -> tuple[int, dict, bytes]:
    response = httpx.request(method, url + path, timeout=30, **kwargs)
    headers = {k: v for k, v in response.headers.items() if k != "date"}
    return response.status_code, headers, response.content


binary_body, binary_headers = v2_binary()
photo = png_bytes(np.full((40, 30), 200, np.uint8))

TAKEN = [
    ("row format", PREDICT, {"json": {"instances": [IMAGE, IMAGE]}}),
    ("columnar", PREDICT, {"json": {"inputs": {"image": [IMAGE]}}}),
    ("a version", f"/v1/models/{MODEL_NAME}/versions/2:predict", {"json": {"instances": [IMAGE]}}),
    ("a label", f"/v1/models/{MODEL_NAME}/labels/stable:predict", {"json": {"instances": [IMAGE]}}),
    ("an unknown label", f"/v1/models/{MODEL_NAME}/labels/nope:predict",
     {"json": {"instances": [IMAGE]}}),
    ("an unknown version", f"/v1/models/{MODEL_NAME}/versions/9:predict",
     {"json": {"instances": [IMAGE]}}),
    ("a bad version", f"/v1/models/{MODEL_NAME}/versions/x:predict",
     {"json": {"instances": [IMAGE]}}),
    ("an unknown model", "/v1/models/nope:predict", {"json": {"instances": [IMAGE]}}),
    ("broken JSON", PREDICT, {"content": b'{"instances": [[[0.1,'}),
    ("an empty body", PREDICT, {"content": b""}),
    ("booleans", PREDICT, {"json": {"instances": [[[True] * 28] * 28]}}),
    ("a wrong shape", PREDICT, {"json": {"instances": [[[0.0] * 27] * 28]}}),
    ("too many images", PREDICT, {"json": {"instances": [IMAGE] * 17}}),
    ("percent-encoded path", f"/v1/models/{MODEL_NAME}%3Apredict", {"json": {"instances": [IMAGE]}}),
    ("V2 JSON", f"/v2/models/{MODEL_NAME}/infer", {"json": V2_JSON}),
    ("V2 binary", f"/v2/models/{MODEL_NAME}/infer",
     {"content": binary_body, "headers": binary_headers}),
    ("V2 bad header length", f"/v2/models/{MODEL_NAME}/infer",
     {"content": binary_body, "headers": {**binary_headers,
                                          "inference-header-content-length": "9999"}}),
    ("/predict pixels", "/predict", {"json": {"instances": [PIXELS]}}),
    ("/predict with pixels back", "/predict?include_pixels=true&invert=no",
     {"json": {"instances": [PIXELS]}}),
    ("/predict bad query", "/predict?include_pixels=maybe", {"json": {"instances": [PIXELS]}}),
    ("/predict base64", "/predict", {"json": {"instances": [{"b64": base64.b64encode(photo).decode()}]}}),
]  # fmt: skip

LEFT_TO_THE_APP = [
    ("a browser's origin", PREDICT,
     {"json": {"instances": [IMAGE]}, "headers": {"origin": "http://127.0.0.1"}}),
    ("an encoded body", f"/v2/models/{MODEL_NAME}/infer",
     {"content": b"x", "headers": {"content-encoding": "gzip"}}),
    ("a multipart form", "/predict", {"files": [("files", ("a.png", photo, "image/png"))]}),
    ("a chunked body", PREDICT,
     {"content": iter([b'{"instances": ', json.dumps([IMAGE]).encode(), b"}"])}),
    ("a body over the limit", PREDICT, {"content": b" " * 200_001}),
    ("a GET", PREDICT, {}),
    ("another route", "/v1/models/fashion_mnist", {}),
]  # fmt: skip


@pytest.mark.parametrize(
    "path, kwargs", [pytest.param(p, k, id=i) for i, p, k in TAKEN]
)  # fmt: skip
def test_the_lane_answers_as_the_app_does(servers, path, kwargs):
    direct_url, plain_url, took = servers
    took.clear()
    method = "POST"
    assert exchange(direct_url, method, path, **kwargs) == exchange(
        plain_url, method, path, **kwargs
    )
    assert len(took) == 1, "the direct lane did not take the request"


@pytest.mark.parametrize(
    "path, kwargs", [pytest.param(p, k, id=i) for i, p, k in LEFT_TO_THE_APP]
)  # fmt: skip
def test_what_the_app_must_see_goes_through_it(servers, path, kwargs):
    direct_url, plain_url, took = servers
    took.clear()
    method = "GET" if not kwargs else "POST"
    if "content" in kwargs and not isinstance(kwargs["content"], bytes):
        # A generator is read once: the same chunks again for the second server.
        chunks = [b'{"instances": ', json.dumps([IMAGE]).encode(), b"}"]
        first = exchange(direct_url, method, path, content=iter(chunks))
        second = exchange(plain_url, method, path, content=iter(chunks))
    else:
        first = exchange(direct_url, method, path, **kwargs)
        second = exchange(plain_url, method, path, **kwargs)
    assert first == second
    assert took == []


def test_a_token_the_app_would_refuse_goes_to_the_app(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("predict-token-0123456789 predict\nstatus-token-0123456789 status\n")
    server, took = serve(FakeBackend(), direct=True, auth_tokens_file=str(tokens))
    with server as (url, _):
        body = {"instances": [IMAGE]}
        good = httpx.post(url + PREDICT, json=body,
                          headers={"authorization": "Bearer predict-token-0123456789"})  # fmt: skip
        assert good.status_code == 200 and took == [PREDICT]
        for authorization in (
            "",
            "Bearer wrong-token-0123456789",
            "Bearer status-token-0123456789",
        ):
            took.clear()
            refused = httpx.post(url + PREDICT, json=body, headers={"authorization": authorization})
            assert refused.status_code in (401, 403) and "www-authenticate" in refused.headers
            assert took == []


def metric(url: str, line: str) -> float:
    for row in httpx.get(url + "/metrics").text.splitlines():
        if row.startswith(line + " "):
            return float(row.split()[-1])
    return 0.0


def test_answers_are_counted_and_timed_as_the_apps_are(servers):
    direct_url, _, took = servers
    ok = 'http_requests_total{method="POST",route="/v1/models/{name}:predict",status="200"}'
    bad = 'http_requests_total{method="POST",route="/v1/models/{name}:predict",status="400"}'
    timed = 'http_request_duration_seconds_count{route="/v1/models/{name}:predict"}'
    before = [metric(direct_url, name) for name in (ok, bad, timed)]
    took.clear()
    httpx.post(direct_url + PREDICT, json={"instances": [IMAGE]})
    httpx.post(direct_url + PREDICT, content=b"{")
    after = [metric(direct_url, name) for name in (ok, bad, timed)]
    assert len(took) == 2
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1, 2]
    assert metric(direct_url, "http_requests_in_flight") == 1  # the /metrics request itself


def request_bytes(path: str, body: bytes, extra: str = "", version: str = "1.1") -> bytes:
    return (
        f"POST {path} HTTP/{version}\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


BODY = orjson.dumps({"instances": [IMAGE]})


def test_kept_alive_pipelined_and_closed_connections(servers):
    direct_url, _, took = servers
    took.clear()
    # Pipelined: a prediction, a probe the app answers, a prediction; answered in order.
    data = (
        request_bytes(PREDICT, BODY)
        + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        + request_bytes(f"/v1/models/{MODEL_NAME}/versions/2:predict", BODY, "Connection: close\r\n")
    )  # fmt: skip
    answers = http_answers(raw_exchange(direct_url, data))
    assert [head.split(b"\r\n")[0] for head, _ in answers] == [b"http/1.1 200 ok"] * 3
    assert orjson.loads(answers[0][1])["model_version"] == "1"
    assert orjson.loads(answers[2][1])["model_version"] == "2"
    assert b"connection: close" not in answers[0][0]
    assert b"connection: close" in answers[2][0]  # and the server closed it (the read ended)
    assert len(took) >= 1  # the first; the last was pipelined behind the app's answer
    # HTTP/1.0 without keep-alive: answered, then closed.
    ((head, _),) = http_answers(raw_exchange(direct_url, request_bytes(PREDICT, BODY, "", "1.0")))
    assert head.startswith(b"http/1.1 200 ") and b"connection: close" in head


def test_a_body_that_comes_too_slowly_gets_408_and_the_connection_ends():
    server, took = serve(FakeBackend(), direct=True, body_timeout_seconds=0.5)
    with server as (url, _):
        head = request_bytes(PREDICT, BODY)[: -len(BODY)]
        answer = raw_exchange(url, head + BODY[:100])  # the rest never comes
        assert took == [PREDICT]
        ((head, body),) = http_answers(answer)
        assert head.startswith(b"http/1.1 408 ") and b"connection: close" in head
        assert "BODY_TIMEOUT_SECONDS" in orjson.loads(body)["error"]
        assert "100 bytes came" in orjson.loads(body)["error"]
        counted = (
            'http_requests_total{method="POST",route="/v1/models/{name}:predict",status="408"}'
        )
        assert metric(url, counted) == 1


def test_a_client_that_leaves_frees_its_place_in_the_queue(caplog):
    gated = GatedFakeBackend()
    batcher = BatchingBackend(gated, max_batch_size=1, timeout_ms=0, max_queue=4)
    server, took = serve(batcher, direct=True)
    caplog.set_level(logging.INFO)
    left = 'http_requests_total{method="POST",route="/v1/models/{name}:predict",status="499"}'
    with server as (url, _), httpx.Client(base_url=url, timeout=30) as client:
        answers = []
        first = threading.Thread(
            target=lambda: answers.append(client.post(PREDICT, json={"instances": [IMAGE]}))
        )
        gated.gate.clear()
        try:
            first.start()  # in the model, held there
            wait_until(lambda: gated.calls_started == 1, "a request in the model")
            # A second, queued behind it, whose client then leaves.
            with connect(url) as sock:
                sock.sendall(request_bytes(PREDICT, BODY))
                wait_until(lambda: batcher.waiting == 1, "the second request to queue")
            wait_until(lambda: batcher.waiting == 0, "the queue to drop the one that left")
            wait_until(lambda: metric(url, left) == 1, "the 499 to be counted")
        finally:
            gated.gate.set()
            first.join(30)
        assert [answer.status_code for answer in answers] == [200]
        # Mid-body: counted as the app counts it, and no error logged.
        with connect(url) as sock:
            sock.sendall(request_bytes(PREDICT, BODY)[:-10])
        wait_until(lambda: metric(url, left) == 2, "the second 499 to be counted")
        assert 'status="500"' not in httpx.get(url + "/metrics").text
    assert gated.sizes == [1]  # the one that left never ran
    assert len(took) == 3
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def connect(url: str) -> socket.socket:
    host, port = url.split("//")[1].split(":")
    return socket.create_connection((host, int(port)), timeout=30)


class Switchable(FakeBackend):
    """Full (its queue, that is) whenever the test says so."""

    full = False

    def overloaded(self) -> bool:
        return self.full


def test_a_queue_that_fills_while_the_body_comes_refuses_it_unparsed(monkeypatch):
    backend = Switchable()
    server, took = serve(backend, direct=True)
    parsed = []
    parse = codec.parse_tf_serving_request
    monkeypatch.setattr(codec, "parse_tf_serving_request", lambda *a: parsed.append(1) or parse(*a))
    with server as (url, _), connect(url) as sock:
        data = request_bytes(PREDICT, BODY)
        sock.sendall(data[:-100])
        wait_until(lambda: took == [PREDICT], "the lane to take the request")
        backend.full = True
        sock.sendall(data[-100:])
        ((head, body),) = http_answers(read_one(sock))
        assert head.startswith(b"http/1.1 503 ") and b"retry-after: 1" in head
        assert "BATCH_MAX_QUEUE" in orjson.loads(body)["error"]
        assert parsed == [] and backend.calls == []
        # The connection lives on: the next request, with room again, is answered.
        backend.full = False
        sock.sendall(data)
        ((head, _),) = http_answers(read_one(sock))
        assert head.startswith(b"http/1.1 200 ") and parsed == [1]


def read_one(sock: socket.socket) -> bytes:
    data = b""
    while not response_complete(data):
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    return data


def test_a_fragment_and_an_absurd_length_are_read_as_the_app_reads_them(servers):
    direct_url, plain_url, took = servers
    body = orjson.dumps({"instances": [PIXELS]})
    fragment = request_bytes("/predict?include_pixels=true#x", body, "Connection: close\r\n")
    took.clear()
    answers = [http_answers(raw_exchange(url, fragment)) for url in (direct_url, plain_url)]
    assert answers[0][0][0].startswith(b"http/1.1 200 ")
    assert [orjson.loads(b) for _, b in answers[0]] == [orjson.loads(b) for _, b in answers[1]]
    assert "pixels" in orjson.loads(answers[0][0][1])["predictions"][0]
    assert len(took) == 1
    # A Content-Length of 5,000 digits: over the limit, not a server error.
    absurd = (
        f"POST {PREDICT} HTTP/1.1\r\nHost: x\r\nContent-Length: {'0' * 4999}1\r\n"
        "Connection: close\r\n\r\n{"
    ).encode()
    took.clear()
    for url in (direct_url, plain_url):
        ((head, body),) = http_answers(raw_exchange(url, absurd))
        assert head.startswith(b"http/1.1 413 ") and b"MAX_BODY_BYTES" in body
    assert took == []


class RefusesOnce(FakeBackend):
    """Its queue is full for the first request only; its predictions take 1.5 s."""

    def __init__(self):
        super().__init__()
        self.delays = {1: 1.5}
        self.refusals = 1

    def overloaded(self) -> bool:
        if self.refusals:
            self.refusals -= 1
            return True
        return False


def test_a_refusal_does_not_close_the_connection_under_the_request_after_it():
    # A refusal is written while the read that holds the next request is parsed; the
    # keep-alive timer it arms must not close the connection while that request runs.
    server, took = serve(RefusesOnce(), direct=True, keepalive=1)
    with server as (url, _):
        both = request_bytes(PREDICT, BODY) + request_bytes(PREDICT, BODY, "Connection: close\r\n")
        (refused, _), (answered, body) = http_answers(raw_exchange(url, both))
    assert refused.startswith(b"http/1.1 503 ")
    assert answered.startswith(b"http/1.1 200 ") and orjson.loads(body)["model_version"] == "1"
    assert took == [PREDICT]


def test_while_the_client_is_not_reading_the_lane_takes_nothing(servers):
    direct_url, _, took = servers
    took.clear()
    with connect(direct_url) as sock:
        sock.sendall(request_bytes(PREDICT, BODY))
        assert read_one(sock).startswith(b"HTTP/1.1 200 ")
        assert len(took) == 1
        # The transport says its buffer is full (the client stopped reading).
        port = sock.getsockname()[1]
        (protocol,) = [c for c in servers_state(direct_url).connections if c.client[1] == port]
        protocol.loop.call_soon_threadsafe(protocol.flow.pause_writing)
        wait_until(lambda: protocol.flow.write_paused, "writing to pause")
        sock.sendall(request_bytes(PREDICT, BODY))
        sock.settimeout(1.0)
        with pytest.raises(TimeoutError):
            sock.recv(65536)  # the app's path waits for the client to read
        assert len(took) == 1  # and the lane did not take it
        protocol.loop.call_soon_threadsafe(protocol.flow.resume_writing)
        sock.settimeout(30)
        assert read_one(sock).startswith(b"HTTP/1.1 200 ")


def test_an_answer_written_during_a_drain_closes_its_connection():
    gated = GatedFakeBackend()
    server, took = serve(gated, direct=True)
    with server as (url, uvicorn_server), connect(url) as sock:
        gated.gate.clear()
        try:
            sock.sendall(request_bytes(PREDICT, BODY))
            wait_until(lambda: gated.calls_started == 1, "the request in the model")
            uvicorn_server.server_state.draining = True  # as DrainingServer marks a drain
        finally:
            gated.gate.set()
        ((head, _),) = http_answers(read_one(sock))
    assert took == [PREDICT]
    assert head.startswith(b"http/1.1 200 ") and b"connection: close" in head


def test_a_shutdown_past_its_grace_answers_500_and_closes():
    gated = GatedFakeBackend()
    app = create_app(Settings(model_name=MODEL_NAME), gated)
    protocol = guarded_protocol(16 * 1024, 10.0, app.state.refusal, app.state.direct_lane)
    gated.gate.clear()
    serving = threaded_server(app, http=protocol, timeout_graceful_shutdown=0.5)
    with serving as (url, server), connect(url) as sock:
        try:
            sock.sendall(request_bytes(PREDICT, BODY))
            wait_until(lambda: gated.calls_started == 1, "the request in the model")
            server.should_exit = True
            ((head, body),) = http_answers(read_one(sock))
            assert sock.recv(65536) == b""  # closed
        finally:
            gated.gate.set()  # the model call's thread, which the server's exit waits for
    assert head.startswith(b"http/1.1 500 ") and b"connection: close" in head
    assert body == b"Internal Server Error"
