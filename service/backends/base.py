"""The backend interface every model runtime implements (in-process TF, TF Serving)."""

from __future__ import annotations

import abc

import numpy as np

from artifact.contract import SIGNATURE_NAME
from service.types import ModelMetadata, Prediction, VersionStatus


class Backend(abc.ABC):
    """Runs one named model; every method is safe to call from the event loop.

    Args:
        model_name: the model this backend serves (MODEL_NAME).
    """

    def __init__(self, model_name: str):
        self.model_name = model_name

    @abc.abstractmethod
    async def start(self) -> None:
        """Load (or connect to) the model; may return before it is ready."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release threads, channels and models."""

    @abc.abstractmethod
    def serving_version(self) -> int | None:
        """The version answering requests that name none; None while nothing answers."""

    @abc.abstractmethod
    def not_ready_reason(self) -> str:
        """Why nothing answers (meaningful while serving_version() is None)."""

    @abc.abstractmethod
    async def model_status(self, name: str, version: int | None) -> list[VersionStatus]:
        """The versions' states, the serving one first. Raises NotFound."""

    @abc.abstractmethod
    async def metadata(self, name: str, version: int | None) -> ModelMetadata:
        """A version's signatures. Raises NotFound."""

    @abc.abstractmethod
    async def predict(
        self,
        name: str,
        images: np.ndarray,
        version: int | None = None,
        signature_name: str = SIGNATURE_NAME,
    ) -> Prediction:
        """Run float32 images [n, 28, 28] through a signature. Raises ServiceError subclasses."""

    @abc.abstractmethod
    def labels(self, version: int) -> tuple[str, ...]:
        """The class labels a version answers with."""

    def device(self) -> str:
        """Where the model runs, for status endpoints and logs."""
        return "unknown"


class DelegatingBackend(Backend):
    """A backend that wraps another and passes every call through; override what differs."""

    def __init__(self, inner: Backend):
        super().__init__(inner.model_name)
        self.inner = inner

    def serving_version(self) -> int | None:
        return self.inner.serving_version()

    def not_ready_reason(self) -> str:
        return self.inner.not_ready_reason()

    def device(self) -> str:
        return self.inner.device()

    def labels(self, version: int) -> tuple[str, ...]:
        return self.inner.labels(version)

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    async def model_status(self, name, version):
        return await self.inner.model_status(name, version)

    async def metadata(self, name, version):
        return await self.inner.metadata(name, version)

    async def predict(self, name, images, version=None, signature_name=SIGNATURE_NAME):
        return await self.inner.predict(name, images, version, signature_name)
