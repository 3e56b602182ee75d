"""`python -m training predict`: batch prediction over a file of images, as JSON lines.

The input is an IDX images file (gzipped or not), a `.npy` array [n, 28, 28] (or one [28, 28]
image; integers 0-255 or floats in [0, 1], the service's JSON convention), one image file, or
a folder of image files (PNG, JPEG, ...; turned into 28x28 exactly as the service turns
uploads, `artifact.images.image_to_pixels`).

It runs the exported SavedModel (`artifact.saved_model.SavedModelPredictor`), not
`estimator.predict` over the checkpoints: the SavedModel is what the service serves, with the
same preprocessing, labels and JSON encoder, so an image gets the service's answer; it needs
no model dir, params or code of the model kind that trained it (the checkpoints may be gone,
the kind's code may have moved on); and it is the faster path. Each line is what the
service's `/predict` answers for that image (`artifact.contract.prediction_rows`, encoded by
`artifact.contract.to_json`) plus where it came from:

    {"index": 0, "class_id": 9, "label": "Ankle boot", "probabilities": {"T-shirt/top": ..., ...}}
    {"file": "boot.png", "class_id": 9, ...}

Byte for byte when the model sees the same batch (a request with the same images in the
same order, within --batch-size); TensorFlow's CPU kernels round differently for other batch
sizes, so probabilities may then differ in the last float32 digits (about 1e-7), as the
service's own answers do when its dynamic batching groups requests differently.

The output appears complete or not at all (written beside it, then renamed).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np

from artifact.contract import (
    IMAGE_SHAPE,
    PixelError,
    normalize_pixels,
    pixels_to_input,
    prediction_rows,
    to_json,
)
from artifact.images import INVERT_MODES, ImageError, image_to_pixels
from artifact.repository import resolve_version_path, version_labels
from artifact.saved_model import SavedModelPredictor
from training import cli, data
from training.errors import UsageError
from training.progress import ProgressBar

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
DEFAULT_BATCH_SIZE = 256


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `predict` subcommand's options."""
    p.add_argument(
        "--model",
        default=cli.DEFAULT_EXPORT_DIR,
        help="an exported version (models/NAME/VERSION) or a model folder (its newest "
        "version) (default: %(default)s)",
    )
    p.add_argument(
        "--input",
        required=True,
        metavar="FILE_OR_DIR",
        help="an IDX images file, a .npy array, an image file, or a folder of image files "
        f"({', '.join(IMAGE_SUFFIXES)})",
    )
    p.add_argument(
        "--output", required=True, help="the JSON-lines file to write (replaced when complete)"
    )
    p.add_argument(
        "--batch-size",
        type=cli.positive_int,
        default=DEFAULT_BATCH_SIZE,
        help="images per model call (default: %(default)s)",
    )
    p.add_argument(
        "--invert",
        choices=INVERT_MODES,
        default="auto",
        help="image files: make them light-on-dark like Fashion-MNIST; auto inverts when the "
        "border is light, as the service does (default: %(default)s)",
    )


def _pixels_from_array(array: np.ndarray, path: Path) -> np.ndarray:
    """A .npy array to float32 [n, 28, 28] in [0, 1] by the service's JSON rules."""
    if array.shape == IMAGE_SHAPE:
        array = array[None]
    if array.ndim != 3 or array.shape[1:] != IMAGE_SHAPE or len(array) == 0:
        raise UsageError(f"{path}: expected an array [n, 28, 28] or [28, 28], got {array.shape}")
    try:
        return pixels_to_input(array)
    except PixelError as err:
        raise UsageError(f"{path}: image {err.index}: {err.problem}") from err


def _image_file_pixels(path: Path, invert: str) -> np.ndarray:
    try:
        return image_to_pixels(path.read_bytes(), invert)
    except ImageError as err:
        raise UsageError(f"{path}: {err}") from err
    except OSError as err:
        raise UsageError(f"{path}: cannot read: {err.strerror}") from err


def read_inputs(path: Path, invert: str = "auto") -> tuple[np.ndarray, str, list]:
    """The images to classify and what names each.

    Returns:
        (float32 images [n, 28, 28] in [0, 1], "index" or "file", one key per image).
    Raises:
        UsageError / DataError: missing, unreadable, empty or malformed input.
    """
    if path.is_dir():
        files = sorted(
            p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES
        )
        if not files:
            raise UsageError(
                f"{path}: no image files in this folder (looked for {', '.join(IMAGE_SUFFIXES)})"
            )
        pixels = np.stack([_image_file_pixels(f, invert) for f in files])
        return normalize_pixels(pixels), "file", [f.name for f in files]
    if not path.is_file():
        raise UsageError(f"{path}: not found")
    suffix = path.suffix.lower()
    if suffix in IMAGE_SUFFIXES:
        return normalize_pixels(_image_file_pixels(path, invert)[None]), "file", [path.name]
    if suffix == ".npy":
        try:
            array = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as err:
            raise UsageError(f"{path}: not a readable .npy array ({err})") from err
        images = _pixels_from_array(array, path)
    else:
        images = data.read_images(path)
        if len(images) == 0:
            raise UsageError(f"{path}: holds no images")
        images = normalize_pixels(images)
    return images, "index", list(range(len(images)))


def cmd_predict(args) -> int:
    """Classify every image of --input with an exported version; write --output."""
    try:
        version = resolve_version_path(Path(args.model))
    except FileNotFoundError as err:
        raise UsageError(f"--model {err}") from err
    output = Path(args.output)
    if not output.parent.is_dir():
        raise UsageError(f"--output {output}: folder {output.parent} does not exist")
    if output.is_dir():
        raise UsageError(f"--output {output}: is a folder")
    images, key_name, keys = read_inputs(Path(args.input), args.invert)
    # The labels the service answers with for this version.
    labels = version_labels(version)
    predictor = SavedModelPredictor(version)
    print(f"Predicting {len(images):,} images from {args.input} with {version}", flush=True)
    fd, temp = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent)
    progress = ProgressBar(len(images), "predict")
    try:
        with os.fdopen(fd, "wb") as out:
            for start in range(0, len(images), args.batch_size):
                stop = start + args.batch_size
                classes, probabilities = predictor.predict(images[start:stop])
                rows = prediction_rows(classes, probabilities, labels)
                for key, row in zip(keys[start:stop], rows, strict=True):
                    out.write(to_json({key_name: key, **row}) + b"\n")
                progress.update(len(classes))
        os.replace(temp, output)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    progress.close()
    print(f"Wrote {len(images):,} predictions to {output}")
    return 0
