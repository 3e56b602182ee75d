"""The data plane: what every protocol does to serve a model, in one place.

Protocol adapters (service/protocols/: TF Serving's REST API, the friendly /predict, the
operations endpoints, and any protocol added later) parse their requests into numpy arrays
and names, call this object, and render the typed results it returns. It checks the limits,
routes canary and shadow traffic (service/traffic.py), calls the backend (through the
batcher, when there is one), records the metrics and tells which version answered with which
labels. It knows no HTTP and no JSON.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from pathlib import Path

from artifact.contract import CLASSES_KEY, SIGNATURE_NAME, output_problems
from artifact.logs import current_request
from service.backends.base import Backend
from service.errors import (
    OVERLOADED,
    NotFound,
    NotReady,
    Overloaded,
    ServiceError,
    UpstreamInternal,
    check_image_count,
)
from service.metrics import Metrics
from service.traffic import SHADOW, Traffic
from service.types import (
    Inputs,
    ModelMetadata,
    PredictResult,
    Readiness,
    SignatureSpec,
    VersionStatus,
    rows_of,
)

log = logging.getLogger("service")


class DataPlane:
    """Limits, routing, backend calls, metrics and typed results for every protocol.

    Args:
        backend: the model runtime (a BatchingBackend around it, when batching is on).
        metrics: the app's Prometheus metrics.
        max_images: most images one request may hold (MAX_IMAGES).
        traffic: canary and shadow settings; none by default.
        on_prediction: called after each successful prediction with the model name, the
            signature name, the images and the result (prediction logging); it must not
            block, and its errors are logged, never the request's.
    """

    def __init__(
        self,
        backend: Backend,
        metrics: Metrics,
        max_images: int,
        traffic: Traffic | None = None,
        on_prediction: Callable[[str, str, Inputs, PredictResult], None] | None = None,
    ):
        self.on_prediction = on_prediction
        self.backend = backend
        self.metrics = metrics
        self.max_images = max_images
        self.traffic = traffic or Traffic(0, 0)
        self.draining = False
        metrics.model_names = backend.model_names
        metrics.queue_depth = backend.queue_depth
        backend.observe(metrics)

    @property
    def model_name(self) -> str:
        """The default model (the friendly /predict's)."""
        return self.backend.model_name

    def model_names(self) -> list[str]:
        return self.backend.model_names()

    async def start(self) -> None:
        await self.backend.start()

    async def close(self) -> None:
        await self.traffic.close()
        await self.backend.close()

    def check_image_count(self, count: int) -> None:
        """PayloadTooLarge naming the limit when a request holds more than MAX_IMAGES images."""
        check_image_count(count, self.max_images)

    def admit(self) -> None:
        """Refuse a new request at once, before its body is read, when the model's queue is
        full: under overload a refusal must cost next to nothing.

        Raises:
            Overloaded: 503, with a Retry-After.
        """
        if self.backend.overloaded():
            raise Overloaded(OVERLOADED)

    async def signature(
        self,
        name: str,
        version: int | None = None,
        label: str | None = None,
        signature_name: str = SIGNATURE_NAME,
    ) -> SignatureSpec:
        """The signature a request names, as the version that would answer it has it.

        Raises:
            NotFound, NotReady: the model, version or label; BadInput: no such signature.
        """
        return await self.backend.signature(name, version, label, signature_name)

    async def predict(
        self,
        name: str,
        images: Inputs,
        version: int | None = None,
        signature_name: str = SIGNATURE_NAME,
        label: str | None = None,
        api: str = "Predict",
    ) -> PredictResult:
        """Run inputs through a version's signature: float32 images [n, 28, 28] (the image
        contract), or each input of the signature by name.

        A request naming neither a version nor a label may go to the canary, and may be
        copied to the shadow; a named one goes where it says. `api` is TF Serving's name for
        the call in its runtime latency (Predict, Classify, Regress).

        Raises:
            ServiceError: over a limit, unknown model, version or label, not ready,
                overloaded.
        """
        count = rows_of(images)
        self.check_image_count(count)
        pinned = version is not None or label is not None
        labels = {} if pinned else self.backend.version_labels(name)
        route = "named" if pinned else "serving"
        prediction = None
        started = time.perf_counter()
        if not pinned:
            canary = self.traffic.route(labels)
            if canary is not None:
                try:
                    prediction = await self.backend.predict(
                        name, images, None, signature_name, canary
                    )
                    route = "canary"
                except (NotFound, NotReady):
                    prediction = None  # the canary is not answering: the serving version does
        if prediction is None:
            prediction = await self.backend.predict(name, images, version, signature_name, label)
        self.metrics.model_called(
            name,
            prediction.version,
            signature_name,
            api,
            time.perf_counter() - started,
            prediction.queued,
        )
        request = current_request.get()
        if request is not None:  # the access line says which version answered, and how
            request.model, request.version, request.signature = (
                name,
                prediction.version,
                signature_name,
            )
            request.batch_size = prediction.batch_size or count
        class_labels = self.backend.class_labels(name, prediction.version)
        self._count(name, prediction, class_labels, route, count)
        served_classes = prediction.outputs.get(CLASSES_KEY)
        # The shadow's agreement is counted on class ids (the image contract's).
        if (
            served_classes is not None
            and served_classes.dtype.kind in "iu"
            and not pinned
            and self.traffic.wants_shadow(name, labels)
        ):
            self.traffic.start_shadow(
                name,
                self.backend.predict_shadow(name, images, SHADOW, signature_name),
                served_classes,
                self.metrics,
            )
        result = PredictResult(name, prediction.version, prediction.outputs, class_labels)
        if self.on_prediction is not None:
            try:
                self.on_prediction(name, signature_name, images, result)
            except Exception:  # noqa: BLE001 - a logging failure must not fail the request
                log.exception("the prediction callback failed")
        return result

    def _count(self, name, prediction, class_labels, route: str, count: int) -> None:
        metrics = self.metrics
        metrics.images_per_request.observe(count)
        metrics.child(metrics.answered, name, str(prediction.version), route).inc()
        problems = [] if prediction.checked else output_problems(prediction.outputs, True)
        if problems:
            # Checked at load too (its warmup answers); a model may still answer otherwise.
            metrics.child(metrics.contract_violations, name, str(prediction.version)).inc()
            message = (
                f"version {prediction.version} of {name} answered outside its contract: "
                + "; ".join(problems)
            )
            log.warning("%s", message)
            if any(problem.startswith("classes") for problem in problems):
                raise UpstreamInternal(message)  # no label to answer with
        classes = prediction.outputs.get(CLASSES_KEY)
        if classes is not None and classes.dtype.kind in "iu" and classes.ndim == 1:
            # Counted in Python: a request holds a few images, where each numpy call costs
            # more than the counting.
            counts = collections.Counter(classes.tolist())
            if all(0 <= class_id < len(class_labels) for class_id in counts):
                for class_id, n in counts.items():
                    metrics.child(metrics.predictions, name, class_labels[class_id]).inc(n)

    async def model_status(
        self, name: str, version: int | None, label: str | None = None
    ) -> list[VersionStatus]:
        """The model's versions and their states, the serving one first."""
        return await self.backend.model_status(name, version, label)

    async def metadata(
        self, name: str, version: int | None, label: str | None = None
    ) -> ModelMetadata:
        """A version's signatures."""
        return await self.backend.metadata(name, version, label)

    def model_readiness(self, name: str) -> Readiness:
        """Whether one model answers requests that name no version, and if not, why.

        Raises:
            NotFound: the model is not served.
        """
        if name not in self.model_names():
            raise NotFound(f"Could not find any versions of model {name}")
        version = self.backend.serving_version(name)
        reason = "" if version is not None else self.backend.not_ready_reason(name)
        return Readiness(version is not None, reason, name, version, self.device())

    def start_draining(self) -> None:
        """The process is about to stop: readiness turns false at once (requests are still
        served until the listener closes)."""
        self.draining = True

    def readiness(self) -> Readiness:
        """Whether every model answers; the default model's version and the device."""
        version = self.backend.serving_version(self.model_name)
        if self.draining:
            reason = "the service is shutting down"
            return Readiness(False, reason, self.model_name, version, self.device())
        missing = [n for n in self.model_names() if self.backend.serving_version(n) is None]
        reason = "; ".join(
            (f"{n}: " if len(self.model_names()) > 1 else "") + self.backend.not_ready_reason(n)
            for n in missing
        )
        return Readiness(not missing, reason, self.model_name, version, self.device())

    def rollout(self, name: str) -> dict:
        """A model's serving version, labels, traffic split and shadow comparison.

        Raises:
            NotFound: the model is not served.
        """
        if name not in self.model_names():
            raise NotFound(f"Could not find any versions of model {name}")
        serving = self.backend.serving_version(name)
        labels = self.backend.version_labels(name)
        stats = self.traffic.shadow.get(name)
        class_labels = None
        if stats is not None and stats.label_version is not None:
            class_labels = self.backend.class_labels(name, stats.label_version)
        return {
            "model": name,
            "serving_version": serving,
            "labels": labels,
            "canary_percent": self.traffic.canary_percent if "canary" in labels else 0,
            "shadow_percent": self.traffic.shadow_percent if SHADOW in labels else 0,
            "shadow": stats.as_json(class_labels) if stats is not None else None,
        }

    def device(self) -> str:
        return self.backend.device()

    def model_dir(self, name: str) -> Path | str:
        """A model's folder in the repository. Raises NotFound."""
        return self.backend.model_dir(name)

    def version_labels(self, name: str) -> dict[str, int]:
        """A model's version labels (stable, canary, ...)."""
        return self.backend.version_labels(name)

    def update_gauges(self) -> None:
        """Set the serving-version gauge (called before /metrics is scraped)."""
        self.metrics.model_version.clear()
        for name in self.model_names():
            version = self.backend.serving_version(name)
            if version is not None:
                self.metrics.model_version.labels(name, self.device()).set(version)

    async def update_version_states(self) -> None:
        """Set every version's state gauge (before /metrics is scraped), when the models are
        loaded here (with BACKEND=tfserving, TF Serving exports its own)."""
        if not self.backend.loads_models:
            return
        metrics = self.metrics
        gauge = metrics.version_state
        now: set[tuple[str, str, str]] = set()
        for name in self.model_names():
            try:
                statuses = await self.backend.model_status(name, None)
            except ServiceError:
                continue  # no version yet
            now.update((name, str(s.version), s.state.name) for s in statuses)
        for labels in metrics.version_states - now:
            # A state left: gone from one process's registry; with workers, whose files keep
            # every series written, it reads 0.
            if metrics.multiprocess:
                gauge.labels(*labels).set(0)
            else:
                gauge.remove(*labels)
        for labels in now:
            gauge.labels(*labels).set(1)
        metrics.version_states = now

    def class_labels(self, name: str) -> tuple[str, ...] | None:
        """The class labels of a model's serving version; None while no version serves."""
        version = self.backend.serving_version(name)
        return None if version is None else self.backend.class_labels(name, version)
