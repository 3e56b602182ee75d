"""service/server.py runs a stock Granian through its public API: no module of the service
touches a private name of the web stack, its versions are ranges, and SIGTERM drains."""

from __future__ import annotations

import ast
import asyncio
import re

import pytest
from support.helpers import REPO_ROOT as ROOT

from service.server import Drain

WEB_STACK = ("uvicorn", "starlette", "fastapi", "httptools", "h11", "granian", "hypercorn")
SERVICE_MODULES = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "service").rglob("*.py"))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def web_stack_privates(source: str) -> list[str]:
    """What a module's source uses of the web stack beyond its public API: a private module
    or name imported, a uvicorn module below `uvicorn` itself (its API is uvicorn.Config,
    uvicorn.Server and uvicorn.run), or a private attribute the module does not define."""
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        modules: list[tuple[str, list[str]]] = []
        if isinstance(node, ast.Import):
            modules = [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules = [(node.module, [alias.name for alias in node.names])]
        for module, names in modules:
            parts = module.split(".")
            if parts[0] not in WEB_STACK:
                continue
            if any(_private(part) for part in parts) or (parts[0] == "uvicorn" and len(parts) > 1):
                found.append(f"import of {module}")
            found += [f"{module}.{name}" for name in names if _private(name)]
    defined = {node.name for node in ast.walk(tree)
               if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}  # fmt: skip
    targets = [t for node in ast.walk(tree) if isinstance(node, ast.Assign) for t in node.targets]
    targets += [node.target for node in ast.walk(tree) if isinstance(node, ast.AnnAssign)]
    defined |= {t.attr for t in targets if isinstance(t, ast.Attribute)}
    defined |= {alias for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
                for item in node.body if isinstance(item, ast.Assign)
                for target in item.targets if isinstance(target, ast.Name)
                for alias in (target.id,)}  # fmt: skip
    used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    # __slots__ names count as defined where the class lists them.
    slots = set(re.findall(r'"(_\w+)"', source))
    found += [f".{name}" for name in sorted(used) if _private(name) and name not in defined | slots]
    return found


@pytest.mark.parametrize("module", SERVICE_MODULES)
def test_no_module_uses_a_private_name_of_the_web_stack(module):
    assert web_stack_privates((ROOT / module).read_text()) == []


@pytest.mark.parametrize(
    "source, expected",
    [
        pytest.param("from uvicorn.protocols.http.httptools_impl import STATUS_LINE",
                     ["import of uvicorn.protocols.http.httptools_impl"], id="uvicorn-module"),
        pytest.param("from starlette.routing import _x", ["starlette.routing._x"], id="name"),
        pytest.param("import starlette._utils", ["import of starlette._utils"], id="module"),
        pytest.param("def f(server):\n    return server.server_state._connections",
                     ["._connections"], id="attribute"),
        pytest.param("import uvicorn\nfrom starlette.responses import Response", [], id="public"),
    ],
)  # fmt: skip
def test_the_private_name_check_catches_each_kind(source, expected):
    assert web_stack_privates(source) == expected


def test_the_web_stack_is_pinned_by_ranges():
    """A security release of any of them is taken without a code review of the server."""
    text = (ROOT / "pyproject.toml").read_text()
    for package in ("granian", "starlette"):
        pins = [line for line in text.splitlines() if re.match(rf'\s*"{package}[\[=<>~]', line)]
        assert len(pins) == 1, (package, pins)
        assert "==" not in pins[0] and ">=" in pins[0], (package, pins)


def test_sigterm_drains_then_stops_and_a_second_stops_at_once():
    events = []

    async def run() -> None:
        drain = Drain(lambda: events.append("server stopped"), 0.05,
                      lambda: events.append("drain"), on_stop=lambda: events.append("stop"))  # fmt: skip
        drain.sigterm()
        assert events == ["drain"] and not drain.stopped
        while not drain.stopped:
            await asyncio.sleep(0.01)
        assert events == ["drain", "stop", "server stopped"]
        events.clear()
        again = Drain(lambda: events.append("server stopped"), 60,
                      lambda: events.append("drain"), on_stop=lambda: events.append("stop"))  # fmt: skip
        again.sigterm()
        again.sigterm()  # the second: now, not after the drain
        assert again.stopped
        again.stop()  # stopped once
        assert events == ["drain", "stop", "server stopped"]

    asyncio.run(run())
