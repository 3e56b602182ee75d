"""What TF Serving's flags change on the HTTP side (service/ingress.py, service/app.py):
REQUEST_TIMEOUT_SECONDS (--rest_api_timeout_in_ms) answers a request not done in time with
504 and frees its place; MONITORING_CONFIG_FILE (--monitoring_config_file) serves the
metrics at its Prometheus path too, behind the same token scope as /metrics.

Fast tier: fakes and Starlette's TestClient, no TensorFlow.
"""

from __future__ import annotations

import pytest
from support.fakes import MODEL_NAME, FakeBackend, GatedFakeBackend, app_client

from service.app import create_app
from service.config_files import ServerFileError
from service.settings import Settings

PREDICT = f"/v1/models/{MODEL_NAME}:predict"
BODY = {"instances": [[[0.0] * 28] * 28]}
TOKEN = "t" * 24


def test_a_request_not_answered_in_time_gets_504_and_the_model_goes_on_serving():
    backend = GatedFakeBackend()
    backend.gate.clear()  # the model holds every call until the gate opens
    with app_client(backend, request_timeout_seconds=0.05) as client:
        late = client.post(PREDICT, json=BODY)
        assert late.status_code == 504
        assert late.json() == {
            "error": "the request was not answered within 0.05 s (REQUEST_TIMEOUT_SECONDS)"
        }
        backend.gate.set()
        assert client.post(PREDICT, json=BODY).status_code == 200


def test_a_timeout_of_0_is_no_limit_and_a_fast_request_is_not_touched():
    with app_client(FakeBackend(), request_timeout_seconds=0) as client:
        assert client.post(PREDICT, json=BODY).status_code == 200
    with app_client(FakeBackend(), request_timeout_seconds=30) as client:
        assert client.post(PREDICT, json=BODY).status_code == 200


@pytest.fixture
def monitoring_file(tmp_path):
    def write(text: str) -> str:
        path = tmp_path / "monitoring.config"
        path.write_text(text)
        return str(path)

    return write


def test_the_monitoring_config_serves_the_metrics_at_its_path(monitoring_file):
    path = monitoring_file("prometheus_config { enable: true }")
    with app_client(FakeBackend(), monitoring_config_file=path) as client:
        client.post(PREDICT, json=BODY)
        prometheus = client.get("/monitoring/prometheus/metrics")
        metrics = client.get("/metrics")
    assert prometheus.status_code == metrics.status_code == 200
    assert prometheus.headers["content-type"] == metrics.headers["content-type"]
    # The same exposition: the same metric families (the values move between the two reads).
    assert families(prometheus.text) == families(metrics.text)
    assert len(families(metrics.text)) > 5


def families(exposition: str) -> set[str]:
    return {line.split()[2] for line in exposition.splitlines() if line.startswith("# HELP ")}


def test_the_monitoring_path_wants_the_metrics_token(monitoring_file, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN} status\n")
    path = monitoring_file('prometheus_config { enable: true path: "/tfs/metrics" }')
    with app_client(FakeBackend(), monitoring_config_file=path, auth_tokens_file=str(tokens)) as c:
        assert c.get("/tfs/metrics").status_code == 401
        answer = c.get("/tfs/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert answer.status_code == 200


def test_a_disabled_monitoring_config_adds_no_path(monitoring_file):
    path = monitoring_file('prometheus_config { enable: false path: "/tfs/metrics" }')
    with app_client(FakeBackend(), monitoring_config_file=path) as client:
        assert client.get("/tfs/metrics").status_code == 404
        assert client.get("/metrics").status_code == 200


@pytest.mark.parametrize("taken", ["/healthz", f"/v1/models/{MODEL_NAME}", "/predict"])
def test_a_monitoring_path_the_service_answers_already_is_refused(monitoring_file, taken):
    path = monitoring_file(f'prometheus_config {{ enable: true path: "{taken}" }}')
    with pytest.raises(ServerFileError) as refused:
        create_app(Settings(monitoring_config_file=path), FakeBackend())
    assert str(refused.value).startswith(
        f"MONITORING_CONFIG_FILE: prometheus_config.path {taken} is one of the service's own"
    )


def test_metrics_as_the_monitoring_path_is_metrics_itself(monitoring_file):
    path = monitoring_file('prometheus_config { enable: true path: "/metrics" }')
    with app_client(FakeBackend(), monitoring_config_file=path) as client:
        assert client.get("/metrics").status_code == 200
