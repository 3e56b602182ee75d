"""service/server.py is the one module that touches uvicorn's internals: each is named in
UVICORN_INTERNALS, and the pinned uvicorn must have every one (the server refuses to start
otherwise, naming what is missing)."""

from __future__ import annotations

import ast
import asyncio
import re
import socket

import pytest
import uvicorn
from support.helpers import REPO_ROOT as ROOT

from service import server
from service.server import (
    EVENT_LOOP,
    UVICORN_INTERNALS,
    Drain,
    guarded_protocol,
    missing_uvicorn_internals,
)


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
    own = {node.name for node in ast.walk(tree)
           if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}  # fmt: skip
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


def accepted_within_turns(loop_name: str, clients: int, turns: int) -> int:
    """How many of `clients` connections waiting in the listen queue the named uvicorn event
    loop has accepted after `turns` turns of it (counted in turns, not time)."""
    accepted = []

    class Counting(asyncio.Protocol):
        def connection_made(self, transport):
            accepted.append(transport)

    async def run() -> int:
        loop = asyncio.get_running_loop()
        listener = socket.create_server(("127.0.0.1", 0), backlog=clients)
        server = await loop.create_server(Counting, sock=listener, backlog=clients)
        # Connected by the kernel, waiting in the listen queue: the loop has not turned yet.
        sockets = [socket.create_connection(listener.getsockname()) for _ in range(clients)]
        try:
            for _ in range(turns):
                await asyncio.sleep(0)
            return len(accepted)
        finally:
            for transport in accepted:
                transport.close()
            for sock in sockets:
                sock.close()
            server.close()

    loop_factory = uvicorn.Config(app=None, loop=loop_name).get_loop_factory()
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(run())


def test_the_server_accepts_every_waiting_connection_in_a_few_turns_of_its_loop():
    # Under load one turn of the loop takes tens of milliseconds: a loop that accepts one
    # connection a turn (uvloop's) left new clients in the listen queue for seconds.
    assert accepted_within_turns(EVENT_LOOP, clients=40, turns=10) == 40


def test_uvloop_accepts_one_connection_a_turn():
    # Why EVENT_LOOP is not uvloop; when this fails, uvloop accepts more per turn again.
    pytest.importorskip(
        "uvloop",
        reason="uvloop is not installed: the service does not use it, so there is "
        "nothing to compare (uvicorn[standard] installs it)",
    )
    assert accepted_within_turns("uvloop", clients=40, turns=10) <= 10
