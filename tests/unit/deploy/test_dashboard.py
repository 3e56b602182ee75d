"""The Grafana dashboard (deploy/monitoring/grafana-dashboard.json): a dashboard Grafana
imports, whose every query parses and reads only metrics the service exports.

No JSON Schema of Grafana's dashboards is installed here (Grafana publishes its dashboard
model as documentation and, from v11, as CUE/TypeScript kinds, not as a JSON Schema on PyPI),
so the checks are written from Grafana's documented JSON model ("JSON model" in Grafana's
dashboard docs): the top-level keys an import needs, each panel's id, type, gridPos and
datasource, each target's refId and expr, the template variables the queries use. promtool
(Debian's `prometheus`) parses every query; without it that test is skipped, saying so.
"""

from __future__ import annotations

import json

import pytest
from support.fakes import MODEL_NAME, FakeBackend, app_client
from support.helpers import REPO_ROOT
from support.promql import check_expressions, exported_names, metric_names, promtool

from service.metrics import Metrics

DASHBOARD = REPO_ROOT / "deploy" / "monitoring" / "grafana-dashboard.json"
# Grafana's core panel types (public/app/plugins/panel/ in Grafana's repository).
PANEL_TYPES = {"timeseries", "stat", "gauge", "table", "state-timeline", "bargauge", "text",
               "row", "heatmap", "barchart", "histogram", "piechart", "status-history"}  # fmt: skip
GRID_COLUMNS = 24
# What the dashboard is for (issue #37): each must be read by some panel.
REQUIRED_METRICS = {
    "http_requests_total",
    "estimator_serving_request_duration_seconds_bucket",
    "estimator_serving_queue_wait_seconds_bucket",
    "estimator_serving_batch_size_bucket",
    "estimator_serving_queue_requests",
    "estimator_serving_model_version_state",
    "estimator_serving_model_load_failures_total",
    "estimator_serving_feedback_accepted_total",
    "estimator_serving_feedback_refused_total",
    ":tensorflow:serving:request_count",
}


def load() -> dict:
    return json.loads(DASHBOARD.read_text())


def expressions(dashboard: dict) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def test_the_dashboard_has_what_grafana_imports():
    dashboard = load()
    for key, kind in (("title", str), ("uid", str), ("schemaVersion", int), ("panels", list),
                      ("time", dict), ("templating", dict), ("version", int)):  # fmt: skip
        assert isinstance(dashboard.get(key), kind), key
    assert len(dashboard["uid"]) <= 40  # Grafana's limit on a uid
    assert set(dashboard["time"]) == {"from", "to"}
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"


def test_every_panel_is_placed_typed_and_reads_prometheus():
    dashboard = load()
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    ids, cells = set(), set()
    for panel in dashboard["panels"]:
        where = panel.get("title")
        assert isinstance(panel["id"], int) and panel["id"] not in ids, where
        ids.add(panel["id"])
        assert panel["type"] in PANEL_TYPES, where
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in ("x", "y", "w", "h")), where
        assert grid["x"] >= 0 and grid["y"] >= 0 and grid["w"] > 0 and grid["h"] > 0, where
        assert grid["x"] + grid["w"] <= GRID_COLUMNS, where
        mine = {(grid["x"] + i, grid["y"] + j) for i in range(grid["w"]) for j in range(grid["h"])}
        assert not mine & cells, f"{where} overlaps another panel"
        cells |= mine
        datasource = panel["datasource"]
        assert datasource == {"type": "prometheus", "uid": "${datasource}"}, where
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(set(refs)) == len(refs), where
        for target in panel["targets"]:
            assert target["datasource"] == datasource and target["expr"].strip(), where
            for used in ("model",):
                if f"${used}" in target["expr"]:
                    assert used in variables, where


@pytest.mark.skipif(promtool() is None,
                    reason="promtool is missing: run 'sudo apt-get install prometheus' (make setup)")  # fmt: skip
def test_every_query_parses(tmp_path):
    result = check_expressions(expressions(load()), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    # And a query that does not parse is refused: the check can fail.
    broken = check_expressions(["sum(rate(http_requests_total[5m])"], tmp_path)
    assert broken.returncode != 0


def test_the_queries_name_only_metrics_the_service_exports():
    exported = exported_names(Metrics())
    used = set().union(*map(metric_names, expressions(load())))
    assert used <= exported, used - exported
    assert used >= REQUIRED_METRICS, REQUIRED_METRICS - used
    # The names as a real scrape writes them (the fake backend's app, one prediction).
    with app_client(FakeBackend()) as client:
        body = {"instances": [[[0.0] * 28] * 28]}
        assert client.post(f"/v1/models/{MODEL_NAME}:predict", json=body).status_code == 200
        exposition = client.get("/metrics").text
    for name in ("http_requests_total", "estimator_serving_model_version_state",
                 ":tensorflow:serving:request_count"):  # fmt: skip
        assert f"\n{name}{{" in exposition, name


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        pytest.param('sum by (le, model) (rate(a_bucket{model=~"$model"}[5m]))', {"a_bucket"},
                     id="grouping-and-matchers"),
        pytest.param("a_sum / ignoring (x) b_count > bool 0", {"a_sum", "b_count"}, id="binary"),
        pytest.param('histogram_quantile(0.99, x{s="by (y)"})', {"x"}, id="string"),
        pytest.param("sum(rate(:tensorflow:serving:request_count[1m]))",
                     {":tensorflow:serving:request_count"}, id="colons"),
    ],
)  # fmt: skip
def test_the_lexer_finds_the_metric_names(expr, names):
    assert metric_names(expr) == names
