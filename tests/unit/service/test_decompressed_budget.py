"""A compressed V2 body's decompressed bytes count in MAX_BODY_BYTES_IN_FLIGHT as its wire
bytes do (service/codecs/compression.py's decompress_body, reserving through the door's Call)."""

from __future__ import annotations

import gzip

import orjson
import pytest
from support.fakes import FakeBackend, app_client

from service.codecs.compression import decompress_body
from service.errors import BodiesInFlight

MODEL = FakeBackend().model_name
INFER = f"/v2/models/{MODEL}/infer"
LIMIT = 1_000_000
# A valid request padded with JSON whitespace: 600 KB as it is, a few KB gzipped.
BODY = (
    orjson.dumps(
        {
            "inputs": [
                {"name": "image", "datatype": "FP32", "shape": [1, 28, 28], "data": [0.0] * 784}
            ]
        }
    )
    + b" " * 600_000
)


@pytest.fixture
def client():
    with app_client(FakeBackend(), max_body_bytes=LIMIT, max_body_bytes_in_flight=LIMIT) as client:
        yield client


def test_a_body_that_fits_as_sent_is_served(client):
    assert client.post(INFER, content=BODY).status_code == 200


def test_a_small_gzip_body_that_decompresses_past_the_whole_budget_is_too_large(client):
    squeezed = gzip.compress(BODY)
    assert len(squeezed) < LIMIT // 100
    answer = client.post(INFER, content=squeezed, headers={"content-encoding": "gzip"})
    # More than the whole budget for one request: it would never fit, so no Retry-After.
    assert answer.status_code == 413, answer.text
    assert "MAX_BODY_BYTES_IN_FLIGHT" in answer.json()["error"]
    assert "retry-after" not in answer.headers


def test_a_gzip_body_past_what_others_leave_of_the_budget_is_refused_for_now(client):
    half = BODY[:-300_000]  # counted twice decompressed: more than half the budget
    with client.app.ingress.body_budget.hold() as others:
        others.reserve(LIMIT // 2)
        answer = client.post(
            INFER, content=gzip.compress(half), headers={"content-encoding": "gzip"}
        )
    assert answer.status_code == 503, answer.text
    assert "MAX_BODY_BYTES_IN_FLIGHT" in answer.json()["error"]
    assert answer.headers["retry-after"]
    # Once the others' bytes are given back, the same request is served.
    again = client.post(INFER, content=gzip.compress(half), headers={"content-encoding": "gzip"})
    assert again.status_code == 200, again.text


def test_the_decompressed_bytes_are_given_back_when_answered(client):
    half = BODY[:-300_000]  # counted twice decompressed: more than half the budget
    for _ in range(3):  # each would not fit if the one before were still held
        answer = client.post(
            INFER, content=gzip.compress(half), headers={"content-encoding": "gzip"}
        )
        assert answer.status_code == 200, answer.text


def test_decompress_body_reserves_every_byte_it_keeps():
    reserved = []
    data = decompress_body(gzip.compress(BODY), "gzip", LIMIT, reserved.append)
    assert data == BODY
    # The pieces as they come, then the whole they are joined into.
    assert sum(reserved) >= 2 * len(BODY)
    assert reserved[-1] == len(BODY)


def test_decompress_body_stops_when_the_budget_has_no_room():
    def full(count):
        raise BodiesInFlight("no room")

    with pytest.raises(BodiesInFlight):
        decompress_body(gzip.compress(BODY), "gzip", LIMIT, full)
