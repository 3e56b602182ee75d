"""The shipped scrape settings as Prometheus jobs that a Prometheus outside Kubernetes runs.

Two ways the manifests have the API scraped (docs/security.md, "Metrics"):

- the ServiceMonitor (components/prometheus-operator), whose `http` endpoint the Prometheus
  Operator turns into a job: its path, scheme, interval and bearer token (the Secret's key,
  which the operator mounts as a file), here with a static target instead of the Service's
  endpoints;
- deploy/monitoring/prometheus-scrape.yaml, the job for a Prometheus that scrapes annotated
  pods: taken whole (authorization, relabelling), with its `kubernetes_sd_configs` replaced
  by a static target that carries the labels Kubernetes' pod discovery would give the base
  Deployment's pod (its labels and `prometheus.io/*` annotations, the port annotation set to
  the port the test's service listens on), so the job's own relabelling picks the address,
  path and scheme. (Debian's Prometheus is built without Kubernetes discovery.)
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import yaml

from support.helpers import REPO_ROOT
from support.manifest_harness import KUBE_DIR, NAMESPACE, render

SCRAPE_JOB_FILE = REPO_ROOT / "deploy" / "monitoring" / "prometheus-scrape.yaml"
SERVICE_MONITOR_OVERLAY = KUBE_DIR / "overlays" / "prometheus-operator"
API_PORT_NAME = "http"


def service_monitor_endpoint() -> dict:
    """The ServiceMonitor's endpoint for the API's port."""
    (monitor,) = [
        o for o in render(SERVICE_MONITOR_OVERLAY) if o["kind"] == "ServiceMonitor"
    ]  # fmt: skip
    (endpoint,) = [e for e in monitor["spec"]["endpoints"] if e["port"] == API_PORT_NAME]
    return endpoint


def service_monitor_job(target: str, secrets_dir: Path) -> dict:
    """The job the operator makes of the API's endpoint, scraping `target` (host:port); its
    token is read from `secrets_dir`/<Secret name>/<key>, as the operator mounts it."""
    endpoint = service_monitor_endpoint()
    job = {
        "job_name": "service-monitor",
        "metrics_path": endpoint.get("path", "/metrics"),
        "scheme": endpoint.get("scheme", "http"),
        "static_configs": [{"targets": [target]}],
    }
    authorization = endpoint.get("authorization")
    if authorization is not None:
        secret = authorization["credentials"]
        job["authorization"] = {
            "type": authorization.get("type", "Bearer"),
            "credentials_file": str(secrets_dir / secret["name"] / secret["key"]),
        }
    return job


def pod_discovery_labels(port: int) -> dict[str, str]:
    """The `__meta_kubernetes_*` labels pod discovery gives the base API pod, its
    `prometheus.io/port` annotation set to `port`."""
    (deployment,) = [
        o for o in render(KUBE_DIR / "base")
        if o["kind"] == "Deployment" and o["metadata"]["name"] == "api"
    ]  # fmt: skip
    template = deployment["spec"]["template"]["metadata"]
    annotations = {**template.get("annotations", {}), "prometheus.io/port": str(port)}
    labels = {"__meta_kubernetes_namespace": NAMESPACE, "__meta_kubernetes_pod_name": "api-0"}
    for prefix, values in (("label", template["labels"]), ("annotation", annotations)):
        for name, value in values.items():
            labels[f"__meta_kubernetes_pod_{prefix}_{re.sub(r'[^a-zA-Z0-9_]', '_', name)}"] = value
    return labels


def annotation_job(host: str, port: int, credentials_file: Path) -> tuple[dict, str]:
    """The shipped annotation job, discovering one pod at `host` whose annotations name
    `port`, its token read from `credentials_file`; and the path it names for the token."""
    (job,) = copy.deepcopy(yaml.safe_load(SCRAPE_JOB_FILE.read_text())["scrape_configs"])
    shipped_path = job["authorization"]["credentials_file"]
    job["authorization"]["credentials_file"] = str(credentials_file)
    del job["kubernetes_sd_configs"]
    # Pod discovery's address: the pod's IP and a declared container port.
    job["static_configs"] = [{"targets": [f"{host}:1"], "labels": pod_discovery_labels(port)}]
    return job, shipped_path


def prometheus_config(jobs: list[dict], interval: str = "1s", rule_files=()) -> str:
    """A prometheus.yml with `jobs`, scraping every `interval`."""
    config: dict = {
        "global": {"scrape_interval": interval, "scrape_timeout": interval,
                   "evaluation_interval": interval},
        "scrape_configs": jobs,
    }  # fmt: skip
    if rule_files:
        config["rule_files"] = [str(path) for path in rule_files]
    return yaml.safe_dump(config, sort_keys=False)
