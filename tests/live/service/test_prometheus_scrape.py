"""A real Prometheus (Debian's `prometheus`) scrapes a live `python -m service` and the metrics
are queried back through its HTTP API: TF Serving's (`:tensorflow:serving:*`, at
MONITORING_CONFIG_FILE's path, as a dashboard written for TF Serving reads them) and the
per-model ones (`estimator_serving_*`, at /metrics), after predictions over REST and gRPC.

Tokens are on, as in every shipped deployment: each scrape sends a bearer token of the
`status` scope from a file (Prometheus's `authorization.credentials_file`, what a
ServiceMonitor's `authorization` points a Secret at). Prometheus listens on a free loopback
port, keeps its data in the test's folder and reaches nothing but the service.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Iterator

import grpc
import httpx
import numpy as np
import pytest
from support.servers import MODEL_NAME, Server, copy_repository, free_port, start_server
from support.tfserving_requests import predict_request
from tensorflow_serving.apis import prediction_service_pb2_grpc

PREDICT_TOKEN = "scrape-test-predict-token"
SCRAPE_TOKEN = "scrape-test-status-token"
MONITORING_PATH = "/monitoring/prometheus/metrics"
REST_PREDICTIONS, GRPC_PREDICTIONS = 3, 2
# How long Prometheus may take to start and to scrape what the test waits for (it scrapes
# every second); a condition is polled, never a time asserted.
WAIT_SECONDS = 90.0


@pytest.fixture(scope="module")
def prometheus_binary() -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip(
            "Prometheus is not installed: run 'sudo apt-get install prometheus' (make setup)"
        )
    return binary


@pytest.fixture(scope="module")
def server(prometheus_binary, trained_model, tmp_path_factory) -> Iterator[Server]:
    """The trained model, both APIs, tokens required, TF Serving's monitoring config."""
    root = tmp_path_factory.mktemp("prometheus-scrape")
    base = copy_repository(trained_model, root)
    tokens = root / "tokens"
    tokens.write_text(f"{PREDICT_TOKEN} predict\n{SCRAPE_TOKEN} status\n")
    monitoring = root / "monitoring.config"
    monitoring.write_text(f'prometheus_config {{ enable: true path: "{MONITORING_PATH}" }}\n')
    srv = start_server(
        root / "server.log",
        grpc=True,
        MODEL_BASE_PATH=str(base),
        AUTH_TOKENS_FILE=str(tokens),
        GRPC_ALLOW_PLAINTEXT_TOKENS="true",  # loopback
        MONITORING_CONFIG_FILE=str(monitoring),
    )
    yield srv
    assert srv.stop() in (0, -signal.SIGTERM), srv.log()
    assert "Traceback" not in srv.log(), srv.log()


@pytest.fixture(scope="module")
def predictions(server):
    """A few predictions over TF Serving's REST and gRPC APIs, all answered."""
    images = np.random.default_rng(5).random((2, 28, 28)).astype(np.float32)
    headers = {"Authorization": f"Bearer {PREDICT_TOKEN}"}
    for _ in range(REST_PREDICTIONS):
        response = httpx.post(f"{server.url}/v1/models/{MODEL_NAME}:predict",
                              json={"instances": images.tolist()}, headers=headers,
                              timeout=30.0)  # fmt: skip
        assert response.status_code == 200, response.text
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        metadata = [("authorization", f"Bearer {PREDICT_TOKEN}")]
        for _ in range(GRPC_PREDICTIONS):
            stub.Predict(predict_request(images), timeout=30.0, metadata=metadata)
        # A model nobody serves: counted under `other`, with TF Serving's status name.
        with pytest.raises(grpc.RpcError) as refused:
            stub.Predict(predict_request(images, name="nobody"), timeout=30.0, metadata=metadata)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.fixture(scope="module")
def prometheus(prometheus_binary, server, predictions, tmp_path_factory) -> Iterator[str]:
    """Prometheus scraping the service's two metrics paths every second; its URL."""
    root = tmp_path_factory.mktemp("prometheus")
    credentials = root / "scrape-token"
    credentials.write_text(SCRAPE_TOKEN)
    target = f"127.0.0.1:{server.port}"
    jobs = {"tfserving": MONITORING_PATH, "service": "/metrics"}
    config = "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n"
    for job, path in jobs.items():
        config += (
            f"  - job_name: {job}\n"
            f"    metrics_path: {path}\n"
            f"    authorization:\n      type: Bearer\n      credentials_file: {credentials}\n"
            f"    static_configs:\n      - targets: ['{target}']\n"
        )
    (root / "prometheus.yml").write_text(config)
    port = free_port()
    log = open(root / "prometheus.log", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [prometheus_binary, f"--config.file={root / 'prometheus.yml'}",
         f"--storage.tsdb.path={root / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(url), "Prometheus to be ready", root / "prometheus.log")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def wait_for(condition, what: str, log_path=None):
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.25)
    log = log_path.read_text()[-4000:] if log_path is not None else ""
    raise AssertionError(f"timed out waiting for {what}\n{log}")


def query(url: str, promql: str) -> list[dict]:
    response = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=10.0)
    body = response.json()
    assert response.status_code == 200 and body["status"] == "success", body
    return body["data"]["result"]


def value_when(url: str, promql: str, done) -> float:
    """The query's single value once `done(value)` holds (Prometheus scrapes every second)."""

    def check():
        result = query(url, promql)
        return len(result) == 1 and done(float(result[0]["value"][1])) and result

    try:
        return float(wait_for(check, f"{promql} to satisfy the test")[0]["value"][1])
    except AssertionError as err:
        targets = httpx.get(f"{url}/api/v1/targets", timeout=10.0).json()["data"]
        scrapes = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in targets["activeTargets"]]
        raise AssertionError(f"{err}\nthe scrapes: {scrapes}") from None


def test_both_paths_are_scraped_with_the_token(prometheus):
    for job in ("tfserving", "service"):
        assert value_when(prometheus, f'up{{job="{job}"}}', lambda v: v == 1) == 1


def test_tf_servings_metrics_are_queried_by_its_names(prometheus):
    count = (
        f':tensorflow:serving:request_count{{job="tfserving",model_name="{MODEL_NAME}",'
        'status="OK"}'
    )
    assert value_when(prometheus, count, lambda v: v >= REST_PREDICTIONS + GRPC_PREDICTIONS) == (
        REST_PREDICTIONS + GRPC_PREDICTIONS
    )
    unknown = (
        ':tensorflow:serving:request_count{job="tfserving",model_name="other",status="NOT_FOUND"}'
    )
    assert value_when(prometheus, unknown, bool) == 1
    latency = (
        ':tensorflow:serving:request_latency_count{{job="tfserving",entrypoint="{}",API="{}"}}'
    )
    assert value_when(prometheus, latency.format("REST", "predict"), bool) == REST_PREDICTIONS
    assert value_when(prometheus, latency.format("GRPC", "Predict"), bool) == GRPC_PREDICTIONS
    runtime = f':tensorflow:serving:runtime_latency_count{{job="tfserving",model_name="{MODEL_NAME}",API="Predict"}}'
    assert value_when(prometheus, runtime, bool) == REST_PREDICTIONS + GRPC_PREDICTIONS
    # A TF Serving dashboard's p99: microseconds, from its buckets.
    p99 = (
        "histogram_quantile(0.99, sum by (le) "
        '(:tensorflow:serving:request_latency_bucket{job="tfserving"}))'
    )
    assert 0 < value_when(prometheus, p99, lambda v: v > 0) < 60e6
    runs = ':tensorflow:serving:batching_session:wrapped_run_count{job="tfserving"}'
    assert value_when(prometheus, runs, bool) >= 1


def test_per_model_latency_is_queried_by_model_version_signature_and_protocol(prometheus):
    for protocol, expected in (("tfserving_rest", REST_PREDICTIONS),
                               ("tfserving_grpc", GRPC_PREDICTIONS)):  # fmt: skip
        series = (
            f'estimator_serving_request_duration_seconds_count{{job="service",model="{MODEL_NAME}",'
            f'signature="serving_default",protocol="{protocol}"}}'
        )
        assert value_when(prometheus, series, bool) == expected
        result = query(prometheus, series)
        assert result[0]["metric"]["version"].isdigit()
    p99 = (
        "histogram_quantile(0.99, sum by (le, model) "
        '(estimator_serving_request_duration_seconds_bucket{job="service"}))'
    )
    assert 0 < value_when(prometheus, p99, lambda v: v > 0) < 60
    queue = 'estimator_serving_queue_wait_seconds_count{job="service"}'
    assert value_when(prometheus, f"sum({queue})", bool) == REST_PREDICTIONS + GRPC_PREDICTIONS
