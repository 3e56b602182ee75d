"""Fixtures of the deployment tests (their plain helpers are in tests/support/)."""

from __future__ import annotations

import importlib.util

import pytest
from support.helpers import REPO_ROOT


@pytest.fixture(scope="session")
def make_tokens():
    """deploy/make_tokens.py as a module (a script, not a package: loaded from its path)."""
    path = REPO_ROOT / "deploy" / "make_tokens.py"
    spec = importlib.util.spec_from_file_location("make_tokens", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
