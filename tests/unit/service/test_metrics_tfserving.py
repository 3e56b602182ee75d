"""TF Serving's metrics (service/metrics_tfserving.py): its names, types, labels and buckets as
its exporter writes them, measured from the service's own timers, with bounded labels."""

from __future__ import annotations

import re

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter
from support.fakes import MODEL_NAME, FakeBackend, app_client

from service import metrics_tfserving
from service.backends.batching import BatchingBackend

IMAGES = np.random.default_rng(0).random((1, 28, 28)).tolist()
PREDICT = f"/v1/models/{MODEL_NAME}:predict"


def exponential(scale: float, growth: float, count: int) -> list[str]:
    """TensorFlow's monitoring::Buckets::Exponential (tensorflow/core/lib/monitoring/
    sampler.cc: each bound the previous times `growth`, DBL_MAX past the last) as TF Serving's
    exporter prints the bounds (tensorflow_serving/util/prometheus_exporter.cc: absl::StrCat of
    a double, six significant digits; the last bucket `+Inf`)."""
    bounds, bound = [], float(scale)
    for _ in range(count):
        bounds.append(f"{bound:.6g}")
        bound *= growth
    return [*bounds, "+Inf"]


# Written from TF Serving's source, not from the code under test: the exported name (the
# exporter turns `/` into `:`), the type, the labels in order, and the buckets' scale, growth
# and count.
UPSTREAM = [
    # tensorflow_serving/servables/tensorflow/util.cc
    pytest.param(
        ":tensorflow:serving:request_example_counts", "histogram", ("model",), (1, 2, 15),
        id="request_example_counts",
    ),
    pytest.param(
        ":tensorflow:serving:request_example_count_total", "counter", ("model",), None,
        id="request_example_count_total",
    ),
    pytest.param(
        ":tensorflow:serving:request_count", "counter", ("model_name", "status"), None,
        id="request_count",
    ),
    pytest.param(
        ":tensorflow:serving:request_latency", "histogram", ("model_name", "API", "entrypoint"),
        (10, 1.8, 33), id="request_latency",
    ),
    pytest.param(
        ":tensorflow:serving:runtime_latency", "histogram", ("model_name", "API", "runtime"),
        (10, 1.8, 33), id="runtime_latency",
    ),
    # tensorflow_serving/batching/batching_session.cc
    pytest.param(
        ":tensorflow:serving:batching_session:queuing_latency", "histogram",
        ("thread_pool_name",), (100, 1.2, 52), id="queuing_latency",
    ),
    pytest.param(
        ":tensorflow:serving:batching_session:wrapped_run_count", "counter", (), None,
        id="wrapped_run_count",
    ),
    # tensorflow_serving/batching/batching_util.h, with batching_session.h's task name
    pytest.param(
        ":tensorflow:serving:batching_session:input_batch_size", "histogram", (), (1, 2, 14),
        id="input_batch_size",
    ),
    pytest.param(
        ":tensorflow:serving:batching_session:processed_batch_size", "histogram", (),
        (1, 2, 14), id="processed_batch_size",
    ),
    pytest.param(
        ":tensorflow:serving:batching_session:padding_size", "histogram",
        ("execution_batch_size",), (1, 2, 14), id="padding_size",
    ),
]  # fmt: skip

SAMPLE = re.compile(r"^(?P<name>[^{ ]+)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def exposition(client) -> str:
    response = client.get("/metrics")
    assert response.status_code == 200
    return response.text


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample called exactly `name`: (labels in the order written, value)."""
    found = []
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match and match["name"] == name:
            labels = dict(LABEL.findall(match["labels"] or ""))
            found.append((labels, float(match["value"])))
    return found


def value(text: str, name: str, **labels) -> float:
    return sum(v for found, v in samples(text, name) if labels.items() <= found.items())


@pytest.fixture(scope="module")
def traffic_text():
    """The exposition after a few predictions through the batcher (padded to 2 and 4), a
    status request, one to a model nobody serves and one with a bad body."""
    batcher = BatchingBackend(FakeBackend(versions=(1, 2)), 4, 0.0, 8, (2, 4))
    with app_client(batcher) as client:
        for images in (IMAGES, IMAGES * 3, IMAGES):
            assert client.post(PREDICT, json={"instances": images}).status_code == 200
        assert client.get(f"/v1/models/{MODEL_NAME}").status_code == 200
        assert (
            client.post("/v1/models/nobody:predict", json={"instances": IMAGES}).status_code == 404
        )
        assert client.post(PREDICT, content=b"{not json").status_code == 400
        # What gRPC's MultiInference records (tests/live/service/test_multi_inference.py).
        client.app.dataplane.metrics.examples_counted(MODEL_NAME, 3)
        return exposition(client)


@pytest.mark.parametrize("name, kind, labels, buckets", UPSTREAM)
def test_tf_servings_metrics_have_its_names_types_labels_and_buckets(
    traffic_text, name, kind, labels, buckets
):
    assert f"# TYPE {name} {kind}\n" in traffic_text
    # TF Serving's exporter writes no HELP, and a counter under its own name (no _total).
    assert f"# HELP {name}" not in traffic_text
    if kind == "counter":
        written = samples(traffic_text, name)
        assert written and not samples(traffic_text, name + "_total")
        assert all(tuple(found) == labels for found, _ in written)
        return
    written = samples(traffic_text, name + "_bucket")
    assert written, f"no {name}_bucket samples"
    first = {k: v for k, v in written[0][0].items() if k != "le"}
    assert tuple(first) == labels
    bounds = [found["le"] for found, _ in written if first.items() <= found.items()]
    assert bounds == exponential(*buckets)
    assert samples(traffic_text, name + "_count") and samples(traffic_text, name + "_sum")


def test_requests_are_counted_by_model_and_tf_servings_status_names(traffic_text):
    count = ":tensorflow:serving:request_count"
    # Three predictions and one status request answered; TF Serving counts both kinds.
    assert value(traffic_text, count, model_name=MODEL_NAME, status="OK") == 4
    assert value(traffic_text, count, model_name=MODEL_NAME, status="INVALID_ARGUMENT") == 1
    assert value(traffic_text, count, model_name="other", status="NOT_FOUND") == 1
    latency = ":tensorflow:serving:request_latency_count"
    # Only answered requests are timed (TF Serving's http_server.cc); status and metadata
    # under an empty API, as TF Serving's REST handler leaves it.
    assert (
        value(traffic_text, latency, model_name=MODEL_NAME, API="predict", entrypoint="REST") == 3
    )
    assert value(traffic_text, latency, model_name=MODEL_NAME, API="", entrypoint="REST") == 1
    assert value(traffic_text, latency, model_name="other") == 0
    runtime = ":tensorflow:serving:runtime_latency_count"
    assert value(traffic_text, runtime, model_name=MODEL_NAME, API="Predict", runtime="TF1") == 3


def test_the_batchers_sizes_padding_and_queueing(traffic_text):
    prefix = ":tensorflow:serving:batching_session:"
    assert value(traffic_text, prefix + "wrapped_run_count") == 3
    # Requests of 1, 3 and 1 images, padded to 2, 4 and 2: padding 1 each time.
    assert value(traffic_text, prefix + "input_batch_size_sum") == 5
    assert value(traffic_text, prefix + "processed_batch_size_sum") == 8
    assert value(traffic_text, prefix + "padding_size_count", execution_batch_size="2") == 2
    assert value(traffic_text, prefix + "padding_size_sum", execution_batch_size="4") == 1
    assert value(traffic_text, prefix + "queuing_latency_count", thread_pool_name="") == 3


def test_request_latency_is_the_routes_own_measurement():
    # One timer per request: TF Serving's latency (microseconds) is the route's histogram's
    # observation, not a second clock read later.
    with app_client(FakeBackend()) as client:
        for _ in range(3):
            client.post(PREDICT, json={"instances": IMAGES})
        text = exposition(client)
    route = value(text, "http_request_duration_seconds_sum", route="/v1/models/{name}:predict")
    tf = value(text, ":tensorflow:serving:request_latency_sum", API="predict")
    per_model = value(text, "estimator_serving_request_duration_seconds_sum", model=MODEL_NAME)
    assert route > 0
    assert tf == pytest.approx(route * 1e6, rel=1e-9)
    assert per_model == pytest.approx(route, rel=1e-9)


def test_made_up_model_names_count_as_one_label_value():
    names = [f"made-up-{i}" for i in range(40)]
    with app_client(FakeBackend()) as client:
        for name in names:
            client.post(f"/v1/models/{name}:predict", json={"instances": IMAGES})
            client.get(f"/v1/models/{name}/metadata")
        client.post(PREDICT, json={"instances": IMAGES})
        text = exposition(client)
        kept = len(client.app.dataplane.metrics._routes)
    written = {
        found["model_name"] for found, _ in samples(text, ":tensorflow:serving:request_count")
    }
    assert written == {MODEL_NAME, "other"}
    assert value(text, ":tensorflow:serving:request_count", model_name="other") == 80
    assert not any(name in text for name in names)
    # What is kept per route and model does not grow with them either: the routes a served
    # and an unknown model were asked on.
    assert kept <= 4


@pytest.mark.parametrize(
    "status, name",
    [
        pytest.param(200, "OK", id="ok"),
        pytest.param(204, "OK", id="no-content"),
        pytest.param(400, "INVALID_ARGUMENT", id="bad-input"),
        pytest.param(401, "UNAUTHENTICATED", id="no-token"),
        pytest.param(403, "PERMISSION_DENIED", id="scope"),
        pytest.param(404, "NOT_FOUND", id="unknown"),
        pytest.param(429, "RESOURCE_EXHAUSTED", id="rate"),
        pytest.param(499, "CANCELLED", id="left"),
        pytest.param(500, "INTERNAL", id="internal"),
        pytest.param(501, "UNIMPLEMENTED", id="unimplemented"),
        pytest.param(503, "UNAVAILABLE", id="overloaded"),
        pytest.param(504, "DEADLINE_EXCEEDED", id="timeout"),
        pytest.param(418, "INVALID_ARGUMENT", id="other-4xx"),
        pytest.param(599, "UNKNOWN", id="other-5xx"),
    ],
)
def test_http_statuses_read_as_tf_servings_status_names(status, name):
    # TF Serving's ToHTTPStatusCode (tensorflow_serving/model_servers/http_server.cc) read
    # backwards.
    assert metrics_tfserving.status_name(status) == name


def test_label_values_are_escaped_as_the_exporter_escapes_them():
    registry = CollectorRegistry()
    counter = Counter(":tensorflow:serving:request_count", "", ["model_name", "status"],
                      registry=registry)  # fmt: skip
    counter.labels('a"b\\c\nd', "OK").inc(2)
    text = metrics_tfserving.render(registry.collect())
    assert text == (
        "# TYPE :tensorflow:serving:request_count counter\n"
        ':tensorflow:serving:request_count{model_name="a\\"b\\\\c\\nd",status="OK"} 2\n'
    )
