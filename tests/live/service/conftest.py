"""Fixtures: a real `python -m service` process serving a copy of the session's trained model;
one serving models of other contracts side by side (`any_server`; the models, `any_models`,
are the live tier's: tests/live/conftest.py); one serving models as users export them
beyond the trainer's kinds (`exports_server`; the models, `user_exports`,
support/user_exports.py).

The session fixture `trained_model` (tests/live/conftest.py) provides the exported model; every
server here serves a copy of its model repository (or an empty one), so tests that add
versions never disturb the others.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.servers import Server, copy_repository, serve_models, start_server
from support.shared import shared_folder
from support.user_exports import make_user_exports


@pytest.fixture(scope="module")
def server(trained_model, tmp_path_factory) -> Iterator[Server]:
    """The main server: a copy of the trained repository, small limits, no polling."""
    root = tmp_path_factory.mktemp("service")
    base = copy_repository(trained_model, root)
    srv = start_server(root / "server.log", MODEL_BASE_PATH=str(base))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60.0) as c:
        yield c


@pytest.fixture(scope="module")
def any_server(any_models, tmp_path_factory) -> Iterator[Server]:
    """One `python -m service` serving every model of `any_models` from one model config,
    gRPC on."""
    srv = serve_models(any_models, tmp_path_factory.mktemp("any-service"))
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def user_exports(tmp_path_factory) -> dict[str, Path]:
    """Models as users export them (support/user_exports.py), made once per run: their
    folders by model name."""
    root = shared_folder(tmp_path_factory, "user-exports", make_user_exports)
    return {path.name: path for path in sorted((root / "models").iterdir())}


@pytest.fixture(scope="module")
def exports_server(user_exports, tmp_path_factory) -> Iterator[Server]:
    """One `python -m service` serving every model of `user_exports` from one model config."""
    srv = serve_models(user_exports, tmp_path_factory.mktemp("exports-service"))
    yield srv
    srv.stop()
