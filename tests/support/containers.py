"""Podman for the container tier (tests/live/containers): the project's private podman setup
(tools/podman.py), containers started from the built images, and waiting on them.

Plain helpers, no fixtures: tests/live/containers/conftest.py holds them. Containers publish
their ports on 127.0.0.1 only, on free host ports (`servers.free_ports`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from support.helpers import REPO_ROOT
from support.servers import MODEL_NAME, free_ports

# tools/podman.py is a script, not a package: loaded from its file.
_spec = importlib.util.spec_from_file_location("tools_podman", REPO_ROOT / "tools" / "podman.py")
podman_tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(podman_tool)

APP_UID = podman_tool.APP_UID
START_TIMEOUT_SECONDS = 120.0
# Where a test's small MNIST-format data is mounted in the trainer (the image's own data set,
# Debian's, takes a minute a run just to evaluate on here).
DATA_MOUNT = "/data"
# The manifests' tokens mount (deploy/kubernetes/base/api-deployment.yaml).
TOKENS_DIR = "/run/secrets/api-tokens"
# The hardening docker-compose.yml and the Kubernetes manifests give every container: a
# read-only root filesystem, a small writable /tmp, no capabilities, no privilege escalation.
HARDENING = (
    "--read-only",
    "--tmpfs", "/tmp:rw,size=256m,mode=1777",
    "--cap-drop", "ALL",
    "--security-opt", "no-new-privileges",
)  # fmt: skip


def podman(*args: str, timeout: float = 600.0, check: bool = True) -> subprocess.CompletedProcess:
    """`podman ARGS` on the private setup; with check, a failure fails the test with its output."""
    result = subprocess.run(
        ["podman", *args],
        env=podman_tool.podman_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and result.returncode != 0:
        pytest.fail(
            f"podman {' '.join(args)} exited with {result.returncode}:\n"
            f"{result.stdout}\n{result.stderr}"
        )
    return result


def inspect(name: str) -> dict:
    """`podman inspect` of one container."""
    (data,) = json.loads(podman("inspect", name).stdout)
    return data


def give_to_app_user(path: Path) -> None:
    """Make a host folder (and everything in it) the containers' user's, as fsGroup would."""
    for root, dirs, files in os.walk(path):
        for entry in (root, *(os.path.join(root, name) for name in dirs + files)):
            os.chown(entry, APP_UID, APP_UID)


@dataclass
class ApiContainer:
    """An api container on free host ports: HTTP (`url`) and TF Serving's gRPC (`grpc_address`)."""

    name: str
    http_port: int
    grpc_port: int
    token: str
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def logs(self) -> str:
        result = podman("logs", self.name, check=False)
        return result.stdout + result.stderr

    def wait_ready(self, timeout: float = START_TIMEOUT_SECONDS) -> None:
        """Poll /readyz until 200; fail with the container's log if it exits or never does."""
        deadline = time.monotonic() + timeout
        with httpx.Client(base_url=self.url, timeout=5.0) as client:
            while True:
                state = inspect(self.name)["State"]
                if not state["Running"]:
                    pytest.fail(
                        f"container {self.name} exited with {state['ExitCode']} before /readyz "
                        f"answered 200; its log:\n{self.logs()}"
                    )
                try:
                    if client.get("/readyz").status_code == 200:
                        return
                except httpx.TransportError:
                    pass  # not listening yet
                if time.monotonic() > deadline:
                    pytest.fail(
                        f"container {self.name}: /readyz not 200 within {timeout:.0f} s; "
                        f"its log:\n{self.logs()}"
                    )
                time.sleep(0.5)


def start_api(
    name: str, image: str, repository: Path, tokens_dir: Path, token: str, **settings: str
) -> ApiContainer:
    """Run the api image as the Kubernetes Deployment does (its environment, the model
    repository and the tokens mounted read-only, the hardening above) and wait until ready."""
    http_port, grpc_port = free_ports(2)
    env = {
        "BACKEND": "tensorflow",
        "HOST": "0.0.0.0",
        "PORT": "8000",
        "GRPC_PORT": "8500",
        "MODEL_NAME": MODEL_NAME,
        "MODEL_BASE_PATH": "/models",
        "MODEL_CONFIG_FILE": "/models/models.config",
        "MODEL_CONFIG_FILE_POLL_SECONDS": "1",
        "MODEL_POLL_SECONDS": "1",
        "AUTH_TOKENS_FILE": f"{TOKENS_DIR}/tokens",
        # The tests' gRPC client is on the host's loopback, over the published port.
        "GRPC_ALLOW_PLAINTEXT_TOKENS": "true",
        "INTRA_OP_THREADS": "2",
        **settings,
    }
    podman(
        "run", "--detach", "--name", name,
        *HARDENING,
        "--volume", f"{repository}:/models:ro",
        "--volume", f"{tokens_dir}:{TOKENS_DIR}:ro",
        "--publish", f"127.0.0.1:{http_port}:8000",
        "--publish", f"127.0.0.1:{grpc_port}:8500",
        *(f"--env={key}={value}" for key, value in env.items()),
        image,
    )  # fmt: skip
    container = ApiContainer(name, http_port, grpc_port, token, env)
    try:
        container.wait_ready()
    except pytest.fail.Exception:
        podman("rm", "--force", name, check=False)
        raise
    return container


def run_trainer(
    image: str,
    repository: Path,
    args: list[str],
    *,
    name: str,
    data: Path | None = None,
    feedback: Path | None = None,
    models_read_only: bool = False,
    staging: Path | None = None,
    staging_read_only: bool = False,
) -> subprocess.CompletedProcess:
    """`python -m training ARGS` in a trainer container as the Kubernetes Jobs run it: the model
    repository at /models (runs under /models/runs), read-write unless models_read_only, data
    read-only at DATA_MOUNT, the feedback read-only, the retrain's staging volume at /staging
    when given, the hardening above and no network (the trainers' NetworkPolicy). Returns the
    finished run (its exit code is the caller's to judge)."""
    mounts = ["--volume", f"{repository}:/models" + (":ro" if models_read_only else "")]
    if data is not None:
        mounts += ["--volume", f"{data}:{DATA_MOUNT}:ro"]
    if feedback is not None:
        mounts += ["--volume", f"{feedback}:/feedback:ro"]
    if staging is not None:
        mounts += ["--volume", f"{staging}:/staging" + (":ro" if staging_read_only else "")]
    return podman(
        "run", "--rm", "--name", name, *HARDENING, *mounts, "--network", "none",
        "--env", "TF_CPP_MIN_LOG_LEVEL=2",
        image, *args,
        check=False,
    )  # fmt: skip
