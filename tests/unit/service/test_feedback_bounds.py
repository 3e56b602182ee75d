"""Feedback's provenance and bounds per sender, through the route: each example stored with its
token's name (never the token) and time, a rate per sender (429 with Retry-After, 413 past the
bucket), a share of the store per sender (507). No TensorFlow (the fast tier)."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest
from support.fakes import MODEL_NAME, FakeBackend, app_client
from support.feedback_stores import stored_shards
from support.helpers import error_message, ok_json

from artifact import tfrecord
from artifact.feedback import ANONYMOUS, image_examples, store_dir
from service.protocols.feedback import SenderRates
from service.security import token_name

URL = f"/v1/models/{MODEL_NAME}/feedback"
PIXELS = np.random.default_rng(5).integers(0, 256, (8, 28, 28), dtype=np.uint8)
ALICE = "alice-feedback-token-0123456789"
MALLORY = "mallory-feedback-token-0123456789"


@pytest.fixture
def tokens_file(tmp_path):
    path = tmp_path / "tokens"
    # alice's token is named; mallory's gets a name from its hash.
    path.write_text(f"{ALICE} feedback alice\n{MALLORY} feedback\n")
    return path


def post(client, count: int, token: str | None = None, start: int = 0):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body = {"instances": PIXELS[start : start + count].tolist(), "labels": [1] * count}
    return client.post(URL, json=body, headers=headers)


def stored(feedback_dir) -> list:
    return stored_shards(store_dir(feedback_dir, MODEL_NAME))


def sample(client, name: str, **labels) -> float:
    return client.app.dataplane.metrics.registry.get_sample_value(name, labels) or 0.0


def test_each_example_is_stored_with_its_senders_name_and_time(tmp_path, tokens_file):
    before = dt.datetime.now(dt.UTC).replace(microsecond=0)
    feedback_dir = tmp_path / "fb"
    with app_client(
        FakeBackend(), auth_tokens_file=str(tokens_file), feedback_dir=str(feedback_dir)
    ) as client:
        ok_json(post(client, 2, ALICE))
        ok_json(post(client, 1, MALLORY, start=2))
    (shard,) = stored(feedback_dir)
    assert shard.senders == ("alice", "alice", token_name(MALLORY))
    on_disk = b"".join(p.read_bytes() for p in shard.path.iterdir())
    assert ALICE.encode() not in on_disk and MALLORY.encode() not in on_disk  # no secret
    after = dt.datetime.now(dt.UTC)
    for when in shard.received_at:
        assert before <= dt.datetime.fromisoformat(when) <= after


def test_without_tokens_every_example_is_anonymous(tmp_path):
    with app_client(FakeBackend(), feedback_dir=str(tmp_path)) as client:
        ok_json(post(client, 2))
    (shard,) = stored(tmp_path)
    assert shard.senders == (ANONYMOUS, ANONYMOUS)


def test_a_sender_past_its_rate_gets_429_with_retry_after_and_others_do_not(tmp_path, tokens_file):
    with app_client(
        FakeBackend(),
        auth_tokens_file=str(tokens_file),
        feedback_dir=str(tmp_path / "fb"),
        feedback_rate_per_minute=0.6,  # an image every 100 s: nothing refills during the test
        feedback_burst_images=3,
    ) as client:
        ok_json(post(client, 2, MALLORY))
        refused = post(client, 2, MALLORY, start=2)  # one image left in the bucket
        message = error_message(refused, 429)
        assert "past its rate of 0.6 images a minute (FEEDBACK_RATE_PER_MINUTE)" in message
        assert "2 more may come in" in message and "nothing was stored" in message
        assert 90 < int(refused.headers["retry-after"]) <= 100  # the second image: 100 s
        ok_json(post(client, 1, MALLORY, start=2))  # what the bucket holds passes
        # An empty bucket is refused before the body is read: any body.
        early = client.post(URL, content=b"{", headers={"Authorization": f"Bearer {MALLORY}"})
        assert "1 more may come in" in error_message(early, 429)
        assert 90 < int(early.headers["retry-after"]) <= 100
        too_many = post(client, 4, ALICE)
        assert "at most 3 at once (FEEDBACK_BURST_IMAGES)" in error_message(too_many, 413)
        ok_json(post(client, 3, ALICE, start=3))  # alice has a bucket of her own
        mallory = token_name(MALLORY)
        assert sample(client, "feedback_rate_limited_total", model=MODEL_NAME, sender=mallory) == 2
        assert sample(client, "feedback_rate_limited_total", model=MODEL_NAME, sender="alice") == 0
    (shard,) = stored(tmp_path / "fb")
    assert shard.senders.count("alice") == 3 and len(shard) == 6


def test_a_sender_past_its_share_gets_507_and_others_still_store(tmp_path, tokens_file):
    # A share of three examples' records of the store.
    record = len(tfrecord.frame(image_examples(PIXELS[:1], [1], "image")[0]))
    max_bytes = 100_000
    with app_client(
        FakeBackend(),
        auth_tokens_file=str(tokens_file),
        feedback_dir=str(tmp_path / "fb"),
        feedback_max_bytes=max_bytes,
        feedback_sender_share=(3 * record + 0.5) / max_bytes,
    ) as client:
        ok_json(post(client, 3, MALLORY))
        refused = post(client, 1, MALLORY, start=3)
        message = error_message(refused, 507)
        assert "has 3 examples" in message and "FEEDBACK_SENDER_SHARE" in message
        assert sample(client, "feedback_refused_total", model=MODEL_NAME) == 1
        ok_json(post(client, 3, ALICE, start=3))
    (shard,) = stored(tmp_path / "fb")
    assert len(shard) == 6


def test_a_bucket_refills_at_its_rate_and_never_past_its_size():
    now = [0.0]
    rates = SenderRates(per_minute=60, size=4, clock=lambda: now[0])
    assert rates.take("a", 4) == 0
    assert rates.take("a", 2) == pytest.approx(2.0)  # nothing taken: two images at 1/s
    now[0] += 1.5
    assert rates.take("a", 2) == pytest.approx(0.5)
    now[0] += 0.5
    assert rates.take("a", 2) == 0
    assert rates.wait("b", 4) == 0  # every sender starts full
    now[0] += 3600
    assert rates.take("a", 5) == pytest.approx(1.0)  # full is 4, however long it waited
    rates.give_back("a", 10)
    assert rates.take("a", 4) == 0 and rates.wait("a", 1) == pytest.approx(1.0)
    off = SenderRates(per_minute=0, size=1)
    assert off.take("a", 10**6) == 0
