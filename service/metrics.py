"""Prometheus metrics, one registry per app (tests build many apps in one process).

With WORKERS > 1 every worker process writes its values to files in PROMETHEUS_MULTIPROC_DIR
(prometheus_client's multiprocess mode, set up by the supervisor, service/workers.py) and
/metrics, whichever worker answers it, adds up all of them.

Three families, one exposition (at /metrics, and at MONITORING_CONFIG_FILE's path):
- the service's own, by route and method (`http_requests_total`, `predictions_total`, ...);
- per model, under `estimator_serving_` (request and model latency by model, version,
  signature and protocol; queue wait, batch sizes, queue depth; model loads; feedback);
- TF Serving's (service/metrics_tfserving.py), with its names and as its exporter writes them.

Every latency is measured once: the per-model and TF Serving's request latencies are the
same measurement as `http_request_duration_seconds` (the ingress's) and
`grpc_request_duration_seconds`, and the model's time is one timer around the backend call.
The children a request records into are looked up once per route and model (`_RouteMetrics`)
and once per model, version, signature and protocol (`_CallMetrics`), not per request. Label
values are bounded whatever a client sends: a model name the service does not serve is
counted as `other`, as made-up HTTP and gRPC methods are.
"""

from __future__ import annotations

import contextvars
import dataclasses
import os
import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from service import metrics_tfserving
from service.metrics_tfserving import TFServingMetrics

# The methods counted by name; any other a client makes up is counted as "other".
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
PREFIX = "estimator_serving_"
# What a model name the service does not serve is counted as.
OTHER = "other"
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
LOAD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0, 300.0)
MICROS = 1e6


@dataclasses.dataclass(slots=True)
class Served:
    """One request's prediction, as the data plane tells it to the request's ingress (HTTP's or
    gRPC's), which records the request's latency under these labels."""

    protocol: str
    model: str = ""
    version: str = ""
    signature: str = ""


# The request being answered, set by the ingress for a model's routes (each request runs in a
# task of its own, so in a context of its own).
SERVED: contextvars.ContextVar[Served | None] = contextvars.ContextVar("served", default=None)


class Metrics:
    """The service's metrics: HTTP and gRPC requests and latency, predictions by class, model
    version."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # Chosen by prometheus_client when it is imported: the supervisor sets the variable.
        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        # prometheus_client's labels() checks and locks on every call: the hot path looks each
        # child up once and keeps it (child()).
        self._children: dict[tuple, object] = {}
        self.requests = Counter(
            "http_requests_total",
            "HTTP requests by route template, method and status code.",
            ["route", "method", "status"],
            registry=self.registry,
        )
        # What an autoscaler scales on: the work each replica holds right now. One process
        # keeps a plain count the gauge reads when scraped (no lock per request); workers
        # must write theirs where the others can add it up.
        self.in_flight = 0
        in_flight = Gauge(
            "http_requests_in_flight",
            "HTTP requests being answered right now (the scrape that reads this included).",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.in_flight_gauge = in_flight if self.multiprocess else None
        if not self.multiprocess:
            in_flight.set_function(lambda: self.in_flight)
        self.latency = Histogram(
            "http_request_duration_seconds",
            "Time from request start to the end of the response, by route template.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.predictions = Counter(
            "predictions_total",
            "Images classified, by predicted label.",
            ["model", "label"],
            registry=self.registry,
        )
        self.images_per_request = Histogram(
            "images_per_request",
            "Images in one prediction request.",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
            registry=self.registry,
        )
        self.grpc_requests = Counter(
            "grpc_requests_total",
            "gRPC calls by method and status code.",
            ["method", "code"],
            registry=self.registry,
        )
        self.grpc_latency = Histogram(
            "grpc_request_duration_seconds",
            "Time from a gRPC call's start to its answer, by method.",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.model_version = Gauge(
            "model_version",
            "The version answering requests that name no version, per model.",
            ["model", "device"],
            registry=self.registry,
            multiprocess_mode="livemostrecent",
        )
        self.answered = Counter(
            "predict_requests_by_version_total",
            "Prediction requests answered, by model, version and how the version was chosen "
            "(serving, canary, named).",
            ["model", "version", "route"],
            registry=self.registry,
        )
        self.shadow_images = Counter(
            "shadow_images_total",
            "Images copied to the shadow version, by whether its class agreed with the served one.",
            ["model", "agreement"],
            registry=self.registry,
        )
        self.contract_violations = Counter(
            "model_contract_violations_total",
            "Answers whose outputs break the contract (probabilities outside [0, 1] or not "
            "summing to 1, class ids out of range), by model and version: a model is code.",
            ["model", "version"],
            registry=self.registry,
        )
        self.shadow_errors = Counter(
            "shadow_errors_total",
            "Shadow copies that failed (the served answers were not affected).",
            ["model"],
            registry=self.registry,
        )
        self.shadow_latency = Histogram(
            "shadow_latency_seconds",
            "Time the shadow version took to answer a copy.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._per_model()
        # The batch queue's length, read when scraped (the data plane sets it); with workers,
        # each writes its own at every batch (batch_ran), and the scrape adds them up.
        self.queue_depth: Callable[[], int] = int
        if not self.multiprocess:
            self.queue_requests.set_function(lambda: self.queue_depth())
        # TF Serving's, in a registry of their own: they are written as its exporter writes.
        self.tfserving_registry = CollectorRegistry()
        self.tfserving = TFServingMetrics(self.tfserving_registry)
        # The models served, for bounding the label (the data plane sets it).
        self.model_names: Callable[[], Iterable[str]] = tuple
        self._routes: dict[tuple[int, str], _RouteMetrics] = {}
        self._calls: dict[tuple, _CallMetrics] = {}
        self._batches: dict[tuple, tuple[Histogram, Histogram, Histogram]] = {}
        # The (model, version, state) series of the version state gauge set at the last scrape.
        self.version_states: set[tuple[str, str, str]] = set()

    def _per_model(self) -> None:
        labels = ["model", "version", "signature", "protocol"]
        self.request_duration = Histogram(
            PREFIX + "request_duration_seconds",
            "Time from a prediction request's start to its answer (the route's measurement), "
            "by model, version, signature and protocol; answered requests only.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.model_duration = Histogram(
            PREFIX + "model_duration_seconds",
            "Time a prediction spent in the model's call, its wait in the batch queue left "
            "out, by model, version, signature and protocol.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            PREFIX + "queue_wait_seconds",
            "Time a request waited in the batch queue before its batch ran.",
            labels[:3],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_size = Histogram(
            PREFIX + "batch_size",
            "Instances in one model call of the batcher (before padding).",
            labels[:3],
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self.queue_requests = Gauge(
            PREFIX + "queue_requests",
            "Requests waiting in the batch queue.",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.load_duration = Histogram(
            PREFIX + "model_load_duration_seconds",
            "Time to fetch, load and warm up one version, by model (loads that succeeded).",
            ["model"],
            buckets=LOAD_BUCKETS,
            registry=self.registry,
        )
        self.load_failures = Counter(
            PREFIX + "model_load_failures_total",
            "Versions that failed to load, by model.",
            ["model"],
            registry=self.registry,
        )
        self.version_state = Gauge(
            PREFIX + "model_version_state",
            "1 for each version's state (START, LOADING, AVAILABLE, UNLOADING, END), by model "
            "and version.",
            ["model", "version", "state"],
            registry=self.registry,
            multiprocess_mode="livemostrecent",
        )
        self.feedback_accepted = Counter(
            PREFIX + "feedback_accepted_total",
            "Feedback requests stored, by model.",
            ["model"],
            registry=self.registry,
        )
        self.feedback_refused = Counter(
            PREFIX + "feedback_refused_total",
            "Feedback requests refused, by model and HTTP status (400 bad input, 413 too "
            "large, 429 the sender's rate, 507 no room, ...).",
            ["model", "status"],
            registry=self.registry,
        )

    def exposition(self) -> bytes:
        """The text /metrics answers: this process's registry, or every worker's values."""
        if not self.multiprocess:
            own = generate_latest(self.registry)
            theirs = metrics_tfserving.render(self.tfserving_registry.collect())
        else:
            registry = CollectorRegistry()
            MultiProcessCollector(registry)
            families = list(registry.collect())
            own = generate_latest(
                _Families([f for f in families if not metrics_tfserving.is_tfserving(f.name)])
            )
            theirs = metrics_tfserving.render(families)
        return own + theirs.encode()

    def request_started(self) -> float:
        """Count a request in flight; the time it started, for request_finished."""
        if self.in_flight_gauge is None:
            self.in_flight += 1
        else:
            self.in_flight_gauge.inc()
        return time.perf_counter()

    def request_finished(self, template: str, method: str, status: int, started: float) -> float:
        """Count an answered (or abandoned) request by its route template, method and status,
        and time it; the seconds it took."""
        if self.in_flight_gauge is None:
            self.in_flight -= 1
        else:
            self.in_flight_gauge.dec()
        if method not in HTTP_METHODS:
            method = "other"  # a client's made-up method must not grow the label set
        self.child(self.requests, template, method, str(status)).inc()
        seconds = time.perf_counter() - started
        self.child(self.latency, template).observe(seconds)
        return seconds

    def child(self, metric, *labels):
        """The metric's child for these label values, looked up once."""
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    # --- per model, and TF Serving's ------------------------------------------------------

    def known_model(self, name: str) -> str:
        """`name` when the service serves it, else `other`."""
        return name if name in self.model_names() else OTHER

    def route(self, key: int, protocol: str, api: str | None, entrypoint: str, name: str):
        """The metrics of one route (or gRPC method, `key` its identity) and model, made once:
        a name the service does not serve shares the `other` ones, and is never kept."""
        found = self._routes.get((key, name))
        if found is None:
            label = self.known_model(name)
            found = self._routes.get((key, label))
            if found is None:
                found = _RouteMetrics(self, protocol, api, entrypoint, label)
                self._routes[(key, label)] = found
        return found

    def model_called(
        self,
        name: str,
        version: int,
        signature: str,
        api: str,
        seconds: float,
        queued: float,
    ) -> None:
        """A prediction the model answered: `seconds` in the backend's call, `queued` of them in
        the batch queue. Tells the request's ingress its version and signature."""
        served = SERVED.get()
        protocol = served.protocol if served is not None else OTHER
        key = (name, version, signature, api, protocol)
        call = self._calls.get(key)
        if call is None:
            call = self._calls[key] = _CallMetrics(self, *key)
        if served is not None:
            served.model, served.version, served.signature = name, call.version, signature
        # TF Serving's runtime latency is its session's Run, which waits in the batch queue too.
        call.runtime.observe(seconds * MICROS)
        call.model.observe(seconds - queued)

    def batch_ran(
        self,
        served: tuple,
        rows: int,
        padded: int,
        waits: Iterable[tuple[int, float]],
        left: int,
    ) -> None:
        """One batch the batcher ran (on its thread): `rows` instances padded to `padded`, each
        request's (instances, seconds waited in the queue), and `left` requests still queued."""
        tf = self.tfserving
        children = self._batches.get((served, padded))
        if children is None:
            model, version, signature = served
            labels = (model, "" if version is None else str(version), signature)
            children = self._batches[(served, padded)] = (
                self.batch_size.labels(*labels),
                self.queue_wait.labels(*labels),
                tf.padding_size.labels(str(padded)),
            )
        batch_size, queue_wait, padding = children
        if self.multiprocess:
            self.queue_requests.set(left)
        tf.wrapped_run_count.inc()
        tf.processed_batch_size.observe(padded)
        padding.observe(padded - rows)
        batch_size.observe(rows)
        for request_rows, waited in waits:
            tf.input_batch_size.observe(request_rows)
            tf.queuing_latency.observe(waited * MICROS)
            queue_wait.observe(waited)

    def examples_counted(self, model: str, count: int) -> None:
        """A MultiInference request's tf.Examples, once its tasks ran (TF Serving counts them
        there only: servables/tensorflow/multi_inference.cc)."""
        tf = self.tfserving
        self.child(tf.example_counts, model).observe(count)
        self.child(tf.example_count_total, model).inc(count)

    def version_loaded(self, model: str, seconds: float, failed: bool) -> None:
        """A version's load ended (on the event loop)."""
        if failed:
            self.child(self.load_failures, model).inc()
        else:
            self.child(self.load_duration, model).observe(seconds)


class _RouteMetrics:
    """What a request to one route for one model records into: TF Serving's request count by
    status and latency (for TF Serving's APIs), and the per-model request latency by version
    and signature."""

    __slots__ = (
        "metrics", "protocol", "api", "entrypoint", "model", "count", "latency", "by_call",
        "feedback",
    )  # fmt: skip

    def __init__(self, metrics: Metrics, protocol: str, api: str | None, entrypoint: str, model):
        self.metrics = metrics
        self.protocol = protocol
        self.api = api
        self.entrypoint = entrypoint
        self.model = model
        self.count: dict[str, Counter] = {}
        # Made at the first answer, so a refused name's has no series.
        self.latency: Histogram | None = None
        self.by_call: dict[tuple[str, str], Histogram] = {}
        self.feedback: dict[str | int, Counter] = {}

    def finished(self, ok: bool, status: str | int, seconds: float, served: Served | None):
        """Record one request: `status` is its HTTP status or its gRPC status's name, `seconds`
        the route's own measurement."""
        if self.protocol == "feedback":
            self._feedback(ok, status)
            return
        if self.api is not None:
            if isinstance(status, int):
                status = metrics_tfserving.status_name(status)
            count = self.count.get(status)
            if count is None:
                count = self.count[status] = self.metrics.tfserving.request_count.labels(
                    self.model, status
                )
            count.inc()
            # TF Serving times only what it answered (http_server.cc, prediction_service_impl.cc).
            if ok:
                if self.latency is None:
                    self.latency = self.metrics.tfserving.request_latency.labels(
                        self.model, self.api, self.entrypoint
                    )
                self.latency.observe(seconds * MICROS)
        if ok and served is not None and served.signature:
            key = (served.version, served.signature)
            latency = self.by_call.get(key)
            if latency is None:
                latency = self.by_call[key] = self.metrics.request_duration.labels(
                    self.model, served.version, served.signature, self.protocol
                )
            latency.observe(seconds)

    def _feedback(self, ok: bool, status) -> None:
        counter = self.feedback.get(status)
        if counter is None:
            metrics = self.metrics
            counter = self.feedback[status] = (
                metrics.feedback_accepted.labels(self.model)
                if ok
                else metrics.feedback_refused.labels(self.model, str(status))
            )
        counter.inc()


class _CallMetrics:
    """What a model call records into, for one model, version, signature, API and protocol."""

    __slots__ = ("version", "runtime", "model")

    def __init__(self, metrics: Metrics, name, version, signature, api, protocol):
        self.version = str(version)
        self.runtime = metrics.tfserving.runtime_latency.labels(
            name, api, metrics_tfserving.RUNTIME
        )
        self.model = metrics.model_duration.labels(name, self.version, signature, protocol)


class _Families:
    """Collected families as a collector (for generate_latest)."""

    def __init__(self, families: list):
        self.families = families

    def collect(self):
        return self.families
