"""Traces (service/tracing.py): which OTEL_* variables turn tracing on, the refusals at start,
and the spans of a REST and a V2 prediction through the batcher, recorded in memory: names,
parents, the model span's links and attributes, the log line's trace id, and nothing recorded
for a request its caller did not sample. The same over OTLP/HTTP to a real receiver, gRPC
included: tests/live/service/test_tracing_otlp.py."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import numpy as np
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support.entry import run_main_in_process
from support.fakes import MODEL_NAME, FakeBackend, app_client
from support.servers import REPO_ROOT

from artifact.logs import JSONFormatter
from service import tracing
from service.backends.batching import BatchingBackend

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
SAMPLED = f"00-{TRACE}-{PARENT}-01"
UNSAMPLED = f"00-{TRACE}-{PARENT}-00"
IMAGES = np.zeros((3, 28, 28)).tolist()


@pytest.fixture
def spans():
    """The spans the service ends during the test, in memory (the SDK's default sampler:
    parent-based, always on)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    yield exporter
    tracing.stop()


@pytest.fixture
def client():
    with app_client(BatchingBackend(FakeBackend(), 8, 0.0, 16)) as c:
        yield c


@pytest.fixture
def access_lines():
    """The JSON access lines written during the test."""
    entries: list[dict] = []

    class Collect(logging.Handler):
        def emit(self, record):
            entries.append(json.loads(JSONFormatter().format(record)))

    logger = logging.getLogger("service.access")
    handler = Collect(logging.INFO)
    level, disabled = logger.level, logger.disabled
    logger.disabled = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    yield entries
    logger.removeHandler(handler)
    logger.setLevel(level)
    logger.disabled = disabled


@pytest.mark.parametrize(
    "environ, on",
    [
        pytest.param({}, False, id="nothing-set"),
        pytest.param({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True, id="endpoint"),
        pytest.param({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True,
                     id="traces-endpoint"),
        pytest.param({"OTEL_TRACES_EXPORTER": "otlp"}, True, id="exporter"),
        pytest.param({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"},
                     False, id="exporter-none"),
        pytest.param({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"},
                     False, id="sdk-disabled"),
        pytest.param({"OTEL_SERVICE_NAME": "api"}, False, id="only-a-name"),
    ],
)  # fmt: skip
def test_which_variables_turn_tracing_on(environ, on):
    assert tracing.wanted(environ) is on


@pytest.mark.parametrize(
    "environ, named",
    [
        pytest.param({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER", id="exporter"),
        pytest.param({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
                     "OTEL_EXPORTER_OTLP_PROTOCOL", id="protocol"),
        pytest.param({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c",
                      "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"},
                     "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", id="traces-protocol"),
    ],
)  # fmt: skip
def test_a_variable_the_service_cannot_follow_stops_it_with_one_line(tmp_path, environ, named):
    assert named in tracing.environment_problem(environ)
    result = run_main_in_process(MODEL_BASE_PATH=str(tmp_path), **environ)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {named}: expected"), line
    assert "got 'grpc'" in line or "got 'zipkin'" in line


def test_tracing_off_imports_no_opentelemetry_sdk():
    code = (
        "import os, sys\n"
        "from service import tracing, app\n"
        "assert not tracing.start()\n"
        "assert tracing.tracer is None\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk')))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)}
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO_ROOT
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "[]"


def by_name(finished) -> dict:
    named: dict = {}
    for span in finished:
        named.setdefault(span.name, []).append(span)
    return named


def assert_request_trace(finished, request_name: str, parse_names: tuple[str, ...]) -> None:
    """One request's spans, as the service makes them, under the caller's parent."""
    named = by_name(finished)
    (request,) = named[request_name]
    assert format(request.context.trace_id, "032x") == TRACE
    assert format(request.parent.span_id, "016x") == PARENT
    assert request.parent.is_remote
    for name in ("admission", "read body", *parse_names, "queue wait", "render"):
        (child,) = named[name]
        assert child.parent.span_id == request.context.span_id, name
    (model,) = named["model"]
    assert model.parent.span_id == request.context.span_id
    assert [link.context.span_id for link in model.links] == [request.context.span_id]
    assert model.attributes["batch.size"] == 3
    assert model.attributes["batch.requests"] == 1
    assert model.attributes["model"] == MODEL_NAME
    assert model.attributes["model.signature"] == "serving_default"
    assert isinstance(model.attributes["model.version"], int)
    (queued,) = named["queue wait"]
    assert queued.start_time <= queued.end_time <= model.start_time
    assert request.attributes["http.response.status_code"] == 200


def test_a_rest_prediction_is_traced_under_its_callers_span(client, spans, access_lines):
    answer = client.post(
        f"/v1/models/{MODEL_NAME}:predict",
        json={"instances": IMAGES},
        headers={"traceparent": SAMPLED},
    )
    assert answer.status_code == 200, answer.text
    template = "POST /v1/models/{name}:predict"
    finished = spans.get_finished_spans()
    assert_request_trace(finished, template, ("parse", "read inputs"))
    (line,) = [e for e in access_lines if e["path"].endswith(":predict")]
    assert line["trace_id"] == TRACE


def test_a_v2_inference_is_traced_under_its_callers_span(client, spans):
    body = {"inputs": [{"name": "image", "shape": [3, 28, 28], "datatype": "FP32",
                        "data": np.zeros(3 * 28 * 28).tolist()}]}  # fmt: skip
    answer = client.post(
        f"/v2/models/{MODEL_NAME}/infer", json=body, headers={"traceparent": SAMPLED}
    )
    assert answer.status_code == 200, answer.text
    names = {span.name for span in spans.get_finished_spans()}
    request_name = next(name for name in names if name.startswith("POST /v2/"))
    assert_request_trace(spans.get_finished_spans(), request_name, ("parse",))


def test_a_request_without_a_parent_starts_a_trace_the_log_line_names(client, spans, access_lines):
    answer = client.post(f"/v1/models/{MODEL_NAME}:predict", json={"instances": IMAGES})
    assert answer.status_code == 200
    (request,) = [s for s in spans.get_finished_spans() if s.name.startswith("POST ")]
    assert request.parent is None
    (line,) = [e for e in access_lines if e["path"].endswith(":predict")]
    assert line["trace_id"] == format(request.context.trace_id, "032x")


def test_a_request_its_caller_did_not_sample_records_no_span(client, spans, access_lines):
    answer = client.post(
        f"/v1/models/{MODEL_NAME}:predict",
        json={"instances": IMAGES},
        headers={"traceparent": UNSAMPLED},
    )
    assert answer.status_code == 200
    assert spans.get_finished_spans() == ()
    (line,) = [e for e in access_lines if e["path"].endswith(":predict")]
    assert line["trace_id"] == TRACE  # still the caller's trace, for its own logs


def test_a_batch_of_several_requests_is_one_model_span_linked_to_each(spans):
    import asyncio

    from opentelemetry import trace

    batcher = BatchingBackend(FakeBackend(), 8, 50.0, 16)

    async def predict_under(name: str):
        with tracing.tracer.start_as_current_span(name):
            await batcher.predict(MODEL_NAME, np.zeros((2, 28, 28), np.float32))
            return trace.get_current_span().get_span_context()

    async def both():
        await batcher.start()
        try:
            return await asyncio.gather(predict_under("first"), predict_under("second"))
        finally:
            await batcher.close()

    first, second = asyncio.run(both())
    named = by_name(spans.get_finished_spans())
    (model,) = named["model"]
    assert {link.context.span_id for link in model.links} == {first.span_id, second.span_id}
    assert model.attributes["batch.size"] == 4
    assert model.attributes["batch.requests"] == 2
    assert model.parent.span_id in {first.span_id, second.span_id}
    assert {span.parent.span_id for span in named["queue wait"]} == {
        first.span_id,
        second.span_id,
    }


def test_start_sets_up_the_sdk_from_the_environment_and_stop_turns_it_off(monkeypatch):
    monkeypatch.setenv("OTEL_SERVICE_NAME", "api-under-test")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    try:
        assert tracing.start()
        provider = tracing._provider
        assert tracing.tracer is not None
        assert provider.resource.attributes["service.name"] == "api-under-test"
        assert "TraceIdRatioBased{0.25}" in provider.sampler.get_description()
    finally:
        tracing.stop()
    assert tracing.tracer is None
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "jaeger")
    with pytest.raises(tracing.TracingError, match="OTEL_TRACES_EXPORTER"):
        tracing.start()
    assert tracing.tracer is None


def test_a_request_that_fails_is_traced_with_its_status_and_no_model_span(client, spans):
    answer = client.post(
        "/v1/models/nobody:predict",
        json={"instances": IMAGES},
        headers={"traceparent": SAMPLED},
    )
    assert answer.status_code == 404
    named = by_name(spans.get_finished_spans())
    (request,) = named["POST /v1/models/{name}:predict"]
    assert request.attributes["http.response.status_code"] == 404
    assert "model" not in named and "queue wait" not in named
