"""The venvs of the clients that cannot share the project's (tests/support/client_venvs.py):
KServe's hashed lock, the stamp that keeps an installed venv until its lock changes, and an
install that tells an unreachable package index (skip: cannot run here) from any other failure
(fail). uv runs here only against loopback indexes: one that refuses, one that is empty."""

from __future__ import annotations

import http.server
import shutil
import subprocess
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from support import client_venvs
from support.servers import free_port


def pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line and not line.startswith("-"):
            name, version = line.split(" ")[0].split("==")
            found[name.lower()] = version
    return found


def test_the_kserve_lock_pins_what_its_in_file_asks_for():
    lock = pins(client_venvs.lock_file("kserve"))
    for line in client_venvs.in_file("kserve").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            assert requirement.specifier.contains(lock[requirement.name]), requirement
    assert lock["kserve"] == "0.21.0"
    assert int(lock["protobuf"].split(".")[0]) >= 6
    assert {"fastapi", "starlette", "uvicorn"} <= lock.keys()


def test_the_lock_says_how_to_rewrite_it():
    header = client_venvs.lock_file("kserve").read_text().splitlines()[:2]
    assert header[1] == f"#    {client_venvs.RELOCK_COMMAND}"
    command = client_venvs.relock_command("kserve")
    assert "--generate-hashes" in command
    assert command[command.index("--custom-compile-command") + 1] == client_venvs.RELOCK_COMMAND
    # Resolved on its own: the service's lock would refuse kserve's own web stack.
    assert "--constraint" not in command and "requirements-service.lock" not in command


@pytest.fixture
def clients(tmp_path, monkeypatch) -> Path:
    """A copy of tests/support/clients to change: the venvs' base folder is tmp_path/venvs."""
    directory = tmp_path / "clients"
    shutil.copytree(client_venvs.CLIENTS_DIR, directory)
    monkeypatch.setattr(client_venvs, "CLIENTS_DIR", directory)
    return directory


def one_package_lock(clients: Path) -> None:
    """The copied kserve lock cut to its first entry: uv asks the index for one package."""
    lock = clients / "requirements-kserve.lock"
    first = lock.read_text().split("\n    # via", 1)[0]
    assert first.count("==") == 1 and "--hash=sha256:" in first, first
    lock.write_text(first + "\n")


def fake_venv(base: Path) -> Path:
    python = client_venvs.python("kserve", base)
    python.parent.mkdir(parents=True)
    python.write_text("")
    return python


def test_an_installed_venv_is_reused_until_its_lock_changes(clients, tmp_path, monkeypatch):
    base = tmp_path / "venvs"
    python = fake_venv(base)
    assert not client_venvs.is_installed("kserve", base)  # no stamp yet
    client_venvs.stamp("kserve", base).write_text(client_venvs.fingerprint("kserve") + "\n")
    assert client_venvs.is_installed("kserve", base)

    def refuse(*args, **kwargs):
        raise AssertionError(f"nothing should run for an installed venv: {args}")

    monkeypatch.setattr(subprocess, "run", refuse)
    assert client_venvs.ensure("kserve", base, log=refuse) == python

    lock = client_venvs.lock_file("kserve")
    lock.write_text(lock.read_text() + "\n")
    assert not client_venvs.is_installed("kserve", base)


def test_the_install_is_hash_checked_from_the_lock(tmp_path):
    python = tmp_path / "bin" / "python"
    command = client_venvs.install_command("kserve", python)
    assert command[1:3] == ["pip", "install"]
    assert command[command.index("--python") + 1] == str(python)
    assert "--require-hashes" in command
    assert command[command.index("-r") + 1] == str(client_venvs.lock_file("kserve"))


@pytest.fixture
def loopback_uv(monkeypatch) -> None:
    """uv with no cache, no retries and no other index than the one a test sets."""
    monkeypatch.setenv("UV_NO_CACHE", "1")
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")
    for name in ("UV_EXTRA_INDEX_URL", "UV_FIND_LINKS", "UV_OFFLINE"):
        monkeypatch.delenv(name, raising=False)


def test_an_index_that_cannot_be_reached_is_told_apart(clients, tmp_path, monkeypatch, loopback_uv):
    monkeypatch.setenv("UV_INDEX_URL", f"http://127.0.0.1:{free_port()}/simple")  # nobody there
    one_package_lock(clients)
    base = tmp_path / "venvs"
    with pytest.raises(client_venvs.IndexUnreachable, match="Connection refused"):
        client_venvs.ensure("kserve", base, log=lambda *a: None)
    assert not client_venvs.is_installed("kserve", base)
    assert "Failed to fetch" in (client_venvs.venv_dir("kserve", base) / "install.log").read_text()


@pytest.fixture
def empty_index(tmp_path) -> Iterator[str]:
    """A package index on loopback that has no package at all (every page 404)."""
    root = tmp_path / "index"
    (root / "simple").mkdir(parents=True)
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    server.shutdown()
    server.server_close()
    thread.join()


def test_a_package_the_index_lacks_is_a_failure_not_a_skip(
    clients, tmp_path, monkeypatch, loopback_uv, empty_index
):
    monkeypatch.setenv("UV_INDEX_URL", empty_index)
    one_package_lock(clients)
    base = tmp_path / "venvs"
    with pytest.raises(RuntimeError, match="not found in the package registry") as caught:
        client_venvs.ensure("kserve", base, log=lambda *a: None)
    assert not isinstance(caught.value, client_venvs.IndexUnreachable)
    assert not client_venvs.is_installed("kserve", base)


def test_the_command_line_names_an_unknown_client(capsys):
    with pytest.raises(SystemExit) as caught:
        client_venvs.main(["setup", "seldon"])
    assert caught.value.code == 2
    assert "unknown client seldon; the clients are kserve" in capsys.readouterr().err
