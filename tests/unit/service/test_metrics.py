"""The per-model metrics (service/metrics.py, `estimator_serving_`): request and model latency
by model, version, signature and protocol; the batcher's queue; model loads; feedback."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
from support.fakes import MODEL_NAME, FakeBackend, FakeLoader, app_client, write_version

from artifact.model_config import ModelEntry, Policy
from service.backends.batching import BatchingBackend
from service.backends.registry import ModelRegistry
from service.metrics import Metrics

IMAGES = np.random.default_rng(1).random((2, 28, 28))
PIXELS = (IMAGES * 255).astype(int)


def sample(client, name: str, **labels) -> float:
    registry = client.app.dataplane.metrics.registry
    return registry.get_sample_value(name, labels) or 0.0


def test_request_and_model_latency_by_model_version_signature_and_protocol():
    with app_client(FakeBackend(versions=(1, 2))) as client:
        v1 = f"/v1/models/{MODEL_NAME}"
        assert client.post(f"{v1}:predict", json={"instances": IMAGES.tolist()}).status_code == 200
        named = client.post(f"{v1}/versions/1:predict", json={"instances": IMAGES.tolist()})
        assert named.status_code == 200
        assert client.post("/predict", json={"instances": PIXELS.tolist()}).status_code == 200
        v2 = {"inputs": [{"name": "image", "shape": [2, 28, 28], "datatype": "FP32",
                          "data": IMAGES.ravel().tolist()}]}  # fmt: skip
        assert client.post(f"/v2/models/{MODEL_NAME}/infer", json=v2).status_code == 200
        # Not answered: not timed per model (TF Serving times answered requests only).
        assert client.post(f"{v1}:predict", content=b"[").status_code == 400
        request = "estimator_serving_request_duration_seconds_count"
        model = "estimator_serving_model_duration_seconds_count"
        for version, protocol in (("2", "tfserving_rest"), ("1", "tfserving_rest"),
                                  ("2", "simple"), ("2", "v2_rest")):  # fmt: skip
            labels = {"model": MODEL_NAME, "version": version, "signature": "serving_default",
                      "protocol": protocol}  # fmt: skip
            assert sample(client, request, **labels) == 1, labels
            assert sample(client, model, **labels) == 1, labels
        text = client.get("/metrics").text
    assert text.count("estimator_serving_request_duration_seconds_count{") == 4


def test_the_batchers_queue_wait_batch_sizes_and_queue_depth():
    batcher = BatchingBackend(FakeBackend(), 4, 0.0, 8)
    with app_client(batcher) as client:
        for count in (1, 3):
            body = {"instances": IMAGES[:1].repeat(count, 0).tolist()}
            assert client.post(f"/v1/models/{MODEL_NAME}:predict", json=body).status_code == 200
        labels = {"model": MODEL_NAME, "version": "1", "signature": "serving_default"}
        assert sample(client, "estimator_serving_batch_size_count", **labels) == 2
        assert sample(client, "estimator_serving_batch_size_sum", **labels) == 4
        assert sample(client, "estimator_serving_queue_wait_seconds_count", **labels) == 2
        assert "estimator_serving_queue_requests 0.0" in client.get("/metrics").text
        # The depth is read from the batcher when scraped.
        batcher._queue.extend([_Waiting()] * 3)
        try:
            assert "estimator_serving_queue_requests 3.0" in client.get("/metrics").text
        finally:
            batcher._queue.clear()


class _Waiting:
    """A queued request whose client still waits (all the depth reads of one)."""

    dropped = False


def test_every_versions_state_is_a_gauge():
    backend = FakeBackend(versions=(1, 2))
    with app_client(backend) as client:
        client.get("/metrics")
        for version in ("1", "2"):
            state = {"model": MODEL_NAME, "version": version, "state": "AVAILABLE"}
            assert sample(client, "estimator_serving_model_version_state", **state) == 1
        backend.versions = [2]  # version 1 is gone: so is its series
        text = client.get("/metrics").text
    assert (
        'estimator_serving_model_version_state{model="fashion_mnist",state="AVAILABLE",version="2"} 1.0'
        in text
    )
    assert (
        'version="1"'
        not in text.split("# TYPE estimator_serving_model_version_state")[1].split("#")[0]
    )


def test_loads_are_timed_and_failures_counted(tmp_path):
    model_dir = tmp_path / "m"
    write_version(model_dir, 1)
    write_version(model_dir, 2, content="broken")
    metrics = Metrics()
    models = ModelRegistry(FakeLoader())
    models.observer = metrics
    started = time.perf_counter()

    async def apply():
        await models.apply([ModelEntry("m", Path(model_dir), Policy("all"), {})])
        await models.close()

    asyncio.run(apply())
    took = time.perf_counter() - started
    registry = metrics.registry
    assert (
        registry.get_sample_value("estimator_serving_model_load_failures_total", {"model": "m"})
        == 1
    )
    count = registry.get_sample_value(
        "estimator_serving_model_load_duration_seconds_count", {"model": "m"}
    )
    total = registry.get_sample_value(
        "estimator_serving_model_load_duration_seconds_sum", {"model": "m"}
    )
    assert count == 1 and 0 <= total <= took


def test_feedback_accepted_and_refused_by_model_and_status(tmp_path):
    url = f"/v1/models/{MODEL_NAME}/feedback"
    body = {"instances": PIXELS[:1].tolist(), "labels": [3]}
    with app_client(FakeBackend(), feedback_dir=str(tmp_path)) as client:
        assert client.post(url, json=body).status_code == 200
        assert client.post(url, json={"instances": PIXELS[:1].tolist()}).status_code == 400
        assert client.post("/v1/models/made-up/feedback", json=body).status_code == 404
        accepted = "estimator_serving_feedback_accepted_total"
        refused = "estimator_serving_feedback_refused_total"
        assert sample(client, accepted, model=MODEL_NAME) == 1
        assert sample(client, refused, model=MODEL_NAME, status="400") == 1
        assert sample(client, refused, model="other", status="404") == 1
    with app_client(FakeBackend()) as client:  # feedback off: 403
        assert client.post(url, json=body).status_code == 403
        assert sample(client, "estimator_serving_feedback_refused_total", model=MODEL_NAME,
                      status="403") == 1  # fmt: skip


def test_per_model_names_follow_prometheus_naming():
    # Units in the name, counters in _total, one prefix.
    with app_client(FakeBackend()) as client:
        text = client.get("/metrics").text
    families = [
        line.split()[2] for line in text.splitlines() if line.startswith("# TYPE estimator")
    ]
    assert families
    for name in families:
        kind = text.split(f"# TYPE {name} ", 1)[1].split("\n", 1)[0]
        if kind == "counter":
            assert name.endswith("_total")
        if "duration" in name or "wait" in name:
            assert name.endswith("_seconds")
