"""The data plane over a fake backend: limits before the model, metrics, labels, readiness."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from support.fakes import MODEL_NAME, FakeBackend, toy_model

from artifact.contract import CLASSES_KEY, FASHION_MNIST_LABELS
from service.dataplane import DataPlane
from service.errors import NotFound, PayloadTooLarge, UpstreamInternal
from service.metrics import Metrics

IMAGES = np.random.default_rng(1).random((5, 28, 28)).astype(np.float32)


def plane(backend=None, max_images=4) -> DataPlane:
    return DataPlane(backend or FakeBackend(versions=(1, 3)), Metrics(), max_images)


def sample(metrics: Metrics, name: str, **labels) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_predict_returns_who_answered_the_outputs_and_the_labels():
    dataplane = plane()

    async def run():
        await dataplane.start()
        return await dataplane.predict(MODEL_NAME, IMAGES[:3]), await dataplane.predict(
            MODEL_NAME, IMAGES[:2], version=1
        )

    latest, pinned = asyncio.run(run())
    assert (latest.model, latest.version, pinned.version) == (MODEL_NAME, 3, 1)
    assert latest.labels == FASHION_MNIST_LABELS
    np.testing.assert_array_equal(
        latest.outputs[CLASSES_KEY], toy_model(3, IMAGES[:3])[CLASSES_KEY]
    )


def test_too_many_images_never_reach_the_backend():
    backend = FakeBackend()
    dataplane = plane(backend, max_images=4)

    async def run():
        await dataplane.start()
        await dataplane.predict(MODEL_NAME, IMAGES)

    with pytest.raises(PayloadTooLarge, match="request has 5 images; the limit is 4 per request"):
        asyncio.run(run())
    assert backend.calls == []


def test_metrics_count_images_and_predicted_labels_but_not_failed_requests():
    dataplane = plane()

    async def run():
        await dataplane.start()
        await dataplane.predict(MODEL_NAME, IMAGES[:3])
        with pytest.raises(NotFound):
            await dataplane.predict(MODEL_NAME, IMAGES[:3], version=2)

    asyncio.run(run())
    metrics = dataplane.metrics
    assert sample(metrics, "images_per_request_count") == 1
    assert sample(metrics, "images_per_request_sum") == 3
    classes = toy_model(3, IMAGES[:3])[CLASSES_KEY].tolist()
    for class_id in set(classes):
        label = FASHION_MNIST_LABELS[class_id]
        assert sample(metrics, "predictions_total", model=MODEL_NAME, label=label) == (
            classes.count(class_id)
        )


def test_readiness_and_the_version_gauge_follow_the_backend():
    backend = FakeBackend(versions=(2,))
    dataplane = plane(backend)
    before = dataplane.readiness()
    assert (before.ready, before.reason, before.version) == (False, "the model is loading", None)
    dataplane.update_gauges()
    assert sample(dataplane.metrics, "model_version", model=MODEL_NAME, device="/CPU:0") == 0
    asyncio.run(dataplane.start())
    after = dataplane.readiness()
    assert (after.ready, after.reason, after.model, after.version, after.device) == (
        True,
        "",
        MODEL_NAME,
        2,
        "/CPU:0",
    )
    dataplane.update_gauges()
    assert sample(dataplane.metrics, "model_version", model=MODEL_NAME, device="/CPU:0") == 2


def test_the_prediction_callback_sees_each_successful_prediction_and_cannot_fail_it():
    seen = []

    def on_prediction(name, signature_name, images, result):
        seen.append((name, signature_name, len(images), result.version))
        if len(seen) == 2:
            raise RuntimeError("a broken logger")

    backend = FakeBackend(versions=(1, 3))
    dataplane = DataPlane(backend, Metrics(), 4, on_prediction=on_prediction)

    async def run():
        await dataplane.start()
        first = await dataplane.predict(MODEL_NAME, IMAGES[:2])
        second = await dataplane.predict(MODEL_NAME, IMAGES[:1], version=1)  # the callback fails
        with pytest.raises(NotFound):
            await dataplane.predict(MODEL_NAME, IMAGES[:1], version=7)
        return first, second

    first, second = asyncio.run(run())
    assert (first.version, second.version) == (3, 1)
    assert seen == [(MODEL_NAME, "serving_default", 2, 3), (MODEL_NAME, "serving_default", 1, 1)]


class Misbehaving(FakeBackend):
    """A model whose answers break the contract (a model is code): `outputs` change them."""

    def __init__(self, change):
        super().__init__()
        self.change = change

    async def predict(self, name, images, version=None, signature_name="serving_default",
                      label=None):  # fmt: skip
        prediction = await super().predict(name, images, version, signature_name, label)
        outputs = {key: value.copy() for key, value in prediction.outputs.items()}
        self.change(outputs)
        return type(prediction)(prediction.version, outputs)


@pytest.mark.parametrize(
    "change, answered",
    [
        pytest.param(lambda o: o["probabilities"].__imul__(7.0), True, id="probabilities over 1"),
        pytest.param(lambda o: o["probabilities"].__isub__(0.5), True, id="negative probabilities"),
        pytest.param(lambda o: o["probabilities"].__imul__(0.5), True, id="rows not summing to 1"),
        pytest.param(lambda o: o["classes"].__iadd__(10), False, id="class ids out of range"),
    ],
)
def test_answers_outside_the_contract_are_counted_and_bad_class_ids_refused(change, answered):
    dataplane = plane(Misbehaving(change))

    async def run():
        await dataplane.start()
        return await dataplane.predict(MODEL_NAME, IMAGES[:2])

    if answered:
        assert asyncio.run(run()).version == 1
    else:
        with pytest.raises(UpstreamInternal, match="answered outside its contract: classes"):
            asyncio.run(run())
    violations = sample(dataplane.metrics, "model_contract_violations_total",
                        model=MODEL_NAME, version="1")  # fmt: skip
    assert violations == 1


def test_answers_within_the_contract_are_not_counted():
    dataplane = plane()

    async def run():
        await dataplane.start()
        await dataplane.predict(MODEL_NAME, IMAGES[:4])

    asyncio.run(run())
    assert sample(dataplane.metrics, "model_contract_violations_total", model=MODEL_NAME,
                  version="3") == 0  # fmt: skip
