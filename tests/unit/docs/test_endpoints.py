"""The endpoint tables of the README and the docs against the routes the service registers.

An endpoint table is a Markdown table whose first column is headed `endpoint`; its first
column holds routes in backticks: `GET /v1/models/{name}[/versions/{v} \\| /labels/{l}]`,
where `[...]` is optional, `\\|` separates alternatives, `{x}` is a path parameter (any name)
and a trailing `...` any rest of the path. The README's table and the Running the service
page's each cover every route, and neither names a route the service does not have.

Fast tier: the app built over a fake backend, as the service's unit tests build it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.fakes import FakeBackend

from service.app import create_app
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[3]
TABLES = ["README.md", "docs/operations.md"]
ENTRY = re.compile(r"^((?:GET|POST)(?:\\?\|(?:GET|POST))*) (/.*)$")


def registered(monitoring_config: Path) -> set[tuple[str, str]]:
    """(method, template with its parameters as `{}`) of every route the app answers, with
    TF Serving's monitoring config too (its Prometheus path is a route only then)."""
    monitoring_config.write_text("prometheus_config { enable: true }\n")
    found = set()
    for settings in (Settings(), Settings(monitoring_config_file=str(monitoring_config))):
        table = create_app(settings, FakeBackend()).ingress.table
        found |= {(r.method, re.sub(r"{[^}]*}", "{}", r.template)) for r in table.routes}
    return found


def expand(pattern: str) -> list[str]:
    """Every path a table entry stands for: optional groups and alternatives unfolded."""

    def sequence(text: str, at: int) -> tuple[list[str], int]:
        # Alternatives at this level, each a list of expansions, until `]` or the end.
        alternatives, current = [], [""]
        while at < len(text):
            char = text[at]
            if char == "[":
                inner, at = sequence(text, at + 1)
                current = [c + i for c in current for i in ["", *inner]]
            elif char == "]":
                return alternatives + current, at + 1
            elif text.startswith("\\|", at) or char == "|":
                alternatives += current
                current = [""]
                at += 2 if char == "\\" else 1
                continue
            elif char == " ":
                at += 1
                continue
            else:
                current = [c + char for c in current]
            if char != "[":
                at += 1
        return alternatives + current, at

    paths, _ = sequence(pattern, 0)
    return [re.sub(r"{[^}]*}", "{}", path) for path in paths]


def table_entries(text: str) -> list[tuple[str, list[str]]]:
    """(method, expanded paths) of every route named in the file's endpoint tables."""
    entries, in_table = [], False
    for line in text.splitlines():
        if re.match(r"^\| *endpoint *\|", line):
            in_table = True
            continue
        if in_table and not line.startswith("|"):
            in_table = False
        if not in_table or line.startswith("|---"):
            continue
        first = line.strip()[1:].split(" | ")[0]
        for code in re.findall(r"`([^`]+)`", first):
            match = ENTRY.match(code)
            if match:
                paths = expand(match[2])
                for method in re.split(r"\\?\|", match[1]):
                    entries.append((method, paths))
    return entries


def covers(path: str, template: str) -> bool:
    if path.endswith("..."):
        return template.startswith(path[:-3])
    return path == template


def uncovered(text: str, routes: set[tuple[str, str]]) -> set[tuple[str, str]]:
    entries = table_entries(text)
    return {
        (method, template)
        for method, template in routes
        if not any(m == method and any(covers(p, template) for p in paths) for m, paths in entries)
    }


def stale(text: str, routes: set[tuple[str, str]]) -> list[str]:
    """The entries' paths no route of theirs answers."""
    return [
        f"{method} {path}"
        for method, paths in table_entries(text)
        for path in paths
        if not any(m == method and covers(path, t) for m, t in routes)
    ]


# ---- the reader -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern, expected",
    [
        pytest.param("/healthz", ["/healthz"], id="plain"),
        pytest.param("/v1/models/{name}[/versions/{v} \\| /labels/{l}]:predict",
                     ["/v1/models/{}:predict", "/v1/models/{}/versions/{}:predict",
                      "/v1/models/{}/labels/{}:predict"], id="alternatives"),
        pytest.param("/page/models[/{name}[/versions[/{v}/report \\| /{v}/plots/{plot}]]]",
                     ["/page/models", "/page/models/{}", "/page/models/{}/versions",
                      "/page/models/{}/versions/{}/report",
                      "/page/models/{}/versions/{}/plots/{}"], id="nested"),
        pytest.param("/docs[/...]", ["/docs", "/docs/..."], id="rest"),
    ],
)  # fmt: skip
def test_a_table_entry_expands_to_every_path_it_stands_for(pattern, expected):
    assert sorted(expand(pattern)) == sorted(expected)


def test_a_route_left_out_of_a_table_or_a_route_that_is_gone_is_found():
    routes = {("GET", "/healthz"), ("POST", "/v1/models/{}:classify"), ("GET", "/v2/x")}
    text = (
        "| endpoint | what |\n|---|---|\n"
        "| `GET /healthz`, `GET\\|POST /v2/...` | x |\n"
        "| `POST /v1/models/{name}:predict` | gone |\n"
        "| gRPC on 8500 | not HTTP |\n"
    )
    assert uncovered(text, routes) == {("POST", "/v1/models/{}:classify")}
    assert stale(text, routes) == ["POST /v2/...", "POST /v1/models/{}:predict"]


# ---- the tables -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def routes(tmp_path_factory):
    found = registered(tmp_path_factory.mktemp("monitoring") / "monitoring.config")
    assert ("POST", "/v1/models/{}:classify") in found  # a fake app that registers few is wrong
    assert len(found) >= 40
    return found


@pytest.mark.parametrize("name", TABLES)
def test_every_route_is_in_the_endpoint_table(name, routes):
    text = (ROOT / name).read_text()
    assert uncovered(text, routes) == set(), f"{name}: add these routes to its endpoint table"


@pytest.mark.parametrize("name", TABLES)
def test_every_endpoint_in_the_table_is_a_route(name, routes):
    text = (ROOT / name).read_text()
    assert stale(text, routes) == [], f"{name}: no route answers these"
