"""TensorFlow Serving's own metrics, with its names, types, labels and buckets, rendered as its
Prometheus exporter renders them, so that dashboards and alerts written for
`tensorflow/serving` find them here.

The definitions are TF Serving's (tensorflow_serving/servables/tensorflow/util.cc,
tensorflow_serving/batching/batching_session.cc and batching_util.h). Its exporter
(tensorflow_serving/util/prometheus_exporter.cc) turns every character of a name that is not
a letter, digit or `_` into `:` (`/tensorflow/serving/request_count` is
`:tensorflow:serving:request_count`), writes a counter under its own name (no `_total`
added), a histogram's bucket bounds in six significant digits and its last bucket as
`+Inf`, a `# TYPE` line per family and no `# HELP`. Latencies are in microseconds.

The values live in prometheus_client's metrics (so WORKERS > 1 adds up every worker's, as
for the service's own metrics); only their text is TF Serving's (`render`).
"""

from __future__ import annotations

import dataclasses
import math
import re

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.utils import floatToGoString

PREFIX = ":tensorflow:serving:"


def exponential_buckets(scale: float, growth: float, count: int) -> tuple[float, ...]:
    """TensorFlow's monitoring::Buckets::Exponential(scale, growth, count) as TF Serving's
    exporter shows them: `count` bounds, each rounded to six significant digits; the bucket
    past the last (TensorFlow's DBL_MAX) is Prometheus's +Inf."""
    return tuple(float(f"{scale * growth**i:.6g}") for i in range(count))


@dataclasses.dataclass(frozen=True)
class Definition:
    """One of TF Serving's metrics: its exported name, kind, labels and (histograms) bucket
    bounds."""

    name: str
    kind: str  # "counter" or "histogram"
    labels: tuple[str, ...]
    help: str
    buckets: tuple[float, ...] = ()


# Scale 10, growth 1.8, 33 buckets (~20 minutes), in microseconds (util.cc).
LATENCY_US = exponential_buckets(10, 1.8, 33)
# Scale 100, growth 1.2, 52 buckets (~1 second), in microseconds (batching_session.cc).
QUEUING_US = exponential_buckets(100, 1.2, 52)
# 1, 2, 4, ... 8192 (batching_util.h).
BATCH_SIZES = exponential_buckets(1, 2, 14)

EXAMPLE_COUNTS = Definition(
    PREFIX + "request_example_counts",
    "histogram",
    ("model",),
    "The number of tensorflow.Examples per request.",
    exponential_buckets(1, 2, 15),
)
EXAMPLE_COUNT_TOTAL = Definition(
    PREFIX + "request_example_count_total",
    "counter",
    ("model",),
    "The total number of tensorflow.Examples.",
)
REQUEST_COUNT = Definition(
    PREFIX + "request_count", "counter", ("model_name", "status"), "The total number of requests."
)
REQUEST_LATENCY = Definition(
    PREFIX + "request_latency",
    "histogram",
    ("model_name", "API", "entrypoint"),
    "Distribution of wall time (in microseconds) for Tensorflow Serving request.",
    LATENCY_US,
)
RUNTIME_LATENCY = Definition(
    PREFIX + "runtime_latency",
    "histogram",
    ("model_name", "API", "runtime"),
    "Distribution of wall time (in microseconds) for Tensorflow runtime.",
    LATENCY_US,
)
QUEUING_LATENCY = Definition(
    PREFIX + "batching_session:queuing_latency",
    "histogram",
    ("thread_pool_name",),
    "Distribution of wall time spent (in microseconds) in queuing",
    QUEUING_US,
)
WRAPPED_RUN_COUNT = Definition(
    PREFIX + "batching_session:wrapped_run_count",
    "counter",
    (),
    "Total count of run calls on the wrapped session",
)
INPUT_BATCH_SIZE = Definition(
    PREFIX + "batching_session:input_batch_size",
    "histogram",
    (),
    "Tracks the batch size distribution on the inputs.",
    BATCH_SIZES,
)
PROCESSED_BATCH_SIZE = Definition(
    PREFIX + "batching_session:processed_batch_size",
    "histogram",
    (),
    "Tracks the batch size distribution on processing.",
    BATCH_SIZES,
)
PADDING_SIZE = Definition(
    PREFIX + "batching_session:padding_size",
    "histogram",
    ("execution_batch_size",),
    "Tracks the padding size distribution on batches.",
    BATCH_SIZES,
)
DEFINITIONS = (
    EXAMPLE_COUNTS,
    EXAMPLE_COUNT_TOTAL,
    REQUEST_COUNT,
    REQUEST_LATENCY,
    RUNTIME_LATENCY,
    QUEUING_LATENCY,
    WRAPPED_RUN_COUNT,
    INPUT_BATCH_SIZE,
    PROCESSED_BATCH_SIZE,
    PADDING_SIZE,
)

# TF Serving's labels' values that are not the client's: the entry points
# (model_servers/http_server.cc, prediction_service_impl.cc), the runtime of a SavedModel run
# through TensorFlow's classic runtime (servables/tensorflow/predict_util.cc: "TF1", as
# opposed to "TFRT"), and the batch threads' pool, which TF Serving's model server leaves
# unnamed (batching/batching_session.cc: thread_pool_name "").
REST, GRPC = "REST", "GRPC"
RUNTIME = "TF1"
THREAD_POOL = ""
# The gRPC status names TF Serving's request_count says (error::Code_Name), for the HTTP
# statuses its REST API answers them with (model_servers/http_server.cc, ToHTTPStatusCode),
# and the service's own (408 and 413 are the limits TF Serving has no HTTP status for).
STATUS_NAMES = {
    200: "OK",
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "INVALID_ARGUMENT",
    408: "DEADLINE_EXCEEDED",
    409: "ABORTED",
    413: "RESOURCE_EXHAUSTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def status_name(http_status: int) -> str:
    """The gRPC status name TF Serving counts an HTTP answer under."""
    name = STATUS_NAMES.get(http_status)
    if name is None:
        name = "OK" if http_status < 400 else "INVALID_ARGUMENT" if http_status < 500 else "UNKNOWN"
    return name


class TFServingMetrics:
    """TF Serving's metrics in a registry of their own (rendered by `render`)."""

    def __init__(self, registry: CollectorRegistry):
        counters: dict[str, Counter] = {}
        histograms: dict[str, Histogram] = {}
        for definition in DEFINITIONS:
            if definition.kind == "counter":
                counters[definition.name] = Counter(
                    definition.name, definition.help, definition.labels, registry=registry
                )
            else:
                histograms[definition.name] = Histogram(
                    definition.name,
                    definition.help,
                    definition.labels,
                    buckets=definition.buckets,
                    registry=registry,
                )
        self.example_counts = histograms[EXAMPLE_COUNTS.name]
        self.example_count_total = counters[EXAMPLE_COUNT_TOTAL.name]
        self.request_count = counters[REQUEST_COUNT.name]
        self.request_latency = histograms[REQUEST_LATENCY.name]
        self.runtime_latency = histograms[RUNTIME_LATENCY.name]
        self.queuing_latency = histograms[QUEUING_LATENCY.name].labels(THREAD_POOL)
        self.wrapped_run_count = counters[WRAPPED_RUN_COUNT.name]
        self.input_batch_size = histograms[INPUT_BATCH_SIZE.name]
        self.processed_batch_size = histograms[PROCESSED_BATCH_SIZE.name]
        self.padding_size = histograms[PADDING_SIZE.name]


# prometheus_client's family name (a counter's without `_total`) -> TF Serving's definition.
_BY_FAMILY = {re.sub(r"_total$", "", d.name): d for d in DEFINITIONS}


def is_tfserving(family_name: str) -> bool:
    return family_name in _BY_FAMILY


def render(families) -> str:
    """TF Serving's metrics among `families` (prometheus_client's collected metrics) as TF
    Serving's exporter writes them; other families are left out."""
    lines: list[str] = []
    for family in families:
        definition = _BY_FAMILY.get(family.name)
        if definition is None:
            continue
        name = definition.name
        lines.append(f"# TYPE {name} {definition.kind}")
        for sample in family.samples:
            suffix = sample.name[len(family.name) :]
            if suffix == "_created":
                continue
            # In TF Serving's order (the multiprocess files keep them sorted).
            labels = {key: sample.labels[key] for key in definition.labels}
            if "le" in sample.labels:
                labels["le"] = sample.labels["le"]
            if definition.kind == "counter":
                lines.append(f"{name}{_labels(labels)} {int(sample.value)}")
            elif suffix == "_bucket":
                bound = float(labels["le"])
                labels["le"] = "+Inf" if math.isinf(bound) else f"{bound:.6g}"
                lines.append(f"{name}_bucket{_labels(labels)} {int(sample.value)}")
            elif suffix == "_count":
                lines.append(f"{name}_count{_labels(labels)} {int(sample.value)}")
            elif suffix == "_sum":
                lines.append(f"{name}_sum{_labels(labels)} {floatToGoString(sample.value)}")
    return "".join(line + "\n" for line in lines)


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{key}="{_escape(value)}"' for key, value in labels.items()) + "}"


def _escape(value: str) -> str:
    # The exporter escapes \ and "; a newline too, or the line would end inside the value.
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
