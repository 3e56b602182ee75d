"""`python -m training predict`: batch prediction over a file of images, as JSON lines.

The input is an IDX images file (gzipped or not), a `.npy` array [n, 28, 28] (or one [28, 28]
image; integers 0-255 or floats in [0, 1], the service's JSON convention), one image file, or
a folder of image files (PNG, JPEG, ...; turned into 28x28 exactly as the service turns
uploads, `training.images.image_to_pixels`).

It runs the exported SavedModel (`training.saved_model.SavedModelPredictor`), not
`estimator.predict` over the checkpoints: the SavedModel is what the service serves, with the
same preprocessing, labels and JSON encoder, so an image gets the service's answer; it needs
no model dir, params or code of the model kind that trained it (the checkpoints may be gone,
the kind's code may have moved on); and it is the faster path. Each line is what the
service's `/predict` answers for that image plus where it came from:

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

from training import cli
from training.errors import UsageError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
DEFAULT_BATCH_SIZE = 256


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `predict` subcommand's options."""
    from training.images import INVERT_MODES

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


def resolve_version(path: Path) -> Path:
    """An exported version directory, or a model folder's newest version.

    Raises:
        UsageError: neither.
    """
    from training.saved_model import version_dirs

    if (path / "saved_model.pb").is_file():
        return path
    versions = version_dirs(path)
    if not versions:
        what = "not found" if not path.exists() else "holds no exported version"
        raise UsageError(f"--model {path}: {what}")
    return versions[-1][1]


def _pixels_from_array(array: np.ndarray, path: Path) -> np.ndarray:
    """A .npy array to float32 [n, 28, 28] in [0, 1] by the service's JSON rules."""
    from training.contract import IMAGE_SHAPE, normalize_pixels

    if array.shape == IMAGE_SHAPE:
        array = array[None]
    if array.ndim != 3 or array.shape[1:] != IMAGE_SHAPE or len(array) == 0:
        raise UsageError(f"{path}: expected an array [n, 28, 28] or [28, 28], got {array.shape}")
    if array.dtype.kind in "iu":
        if array.min() < 0 or array.max() > 255:
            raise UsageError(f"{path}: integer pixels must be 0-255")
        return normalize_pixels(array.astype(np.uint8))
    if array.dtype.kind != "f":
        raise UsageError(f"{path}: expected integer or float pixels, got dtype {array.dtype}")
    images = array.astype(np.float32)
    if not np.isfinite(images).all() or images.min() < 0.0 or images.max() > 1.0:
        raise UsageError(f"{path}: float pixels must be finite and in [0, 1]")
    return images


def _image_file_pixels(path: Path, invert: str) -> np.ndarray:
    from training.images import ImageError, image_to_pixels

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
    from training import data
    from training.contract import normalize_pixels

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


def prediction_rows(key_name, keys, classes, probabilities, labels):
    """The output lines' objects: the service's /predict item plus `index` or `file`."""
    for key, class_id, row in zip(keys, classes, probabilities, strict=True):
        yield {
            key_name: key,
            "class_id": int(class_id),
            "label": labels[int(class_id)],
            "probabilities": dict(zip(labels, row, strict=True)),
        }


def cmd_predict(args) -> int:
    """Classify every image of --input with an exported version; write --output."""
    import orjson

    from training.contract import DIGIT_LABELS
    from training.progress import ProgressBar
    from training.saved_model import SavedModelPredictor, read_labels_file

    version = resolve_version(Path(args.model))
    output = Path(args.output)
    if not output.parent.is_dir():
        raise UsageError(f"--output {output}: folder {output.parent} does not exist")
    if output.is_dir():
        raise UsageError(f"--output {output}: is a folder")
    images, key_name, keys = read_inputs(Path(args.input), args.invert)
    # The labels the service answers with for this version (base.Backend.labels).
    labels = read_labels_file(version) or DIGIT_LABELS
    predictor = SavedModelPredictor(version)
    print(f"Predicting {len(images):,} images from {args.input} with {version}", flush=True)
    fd, temp = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent)
    progress = ProgressBar(len(images), "predict")
    try:
        with os.fdopen(fd, "wb") as out:
            for start in range(0, len(images), args.batch_size):
                stop = start + args.batch_size
                classes, probabilities = predictor.predict(images[start:stop])
                for row in prediction_rows(
                    key_name, keys[start:stop], classes, probabilities, labels
                ):
                    # The service's encoder (service.codec.dumps): the same bytes per number.
                    out.write(orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
                progress.update(len(classes))
        os.replace(temp, output)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    progress.close()
    print(f"Wrote {len(images):,} predictions to {output}")
    return 0
