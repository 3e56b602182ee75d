"""Canary and shadow traffic through the data plane, over a fake backend."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest
from support.fakes import MODEL_NAME, FakeBackend, toy_model

from service.dataplane import DataPlane
from service.metrics import Metrics
from service.traffic import Traffic

IMAGES = np.random.default_rng(2).random((4, 28, 28)).astype(np.float32)


def plane(backend, canary=0.0, shadow=0.0, seed=7) -> DataPlane:
    return DataPlane(backend, Metrics(), 64, Traffic(canary, shadow, seed=seed))


def sample(dataplane, name, **labels) -> float:
    return dataplane.metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize("percent", [10, 50])
def test_the_canary_gets_its_share_of_unpinned_requests_within_a_statistical_bound(percent):
    backend = FakeBackend(versions=(3, 4))
    backend.labels = {"stable": 3, "canary": 4}
    dataplane = plane(backend, canary=percent)
    n = 2000

    async def run():
        await dataplane.start()
        versions = [(await dataplane.predict(MODEL_NAME, IMAGES[:1])).version for _ in range(n)]
        pinned = [
            (await dataplane.predict(MODEL_NAME, IMAGES[:1], version=3)).version for _ in range(50)
        ]
        labeled = [
            (await dataplane.predict(MODEL_NAME, IMAGES[:1], label="stable")).version
            for _ in range(50)
        ]
        return versions, pinned, labeled

    versions, pinned, labeled = asyncio.run(run())
    share = versions.count(4) / n
    p = percent / 100
    # Five standard deviations of a binomial share: a fair split fails this once in millions.
    assert abs(share - p) < 5 * math.sqrt(p * (1 - p) / n), share
    assert set(versions) == {3, 4}
    # Requests naming a version or a label go where they say, never to the canary.
    assert set(pinned) == {3} and set(labeled) == {3}
    assert sample(
        dataplane,
        "predict_requests_by_version_total",
        model=MODEL_NAME,
        version="4",
        route="canary",
    ) == versions.count(4)


def test_a_canary_that_does_not_answer_leaves_its_share_to_the_serving_version():
    backend = FakeBackend(versions=(3,))
    backend.labels = {"stable": 3, "canary": 9}  # version 9 is not served
    dataplane = plane(backend, canary=100)

    async def run():
        await dataplane.start()
        return [(await dataplane.predict(MODEL_NAME, IMAGES[:1])).version for _ in range(20)]

    assert asyncio.run(run()) == [3] * 20


def test_without_a_canary_label_the_percentage_does_nothing():
    backend = FakeBackend(versions=(3, 4))
    dataplane = plane(backend, canary=100)

    async def run():
        await dataplane.start()
        return {(await dataplane.predict(MODEL_NAME, IMAGES[:1])).version for _ in range(20)}

    assert asyncio.run(run()) == {4}


def test_a_slow_shadow_never_delays_the_served_answer_and_its_copies_are_compared():
    backend = FakeBackend(versions=(3, 4))
    backend.labels = {"stable": 3, "shadow": 4}
    backend.delays[4] = 3600.0  # the shadow takes an hour
    dataplane = plane(backend, shadow=100)

    async def run():
        await dataplane.start()
        results = []
        for _ in range(5):
            # Bounded: a served answer that waited for the shadow would take an hour.
            results.append(await asyncio.wait_for(dataplane.predict(MODEL_NAME, IMAGES), 10))
        return results

    results = asyncio.run(run())
    assert {r.version for r in results} == {3}
    stats = dataplane.traffic.shadow[MODEL_NAME]
    # One copy was running (and never finished); the four after it were skipped.
    assert stats.compared == 0 and stats.skipped == 4
    assert sum(1 for call in backend.calls if call[1] == "shadow") == 1


def test_shadow_answers_are_compared_with_the_served_ones():
    backend = FakeBackend(versions=(3, 4))
    backend.labels = {"stable": 3, "shadow": 4}
    dataplane = plane(backend, shadow=100)

    async def run():
        await dataplane.start()
        for _ in range(3):
            await dataplane.predict(MODEL_NAME, IMAGES)
            await asyncio.sleep(0.01)  # let the copy finish before the next request
        return dataplane.rollout(MODEL_NAME)

    status = asyncio.run(run())
    served = toy_model(3, IMAGES)["classes"]
    shadow = toy_model(4, IMAGES)["classes"]
    agreed = int((served == shadow).sum())
    assert status["shadow"]["compared_images"] == 3 * len(IMAGES)
    assert status["shadow"]["agreement"] == round(agreed / len(IMAGES), 4)
    assert sum(d["images"] for d in status["shadow"]["disagreements"]) == 3 * (len(IMAGES) - agreed)
    assert status["labels"] == {"stable": 3, "shadow": 4}
    assert status["shadow_percent"] == 100
    assert (
        sample(dataplane, "shadow_images_total", model=MODEL_NAME, agreement="agree") == 3 * agreed
    )


def test_a_failing_shadow_is_counted_and_the_served_answer_is_untouched():
    backend = FakeBackend(versions=(3, 4))
    backend.labels = {"stable": 3, "shadow": 4}
    backend.failing.add(4)
    dataplane = plane(backend, shadow=100)

    async def run():
        await dataplane.start()
        result = await dataplane.predict(MODEL_NAME, IMAGES)
        await asyncio.sleep(0.01)
        return result

    result = asyncio.run(run())
    assert result.version == 3
    stats = dataplane.traffic.shadow[MODEL_NAME]
    assert stats.errors == 1 and "version 4 failed" in stats.last_error
