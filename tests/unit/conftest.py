"""Fixtures several fast test modules share: the compose files as docker-compose renders
them (tests/unit/test_containers.py, tests/unit/deploy/test_secure_compose.py)."""

from __future__ import annotations

import pytest
from support.compose import compose_config


@pytest.fixture(scope="module")
def config() -> dict:
    return compose_config("docker-compose.yml")


@pytest.fixture(scope="module")
def gpu_config() -> dict:
    return compose_config("docker-compose.yml", "docker-compose.gpu.yml")


@pytest.fixture(scope="module")
def feedback_config() -> dict:
    """Feedback is off in docker-compose.yml; docker-compose.feedback.yml turns it on."""
    return compose_config("docker-compose.yml", "docker-compose.feedback.yml")
