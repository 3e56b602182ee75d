"""Every request kind through every way into the service (service/door.py), as uvicorn runs
one suite over each of its protocols: the ASGI app called in-process (Starlette's
TestClient), a real uvicorn server on loopback with the service's own protocol
(service/server.py) running the ASGI app for every request, and the same with its direct
transport, which answers the requests the door takes past uvicorn's ASGI cycle. Each kind is
sent through all three; the answers must be equal (status, headers, body) and what the table
says, so neither the server nor its direct transport adds anything a client could tell
apart, and the door's prelude is the one place each check happens."""

from __future__ import annotations

import base64
import contextlib
import logging
import socket
import threading

import httpx
import numpy as np
import orjson
import pytest
from starlette.testclient import TestClient
from support.fakes import (
    MODEL_NAME,
    FakeBackend,
    app_client,
    service_protocol,
    threaded_server,
    wait_until,
)
from support.helpers import open_upload, png_bytes

from service.app import create_app
from service.budgets import BodyBudget
from service.errors import BodiesInFlight, ClientClosedRequest, PayloadTooLarge
from service.server import Drain, guarded_protocol
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
def over_loopback(settings: Settings, direct: bool = False):
    service = create_app(settings, FakeBackend())
    with (
        threaded_server(service, http=service_protocol(service, direct)) as (url, _),
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        yield client


@contextlib.contextmanager
def direct_over_loopback(settings: Settings):
    with over_loopback(settings, direct=True) as client:
        yield client


DOORS = {"asgi": in_process, "uvicorn": over_loopback, "direct": direct_over_loopback}


@pytest.fixture(scope="module")
def doors(settings):
    """A client of each way in, each over its own app (the same settings, a fresh fake)."""
    with contextlib.ExitStack() as stack:
        yield {name: stack.enter_context(start(settings)) for name, start in DOORS.items()}


def send(client, method: str, path: str, options: dict) -> tuple[int, dict, bytes]:
    options = dict(options)
    headers = {**(BEARER if options.pop("auth", True) else {}), **options.pop("headers", {})}
    response = client.request(method, path, headers=headers, **options)
    kept = {k.lower(): v for k, v in response.headers.items() if k.lower() not in SERVER_HEADERS}
    return response.status_code, kept, response.content


@pytest.mark.parametrize("kind, method, path, options, status", KINDS, ids=[k[0] for k in KINDS])
def test_every_door_answers_every_kind_the_same_and_as_the_table_says(
    doors, kind, method, path, options, status
):
    answers = {name: send(client, method, path, options) for name, client in doors.items()}
    first = answers["asgi"]
    assert first[0] == status, first
    assert first[1].get("x-content-type-options") == "nosniff", first[1]
    if status >= 400 and status != 405:
        assert set(orjson.loads(first[2])) == {"error"}, first[2]
    for name, answer in answers.items():
        assert answer == first, (name, answer, first)


def test_the_table_is_not_trivial():
    statuses = {k[-1] for k in KINDS}
    assert {200, 204, 400, 401, 403, 404, 405, 413} <= statuses
    assert len({k[2].split("?")[0] for k in KINDS}) >= 10  # many routes, not one


def test_the_door_refuses_a_full_queue_before_reading_the_body():
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
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(65536)
        if not chunk:
            break
        answer += chunk
    return answer


def test_a_body_past_the_process_budget_is_refused_before_it_is_read():
    settings = Settings(max_body_bytes=2_000_000, max_body_bytes_in_flight=3_000_000)
    protocol = guarded_protocol(16 * 1024, 10.0, Drain())
    with threaded_server(create_app(settings, FakeBackend()), http=protocol) as (url, _):
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


# --- the direct transport -------------------------------------------------------------------


@contextlib.contextmanager
def direct_server(settings: Settings):
    """The service over loopback with its direct transport, each request the door was asked
    to take recorded: (asked, server, client), asked holding (path, declared, taken)."""
    service = create_app(settings, FakeBackend())
    asked = []
    take = service.door.take

    def recorded(scope, declared):
        taken = take(scope, declared)
        asked.append((scope["path"], declared, taken is not None))
        return taken

    service.door.take = recorded
    with (
        threaded_server(service, http=service_protocol(service, True)) as (url, server),
        httpx.Client(base_url=url, timeout=30, headers=BEARER) as client,
    ):
        yield asked, server, client


def test_the_direct_transport_takes_what_the_door_can_answer_from_a_whole_body(settings):
    body = orjson.dumps({"instances": [IMAGE.tolist()]})
    with direct_server(settings) as (asked, _, client):
        assert client.post(f"{V1}:predict", content=body).status_code == 200
        anonymous = {"Authorization": ""}
        assert client.post(f"{V1}:predict", content=body, headers=anonymous).status_code == 401
        assert client.post(f"{V1}:predict", content=iter([body])).status_code == 200  # chunked
        assert client.get(V1).status_code == 200
        assert client.post("/V1/MODELS/fashion_mnist:PREDICT", content=body).status_code == 200
    assert asked == [
        (f"{V1}:predict", len(body), True),
        (f"{V1}:predict", len(body), False),  # refused by the access rules: answered by the app
        ("/V1/MODELS/fashion_mnist:PREDICT", len(body), True),  # matched as TF Serving does
    ]


def test_the_direct_transport_writes_uvicorns_access_line(settings):
    body = orjson.dumps({"instances": [IMAGE.tolist()]})
    lines = {}
    for direct in (False, True):
        records: list[logging.LogRecord] = []
        handler = logging.Handler()
        handler.emit = records.append
        access = logging.getLogger("uvicorn.access")
        with over_loopback(settings, direct) as client:
            # After uvicorn configured its loggers (at warning, the threaded server's level).
            access.addHandler(handler)
            access.setLevel(logging.INFO)
            try:
                client.post(f"{V1}:predict?x=%20y", content=body, headers=BEARER)
                client.post("/V1/MODELS/fashion_mnist:PREDICT", content=body, headers=BEARER)
            finally:
                access.removeHandler(handler)
        lines[direct] = [r.getMessage().split(" - ", 1)[1] for r in records]
    expected = [
        f'"POST {V1}%3Apredict?x=%20y HTTP/1.1" 200',
        '"POST /V1/MODELS/fashion_mnist%3APREDICT HTTP/1.1" 200',  # the path as it was sent
    ]
    assert lines[True] == lines[False] == expected, lines


def test_a_client_not_reading_its_answers_is_left_to_uvicorns_cycle(settings):
    """While the connection's writes are paused (the client does not read), its next request
    goes through uvicorn's cycle, which waits for the client before answering, rather than
    past it into a buffer that grows without bound."""
    body = orjson.dumps({"instances": [IMAGE.tolist()]})
    with direct_server(settings) as (asked, server, client):
        assert client.post(f"{V1}:predict", content=body).status_code == 200
        assert len(asked) == 1
        (connection,) = server.server_state.connections
        # As the transport pauses it past its high-water mark.
        connection.loop.call_soon_threadsafe(connection.flow.pause_writing)
        wait_until(lambda: connection.flow.write_paused, "writing to pause")
        answered = []
        thread = threading.Thread(
            target=lambda: answered.append(client.post(f"{V1}:predict", content=body))
        )
        thread.start()
        wait_until(lambda: server.server_state.tasks, "the request to reach uvicorn's cycle")
        assert len(asked) == 1 and not answered  # not offered, and held until writable
        connection.loop.call_soon_threadsafe(connection.flow.resume_writing)
        thread.join(30)
    assert [r.status_code for r in answered] == [200]


def test_a_taken_request_abandoned_at_shutdown_is_counted_once_and_gives_its_bytes_back():
    service = create_app(Settings(model_name=MODEL_NAME), FakeBackend())
    door = service.door
    scope = {
        "type": "http", "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": f"{V1}:predict", "raw_path": f"{V1}:predict".encode(), "query_string": b"",
        "root_path": "", "headers": [(b"host", b"localhost"), (b"content-length", b"10")],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
    }  # fmt: skip
    taken = door.take(scope, 10)
    assert taken is not None
    assert door.body_budget.held == 10 and door.metrics.in_flight == 1
    door.abandon_taken(taken)
    door.abandon_taken(taken)
    assert door.body_budget.held == 0 and door.metrics.in_flight == 0
    assert b'status="500"' in door.metrics.exposition()


def test_a_request_over_holds_no_more_bytes():
    """A worker thread still reading an answered request's body (a decompression, say) can
    reserve nothing more: it stops, and the budget is not left holding its bytes."""
    budget = BodyBudget(100)
    with budget.hold() as held:
        held.reserve(10)
    with pytest.raises(ClientClosedRequest):
        held.reserve(5)
    assert budget.held == 0
