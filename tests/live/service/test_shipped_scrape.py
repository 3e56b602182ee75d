"""Monitoring works as shipped: Debian's Prometheus scrapes a live `python -m service`, with
tokens on as in every shipped deployment, through exactly the scrape settings the manifests
write (support/scrape_configs.py: the ServiceMonitor's endpoint for port `http`, and the
annotation job of deploy/monitoring/prometheus-scrape.yaml with its relabelling), each
sending the scrape token `make tokens` writes (deploy/make_tokens.py, `.prometheus`). A job
with the same settings but no token is refused, so the token is what makes the scrapes work.
The shipped alert rules (deploy/monitoring/alerts.rules.yml) are loaded into the same
Prometheus and evaluated against what it scrapes.

The service serves the model the repository ships (models/shipped), as `make serve` does
while no version is exported; Prometheus listens on a free loopback port, keeps its data in
the test's folder and reaches nothing but the service.
"""

from __future__ import annotations

import copy
import importlib.util
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import yaml
from support.helpers import REPO_ROOT
from support.scrape_configs import (
    annotation_job,
    prometheus_config,
    service_monitor_endpoint,
    service_monitor_job,
)
from support.servers import MODEL_NAME, Server, free_port, start_server

SHIPPED_MODEL = REPO_ROOT / "models" / "shipped" / MODEL_NAME
PREDICTIONS = 4
ALERT_RULES = REPO_ROOT / "deploy" / "monitoring" / "alerts.rules.yml"
# How long Prometheus may take to start and to scrape what a test waits for (it scrapes every
# second); a condition is polled, never a time asserted.
WAIT_SECONDS = 90.0


def load_make_tokens():
    spec = importlib.util.spec_from_file_location(
        "make_tokens", REPO_ROOT / "deploy" / "make_tokens.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def prometheus_binary() -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip(
            "Prometheus is not installed: run 'sudo apt-get install prometheus' (make setup)"
        )
    return binary


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    """`make tokens`' files: the service's digests, the tokens, the scrape token alone."""
    make_tokens = load_make_tokens()
    path = tmp_path_factory.mktemp("tokens") / "api-tokens"
    issued = make_tokens.write_tokens(path)
    handed_out = {
        line.split()[2]: line.split()[0]
        for line in issued.read_text().splitlines()
        if not line.startswith("#")
    }
    return path, make_tokens.scrape_token_path(path), handed_out


@pytest.fixture(scope="module")
def server(prometheus_binary, tokens, tmp_path_factory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("shipped-scrape")
    base = root / "models"
    shutil.copytree(SHIPPED_MODEL, base / MODEL_NAME)
    srv = start_server(root / "server.log", MODEL_BASE_PATH=str(base),
                       AUTH_TOKENS_FILE=str(tokens[0]), LOG_FORMAT="json")  # fmt: skip
    yield srv
    assert srv.stop() in (0, -signal.SIGTERM), srv.log()
    assert "Traceback" not in srv.log(), srv.log()


@pytest.fixture(scope="module")
def predictions(server, tokens):
    images = np.random.default_rng(7).random((2, 28, 28)).astype(np.float32)
    headers = {"Authorization": f"Bearer {tokens[2]['clients']}"}
    for _ in range(PREDICTIONS):
        response = httpx.post(f"{server.url}/v1/models/{MODEL_NAME}:predict",
                              json={"instances": images.tolist()}, headers=headers,
                              timeout=30.0)  # fmt: skip
        assert response.status_code == 200, response.text


def shipped_jobs(server: Server, scrape_token, secrets_dir) -> list[dict]:
    """The two shipped jobs, and the ServiceMonitor's without its token."""
    # The operator mounts the Secret's keys as files under a folder of its name.
    endpoint = service_monitor_endpoint()
    secret = endpoint["authorization"]["credentials"]
    (secrets_dir / secret["name"]).mkdir(parents=True)
    shutil.copy(scrape_token, secrets_dir / secret["name"] / secret["key"])
    monitor = service_monitor_job(f"127.0.0.1:{server.port}", secrets_dir)
    annotated, _ = annotation_job("127.0.0.1", server.port, scrape_token)
    tokenless = copy.deepcopy(monitor)
    tokenless["job_name"] = "no-token"
    del tokenless["authorization"]
    return [monitor, annotated, tokenless]


@pytest.fixture(scope="module")
def prometheus(prometheus_binary, server, tokens, predictions, tmp_path_factory) -> Iterator[str]:
    """Prometheus running the shipped jobs every second; its URL."""
    root = tmp_path_factory.mktemp("prometheus")
    jobs = shipped_jobs(server, tokens[1], root / "secrets")
    (root / "prometheus.yml").write_text(prometheus_config(jobs, rule_files=[ALERT_RULES]))
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


def targets(url: str) -> dict[str, dict]:
    """job -> its one active target."""
    data = httpx.get(f"{url}/api/v1/targets", timeout=10.0).json()["data"]
    return {t["labels"]["job"]: t for t in data["activeTargets"]}


def scraped(url: str, job: str, health: str) -> dict | None:
    target = targets(url).get(job)
    return target if target is not None and target["health"] == health else None


def query(url: str, promql: str) -> list[dict]:
    response = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=10.0)
    body = response.json()
    assert response.status_code == 200 and body["status"] == "success", body
    return body["data"]["result"]


@pytest.mark.parametrize("job", ["service-monitor", "estimator-serving-api"])
def test_the_shipped_jobs_scrape_the_api_with_the_token(prometheus, server, job):
    target = wait_for(lambda: scraped(prometheus, job, "up"), f"{job} to be scraped")
    # The annotation job's relabelling took the annotations' port and path.
    assert target["scrapeUrl"] == f"http://127.0.0.1:{server.port}/metrics"
    count = f'estimator_serving_request_duration_seconds_count{{job="{job}",model="{MODEL_NAME}"}}'

    def predictions_seen():
        result = query(prometheus, count)
        return result and sum(float(r["value"][1]) for r in result) == PREDICTIONS

    wait_for(predictions_seen, f"{count} to count the predictions")


def test_the_same_job_without_the_token_is_refused(prometheus):
    target = wait_for(lambda: scraped(prometheus, "no-token", "down"), "the tokenless scrape")
    assert "401" in target["lastError"], target


def test_the_shipped_alert_rules_load_and_evaluate(prometheus):
    shipped = yaml.safe_load(ALERT_RULES.read_text())["groups"]
    expected = {rule["alert"] for group in shipped for rule in group["rules"]}

    def evaluated():
        data = httpx.get(f"{prometheus}/api/v1/rules", timeout=10.0).json()["data"]
        loaded = [rule for group in data["groups"] for rule in group["rules"]]
        done = {r["name"] for r in loaded if r["lastEvaluation"] != "0001-01-01T00:00:00Z"}
        return done == expected and loaded

    loaded = wait_for(evaluated, "the shipped rules to be evaluated")
    assert {rule["name"] for rule in loaded} == expected
    for rule in loaded:
        assert rule["type"] == "alerting" and rule["health"] == "ok", rule
    # The service serves a version: the alert on none available stays quiet.
    states = {rule["name"]: rule["state"] for rule in loaded}
    assert states["EstimatorServingNoAvailableVersion"] == "inactive"
    # And its query sees the version the alert would miss.
    available = 'estimator_serving_model_version_state{state="AVAILABLE"} == 1'
    assert wait_for(lambda: query(prometheus, available), "an AVAILABLE version")


def test_the_annotation_job_gives_the_hpa_adapter_its_series(prometheus):
    """prometheus-adapter's rule (docs/kubernetes.md, "Scale") reads the gauge per namespace
    and pod: the job's relabelling writes both."""
    series = 'http_requests_in_flight{job="estimator-serving-api",namespace!="",pod!=""}'
    (found,) = wait_for(lambda: query(prometheus, series), "the in-flight gauge per pod")
    assert found["metric"]["namespace"] == "estimator-serving"
