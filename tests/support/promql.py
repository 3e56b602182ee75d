"""PromQL as the monitoring files hold it: the metric names a query reads, and promtool's
verdict on queries (`promtool check rules` parses every expression of a rules file).

`metric_names` is a small lexer, not a PromQL parser: it drops strings, label matchers,
ranges and the label lists of `by`/`without`/`on`/`ignoring`/`group_*`, then keeps the
identifiers that are not functions, keywords or numbers. promtool judges the syntax.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

# Grafana's variables, as a query sent to Prometheus would have them.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$model": ".*"}
KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "bool",
                      "offset", "and", "or", "unless", "inf", "nan"})  # fmt: skip
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?")


def expand(expr: str) -> str:
    """`expr` with Grafana's variables replaced as Grafana sends it."""
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def metric_names(expr: str) -> set[str]:
    """The metric names `expr` selects."""
    text = _STRINGS.sub('""', expand(expr))
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for name, call in _IDENTIFIER.findall(text):
        if not call and name.lower() not in KEYWORDS:
            names.add(name)
    return names


def promtool() -> str | None:
    return shutil.which("promtool")


def check_rules(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), "check", "rules", str(path)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def check_expressions(exprs: list[str], folder: Path) -> subprocess.CompletedProcess:
    """promtool's verdict on `exprs`, each a recording rule of one rules file."""
    rules = [{"record": f"check:expr_{i}", "expr": expand(e)} for i, e in enumerate(exprs)]
    path = folder / "expressions.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "check", "rules": rules}]}))
    return check_rules(path)


def exported_names(metrics) -> set[str]:
    """Every series name service.metrics.Metrics can export: its own registry's (as
    prometheus_client writes them) and TF Serving's (counters without `_total`, as TF Serving
    writes them)."""
    names = set()
    suffixes = {"counter": ("_total",), "gauge": ("",),
                "histogram": ("_bucket", "_count", "_sum")}  # fmt: skip
    for family in metrics.registry.collect():
        names |= {family.name + suffix for suffix in suffixes[family.type]}
    tfserving = {**suffixes, "counter": ("",)}
    for family in metrics.tfserving_registry.collect():
        names |= {family.name + suffix for suffix in tfserving[family.type]}
    return names
