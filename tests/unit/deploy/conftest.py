"""The deployment tests here use the helpers of tests/deploy (manifest_harness) and of
tests/service (fakes), as the tests there do: those folders on sys.path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[2]
for folder in (TESTS / "deploy", TESTS / "service"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


@pytest.fixture(scope="session")
def make_tokens():
    """deploy/make_tokens.py as a module (a script, not a package: loaded from its path)."""
    path = TESTS.parent / "deploy" / "make_tokens.py"
    spec = importlib.util.spec_from_file_location("make_tokens", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
