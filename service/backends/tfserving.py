"""TensorFlow Serving over gRPC: the same backend interface, answered by a TF Serving server.

Every call goes through `tensorflow-serving-api`'s stubs on one `grpc.aio` channel with a
deadline: PredictionService.Predict and GetModelMetadata, ModelService.GetModelStatus.
Responses are rendered exactly as the in-process backend renders them, and gRPC status codes
become HTTP statuses the way TF Serving's own REST server maps them (`GRPC_ERRORS`).

Readiness is TF Serving's: a background task asks GetModelStatus every second and the backend
is ready while the model has an AVAILABLE version. When TF Serving goes away /readyz turns 503
and predictions get 503; gRPC reconnects on its own (with a short backoff) and the next check
that sees an AVAILABLE version makes the backend ready again, with no restart. Class labels
come from the shared model repository on disk (MODEL_BASE_PATH), as TF Serving does not serve
assets.extra.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import tensorflow as tf
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from artifact.contract import ASSETS_EXTRA, DIGIT_LABELS, INPUT_KEY, LABELS_FILE, SIGNATURE_NAME
from artifact.model_config import ModelEntry
from artifact.repository import assets_stamp, version_labels
from artifact.storage import RemoteModel, StorageError, is_url
from service.backends.base import Backend
from service.backends.registry import STABLE, servable_not_found
from service.codecs.signatures import signature_specs
from service.errors import (
    GRPC_ERRORS,
    BadInput,
    NotFound,
    NotReady,
    ServiceError,
    SignatureNotFound,
    UpstreamError,
    check_label_name,
)
from service.types import (
    Inputs,
    ModelMetadata,
    Prediction,
    SignatureSpec,
    VersionState,
    VersionStatus,
)

log = logging.getLogger("service.backends.tfserving")

# TF Serving itself accepts messages of any size; gRPC's client default refuses answers over
# 4 MiB. Large batches need more.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Reconnect within a couple of seconds once TF Serving is back (gRPC's default backoff
    # grows to two minutes).
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.min_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 2000),
)
STATUS_POLL_SECONDS = 1.0
METADATA_FIELD = "signature_def"
# Versions' metadata kept for signature(); past this many, the cache starts again.
SIGNATURE_CACHE_SIZE = 64


def _error_code_name(status) -> str:
    """The name of a StatusProto's error code ("OK", "UNKNOWN", ...)."""
    enum = status.DESCRIPTOR.fields_by_name["error_code"].enum_type
    value = enum.values_by_number.get(status.error_code)
    return value.name if value is not None else str(status.error_code)


def _state(number: int) -> VersionState:
    try:
        return VersionState(number)
    except ValueError:
        return VersionState.UNKNOWN


@dataclasses.dataclass(frozen=True)
class _Stubs:
    """TF Serving's two gRPC services on one channel (their generated code is untyped)."""

    predict: Any
    model: Any


class TFServingBackend(Backend):
    """Forwards every call to TensorFlow Serving's gRPC API.

    TF Serving reads the same model config (it loads the versions, enforces the policy and
    the labels); this side keeps the config's names and labels to route requests: a label in
    a URL becomes ModelSpec.version_label, and a request naming nothing goes to the `stable`
    label when the config has one, as with the in-process backend.

    Args:
        models: the model config's entries; their base paths are read for class labels.
        address: host:port of TF Serving's gRPC API (TFSERVING_GRPC_ADDRESS).
        deadline_seconds: deadline of each call; past it, 504 (TFSERVING_DEADLINE_SECONDS).
        status_poll_seconds: how often readiness is re-checked.
        default_model: the model /predict serves (the first by default).
    """

    @property
    def loads_models(self) -> bool:
        return False  # TF Serving does, from its own config

    def __init__(
        self,
        models: list[ModelEntry],
        address: str,
        deadline_seconds: float,
        status_poll_seconds: float = STATUS_POLL_SECONDS,
        default_model: str | None = None,
    ):
        super().__init__(default_model or models[0].name)
        self.entries = {entry.name: entry for entry in models}
        self.address = address
        self.deadline_seconds = deadline_seconds
        self._status_poll_seconds = status_poll_seconds
        self._channel: grpc.aio.Channel | None = None
        self._stubs: _Stubs | None = None
        self._poller: asyncio.Task | None = None
        self._serving: dict[str, int | None] = {}
        self._reasons: dict[str, str] = {}
        self._reason = f"not connected to TensorFlow Serving at {address} yet"
        # (model, version) -> (assets.extra's stamp when read, labels): re-read on change.
        self._labels: dict[tuple[str, int], tuple[float, tuple[str, ...]]] = {}
        # (model, version, label, the version they reach) -> its metadata (signature()).
        self._signatures: dict[tuple, ModelMetadata] = {}

    # --- state --------------------------------------------------------------------------
    def model_names(self) -> list[str]:
        return list(self.entries)

    def serving_version(self, name: str) -> int | None:
        return self._serving.get(name)

    def not_ready_reason(self, name: str) -> str:
        return self._reasons.get(name, self._reason)

    def version_labels(self, name: str) -> dict[str, int]:
        entry = self.entries.get(name)
        return dict(entry.labels) if entry is not None else {}

    def device(self) -> str:
        return f"tfserving:{self.address}"

    def model_dir(self, name: str) -> Path | str:
        entry = self.entries.get(name)
        if entry is None:
            raise NotFound(f"Could not find any versions of model {name}")
        return entry.base_path

    def class_labels(self, name: str, version: int) -> tuple[str, ...]:
        """From the shared model repository on disk: TF Serving does not serve assets.extra."""
        entry = self.entries.get(name)
        if entry is None:
            raise NotFound(servable_not_found(name, version))
        if is_url(entry.base_path):
            return self._remote_labels(name, entry.base_path, version)
        path = Path(entry.base_path) / str(version)
        stamp = assets_stamp(path)
        cached = self._labels.get((name, version))
        if cached is None or cached[0] != stamp:
            cached = self._labels[(name, version)] = (stamp, version_labels(path))
        return cached[1]

    def _remote_labels(self, name: str, url: str, version: int) -> tuple[str, ...]:
        """A version's labels.txt on object storage, read once per version (a version there
        is published whole; its labels do not change)."""
        cached = self._labels.get((name, version))
        if cached is not None:
            return cached[1]
        try:
            text = RemoteModel(url).read_text(f"{version}/{ASSETS_EXTRA}/{LABELS_FILE}")
        except StorageError as err:
            log.warning("%s version %s: labels not read, digits meanwhile: %s", name, version, err)
            return DIGIT_LABELS
        labels = tuple(line for line in (text or "").splitlines() if line) or DIGIT_LABELS
        self._labels[(name, version)] = (0.0, labels)
        return labels

    def _set_serving(self, name: str, version: int | None, reason: str = "") -> None:
        before = self._serving.get(name)
        if (version is None) != (before is None):
            if version is not None:
                log.info("TensorFlow Serving at %s serves %s", self.address, name)
            else:
                log.warning("Not ready: %s", reason)
        self._serving[name] = version
        if version is None:
            self._reasons[name] = reason

    # --- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        # The channel belongs to the loop the server runs on, so it is made here.
        self._channel = grpc.aio.insecure_channel(self.address, options=CHANNEL_OPTIONS)
        self._stubs = _Stubs(
            prediction_service_pb2_grpc.PredictionServiceStub(self._channel),
            model_service_pb2_grpc.ModelServiceStub(self._channel),
        )
        await self.check_status()
        self._poller = asyncio.create_task(self._poll(), name="tfserving-status")

    async def apply_config(self, entries: list[ModelEntry]) -> list[str]:
        """Take the new config's names and labels (TF Serving applies the rest itself)."""
        changes = [
            f"model {e.name}: labels {dict(e.labels) or 'none'}"
            for e in entries
            if self.entries.get(e.name) != e
        ]
        self.entries = {entry.name: entry for entry in entries}
        self._serving = {n: v for n, v in self._serving.items() if n in self.entries}
        await self.check_status()
        return changes

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        if self._channel is not None:
            await self._channel.close()
        self._serving.clear()
        self._reason = "the service is shutting down"
        self._reasons.clear()

    async def check_status(self) -> bool:
        """Ask TF Serving which versions of each model are AVAILABLE; update readiness.

        A model serves its `stable` label's version when that is AVAILABLE, else its newest
        AVAILABLE version (what TF Serving answers unversioned requests with).
        """
        ready = True
        for name in list(self.entries):
            try:
                statuses = await self.model_status(name, None)
            except ServiceError as err:
                reason = err.message
                if not reason.startswith("TensorFlow Serving"):
                    reason = f"TensorFlow Serving at {self.address}: {reason}"
                self._set_serving(name, None, reason)
                ready = False
                continue
            serving = self._serving_of(name, statuses)
            if serving is not None:
                self._set_serving(name, serving)
                continue
            states = ", ".join(f"version {s.version}: {s.state.name}" for s in statuses)
            self._set_serving(
                name,
                None,
                f"TensorFlow Serving at {self.address} has no AVAILABLE version of {name} "
                f"({states})",
            )
            ready = False
        return ready

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._status_poll_seconds)
            try:
                await self.check_status()
            except Exception:  # pragma: no cover - the poller must outlive any one failure
                log.exception("checking TensorFlow Serving's model status failed")

    # --- calls --------------------------------------------------------------------------
    def _error(self, err: grpc.aio.AioRpcError, call: str) -> ServiceError:
        """The service error for a failed call: TF Serving's status, TF Serving's message."""
        code = err.code()
        details = err.details() or code.name
        if code == grpc.StatusCode.UNAVAILABLE:
            message = f"TensorFlow Serving at {self.address} is unavailable: {details}"
            for name in self.entries:
                self._set_serving(name, None, message)
        elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
            message = (
                f"TensorFlow Serving at {self.address} did not answer {call} within "
                f"{self.deadline_seconds:g} s (TFSERVING_DEADLINE_SECONDS): {details}"
            )
        else:
            message = details
        return GRPC_ERRORS.get(code.name, UpstreamError)(message)

    async def _call(self, method: Callable[[_Stubs], Any], request, call: str):
        """`method` (which picks a stub's method) called with `request`, by the deadline.

        Raises:
            NotReady: not started; the ServiceError of TF Serving's gRPC status.
        """
        stubs = self._stubs
        if stubs is None:
            raise NotReady(f"not connected to TensorFlow Serving at {self.address}")
        try:
            return await method(stubs)(request, timeout=self.deadline_seconds)
        except grpc.aio.AioRpcError as err:
            raise self._error(err, call) from err

    def _model_spec(self, spec, name: str, version: int | None, label: str | None) -> None:
        """Fill a ModelSpec: a version, a label, or the `stable` label when the config has one
        and the request names neither."""
        if version is not None and label is not None:
            raise BadInput(
                f"Both model version ({version}) and model version label ({label}) cannot "
                "be supplied."
            )
        if label is not None:
            check_label_name(label)
        spec.name = name
        entry = self.entries.get(name)
        if version is None and label is None and entry is not None and STABLE in entry.labels:
            label = STABLE
        if version is not None:
            spec.version.value = version
        elif label is not None:
            spec.version_label = label

    async def model_status(
        self, name: str, version: int | None, label: str | None = None
    ) -> list[VersionStatus]:
        request = get_model_status_pb2.GetModelStatusRequest()
        if label is not None:
            # GetModelStatus takes versions only: the label is read from the shared config.
            check_label_name(label)
            version = self.version_labels(name).get(label)
            if version is None:
                raise BadInput(f"Unrecognized servable version label: {label}")
        request.model_spec.name = name
        if version is not None:
            request.model_spec.version.value = version
        response = await self._call(lambda s: s.model.GetModelStatus, request, "GetModelStatus")
        statuses = [
            VersionStatus(
                entry.version,
                _state(entry.state),
                _error_code_name(entry.status),
                entry.status.error_message,
            )
            for entry in response.model_version_status
        ]
        # As the in-process backend lists them: the serving version first, then newest first.
        serving = self._serving_of(name, statuses)
        statuses.sort(key=lambda s: (s.version == serving, s.version), reverse=True)
        return statuses

    def _serving_of(self, name: str, statuses: list[VersionStatus]) -> int | None:
        """The version answering unversioned requests: the `stable` label's when AVAILABLE,
        else the newest AVAILABLE one (what TF Serving answers them with)."""
        available = [s.version for s in statuses if s.state == VersionState.AVAILABLE]
        entry = self.entries.get(name)
        stable = entry.labels.get(STABLE) if entry is not None else None
        if stable in available:
            return stable
        return max(available) if available else None

    async def metadata(
        self, name: str, version: int | None, label: str | None = None
    ) -> ModelMetadata:
        request = get_model_metadata_pb2.GetModelMetadataRequest()
        self._model_spec(request.model_spec, name, version, label)
        request.metadata_field.append(METADATA_FIELD)
        response = await self._call(
            lambda s: s.predict.GetModelMetadata, request, "GetModelMetadata"
        )
        signature_defs = get_model_metadata_pb2.SignatureDefMap()
        packed = response.metadata.get(METADATA_FIELD)
        if packed is None or not packed.Unpack(signature_defs):
            raise UpstreamError(
                f"TensorFlow Serving at {self.address} sent metadata without a SignatureDefMap "
                f"under {METADATA_FIELD!r}"
            )
        return ModelMetadata(
            name, response.model_spec.version.value, signature_defs, signature_specs(signature_defs)
        )

    async def signature(
        self,
        name: str,
        version: int | None = None,
        label: str | None = None,
        signature_name: str = SIGNATURE_NAME,
    ) -> SignatureSpec:
        """The signature from TF Serving's metadata, kept per version: asked again only when
        the version a request would reach changes (the status poll sees it), so a predict
        costs no extra call."""
        if version is None:
            resolved = self.version_labels(name).get(label) if label else self.serving_version(name)
        else:
            resolved = version
        key = (name, version, label, resolved)
        metadata = self._signatures.get(key) if resolved is not None else None
        if metadata is None:
            metadata = await self.metadata(name, version, label)
            if len(self._signatures) >= SIGNATURE_CACHE_SIZE:
                self._signatures.clear()
            if resolved is not None:
                self._signatures[key] = metadata
        spec = metadata.signatures.get(signature_name)
        if spec is None:
            raise SignatureNotFound(signature_name, metadata.signatures)
        return spec

    async def predict(
        self,
        name: str,
        images: Inputs,
        version: int | None = None,
        signature_name: str = SIGNATURE_NAME,
        label: str | None = None,
    ) -> Prediction:
        request = predict_pb2.PredictRequest()
        self._model_spec(request.model_spec, name, version, label)
        request.model_spec.signature_name = signature_name
        if isinstance(images, dict):
            for key, value in images.items():
                request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
        else:
            request.inputs[INPUT_KEY].CopyFrom(tf.make_tensor_proto(images, tf.float32))
        response = await self._call(lambda s: s.predict.Predict, request, "Predict")
        # Sorted like the in-process outputs (TF returns a signature's outputs by key).
        outputs = {key: tf.make_ndarray(response.outputs[key]) for key in sorted(response.outputs)}
        return Prediction(response.model_spec.version.value, outputs)
