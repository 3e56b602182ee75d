"""Session-wide fixtures of the live tier: a small copy of the real data, and a model trained
on it once.

`small_data_dir` is a 600/300-image MNIST-format copy of the real Fashion-MNIST files
(`real_data_dir`, tests/conftest.py) and `trained_model` trains a tiny model on it once per
session through the real command line; `any_models`, models of other contracts. Each is made
once per `make test` run, whichever of its pytest processes asks first (support/shared.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from support.any_models import make_repository
from support.shared import shared_folder
from support.sides import run_training

from artifact import idx as data

SMALL_TRAIN_COUNT = 600
SMALL_TEST_COUNT = 300
# The trained_model fixture's run: tiny, but enough for a non-trivial evaluation report.
TRAIN_STEPS = 40
TRAIN_BATCH_SIZE = 50


class TrainedModel(NamedTuple):
    """What the `trained_model` fixture produced (all paths are inside a session tmp dir)."""

    model_dir: Path  # checkpoints and params.json, trained to TRAIN_STEPS
    export_base: Path  # the model repository folder, .../models/fashion_mnist
    version_path: Path  # the exported version, export_base / "1"
    data_dir: Path  # the small_data_dir it was trained and evaluated on
    max_steps: int  # the global step it was trained to (TRAIN_STEPS)


@pytest.fixture(scope="session")
def small_data_dir(tmp_path_factory, real_data_dir) -> Path:
    """An MNIST-format dir with the first 600 train and 300 test images of Fashion-MNIST."""

    def make(directory: Path) -> None:
        for split, count in (("train", SMALL_TRAIN_COUNT), ("test", SMALL_TEST_COUNT)):
            _, images, labels = data.load_split(real_data_dir, split)
            data.write_idx(directory, split, images[:count], labels[:count])

    return shared_folder(tmp_path_factory, "fashion-mnist-small", make)


@pytest.fixture(scope="session")
def small_test_data(small_data_dir) -> tuple[np.ndarray, np.ndarray]:
    """The small test split as uint8 images [300, 28, 28] and uint8 labels [300]."""
    _, images, labels = data.load_split(small_data_dir, "test")
    return images, labels


@pytest.fixture(scope="session")
def trained_model(tmp_path_factory, small_data_dir) -> TrainedModel:
    """A tiny CNN trained once per session with `python -m training train` and exported.

    Run in the training side's interpreter (support/sides.py), whichever side this session
    tests. Treat it as read-only: copy the model dir, or export to another folder, before
    changing it.
    """

    def make(root: Path) -> None:
        run_training(
            "train",
            "--data-dir", small_data_dir,
            "--model-dir", root / "run",
            "--export-dir", root / "models" / "fashion_mnist",
            "--max-steps", TRAIN_STEPS,
            "--batch-size", TRAIN_BATCH_SIZE,
            "--labels", "fashion",
            "--deterministic",
            "--eval-every-secs", 1,
        )  # fmt: skip

    root = shared_folder(tmp_path_factory, "trained", make)
    model_dir = root / "run"
    export_base = root / "models" / "fashion_mnist"
    versions = sorted(p for p in export_base.iterdir() if p.name.isdigit())
    assert [p.name for p in versions] == ["1"], f"expected exactly version 1, got {versions}"
    return TrainedModel(model_dir, export_base, versions[0], small_data_dir, TRAIN_STEPS)


@pytest.fixture(scope="session")
def any_models_root(tmp_path_factory) -> Path:
    """Where `any_models` lives: the models under models/, sample-data's files under sample/."""
    return shared_folder(tmp_path_factory, "any-models", make_repository)


@pytest.fixture(scope="session")
def any_models(any_models_root) -> dict[str, Path]:
    """Models of other contracts (support/any_models.py), trained a few steps once per
    session (in the training side's interpreter): their folders by model name."""
    return {path.name: path for path in sorted((any_models_root / "models").iterdir())}


@pytest.fixture(scope="session")
def sample_data(any_models_root) -> Path:
    """The folder `python -m training sample-data` wrote for `any_models`: classification.csv,
    regression.csv and shapes/."""
    return any_models_root / "sample"
