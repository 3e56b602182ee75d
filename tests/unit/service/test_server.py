"""service/server.py runs a stock uvicorn through its public options: no module of the service
touches a private name of the web stack, its versions are ranges, SIGTERM drains, and the
event loop accepts every waiting connection."""

from __future__ import annotations

import ast
import asyncio
import re
import socket

import pytest
import uvicorn
from support.helpers import REPO_ROOT as ROOT

from service.server import EVENT_LOOP, Drain

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
    for package in ("uvicorn", "starlette", "httptools"):
        pins = [line for line in text.splitlines() if re.match(rf'\s*"{package}[\[=<>~]', line)]
        assert len(pins) == 1, (package, pins)
        assert "==" not in pins[0] and ">=" in pins[0], (package, pins)


class FakeServer:
    should_exit = False


def test_sigterm_drains_then_stops_and_a_second_stops_at_once():
    events = []

    async def run() -> None:
        server = FakeServer()
        drain = Drain(server, 0.05, lambda: events.append("drain"),
                      on_stop=lambda: events.append("stop"))  # fmt: skip
        drain.sigterm()
        assert events == ["drain"] and not server.should_exit
        while not server.should_exit:
            await asyncio.sleep(0.01)
        assert events == ["drain", "stop"]
        again = Drain(FakeServer(), 60, lambda: events.append("drain 2"),
                      on_stop=lambda: events.append("stop 2"))  # fmt: skip
        again.sigterm()
        again.sigterm()  # the second: now, not after the drain
        assert again.server.should_exit
        again.stop()  # gRPC is stopped once
        assert events == ["drain", "stop", "drain 2", "stop 2"]

    asyncio.run(run())


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
