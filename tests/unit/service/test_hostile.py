"""What an adversarial client tries, against the app over a fake backend (no TensorFlow): each
case a clear 4xx in TF Serving's {"error"} form, never a 5xx, never a stall of others.

The cases are the rows of the reliability review: deep nesting, booleans, hang-ups, oversized
and slow headers, huge bodies, decompression bombs, overload, slow bodies, origins, tokens,
log injection, paths in error bodies, MIME sniffing, the docs' assets, TLS.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import re
import socket
import ssl
import threading

import httpx
import numpy as np
import orjson
import pytest
from support import fakes
from support.fakes import (
    MODEL_NAME,
    FakeBackend,
    GatedFakeBackend,
    app_client,
    threaded_server,
    wait_until,
)
from support.helpers import error_message, png_bytes, response_complete, self_signed

from artifact.images import MAX_PIXELS
from service import errors, protocols
from service.app import create_app
from service.backends.batching import BatchingBackend
from service.codecs import images, pixels, tf_example, tfserving_json
from service.settings import Settings
from service.types import SignatureSpec, TensorSpec

PREDICT = f"/v1/models/{MODEL_NAME}:predict"
OVERLOADED_WORDS = (
    "the service is overloaded (the batching queue is full, BATCH_MAX_QUEUE); retry shortly"
)
ZEROS = [[[0.0] * 28] * 28]


def nested_pixel(depth: int) -> bytes:
    """A :predict body whose first pixel is a number nested `depth` arrays deep."""
    row = "[" + ",".join(["0.0"] * 28) + "]"
    first = "[" + "[" * depth + "0.0" + "]" * depth + "," + ",".join(["0.0"] * 27) + "]"
    image = "[" + first + "," + ",".join([row] * 27) + "]"
    return ('{"instances": [' + image + "]}").encode()


@pytest.fixture
def client():
    with app_client(FakeBackend()) as c:
        yield c


# --- the body: shapes the JSON reader accepts and the contract does not -----------------------


@pytest.mark.parametrize("depth", [1, 100, 1015])
@pytest.mark.parametrize("path", [PREDICT, "/predict"])
def test_deep_nesting_is_a_400(client, path, depth):
    response = client.post(path, content=nested_pixel(depth))
    assert "instances[0]" in error_message(response, 400)


@pytest.mark.parametrize("path", [PREDICT, "/predict"])
@pytest.mark.parametrize("value", ["true", "false"])
def test_booleans_are_not_pixels(client, path, value):
    image = [[0] * 28 for _ in range(28)]
    body = orjson.dumps({"instances": [image]}).replace(b"[0,", f"[{value},".encode(), 1)
    message = error_message(client.post(path, content=body), 400)
    assert f"instances[0][0][0]: expected a number, got bool {value.capitalize()}" in message


def test_images_are_counted_before_any_array_is_built(client, monkeypatch):
    built = []
    monkeypatch.setattr(pixels, "to_array", lambda *a, **k: built.append(a) or ZEROS)
    body = orjson.dumps({"instances": [[[0.0]]] * 5000})
    assert "request has 5000 images; the limit is 16" in error_message(
        client.post(PREDICT, content=body), 413
    )
    assert built == []


def test_large_bodies_are_parsed_off_the_event_loop(client, monkeypatch):
    threads = []
    parse = tfserving_json.read_predict_request

    def recording(*args):
        threads.append(threading.current_thread().name)
        return parse(*args)

    monkeypatch.setattr(tfserving_json, "read_predict_request", recording)
    small = orjson.dumps({"instances": ZEROS})
    large = orjson.dumps({"instances": [[[0.123456789] * 28] * 28] * 12})
    assert len(small) < protocols.tfserving_rest.INLINE_PARSE_BYTES < len(large)
    loop_thread = client.portal.call(lambda: threading.current_thread().name)
    assert client.post(PREDICT, content=small).status_code == 200
    assert client.post(PREDICT, content=large).status_code == 200
    assert threads[0] == loop_thread  # a small body: inline, cheaper than a thread hop
    assert threads[1] != loop_thread  # a large one: on a worker thread


def test_a_decompression_bomb_per_request_is_refused_from_the_headers(client, monkeypatch):
    decoded = []
    monkeypatch.setattr(
        images, "image_to_pixels", lambda *a: decoded.append(1) or np.zeros((28, 28), np.uint8)
    )
    # Files of 20 megapixels each (20 KB compressed): each under the per-image limit, 60
    # megapixels together.
    bomb = png_bytes(np.zeros((4000, 5000), np.uint8))
    assert len(bomb) < 50_000
    files = [("files", (f"{i}.png", bomb, "image/png")) for i in range(3)]
    message = error_message(client.post("/predict", files=files), 413)
    assert "megapixels; the limit is 48 per request (MAX_REQUEST_PIXELS)" in message
    assert decoded == []
    b64 = [{"b64": base64.b64encode(bomb).decode()} for _ in range(3)]
    assert "MAX_REQUEST_PIXELS" in error_message(
        client.post("/predict", json={"instances": b64}), 413
    )
    assert decoded == []


def test_decoding_stops_when_the_client_has_left():
    cancelled = threading.Event()
    cancelled.set()
    files = [("files[0]", png_bytes(np.zeros((28, 28), np.uint8)))]
    with pytest.raises(images.Cancelled):
        images.decode_image_files(files, "auto", MAX_PIXELS, cancelled)


@pytest.mark.parametrize(
    "data, fragment",
    [
        pytest.param(png_bytes(np.zeros((28, 28), np.uint8), "TIFF"), "not an image file in an accepted format", id="tiff"),
        pytest.param(b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 28 28\n", "not an image file in an accepted format", id="eps"),
        # The docs promise PNG and JPEG: Pillow's other decoders stay closed too.
        pytest.param(png_bytes(np.zeros((28, 28), np.uint8), "GIF"), "accepted format (PNG, JPEG)", id="gif"),
        pytest.param(png_bytes(np.zeros((28, 28), np.uint8), "WEBP"), "accepted format (PNG, JPEG)", id="webp"),
        pytest.param(png_bytes(np.zeros((28, 28), np.uint8), "BMP"), "accepted format (PNG, JPEG)", id="bmp"),
    ],
)  # fmt: skip
def test_only_allow_listed_formats_are_decoded(client, data, fragment):
    files = {"files": ("x.img", data, "application/octet-stream")}
    assert fragment in error_message(client.post("/predict", files=files), 400)
    b64 = {"instances": [{"b64": base64.b64encode(data).decode()}]}
    assert fragment in error_message(client.post("/predict", json=b64), 400)


def test_png_and_jpeg_are_decoded(client):
    for fmt in ("PNG", "JPEG"):
        files = {"files": ("x.img", png_bytes(np.zeros((28, 28), np.uint8), fmt), "image/png")}
        assert client.post("/predict", files=files).status_code == 200, fmt


# --- errors and logs --------------------------------------------------------------------------


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(self.format(record))


def test_a_newline_in_a_url_writes_one_log_line(client, monkeypatch):
    logger = logging.getLogger("service")
    collect = Collect()
    # Whatever other tests did to logging in this process: this logger, at INFO, enabled.
    monkeypatch.setattr(logger, "disabled", False)
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(collect)
    try:
        client.post("/v1/models/evil%0AINFO%20forged%20line:predict", json={"instances": ZEROS})
    finally:
        logger.removeHandler(collect)
        logger.setLevel(level)
    lines = [line for line in collect.lines if "evil" in line]
    # The error's line and the access line: each one line, the newline escaped.
    assert len(lines) == 2 and all("\n" not in line and "evil\\x0aINFO" in line for line in lines)
    assert not [line for line in collect.lines if line.startswith("INFO forged")]


def test_server_failures_name_no_folder_but_client_errors_keep_their_words():
    backend = FakeBackend(versions=())
    backend.reason = "no version under /srv/secret/models/fashion_mnist"
    with app_client(backend) as client:
        for path in ("/readyz", PREDICT):
            message = error_message(
                client.request(
                    "POST" if "predict" in path else "GET", path, json={"instances": ZEROS}
                ),
                503,
            )
            assert "/srv/secret" not in message and "fashion_mnist" in message
        # The page's view of the model says why it is not ready, in the same words.
        view = client.get(f"/page/models/{MODEL_NAME}").json()
        assert view["ready"] is False
        assert "/srv/secret" not in view["reason"] and "fashion_mnist" in view["reason"]


def test_every_answer_says_nosniff(client):
    for response in (
        client.get("/healthz"),
        client.post(PREDICT, json={}),
        client.get("/"),
        client.get("/nowhere"),
    ):
        assert response.headers["x-content-type-options"] == "nosniff"


def test_the_docs_load_nothing_from_the_network(client):
    page = client.get("/docs")
    assert page.status_code == 200
    assert "/docs/assets/swagger-ui-bundle.js" in page.text and "cdn" not in page.text.lower()
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css"):
        response = client.get(f"/docs/assets/{asset}")
        assert response.status_code == 200 and len(response.content) > 10_000
    assert client.get("/docs/assets/../../etc/passwd").status_code == 404


# --- origins and tokens -----------------------------------------------------------------------


def test_a_cross_site_form_post_is_refused_before_it_runs():
    backend = FakeBackend()
    # Same-origin needs a Host the service answers for: TestClient's is `testserver`.
    with app_client(backend, allowed_hosts="testserver") as client:
        files = {"files": ("a.png", png_bytes(np.zeros((28, 28), np.uint8)), "image/png")}
        response = client.post("/predict", files=files, headers={"Origin": "https://evil.example"})
        assert "cross-origin requests from 'https://evil.example'" in error_message(response, 403)
        assert backend.calls == []
        # The service's own page (same origin) is fine.
        own = client.post("/predict", files=files, headers={"Origin": "http://testserver"})
        assert own.status_code == 200


@pytest.mark.parametrize("path", ["/metrics", "/page/models", f"/v1/models/{MODEL_NAME}"])
def test_on_loopback_a_rebound_name_reads_nothing(path):
    """DNS rebinding: evil.example made to resolve to 127.0.0.1 reads the service's GETs,
    which carry no Origin. Bound to loopback with ALLOWED_HOSTS unset, only loopback names
    are answered for; probes answer any Host."""
    with app_client(FakeBackend(), host="127.0.0.1", allowed_hosts="") as client:
        rebound = client.get(path, headers={"Host": "evil.example:8000"})
        assert "the host 'evil.example:8000' is not one" in error_message(rebound, 400)
        for host in ("127.0.0.1:8000", "localhost:8000", "[::1]:8000", "LOCALHOST."):
            assert client.get(path, headers={"Host": host}).status_code == 200, host
        assert client.get("/healthz", headers={"Host": "evil.example"}).status_code == 200


@pytest.mark.parametrize(
    "settings",
    [
        pytest.param({"host": "0.0.0.0", "allowed_hosts": ""}, id="every-interface"),
        pytest.param({"host": "127.0.0.1", "allowed_hosts": "*"}, id="loopback-any-host"),
    ],
)
def test_off_loopback_or_with_a_wildcard_any_host_is_answered(settings):
    with app_client(FakeBackend(), **settings) as client:
        assert client.get("/metrics", headers={"Host": "api.example:8000"}).status_code == 200


def test_allowed_origins_get_cors_headers_and_preflights():
    with app_client(FakeBackend(), cors_allow_origins="https://app.example") as client:
        origin = {"Origin": "https://app.example"}
        response = client.post(PREDICT, json={"instances": ZEROS}, headers=origin)
        assert response.status_code == 200
        assert response.headers["access-control-allow-origin"] == "https://app.example"
        preflight = client.options(
            PREDICT, headers={**origin, "Access-Control-Request-Method": "POST"}
        )
        assert preflight.status_code == 204
        assert "authorization" in preflight.headers["access-control-allow-headers"]


@pytest.fixture
def tokens_file(tmp_path):
    path = tmp_path / "tokens"
    path.write_text(
        "# token scopes\npredictor-token-0123456789 predict\nwatcher-token-0123456789 status\n"
    )
    return path


def test_bearer_tokens_with_scopes(tokens_file):
    with app_client(FakeBackend(), auth_tokens_file=str(tokens_file)) as client:
        body = {"instances": ZEROS}
        missing = client.post(PREDICT, json=body)
        assert error_message(missing, 401).startswith("this service needs a bearer token")
        assert missing.headers["www-authenticate"] == 'Bearer realm="estimator-serving"'
        wrong = client.post(
            PREDICT, json=body, headers={"Authorization": "Bearer nope-nope-nope-nope"}
        )
        assert error_message(wrong, 401) == "the bearer token is not valid"
        assert 'error="invalid_token"' in wrong.headers["www-authenticate"]
        status_only = {"Authorization": "Bearer watcher-token-0123456789"}
        refused = client.post(PREDICT, json=body, headers=status_only)
        assert "does not have the 'predict' scope" in error_message(refused, 403)
        assert client.get(f"/v1/models/{MODEL_NAME}", headers=status_only).status_code == 200
        predictor = {"Authorization": "Bearer predictor-token-0123456789"}
        assert client.post(PREDICT, json=body, headers=predictor).status_code == 200
        assert client.get("/metrics", headers=predictor).status_code == 403
        # Probes, the page's files and the docs stay open.
        for path in ("/healthz", "/readyz", "/", "/docs", "/openapi.json"):
            assert client.get(path).status_code == 200, path


@pytest.mark.parametrize(
    "text, fragment",
    [
        pytest.param("short predict\n", "16 characters or more", id="short"),
        pytest.param("a-long-enough-token-1234 admin\n", "unknown scope(s) admin", id="scope"),
        pytest.param("one-field-only\n", "expected `<token> <scope>", id="fields"),
        pytest.param("# nothing\n", "holds no token", id="empty"),
    ],
)
def test_a_bad_tokens_file_stops_the_start(tmp_path, text, fragment):
    from support.entry import run_main_in_process

    path = tmp_path / "tokens"
    path.write_text(text)
    result = run_main_in_process(AUTH_TOKENS_FILE=str(path), MODEL_BASE_PATH=str(tmp_path))
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: AUTH_TOKENS_FILE: ") and fragment in line


# --- the server: headers, slow clients, overload, TLS -----------------------------------------


def raw_exchange(
    url: str, data: bytes, read_timeout: float = 30.0, one_response: bool = False
) -> bytes:
    """Send raw bytes to the server and read what it answers until it closes (or, with
    one_response, until one whole response has come: the connection may stay open)."""
    host, port = url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=read_timeout) as sock:
        # The server may close before it has read everything: what it said counts.
        with contextlib.suppress(OSError):
            sock.sendall(data)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            chunks.append(chunk)
            if one_response and response_complete(b"".join(chunks)):
                break
    return b"".join(chunks)


@pytest.fixture
def guarded():
    settings = Settings(
        max_body_bytes=200_000, body_timeout_seconds=1.0, header_timeout_seconds=1.0
    )
    with threaded_server(create_app(settings, FakeBackend()), settings) as (url, _):
        yield url


def connect(url: str, timeout: float = 30) -> socket.socket:
    host, port = url.split("//")[1].split(":")
    return socket.create_connection((host, int(port)), timeout=timeout)


def closed_without_answer(sock: socket.socket) -> bool:
    """Whether the server closes the connection, having answered nothing more."""
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize("size", [100 * 1024, 16 * 1024 * 1024])
def test_oversized_headers_get_431_and_the_server_keeps_answering(guarded, size):
    request = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * size + b"\r\n\r\n"
    answer = raw_exchange(guarded, request)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:100]
    assert httpx.get(guarded + "/healthz").status_code == 200


def test_headers_sent_too_slowly_close_the_connection(guarded):
    with connect(guarded) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")  # and then nothing more
        # Closed once HEADER_TIMEOUT_SECONDS (1 s here) is up: the client holds nothing.
        assert closed_without_answer(sock)
    assert httpx.get(guarded + "/healthz").status_code == 200


def test_a_connection_that_sends_nothing_is_closed(guarded):
    with connect(guarded) as sock:
        assert closed_without_answer(sock)


def test_a_body_sent_too_slowly_gets_408(guarded):
    with connect(guarded) as sock:
        sock.sendall(
            f"POST {PREDICT} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            "Content-Length: 100000\r\n\r\n".encode()
            + b'{"instances": ['
        )
        answer = b""
        while not response_complete(answer):
            answer += sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b"BODY_TIMEOUT_SECONDS" in answer


def test_a_client_that_hangs_up_mid_upload_is_not_a_server_error(caplog):
    app = create_app(Settings(), FakeBackend())
    with caplog.at_level(logging.INFO), threaded_server(app) as (url, _):
        with connect(url) as sock:
            sock.sendall(
                f"POST {PREDICT} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100000\r\n\r\n".encode()
                + b"x" * 1000
            )
        wait_until(
            lambda: b'status="499"' in httpx.get(url + "/metrics").content, "the 499 to be counted"
        )
        metrics = httpx.get(url + "/metrics").text
    assert 'status="500"' not in metrics
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_full_queue_refuses_before_reading_the_body():
    gated = GatedFakeBackend()
    batcher = BatchingBackend(gated, max_batch_size=1, timeout_ms=0, max_queue=1)
    app = create_app(Settings(), batcher)
    statuses = []

    with threaded_server(app) as (url, _), httpx.Client(base_url=url, timeout=30) as client:

        def post():
            statuses.append(client.post(PREDICT, json={"instances": ZEROS}).status_code)

        pending = [threading.Thread(target=post), threading.Thread(target=post)]
        gated.gate.clear()
        try:
            pending[0].start()  # one in the model,
            wait_until(lambda: gated.calls_started == 1, "a request in the model")
            pending[1].start()  # one waiting: the queue (of one) is full
            wait_until(lambda: batcher.waiting == 1, "a full queue")
            # Headers announce a body that never comes: the answer cannot wait for it.
            answer = raw_exchange(
                url,
                f"POST {PREDICT} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5000\r\n\r\n".encode(),
                one_response=True,
            )
        finally:
            gated.gate.set()
            for thread in pending:
                thread.join(30)
    head = answer.split(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.1 503 ") and b"retry-after: 1" in head
    # Its body never came: the connection is not kept for a next request.
    assert b"connection: close" in head
    assert b"BATCH_MAX_QUEUE" in answer
    assert statuses == [200, 200]  # the accepted ones were answered


class AlwaysFull(FakeBackend):
    def overloaded(self) -> bool:
        return True


def test_overload_is_logged_as_a_rate_not_a_line_per_refusal(caplog, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(errors.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(errors, "overload_log", errors.RefusalLog(interval=10.0))
    caplog.set_level(logging.INFO, logger="service")
    with app_client(AlwaysFull()) as client:
        for _ in range(50):
            response = client.post(PREDICT, json={"instances": ZEROS})
            assert response.status_code == 503 and response.headers["retry-after"] == "1"
        first = [r.getMessage() for r in caplog.records if "overloaded" in r.getMessage()]
        clock[0] += 11
        client.post("/predict", json={"instances": ZEROS})
    lines = [r.getMessage() for r in caplog.records if "overloaded" in r.getMessage()]
    assert first == ["overloaded: refused 1 request(s): " + OVERLOADED_WORDS]
    assert lines[1:] == [f"overloaded: refused 50 request(s) in the last 11 s: {OVERLOADED_WORDS}"]
    assert [r.levelno for r in caplog.records if "overloaded" in r.getMessage()] == [
        logging.WARNING
    ] * 2


def http_answers(data: bytes) -> list[tuple[bytes, bytes]]:
    """(head, body) of each whole response in a byte stream (bodies by content-length)."""
    answers = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        length = int(re.search(rb"(?im)^content-length:\s*(\d+)", head).group(1))
        answers.append((head.lower(), rest[:length]))
        data = rest[length:]
    return answers


@pytest.fixture
def refusing():
    backend = AlwaysFull()
    settings = Settings(model_name=MODEL_NAME)
    with threaded_server(create_app(settings, backend), settings) as (url, _):
        yield url, backend


def test_a_full_queue_is_refused_at_the_door_and_the_connection_lives_on(refusing):
    url, backend = refusing
    body = orjson.dumps({"instances": ZEROS})
    requests = (
        f"POST {PREDICT} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode() + body
        + b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
        + b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )  # fmt: skip
    (refused, refused_body), (health, _), (_, metrics) = http_answers(raw_exchange(url, requests))
    assert refused.startswith(b"http/1.1 503 ")
    assert b"retry-after: 1" in refused and b"x-content-type-options: nosniff" in refused
    assert orjson.loads(refused_body) == {"error": OVERLOADED_WORDS}
    # Its small body was set aside: the next request on the connection was answered.
    assert b"connection: close" not in refused
    assert health.startswith(b"http/1.1 200 ")
    assert backend.calls == []
    counted = 'http_requests_total{method="POST",route="/v1/models/{name}:predict",status="503"}'
    assert f"{counted} 1.0".encode() in metrics


def test_a_connection_that_leaves_after_a_refusal_leaves_no_error(caplog):
    settings = Settings(model_name=MODEL_NAME)
    caplog.set_level(logging.ERROR)
    with threaded_server(create_app(settings, AlwaysFull()), settings) as (url, _):
        body = orjson.dumps({"instances": ZEROS})
        request = (
            f"POST {PREDICT} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        for _ in range(3):  # kept alive, then the client closes it
            assert raw_exchange(url, request, one_response=True).startswith(b"HTTP/1.1 503 ")
        assert httpx.get(url + "/healthz").status_code == 200
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.parametrize(
    "request_line, headers",
    [
        pytest.param(f"POST {PREDICT} HTTP/1.0", "", id="http-1.0: answered, then closed"),
        pytest.param("POST /predict?invert=no HTTP/1.1", "Connection: close\r\n",
                     id="the friendly route"),
        pytest.param(f"POST /v2/models/{MODEL_NAME}/infer HTTP/1.1", "Connection: close\r\n",
                     id="the open inference protocol"),
    ],
)  # fmt: skip
def test_every_refusal_says_the_same(refusing, request_line, headers):
    url, backend = refusing
    body = b'{"instances": []}'
    request = (
        f"{request_line}\r\nHost: localhost\r\n{headers}Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    ((head, answer),) = http_answers(raw_exchange(url, request))
    assert head.split(b"\r\n")[0].split(b" ")[1] == b"503"  # HTTP/1.0 is answered in 1.0
    assert b"retry-after: 1" in head
    assert orjson.loads(answer) == {"error": OVERLOADED_WORDS}
    assert backend.calls == []


def test_a_cross_origin_prediction_is_refused_by_the_origin_rule_before_the_queue(refusing):
    url, _ = refusing
    body = b'{"instances": []}'
    request = (
        f"POST {PREDICT} HTTP/1.1\r\nHost: localhost\r\nOrigin: http://elsewhere.example\r\n"
        f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    ((head, answer),) = http_answers(raw_exchange(url, request))
    # No origin is allowed here: the access rule answers before the admission would.
    assert head.startswith(b"http/1.1 403 ") and b"cross-origin" in answer.lower()


def test_tls_with_a_self_signed_certificate(tmp_path):
    cert, key = self_signed(tmp_path)
    settings = Settings(tls_cert_file=str(cert), tls_key_file=str(key))
    with threaded_server(create_app(settings, FakeBackend()), settings) as (url, _):
        assert url.startswith("https://")
        context = ssl.create_default_context(cafile=str(cert))
        with httpx.Client(base_url=url, verify=context, timeout=30) as client:
            assert client.post(PREDICT, json={"instances": ZEROS}).status_code == 200
        with pytest.raises(httpx.ConnectError):  # an unknown certificate is refused
            httpx.get(url + "/healthz", timeout=30)


def test_tls_settings_go_together(tmp_path):
    cert, _ = self_signed(tmp_path)
    with pytest.raises(ValueError, match="TLS_CERT_FILE and TLS_KEY_FILE go together"):
        Settings(tls_cert_file=str(cert))


def test_an_idle_kept_alive_connection_is_closed_after_the_header_timeout(guarded):
    with connect(guarded) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        answer = b""
        while not response_complete(answer):
            answer += sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200 ")
        assert b"connection: close" not in answer.lower()  # kept alive...
        # ...until HEADER_TIMEOUT_SECONDS (1 s here) without the next request: EOF (a recv
        # that timed out would have raised).
        assert closed_without_answer(sock)


def test_connections_past_max_connections_wait_and_are_served_when_one_closes():
    settings = Settings(max_connections=2)
    with threaded_server(create_app(settings, FakeBackend()), settings) as (url, _):
        held = [connect(url) for _ in range(2)]
        try:
            for sock in held:  # two kept-alive connections: MAX_CONNECTIONS=2 in use
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
                assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
            waiting = connect(url)
            waiting.sendall(
                b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
            )
            waiting.settimeout(0.5)
            with pytest.raises(TimeoutError):  # not served while the other two are open
                waiting.recv(65536)
            held.pop().close()
            waiting.settimeout(30)
            assert waiting.recv(65536).startswith(b"HTTP/1.1 200 ")  # ...and served then
            waiting.close()
        finally:
            for sock in held:
                sock.close()


def test_a_client_that_leaves_mid_decoding_stops_the_rest_of_its_images(monkeypatch):
    """A real disconnect (the socket closed while the first of five uploads decodes): the
    service notices, and the four files left are never decoded."""
    decoded: list[str] = []
    seen: dict[str, threading.Event] = {}
    first_started, finished = threading.Event(), threading.Event()
    original_files, original_pixels = images.decode_image_files, images.image_file_pixels

    def decode_image_files(files, invert, budget, cancelled=None, **budgets):
        seen["cancelled"] = cancelled
        try:
            return original_files(files, invert, budget, cancelled, **budgets)
        finally:
            finished.set()

    def image_file_pixels(data, where, invert):
        decoded.append(where)
        if len(decoded) == 1:
            first_started.set()
            seen["cancelled"].wait(30)  # held until the service has seen the client leave
        return original_pixels(data, where, invert)

    monkeypatch.setattr(images, "decode_image_files", decode_image_files)
    monkeypatch.setattr(images, "image_file_pixels", image_file_pixels)
    app = create_app(Settings(), FakeBackend())
    with threaded_server(app) as (url, _):
        png = png_bytes(np.zeros((28, 28), np.uint8))
        files = [("files", (f"{i}.png", png, "image/png")) for i in range(5)]
        request = httpx.Request("POST", url + "/predict", files=files)
        body = request.read()
        head = (
            f"POST /predict HTTP/1.1\r\nHost: localhost\r\n"
            f"Content-Type: {request.headers['content-type']}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        with connect(url) as sock:
            sock.sendall(head + body)
            assert first_started.wait(30), "the first file never started decoding"
        wait_until(lambda: seen["cancelled"].is_set(), "the service to see the client leave")
        wait_until(finished.is_set, "the decoding to end")
    assert decoded == ["files[0] (0.png)"]  # and not files[1] to files[4]


def test_a_refused_request_whose_body_does_not_come_has_its_connection_closed(refusing):
    url, _ = refusing
    with connect(url) as sock:
        sock.sendall(
            f"POST {PREDICT} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 10\r\n\r\n".encode()
        )
        answer = b""
        while not response_complete(answer):
            answer += sock.recv(65536)
        # Its body did not come within the moment it gets to be set aside: answered and closed,
        # so a client cannot hold the connection by sending it slowly.
        assert answer.startswith(b"HTTP/1.1 503 ") and b"connection: close" in answer.lower()
        assert closed_without_answer(sock)


def test_a_refusal_to_a_client_waiting_for_100_continue_closes_the_connection(refusing):
    """Refused before its body was asked for: no 100 Continue is sent, and the connection is
    closed, so a body the client sends anyway is never read as a request."""
    url, _ = refusing
    request = (
        f"POST {PREDICT} HTTP/1.1\r\nHost: localhost\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\n"
    ).encode()
    with connect(url) as sock:
        sock.sendall(request)
        answer = b""
        while not response_complete(answer):
            answer += sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 503 ") and b"100 Continue" not in answer
        assert b"connection: close" in answer.lower()
        with contextlib.suppress(OSError):
            sock.sendall(b"0123456789GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert closed_without_answer(sock)


def test_headers_of_a_request_pipelined_behind_a_body_are_bounded_too(guarded):
    """The second request begins in the same write as the first one's body ends; its 1 MB
    header is refused, not buffered."""
    body = b'{"instances": []}'
    first = (
        f"POST /predict HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    second = (
        b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * (1024 * 1024) + b"\r\n\r\n"
    )
    answer = raw_exchange(guarded, first + second)
    assert answer.startswith(b"HTTP/1.1 400 ")  # the first: no instances
    assert b"HTTP/1.1 431 " in answer and b"HTTP/1.1 200 " not in answer


def test_pipelined_requests_are_answered_in_order():
    """Four requests in one write: a prediction, a bad one, a prediction, a status request;
    answered in the order they came."""
    settings = Settings(model_name=MODEL_NAME)
    body = orjson.dumps({"instances": ZEROS})
    predict = (
        f"POST {PREDICT} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    bad = f"POST {PREDICT} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n\r\n{{}}".encode()
    last = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    with threaded_server(create_app(settings, FakeBackend()), settings) as (url, _):
        answers = http_answers(raw_exchange(url, predict + bad + predict + last))
    statuses = [head.split(b" ")[1] for head, _ in answers]
    assert statuses == [b"200", b"400", b"200", b"200"], answers
    assert orjson.loads(answers[0][1])["predictions"][0]["classes"] is not None


# --- scopes hold for every spelling of a path -------------------------------------------------

SCOPE_TOKENS = {
    "predict": "predictor-token-0123456789",
    "feedback": "labeler-token-0123456789",
    "status": "watcher-token-0123456789",
}
# TF Serving matches its URL words in any case: every spelling is the same route, and needs
# the same scope.
CASED_ROUTES = [
    pytest.param("POST", f"/v1/models/{MODEL_NAME}/FEEDBACK", "feedback", id="FEEDBACK"),
    pytest.param("POST", f"/V1/models/{MODEL_NAME}/feedback", "feedback", id="V1"),
    pytest.param("POST", f"/v1/MODELS/{MODEL_NAME}/Feedback", "feedback", id="MODELS-Feedback"),
    pytest.param("POST", f"/V1/Models/{MODEL_NAME}/fEEDBACK", "feedback", id="mixed"),
    pytest.param("POST", f"/V1/MODELS/{MODEL_NAME}:PREDICT", "predict", id="PREDICT"),
    pytest.param("POST", f"/v1/models/{MODEL_NAME}/Versions/1:Predict", "predict",
                 id="Versions-Predict"),
    pytest.param("GET", f"/V1/MODELS/{MODEL_NAME}", "status", id="GET-MODELS"),
    pytest.param("GET", f"/v1/Models/{MODEL_NAME}/METADATA", "status", id="GET-METADATA"),
]  # fmt: skip


@pytest.fixture
def scoped(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("".join(f"{token} {scope}\n" for scope, token in SCOPE_TOKENS.items()))
    settings = Settings(
        model_name=MODEL_NAME, auth_tokens_file=str(tokens), feedback_dir=str(tmp_path / "fb")
    )
    with threaded_server(create_app(settings, FakeBackend()), settings) as (url, _):
        yield url


def scoped_request(method: str, path: str, token: str, chunked: bool = False) -> bytes:
    body = orjson.dumps({"instances": ZEROS, "labels": [1]}) if method == "POST" else b""
    framing = (
        f"Transfer-Encoding: chunked\r\n\r\n{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
        if chunked
        else f"Content-Length: {len(body)}\r\n\r\n".encode() + body
    )
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\n"
        "Content-Type: application/json\r\nConnection: close\r\n"
    )
    return head.encode() + framing


@pytest.mark.parametrize(
    "method, path, needed, chunked",
    [
        *(pytest.param(*p.values, False, id=f"{p.id}-length") for p in CASED_ROUTES),
        *(pytest.param(*p.values, True, id=f"{p.id}-chunked") for p in CASED_ROUTES
          if p.values[0] == "POST"),
    ],
)  # fmt: skip
def test_every_spelling_of_a_route_needs_its_scope(scoped, method, path, needed, chunked):
    for scope, token in SCOPE_TOKENS.items():
        ((head, body),) = http_answers(raw_exchange(scoped, scoped_request(method, path, token,
                                                                            chunked)))  # fmt: skip
        status = int(head.split(b" ", 2)[1])
        if scope == needed:
            assert status == 200, (scope, head, body)
        else:
            assert status == 403, (scope, head, body)
            assert orjson.loads(body) == {
                "error": f"the bearer token does not have the {needed!r} scope"
            }


# --- tf.Example context amplification -----------------------------------------------------

EXAMPLES_SIGNATURE = SignatureSpec(
    "serving_default",
    "tensorflow/serving/classify",
    (TensorSpec("inputs", np.dtype(object), (-1,)),),
    (TensorSpec("classes", np.dtype(object), (-1, 2)), TensorSpec("scores", np.float32, (-1, 2))),
)


def two_scores(signature_name, inputs):
    n = len(inputs["inputs"])
    classes = np.array([[b"neg", b"pos"]] * n, dtype=object)
    return {"classes": classes, "scores": np.tile(np.float32([[0.25, 0.75]]), (n, 1))}


@pytest.fixture
def examples_client():
    backend = fakes.AnyFakeBackend(
        {"parsing": fakes.FakeModel({"serving_default": EXAMPLES_SIGNATURE}, two_scores)}
    )
    with app_client(backend, max_images=1024, max_body_bytes=200_000,
                    max_body_bytes_in_flight=4_000_000) as client:  # fmt: skip
        yield client


def test_many_context_copies_are_made_off_the_event_loop(examples_client, monkeypatch):
    made_on = []
    serialize = tf_example.JSONExamples.serialize

    def recording(self):
        try:
            asyncio.get_running_loop()
            made_on.append("the event loop")
        except RuntimeError:
            made_on.append("a worker thread")
        return serialize(self)

    monkeypatch.setattr(tf_example.JSONExamples, "serialize", recording)
    # A 3 KB body: 2 KB of context copied into 1,000 examples, 2 MB in all.
    body = {"context": {"pad": "x" * 2_000}, "examples": [{"x": 1.0}] * 1_000}
    answer = examples_client.post("/v1/models/parsing:classify", json=body)
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["results"]) == 1_000
    assert made_on == ["a worker thread"]


def test_context_copies_past_the_body_budget_are_refused_before_any_is_made(
    examples_client, monkeypatch
):
    made = []
    monkeypatch.setattr(tf_example.JSONExamples, "serialize", lambda self: made.append(1) or [])
    # 5 KB of context into 1,000 examples: 5 MB, past the 4 MB MAX_BODY_BYTES_IN_FLIGHT.
    body = {"context": {"pad": "x" * 5_000}, "examples": [{"x": 1.0}] * 1_000}
    answer = examples_client.post("/v1/models/parsing:classify", json=body)
    assert "MAX_BODY_BYTES_IN_FLIGHT" in error_message(answer, 413)
    assert made == []
    assert examples_client.app.ingress.body_budget.held == 0
