"""No training/serving skew for image-folder models: the friendly /predict prepares an
uploaded file (artifact.images.image_to_input, numpy and Pillow) into the same numbers
training's input pipeline reads from that file (training.image_folder.load_image, TensorFlow's
decode_image and resize), at the sizes and channel counts `train --image-folder` takes.

Held equal value for value, JPEGs included: TensorFlow's decode_image decodes them with
libjpeg's fast integer DCT (decode_jpeg's default `dct_method`, INTEGER_FAST), Pillow with
the accurate one, and the two differ by up to about ten gray levels at sharp edges, so
training decodes JPEGs with `dct_method="INTEGER_ACCURATE"`, which gives Pillow's pixels
exactly (checked below).
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from artifact.images import ImageInput, decode_channels, image_to_input
from training import image_folder
from training.sample_data import write_sample_data

RNG = np.random.default_rng(0)


def encoded(pixels: np.ndarray, fmt: str, mode: str | None = None) -> bytes:
    image = Image.fromarray(pixels, mode) if mode else Image.fromarray(pixels)
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return buffer.getvalue()


def smooth(height: int, width: int, channels: int) -> np.ndarray:
    """A photo-like image: smooth gradients and some noise (JPEG's DCT has work to do)."""
    y, x = np.mgrid[0:height, 0:width]
    layers = [
        (np.sin(x / 7 + k) + np.cos(y / 5 - k)) * 60 + 128 + RNG.integers(-20, 20, (height, width))
        for k in range(channels)
    ]
    return np.clip(np.stack(layers, -1), 0, 255).astype(np.uint8)


FILES = {
    "png-rgb": lambda: encoded(smooth(40, 30, 3), "PNG"),
    "png-rgba": lambda: encoded(smooth(40, 30, 4), "PNG", "RGBA"),
    "png-gray": lambda: encoded(smooth(25, 50, 1)[..., 0], "PNG"),
    "png-gray-alpha": lambda: encoded(smooth(40, 30, 2), "PNG", "LA"),
    "png-palette": lambda: encoded(
        np.asarray(Image.fromarray(smooth(40, 30, 3)).quantize(64)), "PNG", "P"
    ),
    "jpeg-rgb": lambda: encoded(smooth(40, 30, 3), "JPEG"),
    "jpeg-gray": lambda: encoded(smooth(40, 30, 1)[..., 0], "JPEG"),
}


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("size", [32, 17, 64])
@pytest.mark.parametrize("kind", sorted(FILES))
def test_serving_prepares_a_file_as_training_reads_it(tmp_path, kind, size, channels):
    path = tmp_path / f"image.{'jpg' if kind.startswith('jpeg') else 'png'}"
    path.write_bytes(FILES[kind]())
    trained = image_folder.load_image(str(path), size, channels).numpy()
    served = image_to_input(path.read_bytes(), ImageInput(size, size, channels, channel_axis=True))
    assert served.shape == trained.shape == (size, size, channels)
    assert served.dtype == trained.dtype
    np.testing.assert_array_equal(served, trained)


@pytest.mark.parametrize("suffix", [".png", ".jpg"], ids=["png", "jpeg"])
def test_the_sample_image_folder_is_prepared_the_same(tmp_path, suffix):
    """Every image sample-data writes (the folder the tests train on), at 32x32x3."""
    folder = write_sample_data(tmp_path / "sample")["images"]
    paths = sorted(p for p in folder.rglob(f"*{suffix}"))
    assert len(paths) > 5
    for path in paths:
        trained = image_folder.load_image(str(path), 32, 3).numpy()
        served = image_to_input(path.read_bytes(), ImageInput(32, 32, 3, channel_axis=True))
        np.testing.assert_array_equal(served, trained, err_msg=path.name)


def test_tensorflows_accurate_jpeg_dct_gives_pillows_pixels(tmp_path):
    """What closes the JPEG skew: training decoding with the accurate DCT."""
    folder = write_sample_data(tmp_path / "sample")["images"]
    for path in sorted(folder.rglob("*.jpg")):
        data = path.read_bytes()
        decoded = tf.io.decode_jpeg(data, channels=3, dct_method="INTEGER_ACCURATE").numpy()
        np.testing.assert_array_equal(decoded, decode_channels(data, 3), err_msg=path.name)
