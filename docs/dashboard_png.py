"""Render the Grafana dashboard (deploy/monitoring/grafana-dashboard.json) as a PNG from a real
Prometheus: every panel's queries, as Grafana would send them, over a time range, drawn with
matplotlib in the dashboard's own layout (its gridPos).

    python docs/dashboard_png.py --prometheus http://127.0.0.1:9090 --minutes 5
    python docs/dashboard_png.py --load-run              # what docs/dashboard.png shows

`--load-run` makes the data first, on this machine: the model the repository ships
(models/shipped) served by `python -m service` on free loopback ports with tokens on and
batching as shipped, Debian's Prometheus (`prometheus` on PATH) scraping it every second with
the scrape token as the ServiceMonitor does, and LOAD_SECONDS of predictions from CLIENTS
concurrent clients (a few of them to a model that does not exist, so the error panels show
something); then the panels are drawn from that Prometheus. Everything it starts it stops.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "monitoring" / "grafana-dashboard.json"
OUTPUT = ROOT / "docs" / "dashboard.png"
SHIPPED_MODEL = ROOT / "models" / "shipped" / "fashion_mnist"
# Grafana's variables, as the rendered range needs them.
RATE_INTERVAL = "15s"
VARIABLES = {"$__rate_interval": RATE_INTERVAL, "$model": ".*"}
LOAD_SECONDS = 90
CLIENTS = 8
# Panels that show a table in Grafana are drawn as their series' last values.
TABLE_TYPES = {"table", "stat"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(condition, what: str, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"timed out waiting for {what}")


def expand(expr: str) -> str:
    for variable, value in VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def query_range(prometheus: str, expr: str, start: float, end: float, step: float) -> list:
    params = {"query": expand(expr), "start": start, "end": end, "step": step}
    response = httpx.get(f"{prometheus}/api/v1/query_range", params=params, timeout=30.0)
    body = response.json()
    if body.get("status") != "success":
        raise SystemExit(f"Prometheus refused {expr!r}: {body}")
    return body["data"]["result"]


def legend(template: str, labels: dict) -> str:
    for name, value in labels.items():
        template = template.replace("{{" + name + "}}", value)
    return template or ",".join(f"{k}={v}" for k, v in labels.items())


def render(prometheus: str, start: float, end: float, output: Path) -> None:
    """Draw every panel of the dashboard from `prometheus` over [start, end] into `output`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    figure = plt.figure(figsize=(16, rows * 0.36), dpi=60)
    grid = figure.add_gridspec(rows, 24, hspace=3.0, wspace=3.0, left=0.05, right=0.98,
                               top=0.95, bottom=0.04)  # fmt: skip
    step = max((end - start) / 120, 1.0)
    for panel in panels:
        g = panel["gridPos"]
        axes = figure.add_subplot(grid[g["y"] : g["y"] + g["h"], g["x"] : g["x"] + g["w"]])
        axes.set_title(panel["title"], fontsize=10, loc="left")
        axes.tick_params(labelsize=7)
        drawn = 0
        for target in panel["targets"]:
            for series in query_range(prometheus, target["expr"], start, end, step):
                points = [(float(t) - start, float(v)) for t, v in series["values"]
                          if v not in ("NaN", "+Inf", "-Inf")]  # fmt: skip
                if not points:
                    continue
                label = legend(target.get("legendFormat", ""), series["metric"])
                if panel["type"] in TABLE_TYPES:
                    axes.barh(label[:40], points[-1][1])
                else:
                    axes.plot(*zip(*points, strict=True), label=label[:40], linewidth=1.2)
                drawn += 1
        if drawn == 0:
            axes.text(0.5, 0.5, "no data", ha="center", va="center", transform=axes.transAxes)
        elif panel["type"] not in TABLE_TYPES:
            axes.legend(fontsize=6, loc="upper left")
            axes.set_xlabel(f"seconds ({panel['fieldConfig']['defaults']['unit']})", fontsize=7)
    figure.suptitle(f"{dashboard['title']} (docs/dashboard_png.py, from Prometheus)", fontsize=12)
    figure.savefig(output, dpi=60)
    print(f"wrote {output} ({output.stat().st_size} bytes)")


def load_run(output: Path) -> None:
    """Serve, scrape, load, draw: see the module's docstring."""
    prometheus_binary = shutil.which("prometheus")
    if prometheus_binary is None:
        raise SystemExit("prometheus is not installed: sudo apt-get install prometheus")
    with tempfile.TemporaryDirectory(prefix="dashboard-") as folder:
        root = Path(folder)
        shutil.copytree(SHIPPED_MODEL, root / "models" / "fashion_mnist")
        client_token, scrape_token = "dashboard-client-token-0123", "dashboard-scrape-token-0123"
        (root / "tokens").write_text(f"{client_token} predict,status clients\n"
                                     f"{scrape_token} status prometheus\n")  # fmt: skip
        (root / "scrape-token").write_text(scrape_token)
        port, prometheus_port = free_port(), free_port()
        env = {**os.environ, "MODEL_NAME": "fashion_mnist", "MODEL_BASE_PATH": str(root / "models"),
               "PORT": str(port), "HOST": "127.0.0.1", "AUTH_TOKENS_FILE": str(root / "tokens"),
               "LOG_FORMAT": "json", "LOG_LEVEL": "warning"}  # fmt: skip
        processes = []
        try:
            with open(root / "service.log", "wb") as service_log:
                processes.append(subprocess.Popen([sys.executable, "-m", "service"], cwd=ROOT,
                                                  env=env, stdout=service_log,
                                                  stderr=subprocess.STDOUT))  # fmt: skip
            url = f"http://127.0.0.1:{port}"
            wait_until(lambda: httpx.get(f"{url}/readyz").status_code == 200, "the service")
            (root / "prometheus.yml").write_text(
                "global: {scrape_interval: 1s, scrape_timeout: 1s}\nscrape_configs:\n"
                "  - job_name: estimator-serving-api\n    metrics_path: /metrics\n"
                f"    authorization: {{type: Bearer, credentials_file: {root / 'scrape-token'}}}\n"
                f"    static_configs: [{{targets: ['127.0.0.1:{port}'], "
                "labels: {namespace: estimator-serving, pod: api-0}}]\n"
            )
            with open(root / "prometheus.log", "wb") as prometheus_log:
                processes.append(subprocess.Popen(
                    [prometheus_binary, f"--config.file={root / 'prometheus.yml'}",
                     f"--storage.tsdb.path={root / 'data'}",
                     f"--web.listen-address=127.0.0.1:{prometheus_port}"],
                    stdout=prometheus_log, stderr=subprocess.STDOUT))  # fmt: skip
            prometheus = f"http://127.0.0.1:{prometheus_port}"
            wait_until(lambda: httpx.get(f"{prometheus}/-/ready").status_code == 200, "Prometheus")
            start = time.time()
            load(url, client_token, LOAD_SECONDS)
            time.sleep(5)  # the last scrapes
            render(prometheus, start - 10, time.time(), output)
        finally:
            for process in reversed(processes):
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def load(url: str, token: str, seconds: float) -> None:
    """CLIENTS threads posting 1 to 8 images each until `seconds` pass; one in 50 requests
    names a model that does not exist (404, counted under `other`)."""
    import numpy as np

    deadline = time.monotonic() + seconds
    headers = {"Authorization": f"Bearer {token}"}

    def client(index: int) -> None:
        rng = np.random.default_rng(index)
        with httpx.Client(base_url=url, headers=headers, timeout=30.0) as http:
            sent = 0
            while time.monotonic() < deadline:
                images = rng.random((int(rng.integers(1, 9)), 28, 28)).round(3).tolist()
                name = "nobody" if sent % 50 == 49 else "fashion_mnist"
                http.post(f"/v1/models/{name}:predict", json={"instances": images})
                sent += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prometheus", help="a Prometheus that scrapes the service")
    parser.add_argument("--minutes", type=float, default=5.0, help="the range, up to now")
    parser.add_argument("--load-run", action="store_true", help="make the data first")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    if args.load_run:
        load_run(args.output)
    elif args.prometheus:
        now = time.time()
        render(args.prometheus.rstrip("/"), now - args.minutes * 60, now, args.output)
    else:
        parser.error("give --prometheus URL or --load-run")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
