"""MAX_PIXELS_IN_FLIGHT: image files being decoded across all requests, /predict and feedback
together, reserve their pixels (from the files' headers) before decoding (service/budgets.py's
PixelBudget, service/codecs/images.py); past the budget, 503 with Retry-After."""

from __future__ import annotations

import concurrent.futures
import threading

import numpy as np
import pytest
from support.fakes import MODEL_NAME, FakeBackend, app_client
from support.helpers import png_bytes

from service.budgets import PixelBudget
from service.codecs import images
from service.errors import PixelsInFlight
from service.settings import Settings

PNG = png_bytes(np.zeros((28, 28), np.uint8))  # 784 pixels
FEEDBACK = f"/v1/models/{MODEL_NAME}/feedback"
WAIT_SECONDS = 30


def test_the_budget_reserves_refuses_and_gives_back():
    budget = PixelBudget(1000)
    with budget.hold(600):
        assert budget.held == 600
        with pytest.raises(PixelsInFlight, match="MAX_PIXELS_IN_FLIGHT=1000"), budget.hold(401):
            pass
        with budget.hold(400):
            assert budget.held == 1000
    assert budget.held == 0 and budget.peak == 1000


def test_decoding_reserves_the_files_pixels_before_decoding():
    budget = PixelBudget(10_000)
    seen = []
    original = images.image_file_pixels

    def spying(data, where, invert):
        seen.append(budget.held)
        return original(data, where, invert)

    files = [("a", PNG), ("b", PNG)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(images, "image_file_pixels", spying)
        images.decode_image_files(files, "auto", 10_000, in_flight=budget)
    assert seen == [2 * 784, 2 * 784] and budget.held == 0
    with pytest.raises(PixelsInFlight):
        images.decode_image_files(files, "auto", 10_000, in_flight=PixelBudget(1000))


def test_a_request_past_the_pixels_in_flight_waits_its_turn_with_503(monkeypatch, tmp_path):
    """/predict's upload holds the budget while it decodes; a feedback upload that would pass
    it is refused before it is decoded, and served once the first is done."""
    decoding, release = threading.Event(), threading.Event()
    original = images.image_file_pixels

    def held_decode(data, where, invert):
        if not decoding.is_set():
            decoding.set()
            release.wait(WAIT_SECONDS)
        return original(data, where, invert)

    monkeypatch.setattr(images, "image_file_pixels", held_decode)
    files = [("files", ("a.png", PNG, "image/png"))]
    with (
        concurrent.futures.ThreadPoolExecutor(1) as pool,
        app_client(
            FakeBackend(),
            feedback_dir=str(tmp_path),
            max_request_pixels=1000,
            max_pixels_in_flight=1500,
        ) as client,
    ):
        try:
            first = pool.submit(client.post, "/predict", files=files)
            assert decoding.wait(WAIT_SECONDS)
            refused = client.post(FEEDBACK, files=files, data={"labels": "1"})
        finally:
            release.set()
        assert refused.status_code == 503, refused.text
        assert "MAX_PIXELS_IN_FLIGHT=1500" in refused.json()["error"]
        assert refused.headers["retry-after"]
        assert first.result().status_code == 200
        assert client.post(FEEDBACK, files=files, data={"labels": "1"}).status_code == 200


def test_pixels_in_flight_below_one_requests_pixels_is_refused_at_start():
    with pytest.raises(ValueError, match="MAX_PIXELS_IN_FLIGHT=10 is below MAX_REQUEST_PIXELS"):
        Settings(max_request_pixels=100, max_pixels_in_flight=10)
