"""Every request kind through every way into the service (service/ingress.py): the ASGI app
called in-process (Starlette's TestClient), and a real server on loopback configured as the
service configures it (service/server.py). Each kind is sent through both; the answers must be
equal (status, headers, body) and what the table says, so the server adds nothing a client
could tell apart, and the ingress is the one place each check happens."""

from __future__ import annotations

import base64
import contextlib
import logging
import socket

import httpx
import numpy as np
import orjson
import pytest
from starlette.testclient import TestClient
from support.fakes import MODEL_NAME, FakeBackend, app_client, threaded_server, wait_until
from support.helpers import open_upload, png_bytes, response_complete

from service.app import create_app
from service.budgets import BodyBudget
from service.errors import BodiesInFlight, ClientClosedRequest, PayloadTooLarge
from service.settings import Settings

FULL_TOKEN = "f" * 24
STATUS_TOKEN = "s" * 24
ALLOWED = "http://allowed.example"
V1 = f"/v1/models/{MODEL_NAME}"
IMAGE = np.linspace(0, 1, 28 * 28, dtype=np.float32).reshape(28, 28)
PIXELS = (IMAGE * 255).astype(np.uint8)
BEARER = {"Authorization": f"Bearer {FULL_TOKEN}"}
# Headers a real server adds to every answer, and the in-process client does not.
SERVER_HEADERS = {"date", "server"}


def v2_body(images: np.ndarray) -> dict:
    return {"inputs": [{"name": "image", "datatype": "FP32", "shape": list(images.shape),
                        "data": images.ravel().tolist()}]}  # fmt: skip


def multipart(*files: bytes) -> dict:
    return {"files": [("files", (f"{i}.png", data, "image/png")) for i, data in enumerate(files)]}


# (id, method, path, request options, expected status)
KINDS = [
    ("tf-serving row", "POST", f"{V1}:predict", {"json": {"instances": [IMAGE.tolist()]}}, 200),
    ("tf-serving columnar", "POST", f"{V1}:predict", {"json": {"inputs": [IMAGE.tolist()]}}, 200),
    ("a version", "POST", f"{V1}/versions/1:predict", {"json": {"instances": [IMAGE.tolist()]}}, 200),
    ("an unknown version", "POST", f"{V1}/versions/9:predict", {"json": {"instances": [IMAGE.tolist()]}}, 404),
    ("an unknown label", "POST", f"{V1}/labels/nope:predict", {"json": {"instances": [IMAGE.tolist()]}}, 400),
    ("a bad body", "POST", f"{V1}:predict", {"content": b"{not json"}, 400),
    ("a wrong shape", "POST", f"{V1}:predict", {"json": {"instances": [[1.0, 2.0]]}}, 400),
    ("too many images", "POST", f"{V1}:predict", {"json": {"instances": [IMAGE.tolist()] * 5}}, 413),
    ("a body over the limit", "POST", f"{V1}:predict", {"content": b" " * 300_000}, 413),
    ("a GET of a predict route", "GET", f"{V1}:predict", {}, 400),
    ("a GET of /predict", "GET", "/predict", {}, 405),
    ("friendly pixels", "POST", "/predict", {"json": {"instances": [PIXELS.tolist()]}}, 200),
    ("friendly with pixels back", "POST", "/predict?include_pixels=yes", {"json": {"instances": [PIXELS.tolist()]}}, 200),
    ("friendly base64", "POST", "/predict", {"json": {"instances": [{"b64": base64.b64encode(png_bytes(PIXELS)).decode()}]}}, 200),
    ("friendly upload", "POST", "/predict", multipart(png_bytes(PIXELS), png_bytes(255 - PIXELS)), 200),
    ("friendly bad query", "POST", "/predict?include_pixels=maybe", {"json": {"instances": [PIXELS.tolist()]}}, 400),
    ("v2 JSON", "POST", f"/v2/models/{MODEL_NAME}/infer", {"json": v2_body(IMAGE[None])}, 200),
    ("v2 unknown model", "POST", "/v2/models/nope/infer", {"json": v2_body(IMAGE[None])}, 404),
    ("v2 malformed gzip", "POST", f"/v2/models/{MODEL_NAME}/infer", {"content": b"x", "headers": {"Content-Encoding": "gzip"}}, 400),
    ("feedback while off", "POST", f"{V1}/feedback", {"json": {"instances": [PIXELS.tolist()], "labels": [1]}}, 403),
    ("status", "GET", V1, {}, 200),
    ("metadata", "GET", f"{V1}/metadata", {}, 200),
    ("v2 metadata", "GET", f"/v2/models/{MODEL_NAME}", {}, 200),
    ("an unknown /v1 path", "GET", f"{V1}/nothing/here", {}, 400),
    ("an unknown path", "GET", "/nothing", {}, 404),
    ("health, open", "GET", "/healthz", {"auth": False}, 200),
    ("no token", "POST", f"{V1}:predict", {"auth": False, "json": {"instances": [IMAGE.tolist()]}}, 401),
    ("a wrong token", "GET", V1, {"auth": False, "headers": {"Authorization": "Bearer " + "x" * 24}}, 401),
    ("a token without the scope", "POST", "/predict", {"auth": False, "headers": {"Authorization": f"Bearer {STATUS_TOKEN}"}, "json": {"instances": [PIXELS.tolist()]}}, 403),
    ("another site", "POST", f"{V1}:predict", {"headers": {"Origin": "http://elsewhere.example"}, "json": {"instances": [IMAGE.tolist()]}}, 403),
    ("an allowed site", "POST", f"{V1}:predict", {"headers": {"Origin": ALLOWED}, "json": {"instances": [IMAGE.tolist()]}}, 200),
    ("a preflight", "OPTIONS", f"{V1}:predict", {"auth": False, "headers": {"Origin": ALLOWED, "Access-Control-Request-Method": "POST"}}, 204),
]  # fmt: skip


@pytest.fixture(scope="module")
def settings(tmp_path_factory) -> Settings:
    tokens = tmp_path_factory.mktemp("door") / "tokens"
    tokens.write_text(f"{FULL_TOKEN} predict,status\n{STATUS_TOKEN} status\n")
    return Settings(
        model_name=MODEL_NAME,
        max_images=4,
        max_body_bytes=200_000,
        auth_tokens_file=str(tokens),
        cors_allow_origins=ALLOWED,
        allowed_hosts="testserver",  # TestClient's Host (on loopback, only named hosts answer)
    )


@contextlib.contextmanager
def in_process(settings: Settings):
    with TestClient(create_app(settings, FakeBackend())) as client:
        yield client


@contextlib.contextmanager
def over_loopback(settings: Settings):
    service = create_app(settings, FakeBackend())
    with (
        threaded_server(service, settings) as (url, _),
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        yield client


WAYS_IN = {"asgi": in_process, "server": over_loopback}
# Sent with every request of the table, and answered back whatever the status.
REQUEST_ID = "kinds-table:1"


@pytest.fixture(scope="module")
def ways_in(settings):
    """A client of each way in, each over its own app (the same settings, a fresh fake)."""
    with contextlib.ExitStack() as stack:
        yield {name: stack.enter_context(start(settings)) for name, start in WAYS_IN.items()}


def send(client, method: str, path: str, options: dict) -> tuple[int, dict, bytes]:
    options = dict(options)
    headers = {
        "x-request-id": REQUEST_ID,
        **(BEARER if options.pop("auth", True) else {}),
        **options.pop("headers", {}),
    }
    response = client.request(method, path, headers=headers, **options)
    kept = {k.lower(): v for k, v in response.headers.items() if k.lower() not in SERVER_HEADERS}
    return response.status_code, kept, response.content


@pytest.mark.parametrize("kind, method, path, options, status", KINDS, ids=[k[0] for k in KINDS])
def test_every_way_in_answers_every_kind_the_same_and_as_the_table_says(
    ways_in, kind, method, path, options, status
):
    answers = {name: send(client, method, path, options) for name, client in ways_in.items()}
    first = answers["asgi"]
    assert first[0] == status, first
    assert first[1].get("x-content-type-options") == "nosniff", first[1]
    assert first[1].get("x-request-id") == REQUEST_ID, first[1]  # errors and refusals too
    if status >= 400:
        assert set(orjson.loads(first[2])) == {"error"}, first[2]
    for name, answer in answers.items():
        assert answer == first, (name, answer, first)


def test_the_table_is_not_trivial():
    statuses = {k[-1] for k in KINDS}
    assert {200, 204, 400, 401, 403, 404, 405, 413} <= statuses
    assert len({k[2].split("?")[0] for k in KINDS}) >= 10  # many routes, not one


def test_the_ingress_refuses_a_full_queue_before_reading_the_body():
    class AlwaysFull(FakeBackend):
        def overloaded(self) -> bool:
            return True

    backend = AlwaysFull()
    with app_client(backend, max_body_bytes=200_000) as client:
        for path in (f"{V1}:predict", "/predict", f"/v2/models/{MODEL_NAME}/infer"):
            # A body longer than the limit: read, it would be a 413; refused first, a 503.
            response = client.post(path, content=b" " * 300_000)
            assert response.status_code == 503, (path, response.text)
            assert response.headers["retry-after"] == "1"
    assert backend.calls == []


# --- bodies in flight: memory bounded across requests ---------------------------------------


def test_the_body_budget_reserves_and_gives_back():
    budget = BodyBudget(100)
    with budget.hold() as first:
        first.reserve(60)
        with (
            pytest.raises(BodiesInFlight, match="MAX_BODY_BYTES_IN_FLIGHT=100"),
            budget.hold() as second,
        ):
            second.reserve(30)
            second.reserve(20)  # 110 in all: refused, and its 30 are given back
        assert budget.held == 60
    assert budget.held == 0


def test_a_request_needing_more_than_the_whole_body_budget_is_too_large():
    budget = BodyBudget(100)
    with budget.hold() as alone:
        alone.reserve(70)
        # It could never fit, whatever others hold: 413, not a 503 to retry.
        with pytest.raises(PayloadTooLarge, match="needs 101 bytes held at once"):
            alone.reserve(31)
        assert budget.held == 70
    assert budget.held == 0


def read_answer(sock: socket.socket) -> bytes:
    """One whole answer: its head, and the body its Content-Length says (or to the close)."""
    answer = b""
    while not response_complete(answer):
        chunk = sock.recv(65536)
        if not chunk:
            break
        answer += chunk
    return answer


def test_a_body_past_the_process_budget_is_refused_before_it_is_read():
    settings = Settings(max_body_bytes=2_000_000, max_body_bytes_in_flight=3_000_000)
    with threaded_server(create_app(settings, FakeBackend()), settings) as (url, _):
        held = open_upload(url, f"{V1}:predict", 2_000_000, b"{" * 1000)
        try:
            wait_until(lambda: metric_value(url, "http_requests_in_flight") >= 2, "the upload")
            refused = open_upload(url, "/predict", 1_500_000, b"")
            answer = read_answer(refused)
            refused.close()
            head = answer.lower()
            assert head.startswith(b"http/1.1 503 ") and b"retry-after: 1" in head, answer
            assert b"MAX_BODY_BYTES_IN_FLIGHT=3000000" in answer
        finally:
            held.close()  # the client leaves: its 2 MB are given back
        wait_until(lambda: metric_value(url, "http_requests_in_flight") <= 1, "the upload to end")
        body = orjson.dumps({"instances": [IMAGE.tolist()]}) + b" " * 1_400_000
        again = open_upload(url, f"{V1}:predict", len(body), body)
        assert read_answer(again).startswith(b"HTTP/1.1 200 ")
        again.close()


def metric_value(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


# --- the access line ---------------------------------------------------------------------


def test_each_request_writes_one_access_line_with_the_path_as_sent(settings):
    body = orjson.dumps({"instances": [IMAGE.tolist()]})
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    access = logging.getLogger("service.access")
    access.addHandler(handler)
    access.setLevel(logging.INFO)
    try:
        with over_loopback(settings) as client:
            client.post(f"{V1}:predict?x=%20y", content=body, headers=BEARER)
            client.post("/V1/MODELS/fashion_mnist:PREDICT", content=body, headers=BEARER)
            client.get("/a%0Aline")
    finally:
        access.removeHandler(handler)
        access.setLevel(logging.NOTSET)
    lines = [r.getMessage().split(" - ", 1)[1] for r in records]
    assert lines == [
        f'"POST {V1}:predict?x=%20y HTTP/1.1" 200',
        '"POST /V1/MODELS/fashion_mnist:PREDICT HTTP/1.1" 200',  # the path as it was sent
        '"GET /a\\x0aline HTTP/1.1" 401',  # one line, whatever the path holds
    ], lines


def test_a_request_over_holds_no_more_bytes():
    """A worker thread still reading an answered request's body (a decompression, say) can
    reserve nothing more: it stops, and the budget is not left holding its bytes."""
    budget = BodyBudget(100)
    with budget.hold() as held:
        held.reserve(10)
    with pytest.raises(ClientClosedRequest):
        held.reserve(5)
    assert budget.held == 0
