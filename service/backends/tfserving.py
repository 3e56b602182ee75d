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

import grpc
import numpy as np

from service.backends.base import Backend, Prediction, version_status
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
from training.contract import INPUT_KEY, SIGNATURE_NAME

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
AVAILABLE = "AVAILABLE"


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


def _enum_name(message, field: str) -> str:
    """The name of an enum field's value, as TF Serving's REST API renders it ("AVAILABLE")."""
    enum = message.DESCRIPTOR.fields_by_name[field].enum_type
    value = enum.values_by_number.get(getattr(message, field))
    return value.name if value is not None else str(getattr(message, field))


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
        super().__init__(model_name, model_base_path)
        self.address = address
        self.deadline_seconds = deadline_seconds
        self._status_poll_seconds = status_poll_seconds
        self._channel: grpc.aio.Channel | None = None
        self._predict_stub = None
        self._model_stub = None
        self._poller: asyncio.Task | None = None
        self._ready = False
        self._reason = f"not connected to TensorFlow Serving at {address} yet"

    # --- state --------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._ready

    def not_ready_reason(self) -> str:
        return self._reason

    def device(self) -> str:
        return f"tfserving:{self.address}"

    def _set_ready(self, ready: bool, reason: str = "") -> None:
        if ready != self._ready:
            if ready:
                log.info("TensorFlow Serving at %s serves %s", self.address, self.model_name)
            else:
                log.warning("Not ready: %s", reason)
        self._ready = ready
        if not ready:
            self._reason = reason

    # --- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

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
        self._ready = False
        self._reason = "the service is shutting down"

    async def check_status(self) -> bool:
        """Ask TF Serving whether the model has an AVAILABLE version; update readiness."""
        try:
            statuses = await self.model_status(self.model_name, None)
        except ServiceError as err:
            reason = err.message
            if not reason.startswith("TensorFlow Serving"):
                reason = f"TensorFlow Serving at {self.address}: {reason}"
            self._set_ready(False, reason)
            return False
        if any(status["state"] == AVAILABLE for status in statuses):
            self._set_ready(True)
            return True
        states = ", ".join(f"version {s['version']}: {s['state']}" for s in statuses)
        self._set_ready(
            False,
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
            self._set_ready(False, message)
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

    async def model_status(self, name: str, version: int | None) -> list[dict]:
        from tensorflow_serving.apis import get_model_status_pb2

        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = name
        if version is not None:
            request.model_spec.version.value = version
        response = await self._call(self._model_stub.GetModelStatus, request, "GetModelStatus")
        statuses = [
            version_status(
                entry.version,
                _enum_name(entry, "state"),
                _enum_name(entry.status, "error_code"),
                entry.status.error_message,
            )
            for entry in response.model_version_status
        ]
        # As the in-process backend lists them: the versions answering first, newest first
        # (/readyz reports the first one).
        statuses.sort(key=lambda s: (s["state"] == AVAILABLE, int(s["version"])), reverse=True)
        return statuses

    async def metadata(self, name: str, version: int | None) -> tuple[int, dict]:
        from google.protobuf.json_format import MessageToDict
        from tensorflow_serving.apis import get_model_metadata_pb2

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
        return response.model_spec.version.value, MessageToDict(
            signature_defs, preserving_proto_field_name=True, including_default_value_fields=True
        )

    async def predict(
        self,
        name: str,
        images: np.ndarray,
        version: int | None = None,
        signature_name: str = SIGNATURE_NAME,
    ) -> Prediction:
        import tensorflow as tf
        from tensorflow_serving.apis import predict_pb2

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
