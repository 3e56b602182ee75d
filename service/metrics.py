"""Prometheus metrics, one registry per app (tests build many apps in one process).

With WORKERS > 1 every worker process writes its values to files in PROMETHEUS_MULTIPROC_DIR
(prometheus_client's multiprocess mode, set up by the supervisor, service/workers.py) and
/metrics, whichever worker answers it, adds up all of them.
"""

from __future__ import annotations

import os
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

# The methods counted by name; any other a client makes up is counted as "other".
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


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

    def exposition(self) -> bytes:
        """The text /metrics answers: this process's registry, or every worker's values."""
        if not self.multiprocess:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        return generate_latest(registry)

    def request_started(self) -> float:
        """Count a request in flight; the time it started, for request_finished."""
        if self.in_flight_gauge is None:
            self.in_flight += 1
        else:
            self.in_flight_gauge.inc()
        return time.perf_counter()

    def request_finished(self, template: str, method: str, status: int, started: float) -> None:
        """Count an answered (or abandoned) request by its route template, method and status,
        and time it."""
        if self.in_flight_gauge is None:
            self.in_flight -= 1
        else:
            self.in_flight_gauge.dec()
        if method not in HTTP_METHODS:
            method = "other"  # a client's made-up method must not grow the label set
        self.child(self.requests, template, method, str(status)).inc()
        self.child(self.latency, template).observe(time.perf_counter() - started)

    def child(self, metric, *labels):
        """The metric's child for these label values, looked up once."""
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child
