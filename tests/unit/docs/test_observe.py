"""The Observe page (docs/observe.md) names every metric the service exports and every alert
it ships, and shows the dashboard drawn by docs/dashboard_png.py."""

from __future__ import annotations

import yaml
from support.helpers import REPO_ROOT

from service.metrics import Metrics

PAGE = REPO_ROOT / "docs" / "observe.md"
PNG = REPO_ROOT / "docs" / "dashboard.png"
# What the docs site may carry per screenshot.
MAX_PNG_BYTES = 200_000


def test_every_metric_is_on_the_page():
    text = PAGE.read_text()
    metrics = Metrics()
    for family in metrics.registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        assert f"`{name}`" in text, name


def test_every_alert_is_on_the_page():
    text = PAGE.read_text()
    rules = yaml.safe_load((REPO_ROOT / "deploy" / "monitoring" / "alerts.rules.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert f"`{rule['alert']}`" in text, rule["alert"]


def test_the_page_shows_the_dashboard_drawn_from_prometheus():
    assert "](dashboard.png)" in PAGE.read_text()
    data = PNG.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) < MAX_PNG_BYTES
