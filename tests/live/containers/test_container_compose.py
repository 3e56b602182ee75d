"""docker-compose.yml itself, brought up and down by Debian's docker-compose against podman's
Docker-compatible API (`podman system service` on a private socket): the api service serves
the model repository, the `train` profile's trainer adds a version it picks up by itself.

Only `api` and the trainer: the `tensorflow/serving` image cannot be pulled where this project
is tested (no registry is reachable), so `tfserving` and `api-tfserving` are not started.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from support.containers import DATA_MOUNT, give_to_app_user, podman, podman_tool
from support.helpers import REPO_ROOT, ok_json, require_tool
from support.servers import MODEL_NAME, free_port

SOCKET_TIMEOUT_SECONDS = 30.0
READY_TIMEOUT_SECONDS = 120.0
V1 = f"/v1/models/{MODEL_NAME}"


@pytest.fixture(scope="module")
def docker_host(images, tmp_path_factory):
    """DOCKER_HOST of a `podman system service` on the private setup, stopped afterwards."""
    socket_path = tmp_path_factory.mktemp("podman-service") / "podman.sock"
    service = subprocess.Popen(
        ["podman", "system", "service", "--time", "0", f"unix://{socket_path}"],
        env=podman_tool.podman_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"unix://{socket_path}"
    deadline = time.monotonic() + SOCKET_TIMEOUT_SECONDS
    transport = httpx.HTTPTransport(uds=str(socket_path))
    with httpx.Client(transport=transport, base_url="http://podman", timeout=5) as client:
        while True:
            if service.poll() is not None:
                pytest.fail(f"podman system service exited: {service.stderr.read().decode()}")
            try:
                if client.get("/_ping").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "podman system service never answered /_ping"
            time.sleep(0.2)
    yield url
    service.terminate()
    service.wait(30)


@pytest.fixture(scope="module")
def project(tmp_path_factory, repository, run_id, docker_host, container_data):
    """A compose project directory (./models with version 1, the tokens secret) and the
    environment that runs docker-compose.yml there on a free port."""
    require_tool("docker-compose", "docker-compose")
    directory = tmp_path_factory.mktemp("compose-project")
    models = directory / "models"
    models.mkdir()
    for config in ("models.config", "batching_parameters.txt", "monitoring.config"):
        shutil.copy(repository / config, models / config)
    shutil.copytree(repository / MODEL_NAME / "1", models / MODEL_NAME / "1")
    token = secrets.token_urlsafe(32)
    tokens = directory / "secrets" / "api-tokens"
    tokens.parent.mkdir()
    tokens.write_text(f"{token} predict,status\n")
    give_to_app_user(directory)
    env = {
        **os.environ,
        "DOCKER_HOST": docker_host,
        "COMPOSE_PROJECT_NAME": f"{run_id}-compose".replace("-", ""),
        "API_PORT": str(free_port()),
        "APP_UID": str(podman_tool.APP_UID),
    }
    env["SMALL_DATA_DIR"] = str(container_data)
    yield directory, env, token
    compose(directory, env, "down", "--volumes", "--timeout", "40", check=False)


def compose(directory: Path, env: dict, *args: str, check: bool = True):
    command = [
        "docker-compose", "--file", str(REPO_ROOT / "docker-compose.yml"),
        "--project-directory", str(directory), *args,
    ]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if check:
        assert result.returncode == 0, f"{' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result


def project_containers(env: dict) -> list[str]:
    label = f"label=com.docker.compose.project={env['COMPOSE_PROJECT_NAME']}"
    listed = podman("ps", "--all", "--filter", label, "--format", "{{.Names}}").stdout
    return listed.split()


def wait_for_version(url: str, token: str, version: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    headers = {"Authorization": f"Bearer {token}"}
    states: dict = {}
    while True:
        try:
            answer = httpx.get(f"{url}{V1}", headers=headers, timeout=5)
            if answer.status_code == 200:
                states = {e["version"]: e["state"] for e in answer.json()["model_version_status"]}
                if states.get(version) == "AVAILABLE":
                    return
        except httpx.TransportError:
            pass  # not listening yet
        assert time.monotonic() < deadline, f"version {version} never AVAILABLE: {states}"
        time.sleep(0.5)


def test_compose_up_serves_trains_a_new_version_and_down_removes_everything(project):
    directory, env, token = project
    compose(directory, env, "up", "--detach", "--no-build", "api")
    url = f"http://127.0.0.1:{env['API_PORT']}"
    wait_for_version(url, token, "1")
    answer = httpx.post(
        f"{url}{V1}:predict",
        content=(REPO_ROOT / "examples" / "predict.json").read_bytes(),
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert ok_json(answer)["model_version"] == "1"

    # The trainer service as it is, on the small data (the image's own takes minutes here).
    compose(
        directory, env, "--profile", "train", "run", "--rm",
        "--volume", f"{env['SMALL_DATA_DIR']}:{DATA_MOUNT}:ro", "trainer",
        "train", "--data-dir", DATA_MOUNT,
        "--model-dir", "/app/runs/fashion_mnist", "--export-dir", "/models/fashion_mnist",
        "--max-steps", "10", "--batch-size", "50", "--seed", "0",
    )  # fmt: skip
    assert (directory / "models" / MODEL_NAME / "2" / "saved_model.pb").is_file()
    wait_for_version(url, token, "2")  # picked up by the running api, no restart

    assert project_containers(env), "compose started no container"
    compose(directory, env, "down", "--volumes", "--timeout", "40")
    assert project_containers(env) == []
