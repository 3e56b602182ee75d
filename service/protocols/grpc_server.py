"""TensorFlow Serving's gRPC API, served natively: PredictionService and ModelService.

A client written for TF Serving's gRPC API (`tensorflow-serving-api`'s stubs, usually on
port 8500) works unchanged against this service: Predict, GetModelMetadata, GetModelStatus,
HandleReloadConfigRequest (service/protocols/grpc_reload.py), and Classify, Regress and
MultiInference for signatures that parse serialized tf.Examples (a parsing receiver's
export), checked as TF Serving 2.15 checks them. The tensors and examples are read and written
by service/codecs/ (tensor_proto.py, tf_example.py). The server runs on the app's event loop
and calls the same data plane as the HTTP adapters, so gRPC requests share HTTP's limits,
metrics and batches.

Errors carry TF Serving's status codes and, where it has its own, its messages (cited from
tensorflow/serving 2.15.1: model_servers/server_core.cc, grpc_status_util.cc,
get_model_status_impl.cc; servables/tensorflow/predict_util.cc, classifier.cc, regressor.cc,
multi_inference.cc, get_model_metadata_impl.cc; TF's cc/saved_model/util.cc). The
service's own errors become codes through `GRPC_ERRORS` (service/errors.py, TF Serving's
gRPC-to-HTTP table) read backwards. A client's deadline cancels its request wherever it
waits, batch queue included.

Imported only when GRPC_PORT is not 0: TF Serving's protos import TensorFlow.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Sequence

import grpc
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from artifact.contract import SIGNATURE_NAME
from service import tracing
from service.budgets import BodyBudget, Held
from service.codecs import tensor_proto, tf_example
from service.config_files import GRPCTLS
from service.dataplane import DataPlane
from service.errors import (
    GRPC_ERRORS,
    BadInput,
    Overloaded,
    PayloadTooLarge,
    ServiceError,
    SignatureNotFound,
    UpstreamError,
    overload_log,
    printable,
    redact_paths,
)
from service.metrics import SERVED, Served
from service.metrics_tfserving import GRPC
from service.protocols.grpc_access import RECEIVE_TIMEOUT_SECONDS, CallGuard
from service.protocols.grpc_reload import ConfigReloader, ReloadRefused, reload_config
from service.types import Inputs, ModelMetadata, SignatureSpec

log = logging.getLogger("service.grpc")

METADATA_FIELD = "signature_def"
# A MultiInference task's method_name: the examples' kind it runs (TF Serving's
# signature_constants.h, kClassifyMethodName and kRegressMethodName).
MULTI_INFERENCE_KINDS = {
    "tensorflow/serving/classify": "classification",
    "tensorflow/serving/regress": "regression",
}
# TF Serving cuts longer messages (model_servers/grpc_status_util.cc).
MESSAGE_LIMIT = 1024
# Calls served at once (GRPC_MAX_CONCURRENT_RPCS); past it gRPC answers RESOURCE_EXHAUSTED.
MAX_CONCURRENT_RPCS = 256
# In-flight calls may finish when the service stops (SHUTDOWN_TIMEOUT_SECONDS, as HTTP's).
SHUTDOWN_GRACE_SECONDS = 20.0
# A client whose deadline passes cancels the call before the server's copy of the deadline
# (set when the call arrived, so later by the request's transit time) passes too.
DEADLINE_SLACK_SECONDS = 0.1
CLIENT_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)

# The service's errors as gRPC codes: TF Serving's table read backwards (the first code it
# lists for an error wins: BadInput is INVALID_ARGUMENT), plus what it has no code for.
STATUS_OF_ERROR: dict[type[ServiceError], grpc.StatusCode] = {}
for _name, _error in GRPC_ERRORS.items():
    STATUS_OF_ERROR.setdefault(_error, grpc.StatusCode[_name])
STATUS_OF_ERROR.update(
    {
        PayloadTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,  # over MAX_IMAGES
        # The batching queue is full: TF Serving's batcher says UNAVAILABLE too
        # (tensorflow/core/kernels/batching_util/shared_batch_scheduler.h).
        Overloaded: grpc.StatusCode.UNAVAILABLE,
        UpstreamError: grpc.StatusCode.UNAVAILABLE,  # shutting down; a batch that failed
    }
)


def status_code_of(err: ServiceError) -> grpc.StatusCode:
    """The gRPC code for a service error; TF Serving's own code when it came from TF Serving
    (BACKEND=tfserving), so it passes through unchanged."""
    cause = err.__cause__
    if isinstance(cause, grpc.RpcError) and callable(getattr(cause, "code", None)):
        return cause.code()
    for error_class in type(err).__mro__:
        if error_class in STATUS_OF_ERROR:
            return STATUS_OF_ERROR[error_class]
    return grpc.StatusCode.INTERNAL


class RPCError(Exception):
    """A status the service's errors do not carry (TF Serving's FAILED_PRECONDITION, ...)."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def _spec_name(request) -> str:
    return request.model_spec.name


# The methods measured per model (service/metrics.py): their protocol label, TF Serving's API
# label (None: TF Serving's metrics leave the method out, as it does MultiInference), and the
# model the request names.
MEASURED = {
    "Predict": ("tfserving_grpc", "Predict", _spec_name),
    "Classify": ("tfserving_grpc", "Classify", _spec_name),
    "Regress": ("tfserving_grpc", "Regress", _spec_name),
    "MultiInference": (
        "tfserving_grpc",
        None,
        lambda request: request.tasks[0].model_spec.name if request.tasks else "",
    ),
    "ModelInfer": ("v2_grpc", None, lambda request: request.model_name),
}


def _rpc(method):
    """Count the call, and answer its errors with their gRPC status, logged as the HTTP side
    logs them. Its token was checked before it came here (service/protocols/grpc_access.py)."""
    name = method.__name__
    measured = MEASURED.get(name)

    @functools.wraps(method)
    async def handler(self, request, context):
        metrics = self.dataplane.metrics
        started = time.perf_counter()
        code = grpc.StatusCode.UNKNOWN
        overloaded = False
        served = None
        if measured is not None:
            served = Served(measured[0])
            SERVED.set(served)
        try:
            response = await method(self, request, context)
            code = grpc.StatusCode.OK
            return response
        except asyncio.CancelledError:
            # gRPC cancels the handler when the client's deadline passes or the client leaves.
            remaining = context.time_remaining()
            expired = remaining is not None and remaining < DEADLINE_SLACK_SECONDS
            code = grpc.StatusCode.DEADLINE_EXCEEDED if expired else grpc.StatusCode.CANCELLED
            raise
        except RPCError as err:
            code, message = err.code, err.message
        except ServiceError as err:
            code, message = status_code_of(err), err.message
            overloaded = isinstance(err, Overloaded)
        except Exception as err:  # noqa: BLE001 - a bug: logged, answered INTERNAL without details
            log.error("gRPC %s failed", name, exc_info=err)
            code, message = grpc.StatusCode.INTERNAL, f"internal error: {type(err).__name__}"
        finally:
            metrics.child(metrics.grpc_requests, name, code.name).inc()
            seconds = time.perf_counter() - started
            metrics.child(metrics.grpc_latency, name).observe(seconds)
            if served is not None and measured is not None:
                protocol, api, model_of = measured
                route = metrics.route(id(measured), protocol, api, GRPC, model_of(request))
                route.finished(code == grpc.StatusCode.OK, code.name, seconds, served)
        if code == grpc.StatusCode.UNAVAILABLE and overloaded:
            overload_log.refused(message)
        else:
            level = logging.INFO if code in CLIENT_CODES else logging.WARNING
            log.log(level, "gRPC %s -> %s: %s", name, code.name, printable(message))
        if code not in CLIENT_CODES:
            message = redact_paths(message)  # as HTTP's bodies: no folder of the server's
        if len(message) > MESSAGE_LIMIT:
            message = message[:MESSAGE_LIMIT] + "...TRUNCATED"
        await context.abort(code, message)

    return handler


def _model_spec(request):
    if not request.HasField("model_spec"):
        raise BadInput("Missing ModelSpec")
    return request.model_spec


def _debug_string(metadata: ModelMetadata, signature_name: str) -> str:
    """A signature as TF Serving prints it in messages (the proto's text format)."""
    # .get: indexing a proto map would add the key to the version's own SignatureDefMap.
    return str(metadata.signature_defs.signature_def.get(signature_name, ""))


def _fill_classifications(result, outputs, count: int) -> None:
    """A ClassificationResult: each example's (label, score) pairs, as TF Serving pairs the
    classes and scores outputs (servables/tensorflow/classifier.cc)."""
    for row in tf_example.classifications(outputs, count):
        classification = result.classifications.add()
        for class_label, score in row:
            classification.classes.add(label=class_label, score=score)


def _fill_regressions(result, outputs, count: int) -> None:
    """A RegressionResult: each example's value (servables/tensorflow/regressor.cc)."""
    for value in tf_example.regressions(outputs, count):
        result.regressions.add(value=value)


class _Servicer(
    prediction_service_pb2_grpc.PredictionServiceServicer,
    model_service_pb2_grpc.ModelServiceServicer,
):
    def __init__(
        self,
        dataplane: DataPlane,
        tensor_content: bool = False,
        strict_numbers: bool = False,
        body_budget: BodyBudget | None = None,
        reload_config: ConfigReloader | None = None,
    ):
        self.dataplane = dataplane
        self.tensor_content = tensor_content
        self.strict_numbers = strict_numbers
        self.body_budget = body_budget or BodyBudget(1 << 62)
        self.reload_config = reload_config

    # --- model specs --------------------------------------------------------------------
    def servable(self, spec) -> tuple[str, int | None, str | None]:
        """(model, version, label) as TF Serving reads a ModelSpec; neither = the serving one."""
        if not spec.name:
            raise BadInput("ModelSpec has no name specified.")
        choice = spec.WhichOneof("version_choice")
        if choice == "version":
            return spec.name, spec.version.value, None
        if choice == "version_label":
            return spec.name, None, spec.version_label
        return spec.name, None, None

    async def _feed_name(
        self, name: str, version: int | None, label: str | None, signature_name: str, alias: str
    ) -> str:
        """The graph tensor an input alias feeds (TF Serving's messages name it)."""
        metadata = await self.dataplane.metadata(name, version, label)
        # .get: indexing a proto map would add the key to the version's own SignatureDefMap.
        signature = metadata.signature_defs.signature_def.get(signature_name)
        if signature is None or alias not in signature.inputs:
            return alias
        return signature.inputs[alias].name

    # --- PredictionService --------------------------------------------------------------
    async def _predict_inputs(
        self, request, signature: SignatureSpec, name: str, version: int | None, label: str | None
    ) -> Inputs:
        """The request's inputs, checked and read as TF Serving reads them
        (service/codecs/tensor_proto.py: the aliases, then each tensor)."""
        missing = tensor_proto.missing_alias(request.inputs, signature)
        if missing is not None:
            feed_name = await self._feed_name(name, version, label, signature.name, missing)
            raise tensor_proto.alias_not_found(missing, feed_name, request.inputs)
        return tensor_proto.read_inputs(
            request.inputs, signature, self.dataplane.check_image_count, self.strict_numbers
        )

    @staticmethod
    def _output_filter(request, outputs) -> list[str]:
        wanted = list(request.output_filter)
        for i, alias in enumerate(wanted):
            if alias not in outputs:
                raise BadInput(
                    f"output tensor alias not found in signature: {alias} Outputs expected to "
                    f"be in the set {{{','.join(sorted(outputs))}}}."
                )
            if alias in wanted[:i]:
                raise BadInput(f"duplicate output tensor alias: {alias}")
        return wanted

    @_rpc
    async def Predict(self, request, context):  # noqa: N802 - gRPC's method name
        with tracing.span("admission"):
            self.dataplane.admit()  # a full queue refuses before the tensor is decoded
        name, version, label = self.servable(_model_spec(request))
        signature_name = request.model_spec.signature_name or SIGNATURE_NAME
        try:
            signature = await self.dataplane.signature(name, version, label, signature_name)
        except SignatureNotFound as err:
            raise RPCError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f'Serving signature key "{signature_name}" not found.',
            ) from err
        with tracing.span("parse"):
            inputs = await self._predict_inputs(request, signature, name, version, label)
        wanted = self._output_filter(request, {spec.name for spec in signature.outputs})
        result = await self.dataplane.predict(name, inputs, version, signature_name, label)
        with tracing.span("render"):
            response = predict_pb2.PredictResponse()
            response.model_spec.name = name
            response.model_spec.version.value = result.version
            response.model_spec.signature_name = signature_name
            for key in wanted or result.outputs:
                tensor_proto.fill_tensor_proto(
                    response.outputs[key], result.outputs[key], self.tensor_content
                )
        return response

    @_rpc
    async def Classify(self, request, context):  # noqa: N802
        name, version, label, signature_name, result, count = await self._run_examples(
            request, "classification"
        )
        response = classification_pb2.ClassificationResponse()
        self._fill_spec(response.model_spec, name, result.version, signature_name)
        _fill_classifications(response.result, result.outputs, count)
        return response

    @_rpc
    async def Regress(self, request, context):  # noqa: N802
        name, version, label, signature_name, result, count = await self._run_examples(
            request, "regression"
        )
        response = regression_pb2.RegressionResponse()
        self._fill_spec(response.model_spec, name, result.version, signature_name)
        _fill_regressions(response.result, result.outputs, count)
        return response

    @staticmethod
    def _fill_spec(spec, name: str, version: int, signature_name: str) -> None:
        spec.name = name
        spec.version.value = version
        spec.signature_name = signature_name

    async def _run_examples(self, request, kind: str):
        """Classify and Regress as TF Serving 2.15 runs them with its default flags (no
        --enable_signature_method_name_check): the signature must take serialized
        tf.Examples under `inputs`; the request's examples (each merged with the context,
        when it has one) are fed to it."""
        self.dataplane.admit()
        name, version, label = self.servable(_model_spec(request))
        metadata = await self.dataplane.metadata(name, version, label)
        signature_name = request.model_spec.signature_name or SIGNATURE_NAME
        tf_example.check_example_signature(
            metadata.signatures.get(signature_name),
            signature_name,
            kind,
            lambda: _debug_string(metadata, signature_name),
        )
        with self.body_budget.hold() as held:
            serialized = await self._serialized_examples(request.input, held)
            result = await self.dataplane.predict(
                name,
                tf_example.example_inputs(serialized),
                version,
                signature_name,
                label,
                api="Classify" if kind == "classification" else "Regress",
            )
        return name, version, label, signature_name, result, len(serialized)

    async def _serialized_examples(self, input_, held: Held) -> list[bytes]:
        """A request's Input as serialized tf.Examples, each after the context when it has
        one, as TF Serving joins them (util.cc, InputToSerializedExampleTensor): counted
        against MAX_IMAGES first, the context's copies then held in the body budget, and
        made off the event loop.

        Raises:
            BadInput: no example.
            PayloadTooLarge: more than MAX_IMAGES, or copies past MAX_BODY_BYTES_IN_FLIGHT.
            BodiesInFlight: the budget has no room for the copies now.
        """
        choice = input_.WhichOneof("kind")
        if choice == "example_list":
            listed, context = input_.example_list.examples, None
        elif choice == "example_list_with_context":
            listed = input_.example_list_with_context.examples
            context = input_.example_list_with_context.context
        else:
            raise BadInput("Input is empty")
        if not listed:
            raise BadInput("Input is empty")
        self.dataplane.check_image_count(len(listed))
        if context is None:
            return [example.SerializeToString() for example in listed]
        held.reserve(context.ByteSize() * len(listed))
        return await asyncio.to_thread(
            lambda: tf_example.with_context(
                context.SerializeToString(), [e.SerializeToString() for e in listed]
            )
        )

    @_rpc
    async def MultiInference(self, request, context):  # noqa: N802
        """Several Classify and Regress tasks over one Input of tf.Examples, as TF Serving
        2.15 runs them (servables/tensorflow/multi_inference.cc, multi_inference_helper.cc):
        the first task's ModelSpec picks the version; every task must name the same model
        and a signature of its own; each signature is checked as Classify or Regress checks
        it; the results come in the tasks' order, each with its ModelSpec. TF Serving runs
        the tasks' signatures in one session call; here each runs on that same version."""
        self.dataplane.admit()
        first = request.tasks[0].model_spec if request.tasks else model_pb2.ModelSpec()
        name, version, label = self.servable(first)
        metadata = await self.dataplane.metadata(name, version, label)
        signature_names: list[str] = []
        for task in request.tasks:
            if not task.model_spec.name:
                raise BadInput("Found ModelSpec with an empty model name.")
            if task.model_spec.name != name:
                raise BadInput(
                    "All ModelSpecs in a MultiInferenceRequest must access the same model name."
                )
            signature_name = task.model_spec.signature_name or SIGNATURE_NAME
            if signature_name in signature_names:
                raise BadInput(f"Duplicate evaluation of signature: {signature_name}")
            signature_names.append(signature_name)
            if signature_name not in metadata.signatures:
                raise BadInput(f"Requested signature not found in model graph: {signature_name}")
            kind = MULTI_INFERENCE_KINDS.get(task.method_name)
            if kind is None:
                raise RPCError(
                    grpc.StatusCode.UNIMPLEMENTED,
                    f"Unsupported signature method_name: {task.method_name}",
                )
            tf_example.check_example_signature(
                metadata.signatures[signature_name],
                signature_name,
                kind,
                functools.partial(_debug_string, metadata, signature_name),
            )
        with self.body_budget.hold() as held:
            serialized = await self._serialized_examples(request.input, held)
            return await self._multi_inference(request, name, metadata, signature_names,
                                               serialized)  # fmt: skip

    async def _multi_inference(self, request, name, metadata, signature_names, serialized):
        response = inference_pb2.MultiInferenceResponse()
        for task, signature_name in zip(request.tasks, signature_names, strict=True):
            # The version the first task found, for every task: one model, one version.
            result = await self.dataplane.predict(
                name,
                tf_example.example_inputs(serialized),
                metadata.version,
                signature_name,
                api="MultiInference",
            )
            answer = response.results.add()
            if MULTI_INFERENCE_KINDS[task.method_name] == "classification":
                _fill_classifications(answer.classification_result, result.outputs, len(serialized))
            else:
                _fill_regressions(answer.regression_result, result.outputs, len(serialized))
            self._fill_spec(answer.model_spec, task.model_spec.name, result.version, signature_name)
        self.dataplane.metrics.examples_counted(name, len(serialized))
        return response

    @_rpc
    async def GetModelMetadata(self, request, context):  # noqa: N802
        spec = _model_spec(request)
        if not request.metadata_field:
            raise BadInput("GetModelMetadataRequest must specify at least one metadata_field")
        for field in request.metadata_field:
            if field != METADATA_FIELD:
                raise BadInput(f"Metadata field {field} is not supported")
        name, version, label = self.servable(spec)
        metadata = await self.dataplane.metadata(name, version, label)
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        response.model_spec.name = metadata.name
        response.model_spec.version.value = metadata.version
        response.metadata[METADATA_FIELD].Pack(metadata.signature_defs)
        return response

    # --- ModelService -------------------------------------------------------------------
    @_rpc
    async def GetModelStatus(self, request, context):  # noqa: N802
        spec = _model_spec(request)
        # TF Serving reads only the version here: a label asks for every version.
        version = spec.version.value if spec.HasField("version") else None
        statuses = await self.dataplane.model_status(spec.name, version)
        response = get_model_status_pb2.GetModelStatusResponse()
        for status in statuses:
            entry = response.model_version_status.add()
            entry.version = status.version
            entry.state = int(status.state)
            codes = entry.status.DESCRIPTOR.fields_by_name["error_code"].enum_type
            code = codes.values_by_name.get(status.error_code) or codes.values_by_name["UNKNOWN"]
            entry.status.error_code = code.number
            entry.status.error_message = redact_paths(status.error_message)
        return response

    @_rpc
    async def HandleReloadConfigRequest(self, request, context):  # noqa: N802
        if self.reload_config is None:
            raise RPCError(
                grpc.StatusCode.UNIMPLEMENTED,
                "with BACKEND=tfserving, TF Serving serves the models: send the reload to it",
            )
        try:
            return await reload_config(request, self.reload_config, self.dataplane.backend)
        except ReloadRefused as err:
            raise RPCError(grpc.StatusCode[err.code], err.message) from err


class GRPCServer:
    """TF Serving's gRPC API on host:port over a data plane, on the running event loop.

    Args:
        dataplane: what serves the model (the HTTP adapters' own).
        host, port: where to listen (HOST, GRPC_PORT).
        max_message_bytes: largest message received or sent (GRPC_MAX_MESSAGE_BYTES).
        tokens: the bearer tokens calls must carry (`authorization` metadata), checked before
            a call's message is read (service/protocols/grpc_access.py); None: none.
        share_port: listen beside the other workers on the same port (SO_REUSEPORT).
        grace: how long in-flight calls may take to finish once it stops
            (SHUTDOWN_TIMEOUT_SECONDS).
        services: other services on the same server and port, each registered with its
            `add_to_server(server)` (the Open Inference Protocol's, service/protocols/v2_grpc.py).
        tensor_content: GRPC_TENSOR_CONTENT: answer outputs as raw bytes, not typed fields.
        strict_numbers: STRICT_NUMBERS: refuse values that are not finite, short float_val.
        tls: the certificate chain and key, and the CA of the clients' certificates when
            they must have one (TLS_CERT_FILE and TLS_KEY_FILE, or SSL_CONFIG_FILE): serve TLS
            only; None: plaintext.
        socket_path: GRPC_SOCKET_PATH: also listen on this UNIX socket (with `tls` too).
        reload_config: serves HandleReloadConfigRequest's configs; None: that call answers
            UNIMPLEMENTED.
        allow_plaintext_tokens: GRPC_ALLOW_PLAINTEXT_TOKENS: without `tls`, take calls that
            carry a token; false refuses them (UNAUTHENTICATED) rather than read a token
            anyone on the path could.
        max_concurrent_rpcs: GRPC_MAX_CONCURRENT_RPCS: most calls served at once; gRPC
            itself answers those past it RESOURCE_EXHAUSTED.
        body_budget: the bytes the process holds for requests (MAX_BODY_BYTES_IN_FLIGHT),
            shared with HTTP: the tf.Examples a call's context is copied into count in it.
        receive_timeout: BODY_TIMEOUT_SECONDS: how long a call may take to send its request
            message; then DEADLINE_EXCEEDED, and its slot is free.
    """

    def __init__(
        self,
        dataplane: DataPlane,
        host: str,
        port: int,
        max_message_bytes: int,
        tokens: dict[bytes, frozenset[str]] | None = None,
        share_port: bool = False,
        grace: float = SHUTDOWN_GRACE_SECONDS,
        services: Sequence = (),
        tensor_content: bool = False,
        strict_numbers: bool = False,
        tls: GRPCTLS | None = None,
        socket_path: str | None = None,
        reload_config: ConfigReloader | None = None,
        allow_plaintext_tokens: bool = False,
        max_concurrent_rpcs: int = MAX_CONCURRENT_RPCS,
        body_budget: BodyBudget | None = None,
        receive_timeout: float = RECEIVE_TIMEOUT_SECONDS,
    ):
        self.body_budget = body_budget
        self.receive_timeout = receive_timeout
        self.tls = tls
        self.socket_path = socket_path
        self.reload_config = reload_config
        self.allow_plaintext_tokens = allow_plaintext_tokens
        self.max_concurrent_rpcs = max_concurrent_rpcs
        self.tensor_content = tensor_content
        self.strict_numbers = strict_numbers
        self.dataplane = dataplane
        self.services = tuple(services)
        self.grace = grace
        self._stopping: asyncio.Future | None = None
        self.tokens = tokens
        self.share_port = share_port
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.max_message_bytes = max_message_bytes
        self.port = port
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        """Listen and serve; on the loop the data plane runs on.

        Raises:
            RuntimeError: the address cannot be bound.
        """

        def count(name: str, code: str) -> None:
            metrics = self.dataplane.metrics
            metrics.child(metrics.grpc_requests, name, code).inc()

        # Every call: its token (when tokens are on) and the time it has to send its message.
        guard = CallGuard(
            self.tokens,
            refuse_plaintext=(
                self.tokens is not None and self.tls is None and not self.allow_plaintext_tokens
            ),
            count=count,
            receive_timeout=self.receive_timeout,
        )
        server = grpc.aio.server(
            interceptors=[guard],
            maximum_concurrent_rpcs=self.max_concurrent_rpcs,
            options=[
                ("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_send_message_length", self.max_message_bytes),
                # gRPC shares a port with any other process's server by default: only the
                # service's own workers may.
                ("grpc.so_reuseport", int(self.share_port)),
            ],
        )
        servicer = _Servicer(
            self.dataplane,
            self.tensor_content,
            self.strict_numbers,
            self.body_budget,
            self.reload_config,
        )
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(servicer, server)
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(servicer, server)
        for service in self.services:
            service.add_to_server(server)
        listening = []
        if self.port:
            self.port = self._listen(server, self.address, "GRPC_PORT")
            listening.append(self.address)
        if self.socket_path:
            self._listen(server, f"unix:{self.socket_path}", "GRPC_SOCKET_PATH")
            listening.append(f"unix:{self.socket_path}")
        await server.start()
        self._server = server
        kind = "plaintext"
        if self.tls is not None:
            kind = "TLS, client certificates required" if self.tls.client_ca else "TLS"
        log.info("TensorFlow Serving's gRPC API on %s (%s)", ", ".join(listening), kind)

    def _listen(self, server: grpc.aio.Server, address: str, variable: str) -> int:
        """Listen on `address` (TLS or plaintext); the port bound."""
        try:
            if self.tls is None:
                port = server.add_insecure_port(address)
            else:
                credentials = grpc.ssl_server_credentials(
                    [(self.tls.key, self.tls.chain)],
                    root_certificates=self.tls.client_ca,
                    require_client_auth=self.tls.client_ca is not None,
                )
                port = server.add_secure_port(address, credentials)
        except RuntimeError as err:
            raise RuntimeError(f"gRPC cannot listen on {address} ({variable}): {err}") from err
        if port == 0:
            raise RuntimeError(f"gRPC cannot listen on {address} ({variable})")
        return port

    def begin_stop(self) -> None:
        """Refuse new calls from now on; those in flight get `grace` seconds to finish. Called
        when HTTP's shutdown begins, so both protocols' in-flight work ends within the same
        SHUTDOWN_TIMEOUT_SECONDS, not one after the other."""
        if self._server is not None and self._stopping is None:
            self._stopping = asyncio.ensure_future(self._server.stop(self.grace))

    async def stop(self) -> None:
        """Refuse new calls, let those in flight finish (up to `grace` seconds), close."""
        self.begin_stop()
        if self._stopping is not None:
            await self._stopping
            self._server = None
