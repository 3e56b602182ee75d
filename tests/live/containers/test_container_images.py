"""The two images as built on the local base: each carries its own side only, and the trainer
its data set."""

from __future__ import annotations

import re

import pytest
from support.containers import podman
from support.helpers import REPO_ROOT


def python_in(image: str, code: str):
    return podman("run", "--rm", "--entrypoint", "python", image, "-c", code, check=False)


def test_the_trainer_image_carries_debians_fashion_mnist(images):
    listed = podman(
        "run", "--rm", "--entrypoint", "ls", images["trainer"], "/usr/share/datasets/fashion-mnist"
    ).stdout.split()
    for split in ("train", "t10k"):
        for kind in ("images-idx3", "labels-idx1"):
            assert f"{split}-{kind}-ubyte.gz" in listed, listed


@pytest.mark.parametrize(
    ("target", "absent"),
    [
        pytest.param("api", "training", id="no-training-code-in-the-api"),
        pytest.param("trainer", "starlette", id="no-web-framework-in-the-trainer"),
        pytest.param("trainer", "service", id="no-service-code-in-the-trainer"),
    ],
)
def test_each_image_carries_its_own_side_only(images, target, absent):
    result = python_in(images[target], f"import {absent}")
    assert result.returncode == 1 and "ModuleNotFoundError" in result.stderr, result.stderr
    assert python_in(images[target], "import artifact").returncode == 0


def locked_tensorflow(lock: str) -> str:
    (pin,) = re.findall(r"^tensorflow==(\S+)", (REPO_ROOT / lock).read_text(), re.M)
    return pin


@pytest.mark.parametrize(
    ("target", "lock"),
    [
        pytest.param("api", "requirements-service.lock", id="api-on-current-tensorflow"),
        pytest.param("trainer", "requirements-training.lock", id="trainer-on-tensorflow-2.15"),
    ],
)
def test_each_image_runs_its_sides_tensorflow(images, target, lock):
    """Two TensorFlows (docs/architecture.md): the api image the service's, the trainer 2.15's
    with tf.estimator, each as its lock pins it."""
    result = python_in(
        images[target], "import importlib.metadata as m; print(m.version('tensorflow'))"
    )
    assert result.stdout.strip() == locked_tensorflow(lock), result.stderr
    estimator = python_in(images[target], "import tensorflow_estimator")
    assert (estimator.returncode == 0) == (target == "trainer"), estimator.stderr
