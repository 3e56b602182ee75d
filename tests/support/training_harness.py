"""Plain helpers shared by the training tests (fixtures live in conftest.py).

`serve(model_folder)` runs the real service app (service.app.create_app with the in-process
TensorFlow backend, what `python -m service` runs) over a model repository through Starlette's
TestClient, so a test sees exactly what a client would get for a version.
"""

from __future__ import annotations

import contextlib
import io
import struct
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from artifact.contract import FASHION_MNIST_LABELS
from training.__main__ import main


def call_main(*argv) -> int:
    """main() with str arguments; a KeyboardInterrupt escaping it fails the test, not the run."""
    try:
        return main([str(a) for a in argv])
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt escaped main() instead of exiting with 130")


@contextlib.contextmanager
def serve(model_folder: Path) -> Iterator:
    """A TestClient on the service app serving a model folder (MODEL_BASE_PATH/MODEL_NAME)."""
    with warnings.catch_warnings():
        # Starlette deprecates its httpx-based TestClient in favour of a package not installed.
        warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
        from fastapi.testclient import TestClient

    from service.app import create_app
    from service.backends.factory import make_backend
    from service.settings import Settings, initial_entries

    settings = Settings(
        model_base_path=str(model_folder.parent), model_name=model_folder.name, model_poll_seconds=0
    )
    backend = make_backend(settings, initial_entries(settings))
    with TestClient(create_app(settings, backend)) as client:
        yield client


def service_predict_pixels(client, images: np.ndarray) -> list[dict]:
    """The service's /predict answer for uint8 images [n, 28, 28] sent as JSON integers."""
    response = client.post("/predict", json={"instances": images.astype(int).tolist()})
    assert response.status_code == 200, response.text
    return response.json()["predictions"]


def checkpoint_step(model_dir: Path) -> int:
    checkpoint = tf.train.latest_checkpoint(str(model_dir))
    assert checkpoint is not None, f"no checkpoint in {model_dir}"
    return int(tf.train.load_variable(checkpoint, "global_step"))


def integer_dirs(base: Path) -> list[str]:
    return sorted(p.name for p in base.iterdir() if p.name.isdigit()) if base.exists() else []


def write_idx_images(path: Path, images: np.ndarray) -> Path:
    """A plain (not gzipped) IDX images file."""
    n, rows, cols = images.shape
    path.write_bytes(struct.pack(">IIII", 2051, n, rows, cols) + images.tobytes())
    return path


LABELS = FASHION_MNIST_LABELS
# The `comparison` fixture's budget (conftest.py): every kind trains this many steps of this
# batch size.
COMPARE_STEPS = 20
COMPARE_BATCH_SIZE = 50

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_real_png(
    path: Path, min_width: int, min_height: int, title: str | None = None
) -> np.ndarray:
    """A PNG that decodes, of at least this size, with a drawing on it (and, given a title,
    naming what it shows in its Title text chunk, as training/plots.py writes it); its pixels."""
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE), path
    assert len(data) > 15_000, f"{path}: {len(data)} bytes is too small for a real plot"
    image = Image.open(io.BytesIO(data))
    assert image.format == "PNG"
    assert image.width >= min_width and image.height >= min_height, image.size
    if title is not None:
        assert image.info.get("Title") == title, (path, image.info)
    pixels = np.asarray(image.convert("RGB"))
    # Mostly white paper, but with plenty drawn on it.
    drawn = (pixels.min(axis=2) < 200).mean()
    assert 0.02 < drawn < 0.9, f"{path}: {drawn:.1%} of the pixels are drawn"
    return pixels
