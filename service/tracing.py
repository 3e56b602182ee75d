"""Traces: OpenTelemetry spans of each request, exported over OTLP/HTTP, configured by the
standard `OTEL_*` variables and off unless `OTEL_EXPORTER_OTLP_ENDPOINT`,
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_TRACES_EXPORTER` is set (docs/operations.md,
"Traces").

Off, nothing of OpenTelemetry is imported and each place that could make a span asks one
thing, `tracer is None`. On, the SDK reads its own variables: the sampler
(`OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`; parent-based, always on, by default), the
resource (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`), the exporter's endpoint, headers,
timeout and compression (`OTEL_EXPORTER_OTLP_*`) and the batch span processor's schedule
(`OTEL_BSP_*`). Each process that serves (each worker, with WORKERS > 1) sets up its own.

The spans of one request: the request itself (its `traceparent` the parent, from an HTTP
header or gRPC metadata), then `admission`, `read body`, `parse`, `queue wait` (from the
moment it was queued to the moment its batch was taken), `model` (the batched call: one span
per batch, a child of the first sampled request in it and linked to every request it served,
with `batch.size`) and `render`. A batch none of whose requests is sampled makes no span.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

# What makes the service trace (any one of them set, and OTEL_SDK_DISABLED not true).
SWITCHES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_TRACES_EXPORTER",
)
EXPORTERS = ("otlp", "console", "none")
PROTOCOLS = ("http/protobuf",)
SCOPE = "service"

# The service's tracer while tracing is on; None while it is off (every caller asks first).
tracer: Any = None
_provider: Any = None
_propagator: Any = None
# opentelemetry.trace and opentelemetry.context, imported when tracing starts (an import
# statement per call costs more than the span it makes, for an unsampled request).
_trace: Any = None
_context: Any = None
_NOTHING = contextlib.nullcontext()


class TracingError(Exception):
    """The OTEL_* variables ask for what the service cannot do: one line saying which."""


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether the environment turns tracing on."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return any(environ.get(name, "").strip() for name in SWITCHES)


def environment_problem(environ: Mapping[str, str]) -> str | None:
    """What is wrong with the OTEL_* variables tracing would use (None: nothing), checked
    before the service starts so that a bad one stops it with one line."""
    if not wanted(environ):
        return None
    exporters = [e.strip().lower() for e in environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    for exporter in exporters:
        if exporter not in EXPORTERS:
            return f"OTEL_TRACES_EXPORTER: expected one of {', '.join(EXPORTERS)}, got {exporter!r}"
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        protocol = environ.get(name, "").strip()
        if protocol:
            if protocol not in PROTOCOLS:
                return (
                    f"{name}: expected {' or '.join(PROTOCOLS)} (the service exports OTLP over "
                    f"HTTP), got {protocol!r}"
                )
            break
    return None


def start() -> bool:
    """Set up this process's tracer provider from the OTEL_* variables (os.environ, which the
    SDK reads itself) when they turn tracing on (else nothing: no OpenTelemetry import); True
    when tracing is on.

    Raises:
        TracingError: the variables ask for what the service cannot do.
    """
    environ = os.environ
    if not wanted(environ):
        return False
    problem = environment_problem(environ)
    if problem is not None:
        raise TracingError(problem)
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    # The sampler from OTEL_TRACES_SAMPLER(_ARG), the resource from OTEL_SERVICE_NAME and
    # OTEL_RESOURCE_ATTRIBUTES: the SDK's own reading of them.
    provider = TracerProvider(resource=Resource.create())
    exporters = {e.strip().lower() for e in environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")}
    if "otlp" in exporters:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    if "console" in exporters:
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    use(provider)
    return True


def use(provider) -> None:
    """Trace with `provider` (an SDK TracerProvider: start's, or a test's in-memory one)."""
    global tracer, _provider, _propagator, _trace, _context
    from opentelemetry import context, trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _trace, _context = trace, context
    _propagator = TraceContextTextMapPropagator()
    _provider = provider
    tracer = provider.get_tracer(SCOPE)


def stop() -> None:
    """Export what is left and turn tracing off (at the service's stop)."""
    global tracer, _provider
    provider, _provider, tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()


# --- spans -------------------------------------------------------------------------------


def request_span(name: str, carrier: Mapping[str, str], attributes: dict) -> tuple[Any, Any]:
    """Start a request's server span, its parent the carrier's `traceparent` (and
    `tracestate`), and make it the current one: (span, token for `end_request`). Only
    while tracing is on."""
    parent = _propagator.extract(carrier)
    span = tracer.start_span(name, parent, _trace.SpanKind.SERVER, attributes)
    token = _context.attach(_trace.set_span_in_context(span, parent))
    return span, token


def end_request(span, token, attributes: dict, error: bool = False) -> None:
    """Set a request span's last attributes, end it and leave its context."""
    if span.is_recording():
        span.set_attributes({k: v for k, v in attributes.items() if v is not None})
        if error:
            span.set_status(_trace.StatusCode.ERROR)
    span.end()
    _context.detach(token)


def trace_id(span) -> str | None:
    """A span's trace id as 32 hex digits (what the log lines carry), None if it has none."""
    found = span.get_span_context()
    return format(found.trace_id, "032x") if found.is_valid else None


def span(name: str, attributes: dict | None = None):
    """A child span of the current one around a `with` block; nothing while tracing is off or
    the current span is not recorded (an unsampled request: its steps would not be either,
    and making their spans costs more than the step itself)."""
    if tracer is None:
        return _NOTHING
    if not _trace.get_current_span().is_recording():
        return _NOTHING
    return tracer.start_as_current_span(name, attributes=attributes)


def queued() -> tuple[Any, int] | None:
    """What a request's batch needs to trace it, taken when it is queued: the current span's
    context and the time (ns); None when it is not sampled (or tracing is off)."""
    if tracer is None:
        return None
    found = _trace.get_current_span().get_span_context()
    if not found.trace_flags.sampled:
        return None
    return found, time.time_ns()


def batch_span(requests: Iterable[tuple[Any, int] | None], attributes: dict):
    """On the batcher thread, as a batch is taken: each sampled request's `queue wait` span
    (from its `queued` time to now), and the batch's `model` span, started, a child of the
    first sampled request and linked to every one; None when none is sampled."""
    if tracer is None:
        return None
    sampled = [request for request in requests if request is not None]
    if not sampled:
        return None
    trace = _trace
    now = time.time_ns()
    for parent, enqueued in sampled:
        context = trace.set_span_in_context(trace.NonRecordingSpan(parent))
        tracer.start_span("queue wait", context, start_time=enqueued).end(end_time=now)
    links = [trace.Link(parent) for parent, _ in sampled]
    context = trace.set_span_in_context(trace.NonRecordingSpan(sampled[0][0]))
    attributes = {k: v for k, v in attributes.items() if v is not None}
    return tracer.start_span("model", context, links=links, attributes=attributes, start_time=now)


def end_batch(span, error: BaseException | None = None, attributes: dict | None = None) -> None:
    """End a batch's `model` span (an error recorded on it)."""
    if attributes:
        span.set_attributes(attributes)
    if error is not None:
        span.record_exception(error)
        span.set_status(_trace.StatusCode.ERROR, f"{type(error).__name__}")
    span.end()
