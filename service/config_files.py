"""TensorFlow Serving's server config files: BatchingParameters, MonitoringConfig, SSLConfig.

`tensorflow_model_server` reads each from a protobuf text file (--batching_parameters_file,
--monitoring_config_file, --ssl_config_file); so does this service (BATCHING_PARAMETERS_FILE,
MONITORING_CONFIG_FILE, SSL_CONFIG_FILE), with `text_format` into the messages themselves.
`tensorflow-serving-api` ships the API's protos but not these three, so their descriptors are
built here, in a descriptor pool of this module's own, field for field as TF Serving declares
them (tensorflow_serving/servables/tensorflow/session_bundle_config.proto for
BatchingParameters, tensorflow_serving/config/monitoring_config.proto and ssl_config.proto):
the same full names, field names, numbers and types, so a file TF Serving reads parses here the
same, and one it refuses is refused. A file that cannot be used is one line naming the file
and the line: the service does not start (exit 2).

What each file does here (docs/operations.md, "TF Serving's config files"):
- BatchingParameters: `max_batch_size`, `batch_timeout_micros` and `allowed_batch_sizes` are
  the batcher's; `max_enqueued_batches` times `max_batch_size` is its queue, in requests; a
  field left out takes TF Serving's default (1000, 0, 10). `num_batch_threads` above 1,
  `enable_large_batch_splitting` and `pad_variable_length_inputs` are warned of and ignored.
- MonitoringConfig: `prometheus_config { enable: true }` serves the metrics at its `path` too
  (TF Serving's default /monitoring/prometheus/metrics).
- SSLConfig: gRPC over TLS with `server_cert` and `server_key` (PEM text, inline); with
  `client_verify`, only clients whose certificate `custom_ca` signed.
"""

from __future__ import annotations

import dataclasses
import re
import ssl
from pathlib import Path

from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    message_factory,
    text_format,
    wrappers_pb2,
)

PACKAGE = "tensorflow.serving"
# TF Serving's PrometheusExporter::kPrometheusPath (tensorflow_serving/util/prometheus_exporter.cc).
DEFAULT_PROMETHEUS_PATH = "/monitoring/prometheus/metrics"
# Its batcher's defaults for what a BatchingParameters file leaves out (TensorFlow's
# SharedBatchScheduler::QueueOptions: input_batch_size_limit, batch_timeout_micros,
# max_enqueued_batches).
TF_MAX_BATCH_SIZE = 1000
TF_BATCH_TIMEOUT_MICROS = 0
TF_MAX_ENQUEUED_BATCHES = 10

_INT64 = ".google.protobuf.Int64Value"
# (file, message, [(field, number, type)]): a type is a scalar's name, a message's full name,
# or "repeated <scalar>".
_DECLARATIONS = (
    ("tensorflow_serving/servables/tensorflow/session_bundle_config.proto", "BatchingParameters", [
        ("max_batch_size", 1, _INT64),
        ("batch_timeout_micros", 2, _INT64),
        ("max_enqueued_batches", 3, _INT64),
        ("num_batch_threads", 4, _INT64),
        ("thread_pool_name", 5, ".google.protobuf.StringValue"),
        ("allowed_batch_sizes", 6, "repeated int64"),
        ("pad_variable_length_inputs", 7, "bool"),
        ("enable_large_batch_splitting", 8, ".google.protobuf.BoolValue"),
        ("max_execution_batch_size", 9, _INT64),
    ]),
    ("tensorflow_serving/config/monitoring_config.proto", "PrometheusConfig", [
        ("enable", 1, "bool"),
        ("path", 2, "string"),
    ]),
    ("tensorflow_serving/config/monitoring_config.proto", "MonitoringConfig", [
        ("prometheus_config", 1, f".{PACKAGE}.PrometheusConfig"),
    ]),
    ("tensorflow_serving/config/ssl_config.proto", "SSLConfig", [
        ("server_key", 1, "string"),
        ("server_cert", 2, "string"),
        ("custom_ca", 3, "string"),
        ("client_verify", 4, "bool"),
    ]),
)  # fmt: skip
_SCALARS = {
    "bool": descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
    "string": descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
    "int64": descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
}


def _build_pool() -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    files: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    for file_name, message_name, fields in _DECLARATIONS:
        file = files.get(file_name)
        if file is None:
            file = files[file_name] = descriptor_pb2.FileDescriptorProto(
                name=file_name, package=PACKAGE, syntax="proto3"
            )
            file.dependency.append("google/protobuf/wrappers.proto")
        message = file.message_type.add(name=message_name)
        for name, number, kind in fields:
            field = message.field.add(name=name, number=number, json_name=_camel(name))
            field.label = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
            if kind.startswith("repeated "):
                field.label = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
                kind = kind.removeprefix("repeated ")
            if kind in _SCALARS:
                field.type = _SCALARS[kind]
            else:
                field.type = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
                field.type_name = kind
    for file in files.values():
        pool.AddSerializedFile(file.SerializeToString())
    return pool


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


_POOL = _build_pool()


def _message_class(name: str):
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{PACKAGE}.{name}"))


BatchingParameters = _message_class("BatchingParameters")
MonitoringConfig = _message_class("MonitoringConfig")
SSLConfig = _message_class("SSLConfig")


class ServerFileError(ValueError):
    """A config file that cannot be used: one line naming the variable, the file and the line."""


@dataclasses.dataclass(frozen=True)
class BatchOptions:
    """The batcher, as a BatchingParameters file sets it.

    Attributes:
        max_batch_size: most instances in one model call.
        timeout_ms: how long a batch that is not full waits for more.
        max_queue: most requests waiting.
        allowed_batch_sizes: the sizes a batch is padded up to (empty: any size).
    """

    max_batch_size: int
    timeout_ms: float
    max_queue: int
    allowed_batch_sizes: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class GRPCTLS:
    """gRPC's TLS: the certificate chain and key (PEM), and the CA that signs the clients'
    certificates when they must have one (None: no client certificate asked for)."""

    chain: bytes
    key: bytes
    client_ca: bytes | None = None


@dataclasses.dataclass(frozen=True)
class ServerFiles:
    """What the settings' TF Serving config files say; None where a file is not given.

    Attributes:
        batching: the batcher's options (BATCHING_PARAMETERS_FILE).
        prometheus_path: the metrics' second path (MONITORING_CONFIG_FILE, when enabled).
        grpc_tls: gRPC's TLS (SSL_CONFIG_FILE).
        warnings: one line per field accepted and ignored.
    """

    batching: BatchOptions | None = None
    prometheus_path: str | None = None
    grpc_tls: GRPCTLS | None = None
    warnings: tuple[str, ...] = ()


def read_server_files(settings) -> ServerFiles:
    """Read the TF Serving config files the settings name (service/settings.py).

    Raises:
        ServerFileError: a file that cannot be read, parsed or used.
    """
    warnings: list[str] = []
    batching = prometheus_path = grpc_tls = None
    if settings.batching_parameters_file:
        batching = batch_options(settings.batching_parameters_file, warnings)
    if settings.monitoring_config_file:
        prometheus_path = prometheus_path_of(settings.monitoring_config_file)
    if settings.ssl_config_file:
        grpc_tls = grpc_tls_of(settings.ssl_config_file)
    return ServerFiles(batching, prometheus_path, grpc_tls, tuple(warnings))


def parse_text_file(path: str | Path, message, variable: str):
    """The message in a protobuf text file.

    Raises:
        ServerFileError: unreadable, or not that message in text format (the line named).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ServerFileError(f"{variable}: cannot read {path}: {err}") from None
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as err:
        where = f"{path}:{err.GetLine()}" if err.GetLine() else str(path)
        reason = re.sub(r"^\d+:\d+ : ", "", str(err))
        raise ServerFileError(
            f"{variable}: {where}: not a {message.DESCRIPTOR.full_name} in text format: {reason}"
        ) from None
    return message


def _line_of(path: str | Path, field: str) -> str:
    """`path:line` of the first line that sets `field` (for messages about its value)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return str(path)
    pattern = re.compile(rf"(^|[\s{{]){re.escape(field)}\s*[:{{]")
    for number, line in enumerate(lines, start=1):
        if pattern.search(line.split("#", 1)[0]):
            return f"{path}:{number}"
    return str(path)


def batch_options(path: str | Path, warnings: list[str] | None = None) -> BatchOptions:
    """The batcher's options from a BatchingParameters file, checked as TF Serving checks them
    (servables/tensorflow/bundle_factory_util.cc, TensorFlow's shared_batch_scheduler.h).
    Fields that do not apply here add a line to `warnings`.

    Raises:
        ServerFileError: the file cannot be used.
    """
    variable = "BATCHING_PARAMETERS_FILE"
    params = parse_text_file(path, BatchingParameters(), variable)

    def value(name: str, default: int) -> int:
        return getattr(params, name).value if params.HasField(name) else default

    def refuse(field: str, problem: str) -> ServerFileError:
        return ServerFileError(f"{variable}: {_line_of(path, field)}: {field} {problem}")

    max_batch_size = value("max_batch_size", TF_MAX_BATCH_SIZE)
    timeout_micros = value("batch_timeout_micros", TF_BATCH_TIMEOUT_MICROS)
    max_enqueued = value("max_enqueued_batches", TF_MAX_ENQUEUED_BATCHES)
    if max_batch_size < 1:
        raise refuse("max_batch_size", f"must be positive, got {max_batch_size}")
    if timeout_micros < 0:
        raise refuse("batch_timeout_micros", f"must be 0 or more, got {timeout_micros}")
    if max_enqueued < 1:
        raise refuse("max_enqueued_batches", f"must be positive, got {max_enqueued}")
    threads = value("num_batch_threads", 1)
    if threads < 1:
        raise refuse("num_batch_threads", f"must be 1 or more, got {threads}")
    allowed = tuple(params.allowed_batch_sizes)
    if allowed:
        if any(size < 1 for size in allowed) or list(allowed) != sorted(set(allowed)):
            raise refuse(
                "allowed_batch_sizes",
                f"must be positive and increasing, got {', '.join(map(str, allowed))}",
            )
        if allowed[-1] != max_batch_size:
            # TF Serving's own rule and words.
            raise refuse(
                "allowed_batch_sizes",
                f"must end with max_batch_size: Last entry in allowed_batch_sizes must match "
                f"max_batch_size; last entry was {allowed[-1]}; expected {max_batch_size}",
            )
    notes = warnings if warnings is not None else []
    if threads > 1:
        notes.append(
            f"{variable}: num_batch_threads {threads}: batches run one at a time in each "
            "process here (WORKERS runs more processes), ignored"
        )
    splitting = params.enable_large_batch_splitting
    if params.HasField("enable_large_batch_splitting") and splitting.value:
        notes.append(
            f"{variable}: enable_large_batch_splitting: a request larger than max_batch_size "
            "runs as a batch of its own here, unsplit; ignored"
        )
    if params.pad_variable_length_inputs:
        notes.append(
            f"{variable}: pad_variable_length_inputs: requests whose inputs differ in shape are "
            "batched apart here, never padded; ignored"
        )
    return BatchOptions(
        max_batch_size=max_batch_size,
        timeout_ms=timeout_micros / 1000.0,
        max_queue=max_enqueued * max_batch_size,
        allowed_batch_sizes=allowed,
    )


def prometheus_path_of(path: str | Path) -> str | None:
    """The path a MonitoringConfig serves the metrics at; None when it does not enable them.

    Raises:
        ServerFileError: the file cannot be used.
    """
    variable = "MONITORING_CONFIG_FILE"
    config = parse_text_file(path, MonitoringConfig(), variable).prometheus_config
    if not config.enable:
        return None
    where = config.path or DEFAULT_PROMETHEUS_PATH
    if not re.fullmatch(r"/[A-Za-z0-9._~!$&'()*+,;=:@%/-]*", where) or "//" in where:
        raise ServerFileError(
            f"{variable}: {_line_of(path, 'path')}: prometheus_config.path must be a URL path "
            f"starting with /, got {where!r}"
        )
    return where


def grpc_tls_of(path: str | Path) -> GRPCTLS:
    """gRPC's TLS from an SSLConfig (its PEM text inline, as TF Serving takes it).

    Raises:
        ServerFileError: the file cannot be used (a certificate or key missing or not PEM,
            client_verify without custom_ca).
    """
    variable = "SSL_CONFIG_FILE"
    config = parse_text_file(path, SSLConfig(), variable)

    def refuse(field: str, problem: str) -> ServerFileError:
        return ServerFileError(f"{variable}: {_line_of(path, field)}: {field} {problem}")

    for field in ("server_cert", "server_key"):
        if not getattr(config, field).strip():
            raise refuse(field, "is missing: the PEM text goes in the file itself")
    for field in ("server_cert", "custom_ca"):
        text = getattr(config, field)
        if text.strip():
            try:
                ssl.create_default_context(cadata=text)
            except (ssl.SSLError, ValueError) as err:
                raise refuse(field, f"is not PEM certificates: {err}") from None
    if "PRIVATE KEY-----" not in config.server_key:
        raise refuse("server_key", "is not a PEM private key (no BEGIN ... PRIVATE KEY line)")
    if config.client_verify and not config.custom_ca.strip():
        raise refuse("client_verify", "needs custom_ca, the CA of the clients' certificates")
    return GRPCTLS(
        chain=config.server_cert.encode(),
        key=config.server_key.encode(),
        client_ca=config.custom_ca.encode() if config.client_verify else None,
    )
