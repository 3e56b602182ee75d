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
import logging
from pathlib import Path

import grpc
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from artifact.contract import INPUT_KEY, SIGNATURE_NAME
from artifact.repository import assets_stamp, version_labels
from service.backends.base import Backend
from service.errors import (
    BadInput,
    ClientClosedRequest,
    Conflict,
    Forbidden,
    NotFound,
    NotImplementedUpstream,
    NotReady,
    ServiceError,
    TooManyRequests,
    Unauthorized,
    UpstreamError,
    UpstreamInternal,
    UpstreamTimeout,
)
from service.tensors import signature_specs
from service.types import ModelMetadata, Prediction, VersionState, VersionStatus

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


# gRPC status -> error, the mapping TF Serving's HTTP server applies to its own statuses
# (tensorflow_serving/model_servers/http_server.cc, ToHTTPStatusCode).
GRPC_ERRORS: dict[grpc.StatusCode, type[ServiceError]] = {
    grpc.StatusCode.CANCELLED: ClientClosedRequest,  # 499
    grpc.StatusCode.UNKNOWN: UpstreamInternal,  # 500
    grpc.StatusCode.INVALID_ARGUMENT: BadInput,  # 400
    grpc.StatusCode.DEADLINE_EXCEEDED: UpstreamTimeout,  # 504
    grpc.StatusCode.NOT_FOUND: NotFound,  # 404
    grpc.StatusCode.ALREADY_EXISTS: Conflict,  # 409
    grpc.StatusCode.PERMISSION_DENIED: Forbidden,  # 403
    grpc.StatusCode.RESOURCE_EXHAUSTED: TooManyRequests,  # 429
    grpc.StatusCode.FAILED_PRECONDITION: BadInput,  # 400
    grpc.StatusCode.ABORTED: Conflict,  # 409
    grpc.StatusCode.OUT_OF_RANGE: BadInput,  # 400
    grpc.StatusCode.UNIMPLEMENTED: NotImplementedUpstream,  # 501
    grpc.StatusCode.INTERNAL: UpstreamInternal,  # 500
    grpc.StatusCode.UNAVAILABLE: NotReady,  # 503
    grpc.StatusCode.DATA_LOSS: UpstreamInternal,  # 500
    grpc.StatusCode.UNAUTHENTICATED: Unauthorized,  # 401
}


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


class TFServingBackend(Backend):
    """Forwards every call to TensorFlow Serving's gRPC API.

    Args:
        model_name, model_base_path: the model served; the repository is read for labels.
        address: host:port of TF Serving's gRPC API (TFSERVING_GRPC_ADDRESS).
        deadline_seconds: deadline of each call; past it, 504 (TFSERVING_DEADLINE_SECONDS).
        status_poll_seconds: how often readiness is re-checked.
    """

    def __init__(
        self,
        model_name: str,
        model_base_path: str,
        address: str,
        deadline_seconds: float,
        status_poll_seconds: float = STATUS_POLL_SECONDS,
    ):
        super().__init__(model_name)
        self.model_dir = Path(model_base_path) / model_name
        self.address = address
        self.deadline_seconds = deadline_seconds
        self._status_poll_seconds = status_poll_seconds
        self._channel: grpc.aio.Channel | None = None
        self._predict_stub = None
        self._model_stub = None
        self._poller: asyncio.Task | None = None
        self._serving: int | None = None
        self._reason = f"not connected to TensorFlow Serving at {address} yet"
        # version -> (assets.extra's stamp when read, labels): re-read when the files change.
        self._labels: dict[int, tuple[float, tuple[str, ...]]] = {}

    # --- state --------------------------------------------------------------------------
    def serving_version(self) -> int | None:
        return self._serving

    def not_ready_reason(self) -> str:
        return self._reason

    def device(self) -> str:
        return f"tfserving:{self.address}"

    def labels(self, version: int) -> tuple[str, ...]:
        """From the shared model repository on disk: TF Serving does not serve assets.extra."""
        path = self.model_dir / str(version)
        stamp = assets_stamp(path)
        cached = self._labels.get(version)
        if cached is None or cached[0] != stamp:
            cached = self._labels[version] = (stamp, version_labels(path))
        return cached[1]

    def _set_serving(self, version: int | None, reason: str = "") -> None:
        if (version is None) != (self._serving is None):
            if version is not None:
                log.info("TensorFlow Serving at %s serves %s", self.address, self.model_name)
            else:
                log.warning("Not ready: %s", reason)
        self._serving = version
        if version is None:
            self._reason = reason

    # --- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        # The channel belongs to the loop the server runs on, so it is made here.
        self._channel = grpc.aio.insecure_channel(self.address, options=CHANNEL_OPTIONS)
        self._predict_stub = prediction_service_pb2_grpc.PredictionServiceStub(self._channel)
        self._model_stub = model_service_pb2_grpc.ModelServiceStub(self._channel)
        await self.check_status()
        self._poller = asyncio.create_task(self._poll(), name="tfserving-status")

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        if self._channel is not None:
            await self._channel.close()
        self._serving = None
        self._reason = "the service is shutting down"

    async def check_status(self) -> bool:
        """Ask TF Serving which versions of the model are AVAILABLE; update readiness."""
        try:
            statuses = await self.model_status(self.model_name, None)
        except ServiceError as err:
            reason = err.message
            if not reason.startswith("TensorFlow Serving"):
                reason = f"TensorFlow Serving at {self.address}: {reason}"
            self._set_serving(None, reason)
            return False
        available = [s.version for s in statuses if s.state == VersionState.AVAILABLE]
        if available:
            # TF Serving answers unversioned requests with its newest AVAILABLE version.
            self._set_serving(max(available))
            return True
        states = ", ".join(f"version {s.version}: {s.state.name}" for s in statuses)
        self._set_serving(
            None,
            f"TensorFlow Serving at {self.address} has no AVAILABLE version of "
            f"{self.model_name} ({states})",
        )
        return False

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
            self._set_serving(None, message)
        elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
            message = (
                f"TensorFlow Serving at {self.address} did not answer {call} within "
                f"{self.deadline_seconds:g} s (TFSERVING_DEADLINE_SECONDS): {details}"
            )
        else:
            message = details
        return GRPC_ERRORS.get(code, UpstreamError)(message)

    async def _call(self, method, request, call: str):
        if self._channel is None:
            raise NotReady(f"not connected to TensorFlow Serving at {self.address}")
        try:
            return await method(request, timeout=self.deadline_seconds)
        except grpc.aio.AioRpcError as err:
            raise self._error(err, call) from err

    async def model_status(self, name: str, version: int | None) -> list[VersionStatus]:
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = name
        if version is not None:
            request.model_spec.version.value = version
        response = await self._call(self._model_stub.GetModelStatus, request, "GetModelStatus")
        statuses = [
            VersionStatus(
                entry.version,
                _state(entry.state),
                _error_code_name(entry.status),
                entry.status.error_message,
            )
            for entry in response.model_version_status
        ]
        # As the in-process backend lists them: the versions answering first, newest first.
        statuses.sort(key=lambda s: (s.state == VersionState.AVAILABLE, s.version), reverse=True)
        return statuses

    async def metadata(self, name: str, version: int | None) -> ModelMetadata:
        request = get_model_metadata_pb2.GetModelMetadataRequest()
        request.model_spec.name = name
        if version is not None:
            request.model_spec.version.value = version
        request.metadata_field.append(METADATA_FIELD)
        response = await self._call(
            self._predict_stub.GetModelMetadata, request, "GetModelMetadata"
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

    async def predict(
        self,
        name: str,
        images: np.ndarray,
        version: int | None = None,
        signature_name: str = SIGNATURE_NAME,
    ) -> Prediction:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = name
        request.model_spec.signature_name = signature_name
        if version is not None:
            request.model_spec.version.value = version
        request.inputs[INPUT_KEY].CopyFrom(tf.make_tensor_proto(images, tf.float32))
        response = await self._call(self._predict_stub.Predict, request, "Predict")
        # Sorted like the in-process outputs (TF returns a signature's outputs by key).
        outputs = {key: tf.make_ndarray(response.outputs[key]) for key in sorted(response.outputs)}
        return Prediction(response.model_spec.version.value, outputs)
