"""WORKERS=2 for real: two `python -m service` workers on one port share the clients, both
serve gRPC on one port, /metrics counts every request whichever worker took it, and SIGTERM
stops them all with exit code 0."""

from __future__ import annotations

import re

import httpx
import numpy as np
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families
from support.servers import MODEL_NAME, copy_repository, start_server

REQUESTS = 40


def predicted(families, route: str) -> float:
    return sum(
        s.value
        for f in families
        for s in f.samples
        if s.name == "http_requests_total" and s.labels["route"] == route
    )


def test_two_workers_share_the_port_the_metrics_and_the_stop(trained_model, tmp_path):
    base = copy_repository(trained_model, tmp_path)
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    server = start_server(
        tmp_path / "server.log",
        MODEL_BASE_PATH=str(base),
        WORKERS="2",
        grpc=True,
        PROMETHEUS_MULTIPROC_DIR=str(metrics_dir),
    )
    try:
        image = np.zeros((1, 28, 28)).tolist()
        for _ in range(REQUESTS):
            # A connection each: the kernel spreads connections, not requests.
            with httpx.Client(base_url=server.url, timeout=60) as client:
                answer = client.post(f"/v1/models/{MODEL_NAME}:predict", json={"instances": image})
                assert answer.status_code == 200, answer.text
        with httpx.Client(base_url=server.url, timeout=60) as client:
            families = list(text_string_to_metric_families(client.get("/metrics").text))
        assert predicted(families, "/v1/models/{name}:predict") == REQUESTS
        # Each worker's own file: both took some of the connections.
        per_worker = {}
        for path in metrics_dir.glob("counter_*.db"):
            merged = MultiProcessCollector.merge([str(path)], accumulate=True)
            per_worker[path.name] = predicted(merged, "/v1/models/{name}:predict")
        assert len(per_worker) == 2, per_worker
        assert sum(per_worker.values()) == REQUESTS and all(per_worker.values()), per_worker
        log = server.log()
        assert len(re.findall(r"\[worker [12]\]: TensorFlow Serving's gRPC API on", log)) == 2
    finally:
        code = server.stop()
    log = server.log()
    assert code == 0, log
    assert log.count("Stopped serving on") == 2, log
