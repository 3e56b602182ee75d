"""Plain helpers shared by the training tests (fixtures live in conftest.py).

`serve(model_folder)` runs the real service (`python -m service`, in the service side's own
interpreter) over a model repository, so a test sees exactly what a client would get for a
version the trainer exported.
"""

from __future__ import annotations

import contextlib
import io
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from artifact.contract import FASHION_MNIST_LABELS
from support.servers import serve_models as support_serve_models
from support.servers import start_server
from training.__main__ import main


def call_main(*argv) -> int:
    """main() with str arguments; a KeyboardInterrupt escaping it fails the test, not the run."""
    try:
        return main([str(a) for a in argv])
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt escaped main() instead of exiting with 130")


@contextlib.contextmanager
def serve(model_folder: Path) -> Iterator[httpx.Client]:
    """The real service serving a model folder (MODEL_BASE_PATH/MODEL_NAME), and an HTTP client
    on it: `python -m service` in the service side's interpreter (support/sides.py), which runs
    current TensorFlow, not this process's 2.15."""
    with tempfile.TemporaryDirectory(prefix="serve-") as logs:
        server = start_server(
            Path(logs) / "service.log",
            MODEL_BASE_PATH=str(model_folder.parent),
            MODEL_NAME=model_folder.name,
            MAX_BODY_BYTES=str(8 * 1024 * 1024),
        )
        try:
            with httpx.Client(base_url=server.url, timeout=60) as client:
                yield client
        finally:
            server.stop()


@contextlib.contextmanager
def serve_models(models: dict[str, Path]) -> Iterator[httpx.Client]:
    """`serve` for several models at once (name -> model folder), from one model config: one
    start of the service for them all."""
    with tempfile.TemporaryDirectory(prefix="serve-") as logs:
        server = support_serve_models(models, Path(logs), MAX_BODY_BYTES=str(8 * 1024 * 1024))
        try:
            with httpx.Client(base_url=server.url, timeout=60) as client:
                yield client
        finally:
            server.stop()


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
