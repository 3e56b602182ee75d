"""The dynamic batcher with real concurrent HTTP requests against a real uvicorn server.

The server runs in a thread of the test process with a fake backend behind a gate
(tests/support/fakes.py): each model call waits until the test opens the gate, so the test
decides what queues while the model is busy, and the gate records the size of every batch the
model ran. The toy model's answers depend on each image, so a batch split back out of order
would show.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import socket
import threading

import httpx
import numpy as np
import pytest
from support.fakes import (
    MODEL_NAME,
    WAIT_SECONDS,
    FakeBackend,
    GatedFakeBackend,
    threaded_server,
    toy_model,
    wait_until,
)

from artifact.contract import PROBABILITIES_KEY
from service import dataplane as dataplane_module
from service.app import create_app
from service.backends.base import DelegatingBackend, Reservation
from service.backends.batching import BatchingBackend
from service.dataplane import DataPlane
from service.errors import UpstreamError
from service.metrics import Metrics
from service.settings import Settings
from service.types import Prediction, join_inputs, rows_of

PATH = "/v1/models/fashion_mnist:predict"


@contextlib.contextmanager
def serving(max_batch_size=4, timeout_ms=0.0, max_queue=8, allowed_batch_sizes=()):
    settings = Settings(model_name="fashion_mnist", log_level="warning")
    gated = GatedFakeBackend()
    batcher = BatchingBackend(gated, max_batch_size, timeout_ms, max_queue, allowed_batch_sizes)
    with threaded_server(create_app(settings, backend=batcher)) as (url, _):
        try:
            yield url, gated, batcher
        finally:
            # Before the server stops (and the clients' pool is joined): no request stays held.
            gated.gate.set()


@pytest.fixture(scope="module")
def images():
    """Eight images and what the toy model of version 1 says about each."""
    pixels = np.random.default_rng(0).random((8, 28, 28)).astype(np.float32)
    return pixels, toy_model(1, pixels)[PROBABILITIES_KEY]


def post(url, pixels):
    body = {"instances": np.asarray(pixels).tolist()}
    return httpx.post(url + PATH, json=body, timeout=WAIT_SECONDS)


def probabilities_of(response):
    assert response.status_code == 200, response.text
    return np.array([p["probabilities"] for p in response.json()["predictions"]])


def test_queued_requests_merge_into_one_call_and_split_back_in_order(images):
    pixels, expected = images
    with (
        concurrent.futures.ThreadPoolExecutor(8) as pool,
        serving(max_batch_size=4) as (url, gated, batcher),
    ):
        gated.gate.clear()
        first = pool.submit(post, url, pixels[0:1])
        wait_until(lambda: gated.calls_started == 1, "the first request to hold the model")
        # While the model is busy: requests of 2, 2 and 1 images queue up.
        parts = [(1, 3), (3, 5), (5, 6)]
        queued = []
        for a, b in parts:  # one at a time, so the queue order is known
            queued.append(pool.submit(post, url, pixels[a:b]))
            count = len(queued)
            wait_until(lambda count=count: batcher.waiting == count, f"{count} queued")
        gated.gate.set()
        np.testing.assert_allclose(probabilities_of(first.result()), expected[0:1], atol=1e-5)
        for (a, b), future in zip(parts, queued, strict=True):
            np.testing.assert_allclose(probabilities_of(future.result()), expected[a:b], atol=1e-5)
    # 2 + 2 images fill a batch of 4; the last request runs in the next one.
    assert gated.sizes == [1, 4, 1]


def test_the_access_line_says_the_batch_each_request_rode_in(images):
    """batch_size on a request's access line (artifact/logs.py) is its model call's instances:
    the batch it was merged into, not its own."""
    pixels, _ = images
    sizes: dict[str, int] = {}
    handler = logging.Handler()
    handler.emit = lambda record: sizes.update(
        {record.request.request_id: record.request.batch_size}
    )
    access = logging.getLogger("service.access")
    access.addHandler(handler)
    access.setLevel(logging.INFO)

    def send(request_id, part):
        body = {"instances": np.asarray(part).tolist()}
        headers = {"X-Request-ID": request_id}
        return httpx.post(url + PATH, json=body, headers=headers, timeout=WAIT_SECONDS)

    try:
        with (
            concurrent.futures.ThreadPoolExecutor(4) as pool,
            serving(max_batch_size=4) as (url, gated, batcher),
        ):
            gated.gate.clear()
            first = pool.submit(send, "alone", pixels[0:1])
            wait_until(lambda: gated.calls_started == 1, "the first request to hold the model")
            queued = []
            for count, (request_id, part) in enumerate(
                [("two", pixels[1:3]), ("one", pixels[3:4])], start=1
            ):
                queued.append(pool.submit(send, request_id, part))
                wait_until(lambda count=count: batcher.waiting == count, f"{count} queued")
            gated.gate.set()
            assert all(f.result().status_code == 200 for f in [first, *queued])
    finally:
        access.removeHandler(handler)
        access.setLevel(logging.NOTSET)
    assert gated.sizes == [1, 3]
    assert sizes == {"alone": 1, "two": 3, "one": 3}


def test_batches_are_padded_up_to_an_allowed_size_and_the_padding_dropped(images):
    # BatchingParameters' allowed_batch_sizes (TF Serving's): 1 image runs as 2, 3 as 4.
    pixels, expected = images
    with (
        concurrent.futures.ThreadPoolExecutor(4) as pool,
        serving(max_batch_size=4, allowed_batch_sizes=(2, 4)) as (url, gated, batcher),
    ):
        gated.gate.clear()
        first = pool.submit(post, url, pixels[0:1])
        wait_until(lambda: gated.calls_started == 1, "the first request to hold the model")
        queued = []
        for a, b in [(1, 3), (3, 4)]:
            queued.append(pool.submit(post, url, pixels[a:b]))
            count = len(queued)
            wait_until(lambda count=count: batcher.waiting == count, f"{count} queued")
        gated.gate.set()
        np.testing.assert_allclose(probabilities_of(first.result()), expected[0:1], atol=1e-5)
        np.testing.assert_allclose(probabilities_of(queued[0].result()), expected[1:3], atol=1e-5)
        np.testing.assert_allclose(probabilities_of(queued[1].result()), expected[3:4], atol=1e-5)
    assert gated.sizes == [2, 4]


@pytest.mark.parametrize(
    "rows, allowed, padded",
    [
        pytest.param(1, (2, 4), 2, id="up-to-the-first"),
        pytest.param(3, (2, 4), 4, id="up-to-the-next"),
        pytest.param(4, (2, 4), 4, id="allowed-already"),
        pytest.param(5, (2, 4), 5, id="past-the-largest"),
    ],
)
def test_padding_repeats_the_first_instance_of_every_input(rows, allowed, padded):
    from service.backends.batching import pad_to_allowed

    inputs = {"x": np.arange(rows, dtype=np.float32), "y": np.arange(rows * 2).reshape(rows, 2)}
    out = pad_to_allowed(inputs, allowed)
    assert {key: len(value) for key, value in out.items()} == {"x": padded, "y": padded}
    np.testing.assert_array_equal(out["x"][:rows], inputs["x"])
    assert (out["x"][rows:] == inputs["x"][0]).all()
    assert (out["y"][rows:] == inputs["y"][0]).all()
    single = pad_to_allowed(inputs["y"], allowed)
    assert single.shape == (padded, 2)


def test_tf_serving_rest_and_the_open_inference_protocol_share_one_batch(images):
    pixels, expected = images
    v2_body = {
        "inputs": [
            {
                "name": "image",
                "datatype": "FP32",
                "shape": [2, 28, 28],
                "data": pixels[3:5].tolist(),
            }
        ]
    }
    with (
        concurrent.futures.ThreadPoolExecutor(4) as pool,
        serving(max_batch_size=4) as (url, gated, batcher),
    ):
        gated.gate.clear()
        first = pool.submit(post, url, pixels[0:1])
        wait_until(lambda: gated.calls_started == 1, "the first request to hold the model")
        v1 = pool.submit(post, url, pixels[1:3])
        wait_until(lambda: batcher.waiting == 1, "the /v1 request queued")
        v2_url = url + "/v2/models/fashion_mnist/infer"
        v2 = pool.submit(httpx.post, v2_url, json=v2_body, timeout=WAIT_SECONDS)
        wait_until(lambda: batcher.waiting == 2, "the /v2 request queued")
        gated.gate.set()
        probabilities_of(first.result())
        np.testing.assert_allclose(probabilities_of(v1.result()), expected[1:3], atol=1e-5)
        response = v2.result()
        assert response.status_code == 200, response.text
        (output,) = [o for o in response.json()["outputs"] if o["name"] == PROBABILITIES_KEY]
        np.testing.assert_allclose(np.reshape(output["data"], (2, 10)), expected[3:5], atol=1e-5)
    assert gated.sizes == [1, 4]


def test_full_queue_answers_503_at_once(images):
    pixels, _ = images
    with (
        concurrent.futures.ThreadPoolExecutor(8) as pool,
        serving(max_queue=2) as (url, gated, batcher),
    ):
        gated.gate.clear()
        running = pool.submit(post, url, pixels[0:1])
        wait_until(lambda: gated.calls_started == 1, "a request holding the model")
        queued = [pool.submit(post, url, pixels[i : i + 1]) for i in (1, 2)]
        wait_until(lambda: batcher.waiting == 2, "a full queue")
        refused = post(url, pixels[3:4])
        assert refused.status_code == 503
        assert "BATCH_MAX_QUEUE" in refused.json()["error"]
        gated.gate.set()
        assert all(f.result().status_code == 200 for f in [running, *queued])
        # Once the queue drains the service takes requests again.
        assert post(url, pixels[3:4]).status_code == 200


def test_a_failed_batch_fails_only_its_own_requests(images):
    pixels, expected = images
    with (
        concurrent.futures.ThreadPoolExecutor(8) as pool,
        serving(max_batch_size=4) as (url, gated, batcher),
    ):
        gated.fail_call = 2
        gated.gate.clear()
        first = pool.submit(post, url, pixels[0:1])
        wait_until(lambda: gated.calls_started == 1, "a request holding the model")
        doomed = [pool.submit(post, url, pixels[i : i + 1]) for i in (1, 2)]
        wait_until(lambda: batcher.waiting == 2, "two queued requests")
        gated.gate.set()
        assert first.result().status_code == 200
        for future in doomed:
            response = future.result()
            assert response.status_code == 502
            assert "injected failure" in response.json()["error"]
        after = post(url, pixels[3:4])
        np.testing.assert_allclose(probabilities_of(after), expected[3:4], atol=1e-5)
    assert gated.sizes == [1, 2, 1]


def test_a_batch_that_is_not_full_waits_for_the_timeout(images):
    pixels, expected = images
    with (
        concurrent.futures.ThreadPoolExecutor(2) as pool,
        serving(max_batch_size=2, timeout_ms=60_000) as (url, gated, _),
    ):
        # With an idle model and a long timeout, two requests still merge: the batch fills.
        futures = [pool.submit(post, url, pixels[i : i + 1]) for i in (0, 1)]
        for i, future in enumerate(futures):
            np.testing.assert_allclose(
                probabilities_of(future.result()), expected[i : i + 1], atol=1e-5
            )
    assert gated.sizes == [2]
    with serving(max_batch_size=4, timeout_ms=50) as (url, gated, _):
        # Alone and short of a full batch, a request runs once the timeout passes.
        np.testing.assert_allclose(
            probabilities_of(post(url, pixels[0:1])), expected[0:1], atol=1e-5
        )
    assert gated.sizes == [1]


def test_a_client_that_gives_up_is_dropped_from_the_queue(images):
    pixels, expected = images
    body = httpx.Request("POST", "http://x" + PATH, json={"instances": pixels[1:2].tolist()})
    with (
        concurrent.futures.ThreadPoolExecutor(4) as pool,
        serving(max_batch_size=4) as (url, gated, batcher),
    ):
        gated.gate.clear()
        first = pool.submit(post, url, pixels[0:1])
        wait_until(lambda: gated.calls_started == 1, "a request holding the model")
        port = int(url.rsplit(":", 1)[1])
        quitter = socket.create_connection(("127.0.0.1", port))
        content = body.read()
        quitter.sendall(
            f"POST {PATH} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(content)}\r\n\r\n".encode()
            + content
        )
        wait_until(lambda: batcher.waiting == 1, "the quitter to queue")
        quitter.close()
        wait_until(lambda: batcher.waiting == 0, "the server to notice the disconnect")
        stayer = pool.submit(post, url, pixels[2:3])
        wait_until(lambda: batcher.waiting == 1, "the stayer to queue")
        gated.gate.set()
        assert first.result().status_code == 200
        np.testing.assert_allclose(probabilities_of(stayer.result()), expected[2:3], atol=1e-5)
    # The model never saw the quitter's image: the stayer ran alone.
    assert gated.sizes == [1, 1]


def test_shutdown_fails_the_running_batch_and_the_queue_instead_of_leaving_them_hung():
    """close() while a batch is in the model: its waiters and the queued ones all get an error."""

    class Stuck(DelegatingBackend):
        async def predict(
            self, name, images, version=None, signature_name="serving_default", label=None
        ):
            await asyncio.Event().wait()  # a model call that never ends by itself

    async def scenario():
        batcher = BatchingBackend(Stuck(FakeBackend()), max_batch_size=1, timeout_ms=0, max_queue=8)
        await batcher.start()
        images = np.zeros((1, 28, 28), np.float32)
        running = asyncio.ensure_future(batcher.predict("fashion_mnist", images))
        queued = asyncio.ensure_future(batcher.predict("fashion_mnist", images))
        deadline = asyncio.get_running_loop().time() + WAIT_SECONDS
        while batcher.waiting != 1:  # the first is in the model, the second waits
            assert asyncio.get_running_loop().time() < deadline, "the requests never queued"
            await asyncio.sleep(0.001)
        await batcher.close()
        return await asyncio.wait_for(
            asyncio.gather(running, queued, return_exceptions=True), WAIT_SECONDS
        )

    outcomes = asyncio.run(scenario())
    assert [type(o) for o in outcomes] == [UpstreamError, UpstreamError], outcomes
    assert all("shutting down" in o.message for o in outcomes)


class _Recording(FakeBackend):
    """Runs y = 2x for any named inputs behind a gate; `fixed` is a signature without a batch
    dimension (its reservations are not batchable). Records each batch's instance count."""

    def __init__(self):
        super().__init__()
        self.gate = threading.Event()
        self.batches: list[int] = []

    async def reserve(self, name, version=None, signature_name="serving_default", label=None):
        def run(inputs):
            assert self.gate.wait(WAIT_SECONDS)
            self.batches.append(rows_of(inputs))
            return Prediction(1, {"y": inputs["x"] * 2})

        return Reservation((name, signature_name), run, batchable=signature_name != "fixed")


async def answers_queued_behind_a_busy_one(batcher, gate, busy, calls):
    """`busy` (a prediction's coroutine) holds the model behind `gate` while `calls` queue, in
    their order; then the gate opens. Every answer, busy's first."""
    running = asyncio.ensure_future(busy)
    while not batcher._running:  # the model is busy with the first request
        await asyncio.sleep(0.001)
    queued = [asyncio.ensure_future(call) for call in calls]
    while batcher.waiting < len(queued):
        await asyncio.sleep(0.001)
    gate.set()
    return await asyncio.gather(running, *queued)


def test_requests_join_only_with_the_same_inner_shapes_and_never_without_a_batch_dimension():
    inner = _Recording()

    async def scenario():
        batcher = BatchingBackend(inner, 8, 0.0, 16)
        await batcher.start()
        inputs = [
            ("fixed", np.arange(3.0)),
            ("fixed", np.arange(3.0) + 10),
            ("serving_default", np.full((1, 2), 1.0)),
            ("serving_default", np.full((2, 2), 2.0)),
            ("serving_default", np.full((1, 5), 3.0)),
        ]
        answers = await answers_queued_behind_a_busy_one(
            batcher,
            inner.gate,
            batcher.predict("m", {"x": np.zeros((1, 2))}),
            [batcher.predict("m", {"x": x}, signature_name=sig) for sig, x in inputs],
        )
        await batcher.close()
        for (_, x), answer in zip(inputs, answers[1:], strict=True):
            np.testing.assert_array_equal(answer.outputs["y"], x * 2)

    asyncio.run(scenario())
    # Each `fixed` request alone; the two [n, 2] requests together; the [1, 5] one alone.
    assert inner.batches == [1, 3, 3, 3, 1]


@pytest.mark.parametrize(
    "parts",
    [
        pytest.param([np.full((1, 28, 28), i, np.float32) for i in range(5)], id="images"),
        pytest.param(
            [np.arange(6, dtype=np.int64).reshape(2, 3) + i for i in range(3)], id="int64"
        ),
        pytest.param([np.array([[True, False]]), np.array([[False, True]] * 2)], id="bool"),
        pytest.param([np.array([b"a", b"bc"], object), np.array([b"d"], object)], id="bytes"),
        pytest.param([np.arange(12.0).reshape(6, 2)[::2], np.ones((1, 2))], id="strided"),
        pytest.param([np.zeros((1, 0), np.float32), np.zeros((2, 0), np.float32)], id="empty rows"),
        pytest.param([np.zeros((0, 3)), np.ones((2, 3))], id="no rows first"),
    ],
)
def test_joined_inputs_are_what_numpy_concatenate_gives(parts):
    joined = join_inputs(parts)
    expected = np.concatenate(parts)
    assert joined.dtype == expected.dtype and joined.shape == expected.shape
    np.testing.assert_array_equal(joined, expected)
    joined[0] = joined[-1]  # the model's to use as it likes: a writable array of its own
    by_name = join_inputs([{"x": part} for part in parts])
    np.testing.assert_array_equal(by_name["x"], expected)


class _Answering(FakeBackend):
    """The toy model behind a gate, recording each batch's size; `change` may break its answers."""

    def __init__(self, change=None):
        super().__init__()
        self.gate = threading.Event()
        self.batches: list[int] = []
        self.change = change

    async def reserve(self, name, version=None, signature_name="serving_default", label=None):
        def run(images):
            assert self.gate.wait(WAIT_SECONDS)
            self.batches.append(len(images))
            outputs = toy_model(1, images)
            if self.change is not None:
                self.change(outputs)
            return Prediction(1, outputs)

        return Reservation((name, signature_name), run)


@pytest.mark.parametrize("broken", [False, True], ids=["within", "probabilities over 1"])
def test_answers_are_checked_against_the_contract_once_per_batch(broken, monkeypatch):
    """The batch thread checks a batch's outputs once; the loop checks a request's own rows
    only when its batch broke the contract, and then counts each such request."""
    checked_on_the_loop = []
    original = dataplane_module.output_problems

    def counting(outputs, finite_rows_only=False):
        checked_on_the_loop.append(len(outputs[PROBABILITIES_KEY]))
        return original(outputs, finite_rows_only)

    monkeypatch.setattr(dataplane_module, "output_problems", counting)
    inner = _Answering((lambda o: o[PROBABILITIES_KEY].__imul__(7.0)) if broken else None)
    metrics = Metrics()
    pixels = np.random.default_rng(2).random((4, 28, 28)).astype(np.float32)

    async def scenario():
        batcher = BatchingBackend(inner, 8, 0.0, 16)
        plane = DataPlane(batcher, metrics, 8)
        await plane.start()
        answers = await answers_queued_behind_a_busy_one(
            batcher,
            inner.gate,
            plane.predict(MODEL_NAME, pixels[:1]),
            [plane.predict(MODEL_NAME, pixels[i : i + 1]) for i in range(1, 4)],
        )
        await plane.close()
        return answers

    answers = asyncio.run(scenario())
    assert inner.batches == [1, 3]
    for i, answer in enumerate(answers):
        expected = toy_model(1, pixels[i : i + 1])[PROBABILITIES_KEY] * (7.0 if broken else 1.0)
        np.testing.assert_allclose(answer.outputs[PROBABILITIES_KEY], expected, rtol=1e-6)
    violations = metrics.registry.get_sample_value(
        "model_contract_violations_total", {"model": MODEL_NAME, "version": "1"}
    )
    assert checked_on_the_loop == ([1, 1, 1, 1] if broken else [])
    assert (violations or 0) == (4 if broken else 0)


def test_empty_instances_join_and_a_bystander_is_answered_beside_them():
    """Instances of zero width (a signature's [-1, -1] input sent `[[]]`) join like any
    others; nothing about them fails another client's request."""
    inner = _Recording()

    async def scenario():
        batcher = BatchingBackend(inner, 8, 0.0, 16)
        await batcher.start()
        inputs = [np.zeros((1, 0)), np.zeros((2, 0)), np.full((1, 3), 5.0)]
        answers = await answers_queued_behind_a_busy_one(
            batcher,
            inner.gate,
            batcher.predict("m", {"x": np.zeros((1, 3))}),
            [batcher.predict("m", {"x": x}) for x in inputs],
        )
        await batcher.close()
        for x, answer in zip(inputs, answers[1:], strict=True):
            np.testing.assert_array_equal(answer.outputs["y"], x * 2)

    asyncio.run(scenario())
    # The busy one; the two empty ones together; the bystander of another shape alone.
    assert inner.batches == [1, 3, 1]


def test_a_signature_without_a_batch_dimension_may_answer_a_scalar():
    """A request of a signature that is never batched gets its outputs whole: a 0-d output
    (a model's scalar summary, say) is not sliced, and the request is answered."""

    class Scalar(_Recording):
        async def reserve(self, name, version=None, signature_name="serving_default", label=None):
            def run(inputs):
                return Prediction(1, {"total": np.asarray(inputs["x"].sum())})

            return Reservation((name, signature_name), run, batchable=False)

    async def scenario():
        batcher = BatchingBackend(Scalar(), 8, 0.0, 16)
        await batcher.start()
        answer = await asyncio.wait_for(
            batcher.predict("m", {"x": np.arange(4.0)}, signature_name="fixed"), WAIT_SECONDS
        )
        await batcher.close()
        return answer

    answer = asyncio.run(scenario())
    assert answer.outputs["total"].shape == () and float(answer.outputs["total"]) == 6.0
