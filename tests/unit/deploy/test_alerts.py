"""The alerts (deploy/monitoring/alerts.rules.yml and the PrometheusRule of
components/prometheus-operator): the same groups in both, valid for promtool (`check
rules`), right on recorded series (`promtool test rules` on deploy/monitoring/
alerts.test.yml: each alert fires when it should and not when it should not), and reading
only metrics the service exports. Without promtool (Debian's `prometheus`) the promtool
tests are skipped, saying so."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml
from support.helpers import REPO_ROOT
from support.manifest_harness import KUBE_DIR, render
from support.promql import check_rules, exported_names, metric_names, promtool

from service.metrics import Metrics

MONITORING = REPO_ROOT / "deploy" / "monitoring"
RULES = MONITORING / "alerts.rules.yml"
RULES_TESTS = MONITORING / "alerts.test.yml"
# What issue #37 asked alerts for, and the alert that answers each.
ALERTS = {"EstimatorServingErrorRatio", "EstimatorServingLatencyP99",
          "EstimatorServingQueueFull", "EstimatorServingNoAvailableVersion",
          "EstimatorServingLoadFailures", "EstimatorServingNoNewVersion"}  # fmt: skip
needs_promtool = pytest.mark.skipif(
    promtool() is None,
    reason="promtool is missing: run 'sudo apt-get install prometheus' (make setup)",
)


def groups() -> list[dict]:
    return yaml.safe_load(RULES.read_text())["groups"]


def rules() -> list[dict]:
    return [rule for group in groups() for rule in group["rules"]]


def test_the_prometheus_rule_holds_the_rules_file_s_groups():
    objects = render(KUBE_DIR / "overlays" / "prometheus-operator")
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    assert rule["spec"]["groups"] == groups()
    assert rule["metadata"]["namespace"] == "estimator-serving"


def test_the_alerts_are_the_ones_asked_for_and_read_exported_metrics():
    assert {rule["alert"] for rule in rules()} == ALERTS
    exported = exported_names(Metrics())
    for rule in rules():
        names = metric_names(rule["expr"])
        assert names and names <= exported, (rule["alert"], names - exported)
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        assert {"summary", "description"} <= set(rule["annotations"])


def test_the_queue_alert_is_at_the_shipped_batch_max_queue():
    from service.settings import Settings

    (queue,) = [r for r in rules() if r["alert"] == "EstimatorServingQueueFull"]
    assert queue["expr"].endswith(f">= {Settings().batch_max_queue}")


@needs_promtool
def test_promtool_checks_the_rules():
    result = check_rules(RULES)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_the_alerts_fire_on_recorded_series_as_expected(tmp_path):
    result = subprocess.run([promtool(), "test", "rules", RULES_TESTS.name], cwd=MONITORING,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    # Every alert is tested, and the test can fail: a threshold moved breaks it.
    tested = {case["alertname"] for test in yaml.safe_load(RULES_TESTS.read_text())["tests"]
              for case in test["alert_rule_test"]}  # fmt: skip
    assert tested == ALERTS
    shutil.copy(RULES_TESTS, tmp_path)
    (tmp_path / RULES.name).write_text(RULES.read_text().replace("> 0.05", "> 0.5"))
    moved = subprocess.run([promtool(), "test", "rules", RULES_TESTS.name], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert moved.returncode != 0
    assert "EstimatorServingErrorRatio" in moved.stdout + moved.stderr
