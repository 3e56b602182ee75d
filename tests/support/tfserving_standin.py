"""A stand-in for TensorFlow Serving's gRPC API, for the BACKEND=tfserving tests.

TF Serving's binary (`tensorflow_model_server`, the tensorflow/serving image) cannot be
installed on this machine, so the tests run this instead: a real gRPC server on a loopback
port speaking TF Serving's real protos (`tensorflow-serving-api`'s PredictionService and
ModelService) over the real exported SavedModel, loaded with artifact.saved_model. It answers
Predict, GetModelMetadata and GetModelStatus as TF Serving 2.15 does, errors included: its
status codes and, where the tests read them, its messages (model_servers/get_model_status_impl.cc,
servables/tensorflow/predict_util.cc and get_model_metadata_impl.cc). Like TF Serving it replays
each version's assets.extra/tf_serving_warmup_requests when it loads the version.

Given a model config file (TF Serving's --model_config_file), it serves what TF Serving would
once everything has loaded: the versions the policy picks (latest N, all, specific, read as
TF Serving's file_system_storage_path_source.cc does) and the version labels, written here
independently of the service's own registry so that the two can be compared.

What it is not: TF Serving's batching, file-system polling, config reloading or REST API. The
exact wording of a wrong input shape comes from TF's runtime there; here it is our own.

Tests steer it: `fail_next(code, message)` makes the next Predict fail with that status,
`delay_next(seconds)` makes it answer late (to pass the client's deadline), `states` sets the
state GetModelStatus reports for a version, and `stop()` / `start()` take it away and bring it
back on the same port.
"""

from __future__ import annotations

import threading
from concurrent import futures
from pathlib import Path

import grpc
import tensorflow as tf
from google.protobuf import text_format
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)
from tensorflow_serving.config import model_server_config_pb2

from artifact.repository import list_versions as version_dirs
from artifact.saved_model import SavedModelPredictor, signature_def_map
from artifact.warmup import read_warmup_requests

DEFAULT_SIGNATURE = "serving_default"
# TF Serving builds its gRPC server with no message size limit.
MAX_MESSAGE_BYTES = 2**31 - 1


class _Servicer(
    prediction_service_pb2_grpc.PredictionServiceServicer,
    model_service_pb2_grpc.ModelServiceServicer,
):
    def __init__(self, stand_in: TFServingStandIn):
        self.stand_in = stand_in

    # --- helpers ------------------------------------------------------------------------
    def _servable(self, model_spec, context) -> int:
        """The version a ModelSpec names, aborting as TF Serving does when there is none."""
        name = model_spec.name
        versions = self.stand_in.models if name == self.stand_in.model_name else {}
        if model_spec.HasField("version"):
            version = model_spec.version.value
            if version not in versions:
                context.abort(
                    grpc.StatusCode.NOT_FOUND,
                    f"Servable not found for request: Specific({name}, {version})",
                )
            return version
        if model_spec.version_label:
            version = self.stand_in.labels.get(model_spec.version_label)
            if version is None:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"Unrecognized servable version label: {model_spec.version_label}",
                )
            if version not in versions:
                context.abort(
                    grpc.StatusCode.NOT_FOUND,
                    f"Servable not found for request: Specific({name}, {version})",
                )
            return version
        if not versions:
            context.abort(
                grpc.StatusCode.NOT_FOUND, f"Servable not found for request: Latest({name})"
            )
        return max(versions)

    # --- PredictionService --------------------------------------------------------------
    def Predict(self, request, context):  # noqa: N802 - gRPC's method name
        self.stand_in.predict_calls += 1
        self.stand_in.apply_injection(context)
        if not request.HasField("model_spec"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec")
        version = self._servable(request.model_spec, context)
        model = self.stand_in.models[version]
        signature_name = request.model_spec.signature_name or DEFAULT_SIGNATURE
        if signature_name not in model.signatures:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f'Serving signature key "{signature_name}" not found.',
            )
        expected = model.input_spec(signature_name)
        if set(request.inputs) != set(expected):
            sent, wanted = sorted(request.inputs), sorted(expected)
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"input size does not match signature: {len(sent)}!={len(wanted)} "
                f"len({{{','.join(sent)}}}) != len({{{','.join(wanted)}}}). "
                f"Sent extra: {{{','.join(sorted(set(sent) - set(wanted)))}}}. "
                f"Missing but required: {{{','.join(sorted(set(wanted) - set(sent)))}}}.",
            )
        inputs = {}
        for key, spec in expected.items():
            proto = request.inputs[key]
            if proto.dtype != spec.dtype.as_datatype_enum:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"Expects arg[0] to be {spec.dtype.name} but "
                    f"{tf.dtypes.as_dtype(proto.dtype).name} is provided",
                )
            value = tf.make_ndarray(proto)
            if not spec.shape.is_compatible_with(value.shape):
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"input '{key}' has shape {list(value.shape)}; the signature takes "
                    f"{spec.shape.as_list()}",
                )
            inputs[key] = value
        (images,) = inputs.values()
        outputs = model.run(images, signature_name)
        response = predict_pb2.PredictResponse()
        response.model_spec.name = request.model_spec.name
        response.model_spec.version.value = version
        response.model_spec.signature_name = signature_name
        for key, value in outputs.items():
            response.outputs[key].CopyFrom(tf.make_tensor_proto(value))
        return response

    def GetModelMetadata(self, request, context):  # noqa: N802
        if not request.HasField("model_spec"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec")
        if not request.metadata_field:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "GetModelMetadataRequest must specify at least one metadata_field",
            )
        for field in request.metadata_field:
            if field != "signature_def":
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"Metadata field {field} is not supported"
                )
        version = self._servable(request.model_spec, context)
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        response.model_spec.name = request.model_spec.name
        response.model_spec.version.value = version
        signature_defs = signature_def_map(self.stand_in.models[version].path)
        response.metadata["signature_def"].Pack(signature_defs)
        return response

    # --- ModelService -------------------------------------------------------------------
    def GetModelStatus(self, request, context):  # noqa: N802
        if not request.HasField("model_spec"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec")
        name = request.model_spec.name
        versions = sorted(self.stand_in.models) if name == self.stand_in.model_name else []
        if request.model_spec.HasField("version"):
            version = request.model_spec.version.value
            if version not in versions:
                context.abort(
                    grpc.StatusCode.NOT_FOUND, f"Could not find version {version} of model {name}"
                )
            versions = [version]
        elif not versions:
            context.abort(grpc.StatusCode.NOT_FOUND, f"Could not find any versions of model {name}")
        response = get_model_status_pb2.GetModelStatusResponse()
        for version in versions:
            entry = response.model_version_status.add()
            entry.version = version
            entry.state = get_model_status_pb2.ModelVersionStatus.State.Value(
                self.stand_in.states.get(version, "AVAILABLE")
            )
            # status left at its defaults: error_code OK, no message (as TF Serving sends).
        return response


class TFServingStandIn:
    """The stand-in server: every version under model_base_path/model_name, on a loopback port.

    Args:
        model_base_path: the model repository (TF Serving's --model_base_path's parent).
        model_name: the one model served.
        port: the port to listen on; a free one by default (kept across stop/start).
        config_file: a ModelServerConfig text file naming the model: its version policy and
            labels are served (relative base paths are read from the file's folder).
    """

    def __init__(
        self,
        model_base_path: str | Path,
        model_name: str,
        port: int = 0,
        config_file: str | Path | None = None,
    ):
        self.model_name = model_name
        self.models: dict[int, SavedModelPredictor] = {}
        self.labels: dict[str, int] = {}
        versions = version_dirs(Path(model_base_path) / model_name)
        if config_file is not None:
            versions = self._configured(Path(config_file), versions)
        for version, path in versions:
            model = SavedModelPredictor(path)
            # TF Serving replays the warmup file when it loads a version.
            model.warm_up(read_warmup_requests(path))
            self.models[version] = model
        self.port = port
        self.predict_calls = 0
        # GetModelStatus's state per version, by name ("LOADING", ...); AVAILABLE by default.
        self.states: dict[int, str] = {}
        self._server: grpc.Server | None = None
        self._lock = threading.Lock()
        self._failures: list[tuple[grpc.StatusCode, str]] = []
        self._delays: list[float] = []
        self._stopping = threading.Event()

    def _configured(self, config_file: Path, on_disk: list) -> list:
        """The versions TF Serving serves under the config's policy; sets the labels."""
        config = model_server_config_pb2.ModelServerConfig()
        text_format.Parse(config_file.read_text(), config)
        (model,) = [m for m in config.model_config_list.config if m.name == self.model_name]
        base = Path(model.base_path)
        if not base.is_absolute():
            base = config_file.parent / base
        on_disk = version_dirs(base)
        policy = model.model_version_policy
        choice = policy.WhichOneof("policy_choice")
        if choice == "all":
            served = on_disk
        elif choice == "specific":
            served = [(v, p) for v, p in on_disk if v in set(policy.specific.versions)]
        else:
            served = on_disk[-max(policy.latest.num_versions, 1) :]
        self.labels = dict(model.version_labels)
        return served

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> TFServingStandIn:
        """Listen (on the same port as before after a stop())."""
        if self._server is not None:
            return self
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="standin"),
            options=[
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        servicer = _Servicer(self)
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(servicer, server)
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(servicer, server)
        port = server.add_insecure_port(f"127.0.0.1:{self.port}")
        if port == 0:
            raise RuntimeError(f"the stand-in cannot listen on 127.0.0.1:{self.port}")
        self.port = port
        self._stopping.clear()
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        """Stop at once: in-flight calls are cancelled and the port closes."""
        if self._server is None:
            return
        self._stopping.set()  # wakes any delayed answer
        self._server.stop(grace=None).wait()
        self._server = None

    # --- fault injection ----------------------------------------------------------------
    def fail_next(self, code: grpc.StatusCode, message: str) -> None:
        """The next Predict aborts with this status and message."""
        with self._lock:
            self._failures.append((code, message))

    def delay_next(self, seconds: float) -> None:
        """The next Predict waits this long before answering (or until stop())."""
        with self._lock:
            self._delays.append(seconds)

    def apply_injection(self, context) -> None:
        with self._lock:
            failure = self._failures.pop(0) if self._failures else None
            delay = self._delays.pop(0) if self._delays else None
        if delay is not None:
            self._stopping.wait(delay)
        if failure is not None:
            context.abort(*failure)
