"""The container tier's session: the images built with podman, a first version trained in the
trainer container, and an api container serving it.

Where podman cannot run, every test here is skipped saying why (`pytest -ra` lists it); as root,
where `make setup` installs podman, a missing podman fails instead, as other Debian tools do.
The images' layers and the base image stay in podman's private storage between runs
(tools/podman.py), so a warm run rebuilds nothing.
"""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

import pytest
from support.containers import (
    DATA_MOUNT,
    ApiContainer,
    give_to_app_user,
    podman,
    podman_tool,
    run_trainer,
    start_api,
)
from support.helpers import REPO_ROOT

# The first version: a few steps on the live tier's small copy of Fashion-MNIST, enough for
# the retrain to beat it.
FIRST_TRAIN_STEPS = 20
TRAIN_BATCH_SIZE = 50


def _podman_or_skip() -> None:
    reason = podman_tool.cannot_run()
    if reason is not None:
        if os.geteuid() == 0 and "not installed" in reason:
            pytest.fail(f"the container tier cannot run: {reason}; `make setup` installs it")
        pytest.skip(f"the container tier cannot run here: {reason}")


@pytest.fixture(scope="session")
def images() -> dict[str, str]:
    """{target: tag} of the api and trainer images, built (or found cached) on the local base."""
    _podman_or_skip()
    try:
        return podman_tool.build_images()
    except podman_tool.PodmanError as err:
        pytest.fail(f"building the images failed: {err}")


@pytest.fixture(scope="session")
def api_image() -> str:
    """The api image's tag, built (or found cached) alone: for the tests that serve the
    repository's shipped model and need no trainer."""
    _podman_or_skip()
    env = podman_tool.podman_env()
    try:
        return podman_tool.build_image("api", podman_tool.make_base_image(env), env)
    except podman_tool.PodmanError as err:
        pytest.fail(f"building the api image failed: {err}")


@pytest.fixture(scope="session")
def shipped_model(tmp_path_factory) -> Path:
    """A host copy of the model the repository ships (models/shipped/fashion_mnist: version 1),
    readable by the containers' user: a model's folder, its versions directly in it."""
    folder = tmp_path_factory.mktemp("shipped") / "fashion_mnist"
    shutil.copytree(REPO_ROOT / "models" / "shipped" / "fashion_mnist", folder)
    give_to_app_user(folder.parent)
    return folder


@pytest.fixture(scope="session")
def run_id() -> str:
    """A prefix for this session's container names, so runs side by side never collide."""
    return f"estimator-serving-test-{os.getpid()}"


@pytest.fixture(scope="session")
def container_data(tmp_path_factory, small_data_dir) -> Path:
    """The small data, readable by the containers' user (mounted read-only at DATA_MOUNT)."""
    folder = tmp_path_factory.mktemp("container-data") / "fashion-mnist"
    shutil.copytree(small_data_dir, folder)
    give_to_app_user(folder)
    return folder


@pytest.fixture(scope="session")
def repository(tmp_path_factory, images, run_id, container_data) -> Path:
    """A host model repository (the repository's models/*.config files, as the Kubernetes
    volume is seeded) with version 1 trained and exported by the trainer container on the
    small data (tests/live/conftest.py)."""
    root = tmp_path_factory.mktemp("container-models")
    for config in ("models.config", "batching_parameters.txt", "monitoring.config"):
        shutil.copy(REPO_ROOT / "models" / config, root / config)
    give_to_app_user(root)
    result = run_trainer(
        images["trainer"],
        root,
        [
            "train",
            "--data-dir", DATA_MOUNT,
            "--model-dir", "/models/runs/fashion_mnist",
            "--export-dir", "/models/fashion_mnist",
            "--max-steps", str(FIRST_TRAIN_STEPS),
            "--batch-size", str(TRAIN_BATCH_SIZE),
            "--deterministic",
        ],
        name=f"{run_id}-train",
        data=container_data,
    )  # fmt: skip
    assert result.returncode == 0, f"training in the container failed:\n{result.stderr[-4000:]}"
    return root


@pytest.fixture(scope="session")
def tokens(tmp_path_factory) -> tuple[Path, str]:
    """(folder holding `tokens`, the predict token): the api-tokens Secret's files."""
    folder = tmp_path_factory.mktemp("api-tokens")
    token = secrets.token_urlsafe(32)
    (folder / "tokens").write_text(f"{token} predict,status\n")
    give_to_app_user(folder)
    (folder / "tokens").chmod(0o400)
    return folder, token


@pytest.fixture(scope="session")
def api(images, repository, tokens, run_id) -> ApiContainer:
    """The api container serving `repository`, as the Kubernetes Deployment runs it."""
    tokens_dir, token = tokens
    container = start_api(f"{run_id}-api", images["api"], repository, tokens_dir, token)
    yield container
    podman("rm", "--force", "--time", "0", container.name, check=False)
