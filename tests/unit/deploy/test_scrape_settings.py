"""Scrapes succeed as shipped: the API's /metrics needs a `status` token in every shipped
deployment, and both ways the manifests have it scraped send one, from the Secret
prometheus-scrape-token that `make tokens`' scrape token makes (docs/security.md,
"Metrics"). tests/live/service/test_shipped_scrape.py runs the same jobs in a real Prometheus.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml
from support.fakes import FakeBackend, app_client
from support.helpers import REPO_ROOT
from support.manifest_harness import KUBE_DIR, render
from support.scrape_configs import (
    SCRAPE_JOB_FILE,
    annotation_job,
    prometheus_config,
    service_monitor_endpoint,
    service_monitor_job,
)

SECRET = "prometheus-scrape-token"
SECRET_KEY = "token"
MAKE_SECRET = (
    f"kubectl -n estimator-serving create secret generic {SECRET} "
    f"--from-file={SECRET_KEY}=secrets/api-tokens.prometheus"
)


def test_the_service_monitor_sends_the_scrape_token():
    authorization = service_monitor_endpoint()["authorization"]
    assert authorization["type"] == "Bearer"
    assert authorization["credentials"] == {"name": SECRET, "key": SECRET_KEY}


def test_the_annotation_job_reads_the_same_secret_and_keeps_to_the_api_pods(tmp_path):
    job, shipped_path = annotation_job("127.0.0.1", 8000, tmp_path / "token")
    assert shipped_path == f"/etc/prometheus/secrets/{SECRET}/{SECRET_KEY}"
    keep = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
    assert {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"],
            "regex": "estimator-serving-api", "action": "keep"} in keep  # fmt: skip


def test_the_docs_say_how_to_make_the_secret():
    for page in ("kubernetes.md", "security.md"):
        assert MAKE_SECRET in (REPO_ROOT / "docs" / page).read_text(), page


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool is missing: run 'sudo apt-get install prometheus' (make setup)")  # fmt: skip
def test_prometheus_takes_both_jobs(tmp_path):
    token = tmp_path / "token"
    token.write_text("a-scrape-token-0123456789\n")
    (token_dir := tmp_path / SECRET).mkdir()
    (token_dir / SECRET_KEY).write_text(token.read_text())
    jobs = [service_monitor_job("127.0.0.1:8000", tmp_path),
            annotation_job("127.0.0.1", 8000, token)[0]]  # fmt: skip
    config = tmp_path / "prometheus.yml"
    config.write_text(prometheus_config(jobs))
    result = subprocess.run(["promtool", "check", "config", str(config)],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    # What the shipped file is: a `scrape_configs` list to add to a prometheus.yml.
    assert list(yaml.safe_load(SCRAPE_JOB_FILE.read_text())) == ["scrape_configs"]


def test_the_hpa_scales_on_a_metric_the_api_exports():
    objects = render(KUBE_DIR / "overlays" / "hpa-in-flight")
    (hpa,) = [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"]
    (name,) = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    with app_client(FakeBackend()) as client:
        exposition = client.get("/metrics").text
    assert f"\n{name} " in exposition or exposition.startswith(f"{name} ")
