"""service/server.py is the one module that touches uvicorn's internals: each is named in
UVICORN_INTERNALS, and the pinned uvicorn must have every one (the server refuses to start
otherwise, naming what is missing)."""

from __future__ import annotations

import ast
import re

import pytest
import uvicorn
from support.helpers import REPO_ROOT as ROOT

from service import server
from service.server import UVICORN_INTERNALS, Drain, guarded_protocol, missing_uvicorn_internals


def test_the_pinned_uvicorn_has_every_internal_the_server_uses():
    assert missing_uvicorn_internals() == []
    names = {name for kinds in UVICORN_INTERNALS.values() for group in kinds.values()
             for name in group}  # fmt: skip
    assert {"cycle", "keep_alive", "connection_made", "handle_exit"} <= names


def test_a_uvicorn_that_lacks_one_is_named_clearly(monkeypatch):
    class Older:
        def __init__(self):
            self.loop = None

        def data_received(self, data):
            pass

    internals = {Older: {"methods": ("data_received", "on_message_begin"),
                         "attributes": ("loop", "cycle")}}  # fmt: skip
    assert missing_uvicorn_internals(internals) == ["Older.on_message_begin()", "Older.cycle"]
    monkeypatch.setattr(server, "UVICORN_INTERNALS", internals)
    monkeypatch.setattr(server.missing_uvicorn_internals, "__defaults__", (internals,))
    with pytest.raises(
        RuntimeError, match=r"uvicorn .* lacks .*Older\.on_message_begin\(\), Older\.cycle"
    ):
        guarded_protocol(16 * 1024, 10.0, Drain())


def test_every_private_name_the_server_touches_is_listed():
    """Each `self._x` or `._x` the module reads from uvicorn's objects is in the list: the
    server's own private names are the only ones it may use unlisted."""
    tree = ast.parse((ROOT / "service" / "server.py").read_text())
    own = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    targets = [t for node in ast.walk(tree) if isinstance(node, ast.Assign) for t in node.targets]
    targets += [node.target for node in ast.walk(tree) if isinstance(node, ast.AnnAssign)]
    own |= {target.attr for target in targets if isinstance(target, ast.Attribute)}
    used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    listed = {name for kinds in UVICORN_INTERNALS.values() for group in kinds.values()
              for name in group}  # fmt: skip
    private = {name for name in used if name.startswith("_") and not name.startswith("__")}
    assert private - own - listed == set()


@pytest.mark.parametrize(
    "module",
    sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "service").rglob("*.py")),
)
def test_no_other_module_imports_uvicorn(module):
    if module == "service/server.py":
        return
    tree = ast.parse((ROOT / module).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}  # fmt: skip
    imported |= {node.module for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}  # fmt: skip
    internal = sorted(name for name in imported if name.startswith("uvicorn."))
    assert internal == [], f"{module} imports {internal}: only service/server.py may"


def test_uvicorn_is_pinned_exactly_with_its_web_stack():
    text = (ROOT / "pyproject.toml").read_text()
    for package, version in (("uvicorn", uvicorn.__version__), ("fastapi", None),
                             ("starlette", None), ("httptools", None)):  # fmt: skip
        pins = [line for line in text.splitlines() if re.match(rf'\s*"{package}[\[=<>]', line)]
        assert len(pins) == 1 and "==" in pins[0], (package, pins)
        if version is not None:
            assert f"=={version}" in pins[0]
