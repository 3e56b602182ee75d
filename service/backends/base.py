"""The backend interface every model runtime implements (in-process TF, TF Serving)."""

from __future__ import annotations

import abc
import dataclasses
from pathlib import Path

import numpy as np

from training.contract import DIGIT_LABELS, SIGNATURE_NAME
from training.saved_model import read_labels_file


@dataclasses.dataclass(frozen=True)
class Prediction:
    """One model call's result: which version answered and every output of the signature."""

    version: int
    outputs: dict[str, np.ndarray]


def servable_not_found(name: str, version: int | None) -> str:
    """TF Serving's own wording for an unknown model or version."""
    if version is None:
        return f"Servable not found for request: Latest({name})"
    return f"Servable not found for request: Specific({name}, {version})"


def version_status(version: int, state: str = "AVAILABLE", code: str = "OK", message: str = ""):
    """One entry of TF Serving's GetModelStatus response, as its REST API renders it."""
    return {
        "version": str(version),
        "state": state,
        "status": {"error_code": code, "error_message": message},
    }


class Backend(abc.ABC):
    """Loads and runs one named model; all methods are safe to call from the event loop.

    Args:
        model_name: the model this backend serves (MODEL_NAME).
        model_base_path: the model repository (MODEL_BASE_PATH), read for labels.
    """

    def __init__(self, model_name: str, model_base_path: str):
        self.model_name = model_name
        self.model_dir = Path(model_base_path) / model_name
        self._labels: dict[int, tuple[str, ...]] = {}

    @abc.abstractmethod
    async def start(self) -> None:
        """Load (or connect to) the model; may return before it is ready."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release threads, channels and models."""

    @property
    @abc.abstractmethod
    def ready(self) -> bool:
        """True when a model version is loaded and answering."""

    @abc.abstractmethod
    def not_ready_reason(self) -> str:
        """Why the backend is not ready, for /readyz and 503 bodies."""

    @abc.abstractmethod
    async def model_status(self, name: str, version: int | None) -> list[dict]:
        """TF Serving's model_version_status entries. Raises NotFound."""

    @abc.abstractmethod
    async def metadata(self, name: str, version: int | None) -> tuple[int, dict]:
        """(version, signature_def map as TF Serving's REST API renders it). Raises NotFound."""

    @abc.abstractmethod
    async def predict(
        self,
        name: str,
        images: np.ndarray,
        version: int | None = None,
        signature_name: str = SIGNATURE_NAME,
    ) -> Prediction:
        """Run float32 images [n, 28, 28] through a signature. Raises ServiceError subclasses."""

    def device(self) -> str:
        """Where the model runs, for status endpoints and logs."""
        return "unknown"

    def labels(self, version: int) -> tuple[str, ...]:
        """The class labels exported with a version (from the shared model repository)."""
        labels = self._labels.get(version)
        if labels is None:
            labels = read_labels_file(self.model_dir / str(version)) or DIGIT_LABELS
            self._labels[version] = labels
        return labels


class DelegatingBackend(Backend):
    """A backend that wraps another and passes every call through; override what differs."""

    def __init__(self, inner: Backend):
        super().__init__(inner.model_name, str(inner.model_dir.parent))
        self.inner = inner

    @property
    def ready(self) -> bool:
        return self.inner.ready

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
