"""The backend interface every model runtime implements (in-process TF, TF Serving)."""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from artifact.contract import SIGNATURE_NAME
from artifact.model_config import ModelEntry
from service.errors import SignatureNotFound
from service.types import Inputs, ModelMetadata, Prediction, SignatureSpec, VersionStatus


@dataclasses.dataclass
class Reservation:
    """What one request needs to run off the event loop: the batcher's thread calls `run`
    (blocking) with the merged inputs of requests whose `key`s (and inner shapes) are equal;
    `release` (on the loop, once) lets go of what was held for the request, such as its version.

    Args:
        key: requests with equal keys may share one model call.
        run: inputs -> Prediction, called on a thread that is not the event loop.
        release: called on the event loop when the request is answered, failed or dropped.
        cancel: stops a run in progress when the service shuts down, where that is possible.
        served: (model, version, signature) for the metrics (service/metrics.py).
    """

    key: tuple
    run: Callable[[Inputs], Prediction]
    release: Callable[[], None] = lambda: None
    cancel: Callable[[], None] = lambda: None
    # False: the signature has an input or output without a batch dimension; never joined.
    batchable: bool = True
    served: tuple[str, int | None, str] = ("", None, "")


class Observer(Protocol):
    """What the backends tell the metrics (service/metrics.py's Metrics is one)."""

    def batch_ran(
        self, served: tuple, rows: int, padded: int, waits: list[tuple[int, float]], left: int
    ) -> None:
        """A batch of `rows` instances, padded to `padded`, ran; each request's (instances,
        seconds queued); `left` requests still queued. Called on the batcher's thread."""

    def version_loaded(self, model: str, seconds: float, failed: bool) -> None:
        """A version's load ended, after `seconds`; `failed` when it did not load."""


class Backend(abc.ABC):
    """Runs the models of a config; every method is safe to call from the event loop.

    A request names a model and at most one of a version or a version label; naming neither
    means the model's serving version (its `stable` label's when it has one, else the newest).

    Args:
        model_name: the default model (the one /predict serves).
    """

    @property
    def loads_models(self) -> bool:
        """Whether apply_config loads and unloads the models (False: another server does, and
        apply_config only takes the names and labels it routes by)."""
        return True

    def __init__(self, model_name: str):
        self.model_name = model_name

    @abc.abstractmethod
    async def start(self) -> None:
        """Load (or connect to) the models; may return before they are ready.

        Raises:
            ConfigError: the models' config cannot be realized (a label to a version that
                is not available); the process should not start.
        """

    @abc.abstractmethod
    async def close(self) -> None:
        """Release threads, channels and models."""

    @abc.abstractmethod
    async def apply_config(self, entries: list[ModelEntry]) -> list[str]:
        """Serve a new model config whole, or refuse it whole (ConfigError); what changed."""

    @abc.abstractmethod
    def model_names(self) -> list[str]:
        """The models served."""

    @abc.abstractmethod
    def serving_version(self, name: str) -> int | None:
        """The version answering a model's requests that name none; None while none does."""

    @abc.abstractmethod
    def not_ready_reason(self, name: str) -> str:
        """Why a model answers nothing (meaningful while serving_version() is None)."""

    @abc.abstractmethod
    def version_labels(self, name: str) -> dict[str, int]:
        """A model's version labels (`stable`, `canary`, ...) and the versions they name."""

    @abc.abstractmethod
    async def model_status(
        self, name: str, version: int | None, label: str | None = None
    ) -> list[VersionStatus]:
        """The versions' states, the serving one first. Raises NotFound."""

    @abc.abstractmethod
    async def metadata(
        self, name: str, version: int | None, label: str | None = None
    ) -> ModelMetadata:
        """A version's signatures. Raises NotFound."""

    async def signature(
        self,
        name: str,
        version: int | None = None,
        label: str | None = None,
        signature_name: str = SIGNATURE_NAME,
    ) -> SignatureSpec:
        """The signature a request names, as the version that would answer it has it: what
        its inputs are checked against. By default read from metadata().

        Raises:
            NotFound, NotReady: as metadata() does.
            BadInput: the version has no such signature (TF Serving's words).
        """
        metadata = await self.metadata(name, version, label)
        spec = metadata.signatures.get(signature_name)
        if spec is None:
            raise SignatureNotFound(signature_name, metadata.signatures)
        return spec

    @abc.abstractmethod
    async def predict(
        self,
        name: str,
        images: Inputs,
        version: int | None = None,
        signature_name: str = SIGNATURE_NAME,
        label: str | None = None,
    ) -> Prediction:
        """Run inputs through a signature: each named input, or one array (float32 images
        [n, 28, 28] for the image contract). Raises ServiceError subclasses."""

    async def reserve(
        self,
        name: str,
        version: int | None = None,
        signature_name: str = SIGNATURE_NAME,
        label: str | None = None,
    ) -> Reservation:
        """Hold what a prediction needs so that a thread can run it without the event loop
        (service/backends/batching.py). Raises what predict() raises for an unknown model, version,
        label or signature, where the backend can tell before running.

        By default the run goes back to this loop and awaits predict(): correct for any
        backend, and what one without a cheaper way (TF Serving's client) gets.
        """
        loop = asyncio.get_running_loop()
        inflight: list[concurrent.futures.Future] = []

        def run(images: Inputs) -> Prediction:
            call = self.predict(name, images, version, signature_name, label)
            future = asyncio.run_coroutine_threadsafe(call, loop)
            inflight.append(future)
            try:
                return future.result()
            finally:
                inflight.remove(future)

        def cancel() -> None:
            for future in list(inflight):
                future.cancel()

        return Reservation(
            (name, version, signature_name, label),
            run,
            cancel=cancel,
            served=(name, version, signature_name),
        )

    async def predict_shadow(
        self, name: str, images: Inputs, label: str, signature_name: str = SIGNATURE_NAME
    ) -> Prediction:
        """A prediction nobody waits for (shadow traffic): may run on its own lane, never in
        the way of served requests. By default, a plain predict."""
        return await self.predict(name, images, None, signature_name, label)

    @abc.abstractmethod
    def class_labels(self, name: str, version: int) -> tuple[str, ...]:
        """The class labels a version answers with (its labels.txt)."""

    @abc.abstractmethod
    def model_dir(self, name: str) -> Path | str:
        """A model's folder in the repository (its versions, their reports and plots), or its
        URL where the backend reads the model from object storage itself (TF Serving).

        Raises:
            NotFound: the model is not served.
        """

    def device(self) -> str:
        """Where the models run, for status endpoints and logs."""
        return "unknown"

    def overloaded(self) -> bool:
        """True when a new request would be refused for capacity anyway (a full queue)."""
        return False

    def queue_depth(self) -> int:
        """Requests waiting in the batch queue (0 without a batcher)."""
        return 0

    def observe(self, observer: Observer) -> None:  # noqa: B027 - optional: none by default
        """Tell `observer` of every batch run and every version loaded from now on (a backend
        that neither batches nor loads, TF Serving's client, has nothing to tell)."""


class DelegatingBackend(Backend):
    """A backend that wraps another and passes every call through; override what differs.

    reserve() is not passed through: the default runs this wrapper's own predict(), so a
    wrapper that changes predict() is never bypassed.
    """

    def __init__(self, inner: Backend):
        super().__init__(inner.model_name)
        self.inner = inner

    @property
    def loads_models(self) -> bool:
        return self.inner.loads_models

    def model_names(self) -> list[str]:
        return self.inner.model_names()

    def serving_version(self, name: str) -> int | None:
        return self.inner.serving_version(name)

    def not_ready_reason(self, name: str) -> str:
        return self.inner.not_ready_reason(name)

    def version_labels(self, name: str) -> dict[str, int]:
        return self.inner.version_labels(name)

    def device(self) -> str:
        return self.inner.device()

    def overloaded(self) -> bool:
        return self.inner.overloaded()

    def queue_depth(self) -> int:
        return self.inner.queue_depth()

    def observe(self, observer: Observer) -> None:
        self.inner.observe(observer)

    def class_labels(self, name: str, version: int) -> tuple[str, ...]:
        return self.inner.class_labels(name, version)

    def model_dir(self, name: str) -> Path | str:
        return self.inner.model_dir(name)

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    async def apply_config(self, entries):
        return await self.inner.apply_config(entries)

    async def model_status(self, name, version, label=None):
        return await self.inner.model_status(name, version, label)

    async def metadata(self, name, version, label=None):
        return await self.inner.metadata(name, version, label)

    async def signature(self, name, version=None, label=None, signature_name=SIGNATURE_NAME):
        return await self.inner.signature(name, version, label, signature_name)

    async def predict(self, name, images, version=None, signature_name=SIGNATURE_NAME, label=None):
        return await self.inner.predict(name, images, version, signature_name, label)

    async def predict_shadow(self, name, images, label, signature_name=SIGNATURE_NAME):
        return await self.inner.predict_shadow(name, images, label, signature_name)
