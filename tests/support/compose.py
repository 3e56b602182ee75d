"""docker-compose files as `docker-compose config` renders them, and what their services say
(Debian's docker-compose, no engine needed)."""

from __future__ import annotations

import functools
import shutil
import subprocess

import pytest
import yaml

from support.helpers import REPO_ROOT

COMPOSE = "docker-compose"


def compose_config(*files: str) -> dict:
    """`docker-compose -f ... config`, parsed (a fresh copy each call); fails the test with
    compose's own complaint."""
    return yaml.safe_load(_rendered(files))


@functools.cache
def _rendered(files: tuple[str, ...]) -> str:
    # Once per process: each run of Debian's docker-compose costs about a second of CPU, and
    # the files do not change during a test run.
    executable = shutil.which(COMPOSE)
    if executable is None:
        pytest.fail(
            f"{COMPOSE} is not installed: run `make setup` (it installs Debian's docker-compose) "
            "or `apt-get install docker-compose`"
        )
    command = [executable]
    for name in files:
        command += ["-f", name]
    result = subprocess.run(
        [*command, "config"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"{' '.join(command)} config failed:\n{result.stderr}"
    return result.stdout


def port_bindings(service: dict) -> list[tuple[str | None, int, int]]:
    """(host address or None, host port, container port) of each published port: compose
    renders a port bound to an address as `ADDRESS:PUBLISHED:TARGET/PROTOCOL`."""
    bindings = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            bindings.append((None, int(port["published"]), int(port["target"])))
        else:
            address, host_port, target = port.split("/")[0].rsplit(":", 2)
            bindings.append((address, int(host_port), int(target)))
    return bindings


def env(service: dict) -> dict[str, str]:
    return {k: str(v) for k, v in (service.get("environment") or {}).items()}
