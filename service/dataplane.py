"""The data plane: what every protocol does to serve a model, in one place.

Protocol adapters (service/protocols/: TF Serving's REST API, the friendly /predict, the
operations endpoints, and any protocol added later) parse their requests into numpy arrays
and names, call this object, and render the typed results it returns. It checks the limits,
calls the backend (through the batcher, when there is one), records the metrics and tells
which version answered with which labels. It knows no HTTP and no JSON.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from artifact.contract import CLASSES_KEY, SIGNATURE_NAME
from service.backends.base import Backend
from service.errors import PayloadTooLarge
from service.metrics import Metrics
from service.types import ModelMetadata, Readiness, VersionStatus


@dataclasses.dataclass(frozen=True)
class PredictResult:
    """A prediction as every protocol needs it: who answered, the outputs, the labels."""

    model: str
    version: int
    outputs: dict[str, np.ndarray]
    labels: tuple[str, ...]


class DataPlane:
    """Limits, backend calls, metrics and typed results for every protocol.

    Args:
        backend: the model runtime (a BatchingBackend around it, when batching is on).
        metrics: the app's Prometheus metrics.
        max_images: most images one request may hold (MAX_IMAGES).
    """

    def __init__(self, backend: Backend, metrics: Metrics, max_images: int):
        self.backend = backend
        self.metrics = metrics
        self.max_images = max_images

    @property
    def model_name(self) -> str:
        """The model served (requests that name none get this one)."""
        return self.backend.model_name

    async def start(self) -> None:
        await self.backend.start()

    async def close(self) -> None:
        await self.backend.close()

    def check_image_count(self, count: int) -> None:
        """PayloadTooLarge naming the limit when a request holds more than MAX_IMAGES images."""
        if count > self.max_images:
            raise PayloadTooLarge(
                f"request has {count} images; the limit is {self.max_images} per request "
                "(MAX_IMAGES)"
            )

    async def predict(
        self,
        name: str,
        images: np.ndarray,
        version: int | None = None,
        signature_name: str = SIGNATURE_NAME,
    ) -> PredictResult:
        """Run float32 images [n, 28, 28] through a version's signature.

        Raises:
            ServiceError: over a limit, unknown model or version, not ready, overloaded.
        """
        self.check_image_count(len(images))
        prediction = await self.backend.predict(name, images, version, signature_name)
        labels = self.backend.labels(prediction.version)
        self.metrics.images_per_request.observe(len(images))
        classes = prediction.outputs.get(CLASSES_KEY)
        if classes is not None:
            for class_id, count in zip(*np.unique(classes, return_counts=True), strict=True):
                self.metrics.predictions.labels(name, labels[int(class_id)]).inc(int(count))
        return PredictResult(name, prediction.version, prediction.outputs, labels)

    async def model_status(self, name: str, version: int | None) -> list[VersionStatus]:
        """The model's versions and their states, the serving one first."""
        return await self.backend.model_status(name, version)

    async def metadata(self, name: str, version: int | None) -> ModelMetadata:
        """A version's signatures."""
        return await self.backend.metadata(name, version)

    def readiness(self) -> Readiness:
        """Whether the served model answers, with which version on which device."""
        version = self.backend.serving_version()
        reason = "" if version is not None else self.backend.not_ready_reason()
        return Readiness(version is not None, reason, self.model_name, version, self.device())

    def device(self) -> str:
        return self.backend.device()

    def update_gauges(self) -> None:
        """Set the serving-version gauge (called before /metrics is scraped)."""
        self.metrics.model_version.clear()
        version = self.backend.serving_version()
        if version is not None:
            self.metrics.model_version.labels(self.model_name, self.device()).set(version)
