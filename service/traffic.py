"""Canary and shadow traffic, which TF Serving does not have.

- **Canary**: CANARY_PERCENT of the requests that name neither a version nor a label go to
  the model's `canary` label (when its version answers); the rest to the serving version
  (`stable`, else the newest). Every answer says which version answered.
- **Shadow**: a copy of SHADOW_PERCENT of those requests goes to the `shadow` label after
  the served answer is on its way: nobody waits for it. Its answers are compared with the
  served ones: the agreement, the classes they disagree on and the shadow's latency are
  counted. A slow or failing shadow costs only its own samples: while one copy is still
  running, further copies are skipped (and counted as skipped).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time

import numpy as np

from artifact.contract import CLASSES_KEY

log = logging.getLogger("service.traffic")

CANARY = "canary"
SHADOW = "shadow"


@dataclasses.dataclass
class ShadowStats:
    """One model's shadow comparisons so far."""

    label_version: int | None = None
    compared: int = 0
    agreed: int = 0
    errors: int = 0
    skipped: int = 0
    last_error: str = ""
    # (served class, shadow class) -> images where they differ
    disagreements: dict[tuple[int, int], int] = dataclasses.field(default_factory=dict)
    latencies: list[float] = dataclasses.field(default_factory=list)

    def as_json(self, class_labels: tuple[str, ...] | None = None) -> dict:
        def name(class_id: int):
            return class_labels[class_id] if class_labels else class_id

        latencies = sorted(self.latencies)
        return {
            "version": self.label_version,
            "compared_images": self.compared,
            "agreement": round(self.agreed / self.compared, 4) if self.compared else None,
            "disagreements": [
                {"served": name(served), "shadow": name(shadow), "images": count}
                for (served, shadow), count in sorted(
                    self.disagreements.items(), key=lambda item: -item[1]
                )
            ],
            "errors": self.errors,
            "last_error": self.last_error or None,
            "skipped_requests": self.skipped,
            "latency_ms": {
                "p50": round(1000 * latencies[len(latencies) // 2], 2) if latencies else None,
                "p99": round(1000 * latencies[int(0.99 * (len(latencies) - 1))], 2)
                if latencies
                else None,
            },
        }


class Traffic:
    """Chooses canary requests and runs shadow copies for the data plane.

    Args:
        canary_percent: share of unpinned requests sent to the `canary` label (0-100).
        shadow_percent: share of unpinned requests copied to the `shadow` label (0-100).
        seed: for the random choices (tests); None = unpredictable.
    """

    # Latencies kept per model for the status endpoint's percentiles.
    KEEP_LATENCIES = 1000

    def __init__(self, canary_percent: float, shadow_percent: float, seed: int | None = None):
        self.canary_percent = canary_percent
        self.shadow_percent = shadow_percent
        self._random = random.Random(seed)
        self.shadow: dict[str, ShadowStats] = {}
        self._running: dict[str, asyncio.Task] = {}

    def route(self, labels: dict[str, int]) -> str | None:
        """The label an unpinned request goes to: `canary` for its share, else None."""
        if CANARY in labels and self.canary_percent > 0:
            return CANARY if self._random.random() * 100 < self.canary_percent else None
        return None

    def wants_shadow(self, name: str, labels: dict[str, int]) -> bool:
        """Whether this unpinned request gets a shadow copy; counts it skipped when the
        model's previous copy is still running."""
        if SHADOW not in labels or self.shadow_percent <= 0:
            return False
        if self._random.random() * 100 >= self.shadow_percent:
            return False
        running = self._running.get(name)
        if running is not None and not running.done():
            self.stats(name).skipped += 1
            return False
        return True

    def stats(self, name: str) -> ShadowStats:
        return self.shadow.setdefault(name, ShadowStats())

    def start_shadow(self, name: str, copy, served_classes: np.ndarray, metrics) -> None:
        """Run `copy` (a coroutine giving the shadow's Prediction) off the response path and
        compare its classes with the served ones."""
        task = asyncio.ensure_future(self._compare(name, copy, served_classes, metrics))
        self._running[name] = task

    async def _compare(self, name: str, copy, served: np.ndarray, metrics) -> None:
        stats = self.stats(name)
        started = time.perf_counter()
        try:
            prediction = await copy
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - a failing shadow only counts as failing
            stats.errors += 1
            stats.last_error = f"{type(err).__name__}: {err}"
            metrics.shadow_errors.labels(name).inc()
            log.debug("shadow copy for %s failed: %s", name, err)
            return
        elapsed = time.perf_counter() - started
        stats.label_version = prediction.version
        shadow = np.asarray(prediction.outputs[CLASSES_KEY])
        agree = shadow == served
        stats.compared += len(shadow)
        stats.agreed += int(agree.sum())
        for served_class, shadow_class in zip(served[~agree], shadow[~agree], strict=True):
            key = (int(served_class), int(shadow_class))
            stats.disagreements[key] = stats.disagreements.get(key, 0) + 1
        stats.latencies.append(elapsed)
        del stats.latencies[: -self.KEEP_LATENCIES]
        metrics.shadow_images.labels(name, "agree").inc(int(agree.sum()))
        metrics.shadow_images.labels(name, "disagree").inc(int((~agree).sum()))
        metrics.shadow_latency.labels(name).observe(elapsed)

    async def close(self) -> None:
        for task in self._running.values():
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
